"""Simulated nodes: the built-in profiles, simulation files, and changes made while running."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.vendors.nvidia.simulated import (
    MIB,
    PROFILES,
    SimulatedProcess,
    SimulatedSource,
    file_cards,
    profile_cards,
)
from agent.vendors.port import InventoryError
from common.core import Fleet, decide, parse_pod
from common.files import parse_pod_manifest
from common.wire import SCHEMA_VERSION, Inventory
from pyhami.sandbox import DEFAULTS


def test_t4x4_is_the_articles_lab_node() -> None:
    cards = profile_cards("t4x4", "gpu-node-1")
    assert [(c.uuid, c.index) for c in cards] == [(f"GPU-gpu-node-1-{i}", i) for i in range(4)]
    for card in cards:
        assert (card.type, card.memory, card.cores, card.count, card.numa, card.links) == (
            "NVIDIA-Tesla T4", 15360, 100, 10, 0, {})
        assert card.health and card.processes == 0


@pytest.mark.parametrize(("profile", "model", "memory", "sm_count", "lanes"), [
    ("a100x8-nvswitch", "NVIDIA A100-SXM4-80GB", 81920, 108, 12),
    # NVML's name and memory of an H200 SXM, and no multiprocessor count: the driver
    # answers only for MIG devices (seen by the GPU check, docs/gpu-check.md).
    ("h200x8-nvswitch", "NVIDIA H200", 143771, None, 18),
    ("h200x8-mig", "NVIDIA H200", 143771, None, 18),
])
def test_nvswitch_nodes_link_every_pair_across_two_numa_nodes(
        profile: str, model: str, memory: int, sm_count: int | None, lanes: int) -> None:
    cards = profile_cards(profile, "n")
    assert len(cards) == 8
    assert [c.numa for c in cards] == [0, 0, 0, 0, 1, 1, 1, 1]
    for card in cards:
        assert (card.type, card.memory, card.sm_count) == (model, memory, sm_count)
        assert card.links is not None
        assert set(card.links) == {c.uuid for c in cards} - {card.uuid}
        assert set(card.links.values()) == {lanes}


def test_h100x8_islands_links_only_within_each_island_of_four() -> None:
    cards = profile_cards("h100x8-islands", "n")
    assert [c.numa for c in cards] == [0, 0, 0, 0, 1, 1, 1, 1]
    for card in cards:
        island = {c.uuid for c in cards if c.index // 4 == card.index // 4}
        assert card.links is not None
        assert set(card.links) == island - {card.uuid}


def test_uuids_are_unique_per_node_and_differ_between_nodes() -> None:
    for profile in PROFILES:
        first = {c.uuid for c in profile_cards(profile, "node-a")}
        second = {c.uuid for c in profile_cards(profile, "node-b")}
        assert len(first) == len(profile_cards(profile, "node-a"))
        assert not first & second


def test_an_unknown_profile_names_itself_and_the_known_ones() -> None:
    with pytest.raises(InventoryError, match=r"unknown simulated profile 'v100x2' \(known: "
                                             r"a100x8-mig, a100x8-nvswitch, h100x8-islands, "
                                             r"h100x8-mig, h200x8-mig, h200x8-nvswitch, "
                                             r"t4x4\)"):
        profile_cards("v100x2", "n")


def test_processes_and_health_change_while_the_source_runs() -> None:
    source = SimulatedSource(profile_cards("t4x4", "n"))
    source.set_processes(2, 3, memory_mib=2048)
    source.set_health(1, False, "critical XID 79")
    cards = source.read()
    assert (cards[2].processes, cards[2].process_memory) == (3, 2048)
    assert (cards[1].health, cards[1].health_detail) == (False, "critical XID 79")
    source.set_health(1, True, "ignored while healthy")
    assert (source.read()[1].health, source.read()[1].health_detail) == (True, "")
    with pytest.raises(KeyError, match="no card with index 9"):
        source.set_processes(9, 1)


POD_A = "0f6c9a1e-7b2d-4c3e-9a8f-1d2e3f4a5b6c"
POD_B = "11111111-2222-3333-4444-555555555555"


@pytest.mark.parametrize(("pods", "tenants"), [
    ([POD_A, POD_A, POD_A, POD_A], 1),
    ([POD_A, POD_A, POD_B], 2),
    ([POD_A, POD_A, None], 2),
    ([None, None], 2),
], ids=["one-pod-four-processes", "two-pods", "a-pod-and-a-process-no-pod-owns",
        "two-processes-no-pod-owns"])
def test_a_simulated_cards_processes_count_a_pod_once(pods: list[str | None],
                                                      tenants: int) -> None:
    source = SimulatedSource(profile_cards("t4x4", "n"))
    source.set_gpu_processes(1, *(SimulatedProcess(pid, MIB, pod=pod)
                                  for pid, pod in enumerate(pods, start=100)))
    card = source.read()[1]
    assert (card.processes, card.process_memory) == (tenants, len(pods))
    assert len(source.gpu_processes()) == len(pods)  # NVML still lists every process


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(text)
    return path


def test_a_file_lists_cards_with_links_by_index_or_uuid(tmp_path: Path) -> None:
    path = _write(tmp_path, """
