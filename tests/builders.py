"""Small builders for cards, nodes, pods and fleets used across the core's tests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agent.mig.tables import (
    A100_80GB,
    MigCardTable,
    allowed_profiles,
    register_profiles,
    slot_count,
)
from common.core import (
    Allocation,
    Card,
    CardGrant,
    Decision,
    Defaults,
    Fleet,
    Node,
    PodManifest,
    PodRejected,
    decide,
    parse_pod,
    rejected,
)
from common.core.deviceconfig import CHART_MIG_PROFILE_ALLOWLIST, DeviceConfig, MigProfiles
from common.core.mig import MigProfile
from common.core.pod import Container, ObjectMeta, PodSpec, ResourceRequirements
from pyhami.sandbox import DEFAULTS

T4 = "NVIDIA-Tesla T4"
T4_MEMORY = 15360


def card(index: int, node: str = "n", **fields: Any) -> Card:
    values: dict[str, Any] = {"uuid": f"GPU-{node}-{index}", "index": index, "type": T4,
                              "memory": T4_MEMORY, "numa": 0, "links": {}}
    values.update(fields)
    return Card(**values)


def node(name: str = "n", cards: int = 4, annotations: dict[str, str] | None = None,
         **fields: Any) -> Node:
    return Node(name=name, cards=[card(i, name, **fields) for i in range(cards)],
                annotations=annotations or {})


def fleet_of(*nodes: Node) -> Fleet:
    fleet = Fleet()
    for each in nodes:
        fleet.upsert_node(each)
    return fleet


def hold(fleet: Fleet, key: str, node_name: str, *uuids: str, memory: int = 1000,
         cores: int = 0) -> None:
    """Book an existing tenant per uuid (one container, one card each, one pod)."""
    grants = tuple(CardGrant(u, memory, cores) for u in uuids)
    fleet.allocate(key, Allocation(node_name, (grants,)))


def gpu_limits(mib: int | None = None, *, cards: int = 1, percent: int | None = None,
               cores: int | None = None) -> dict[str, int]:
    """A container's GPU limits: ``cards`` cards of ``mib`` MiB or ``percent`` % of a
    card's memory, and ``cores`` % of its cores; what is None is left out."""
    limits = {"nvidia.com/gpu": cards}
    for resource, value in (("nvidia.com/gpumem", mib),
                            ("nvidia.com/gpumem-percentage", percent),
                            ("nvidia.com/gpucores", cores)):
        if value is not None:
            limits[resource] = value
    return limits


def manifest(
    name: str = "p",
    *,
    policy: str | None = None,
    annotations: dict[str, str] | None = None,
    gpus: int | str | None = 1,
    gpumem: int | str | None = 1000,
    containers: list[dict[str, int | str]] | None = None,
    init_containers: list[dict[str, int | str]] | None = None,
) -> PodManifest:
    """A pod; ``containers`` gives each container's limits, else one from the arguments."""
    notes = dict(annotations or {})
    if policy is not None:
        notes["hami.io/gpu-scheduler-policy"] = policy
    if containers is None:
        limits: dict[str, int | str] = {}
        if gpus is not None:
            limits["nvidia.com/gpu"] = gpus
        if gpumem is not None:
            limits["nvidia.com/gpumem"] = gpumem
        containers = [limits]

    def build(specs: list[dict[str, int | str]], prefix: str) -> list[Container]:
        return [Container(name=f"{prefix}{i}",
                          resources=ResourceRequirements(limits=dict(spec)))
                for i, spec in enumerate(specs)]

    return PodManifest(
        metadata=ObjectMeta(name=name, namespace="default", annotations=notes),
        spec=PodSpec(containers=build(containers, "c"),
                     init_containers=build(init_containers or [], "init")),
    )


def under(device: DeviceConfig) -> Defaults:
    """The sandbox's defaults under the device configuration ``device``."""
    return replace(DEFAULTS, device=device)


def run(fleet: Fleet, pod: PodManifest, defaults: Defaults = DEFAULTS, *,
        explain: bool = False) -> Decision:
    try:
        request = parse_pod(pod, defaults)
    except PodRejected as error:
        return rejected(pod.key, str(error))
    return decide(fleet, request, explain=explain)


def place(fleet: Fleet, pod: PodManifest, defaults: Defaults = DEFAULTS) -> Decision:
    """Decide and, when scheduled, book the allocation as the daemon would."""
    decision = run(fleet, pod, defaults)
    if decision.allocation is not None:
        fleet.allocate(decision.pod, decision.allocation)
    return decision


def indexes(decision: Decision) -> list[list[int]]:
    return [[c.index for c in cards] for cards in decision.cards]


def lab_fleet() -> Fleet:
    """The article's lab node: four Tesla T4, NUMA 0, no NVLink."""
    return fleet_of(node("gpu-node-1", 4))


def worked_example_fleet() -> Fleet:
    """GPU 0 holds two 1000 MiB tenants, GPU 1 one, GPU 2 and 3 idle."""
    fleet = lab_fleet()
    hold(fleet, "default/bp-1", "gpu-node-1", "GPU-gpu-node-1-0")
    hold(fleet, "default/bp-2", "gpu-node-1", "GPU-gpu-node-1-0")
    hold(fleet, "default/pinned", "gpu-node-1", "GPU-gpu-node-1-1")
    return fleet


def node_with(name: str, *overrides: dict[str, Any],
              annotations: dict[str, str] | None = None) -> Node:
    """A node whose card ``i`` takes the fields in ``overrides[i]``."""
    return Node(name=name, cards=[card(**{"index": i, "node": name, **extra})
                                    for i, extra in enumerate(overrides)],
                annotations=annotations or {})


H100_NVML_NAMES = MigProfiles(("H100 80GB HBM3",), ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"))
"""The allowlist entry an H100 SXM5 node needs: HAMi's chart names no H100 as NVML does."""
H200_NVML_NAMES = MigProfiles(("NVIDIA H200",), ("1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"))
"""The allowlist entry an H200 SXM node needs, before the chart's items: HAMi's chart lists
``H200-SXM5``, NVML calls the card plainly ``NVIDIA H200``, and that name contains the
chart's ``H20``, whose profile names it would otherwise take."""


def mig_profiles_of(table: MigCardTable) -> tuple[MigProfile, ...]:
    """The profiles a card of ``table`` registers under HAMi's chart allowlist, with the
    entries for the H100's and the H200's NVML names (the H200's first: its name contains
    the chart's "H20")."""
    allowed = allowed_profiles(table.name, (H200_NVML_NAMES, *CHART_MIG_PROFILE_ALLOWLIST,
                                            H100_NVML_NAMES))
    assert allowed is not None, f"no allowlist entry for {table.name}"
    return register_profiles(table.profiles, allowed)


def mig_node(name: str = "n", cards: int = 1, table: MigCardTable = A100_80GB,
             **fields: Any) -> Node:
    """A node whose cards are in MIG mode, with NVML's profiles for ``table``."""
    profiles = mig_profiles_of(table)
    values: dict[str, Any] = {"type": table.name, "memory": table.memory_mib,
                              "count": slot_count(profiles), "mode": "mig",
                              "mig_profiles": profiles}
    values.update(fields)
    return Node(name=name, cards=[card(i, name, **values) for i in range(cards)])