- {type: NVIDIA-A10, memory: 23028, numa: 1, links: {1: 4}}
- {type: NVIDIA-A10, memory: 23028, numa: 1, uuid: GPU-fixed, links: {GPU-node-x-0: 4}}
- {type: NVIDIA-A10, memory: 23028, index: 5, processes: 2, health: false}
""")
    cards = file_cards(path, "node-x")
    assert [(c.uuid, c.index) for c in cards] == [("GPU-node-x-0", 0), ("GPU-fixed", 1),
                                                  ("GPU-node-x-5", 5)]
    assert cards[0].links == {"GPU-fixed": 4}
    assert cards[1].links == {"GPU-node-x-0": 4}
    assert cards[2].links is None
    assert (cards[2].processes, cards[2].health, cards[0].count) == (2, False, 10)


@pytest.mark.parametrize(("text", "problem"), [
    ("- {type: T, memroy: 1}", "unknown field `memroy`"),
    ("- {type: T, memory: -5}", r"Expected `int` >= 0 - at `\$\[0\].memory`"),
    ("- {type: T, memory: 1, index: 0}\n- {type: T, memory: 1, index: 0}",
     "index 0 is given to more than one card"),
    ("- {type: T, memory: 1, uuid: a}\n- {type: T, memory: 1, uuid: a}",
     "uuid a is given to more than one card"),
    ("- {type: T, memory: 1, links: {7: 2}}", "card 0: link to index 7, which no card has"),
    ("- {type: T, memory: 1, links: {GPU-zz: 2}}", "card 0: link to 'GPU-zz', which no card has"),
    ("cards: []", "expected a non-empty list of cards"),
    ("- [unclosed", "not YAML"),
])
def test_a_bad_file_is_refused_naming_the_file_and_the_problem(
        tmp_path: Path, text: str, problem: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(InventoryError, match=problem) as raised:
        file_cards(path, "n")
    assert str(raised.value).startswith(f"{path}: ")
    assert "\n" not in str(raised.value)


def test_a_missing_file_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"absent\.yaml: No such file"):
        file_cards(tmp_path / "absent.yaml", "n")


def _decide_on(profile: str, gpus: int) -> tuple[bool, set[int], str]:
    """Place one topology-aware pod on a node reported by the agent, through the core."""
    inventory = Inventory(schema=SCHEMA_VERSION, node="node-1", agent_version="t",
                          instance="i", sequence=1, timestamp=0.0, reason="start",
                          heartbeat_interval=10.0, cards=profile_cards(profile, "node-1"))
    fleet = Fleet()
    fleet.upsert_node(inventory.to_node())
    pod = parse_pod_manifest(f"""
metadata: {{name: p, namespace: default,
           annotations: {{hami.io/gpu-scheduler-policy: topology-aware}}}}
spec:
  containers:
  - name: main
    resources: {{limits: {{nvidia.com/gpu: {gpus}, nvidia.com/gpumem: 1000}}}}
""", "pod")
    decision = decide(fleet, parse_pod(pod, DEFAULTS))
    chosen = {card.index for container in decision.cards for card in container}
    return decision.scheduled, chosen, str(decision.failed_nodes)


def test_the_decision_core_places_topology_aware_pods_on_what_the_agent_reports() -> None:
    scheduled, chosen, _ = _decide_on("h100x8-islands", 4)
    assert scheduled and chosen in ({0, 1, 2, 3}, {4, 5, 6, 7})
    scheduled, _, reasons = _decide_on("h100x8-islands", 5)
    assert not scheduled and "TopologyNotFit" in reasons
    assert _decide_on("a100x8-nvswitch", 8)[0]
    scheduled, _, reasons = _decide_on("t4x4", 2)
    assert not scheduled and "TopologyNotFit" in reasons
