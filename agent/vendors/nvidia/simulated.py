"""A simulated node: built-in profiles or a YAML file of cards, changeable while it runs,
and the node monitor's ``HostProbe`` over figures a test or the demo sets."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import yaml

from agent.mig.tables import A100_80GB, H100_80GB, H200_141GB, MigCardTable
from agent.monitor.model import GpuProcess, HostCard
from agent.monitor.processes import tenants_per_card
from agent.vendors.port import InventoryError
from common.core.model import NonNegative, NumaId
from common.core.vendors import NVIDIA
from common.wire import ReportedCard

MIB = 1024 * 1024


def uuid_for(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


T4_NAME = "Tesla T4"
NVML_NAMES = {NVIDIA.card_type(name): name for name in (
    T4_NAME, A100_80GB.name, H100_80GB.name, H200_141GB.name)}
"""The NVML name of each model the profiles simulate (the MIG tables' names for the others),
by the type it registers as."""


def nvml_name(card_type: str) -> str:
    """The name a simulated card of ``card_type`` answers as NVML's (the node monitor's
    ``device_type`` is ``NVIDIA-`` and it): a profile's model's own; a card of a simulation
    file, which gives its type alone, answers that."""
    return NVML_NAMES.get(card_type, card_type)


def _cards(node: str, count: int, *, name: str, memory: int, sm_count: int | None,
           numa_of: Callable[[int], int],
           peers_of: Callable[[int], dict[int, int]]) -> list[ReportedCard]:
    """``count`` cards NVML names ``name``, typed as HAMi registers that name."""
    model = NVIDIA.card_type(name)
    return [ReportedCard(uuid=uuid_for(node, index), index=index, type=model, memory=memory,
                         numa=numa_of(index), sm_count=sm_count,
                         links={uuid_for(node, peer): lanes
                                for peer, lanes in peers_of(index).items()})
            for index in range(count)]


def _t4x4(node: str) -> list[ReportedCard]:
    """The article's lab: four Tesla T4 on PCIe, one NUMA node."""
    return _cards(node, 4, name=T4_NAME, memory=15360, sm_count=40,
                  numa_of=lambda _: 0, peers_of=lambda _: {})


def _a100x8_nvswitch(node: str) -> list[ReportedCard]:
    """An HGX A100: every card reaches every other through the NVSwitches (12 links each)."""
    return _cards(node, 8, name=A100_80GB.name, memory=81920, sm_count=108,
                  numa_of=lambda i: i // 4,
                  peers_of=lambda i: {peer: 12 for peer in range(8) if peer != i})


def _h100x8_islands(node: str) -> list[ReportedCard]:
    """Two islands of four H100 meshed by direct NVLink (18 links: 6 to each island peer)."""
    return _cards(node, 8, name=H100_80GB.name, memory=81559, sm_count=132,
                  numa_of=lambda i: i // 4,
                  peers_of=lambda i: {peer: 6 for peer in range(i // 4 * 4, i // 4 * 4 + 4)
                                      if peer != i})


def _h200x8_nvswitch(node: str) -> list[ReportedCard]:
    """An HGX H200: every card reaches every other through the NVSwitches (18 links each).
    Name and memory as NVML reports them on an H200 SXM, and no multiprocessor count: the
    driver answers ``nvmlDeviceGetAttributes`` only for MIG devices (docs/gpu-check.md)."""
    return _cards(node, 8, name=H200_141GB.name, memory=143771, sm_count=None,
                  numa_of=lambda i: i // 4,
                  peers_of=lambda i: {peer: 18 for peer in range(8) if peer != i})


PROFILES: dict[str, Callable[[str], list[ReportedCard]]] = {
    "t4x4": _t4x4,
    "a100x8-nvswitch": _a100x8_nvswitch,
    "h100x8-islands": _h100x8_islands,
    "h200x8-nvswitch": _h200x8_nvswitch,
    "a100x8-mig": _a100x8_nvswitch,
    "h100x8-mig": _h100x8_islands,
    "h200x8-mig": _h200x8_nvswitch,
}
MIG_PROFILES: dict[str, MigCardTable] = {"a100x8-mig": A100_80GB, "h100x8-mig": H100_80GB,
                                         "h200x8-mig": H200_141GB}
"""The profiles whose node is in MIG mode, and the NVML tables their simulated GPUs answer
(``agent.mig.simulated``): the same cards as their namesakes, cut into instances."""


def profile_cards(profile: str, node: str) -> list[ReportedCard]:
    try:
        build = PROFILES[profile]
    except KeyError:
        raise InventoryError(f"unknown simulated profile {profile!r} "
                             f"(known: {', '.join(sorted(PROFILES))})") from None
    return build(node)


class CardSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One card in a simulation file: the ``Card`` fields, ``uuid`` and ``index`` optional.

    ``links`` keys name peers by UUID, or by index (an integer), which keeps one
    file usable for many nodes.
    """

    type: str
    memory: NonNegative
    uuid: str | None = None
    index: NonNegative | None = None
    cores: NonNegative = 100
    count: NonNegative = 10
    numa: NumaId = -1
    health: bool = True
    links: dict[str | int, NonNegative] | None = None
    processes: NonNegative = 0
    sm_count: NonNegative | None = None
    process_memory: NonNegative = 0
    health_detail: str = ""


def file_cards(path: Path, node: str) -> list[ReportedCard]:
    """Raises ``InventoryError`` naming the file and what is wrong in it."""
    try:
        document = yaml.safe_load(path.read_bytes())
    except OSError as error:
        raise InventoryError(f"{path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise InventoryError(f"{path}: not YAML: {error}".replace("\n", " ")) from None
    if not isinstance(document, list) or not document:
        raise InventoryError(f"{path}: expected a non-empty list of cards")
    try:
        specs = msgspec.convert(document, list[CardSpec])
    except msgspec.ValidationError as error:
        raise InventoryError(f"{path}: {error}") from None
    try:
        return cards_from_specs(specs, node)
    except ValueError as error:
        raise InventoryError(f"{path}: {error}") from None


def cards_from_specs(specs: list[CardSpec], node: str) -> list[ReportedCard]:
    """Raises ``ValueError`` for repeated UUIDs or indices and links to unknown cards."""
    indices = [spec.index if spec.index is not None else position
               for position, spec in enumerate(specs)]
    uuids = [spec.uuid if spec.uuid is not None else uuid_for(node, index)
             for spec, index in zip(specs, indices, strict=True)]
    _require_unique("index", indices)
    _require_unique("uuid", uuids)
    uuid_of_index = dict(zip(indices, uuids, strict=True))

    def peer_uuid(peer: str | int, position: int) -> str:
        if isinstance(peer, int):
            if peer not in uuid_of_index:
                raise ValueError(f"card {position}: link to index {peer}, which no card has")
            return uuid_of_index[peer]
        if peer not in uuids:
            raise ValueError(f"card {position}: link to {peer!r}, which no card has")
        return peer

    cards = []
    for position, (spec, index, uuid) in enumerate(zip(specs, indices, uuids, strict=True)):
        links = None if spec.links is None else {
            peer_uuid(peer, position): lanes for peer, lanes in spec.links.items()}
        cards.append(ReportedCard(uuid=uuid, index=index, type=spec.type, memory=spec.memory,
                                  cores=spec.cores, count=spec.count, numa=spec.numa,
                                  health=spec.health, links=links, processes=spec.processes,
                                  sm_count=spec.sm_count, process_memory=spec.process_memory,
                                  health_detail=spec.health_detail))
    return sorted(cards, key=lambda card: card.index)


def _require_unique(field: str, values: Iterable[object]) -> None:
    repeated = [value for value, times in Counter(values).items() if times > 1]
    if repeated:
        raise ValueError(f"{field} {repeated[0]} is given to more than one card")


@dataclass(frozen=True, slots=True)
class SimulatedProcess:
    """A process a simulated card runs, as NVML would list it, with the pod the node
    monitor's attribution would find in its cgroup."""

    pid: int
    memory_used: int
    """Bytes."""
    utilization: int = 0
    """Percent of the card's SMs."""
    pod: str | None = None
    """The UID of the pod it runs in; None for a process no pod owns (started outside
    Kubernetes, or whose cgroup cannot be read)."""


@dataclass(frozen=True, slots=True)
class _HostFigures:
    memory_used: int | None
    utilization: int | None
    memory_utilization: int | None


class SimulatedSource:
    """An ``InventorySource`` over fixed cards whose processes and health can be changed,
    and a ``HostProbe`` answering the figures set with ``set_usage`` and
    ``set_gpu_processes`` (deterministic: nothing moves by itself)."""

    def __init__(self, cards: list[ReportedCard]) -> None:
        self._cards = {card.index: card for card in cards}
        self._figures: dict[int, _HostFigures] = {}
        self._processes: dict[int, tuple[SimulatedProcess, ...]] = {}
        self._lock = threading.Lock()

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def read(self) -> list[ReportedCard]:
        with self._lock:
            return [self._cards[index] for index in sorted(self._cards)]

    def set_processes(self, index: int, count: int, memory_mib: int = 0) -> None:
        """The card's tenants seen (its ``processes``) and the MiB its processes hold."""
        self._update(index, processes=count, process_memory=memory_mib)

    def set_health(self, index: int, healthy: bool, detail: str = "") -> None:
        self._update(index, health=healthy, health_detail="" if healthy else detail)

    def set_usage(self, index: int, *, memory_used: int | None, utilization: int | None,
                  memory_utilization: int | None = 0) -> None:
        """What ``host_cards`` says of the card: bytes used, percent of the GPU and of its
        memory controller (None: NVML has no figure). Until set, the card's memory used is
        its processes' and its utilization 0."""
        with self._lock:
            self._require(index)
            self._figures[index] = _HostFigures(memory_used, utilization, memory_utilization)

    def set_gpu_processes(self, index: int, *processes: SimulatedProcess) -> None:
        """The processes ``gpu_processes`` lists on the card; the inventory's memory and
        tenants seen follow them, counted as the NVML inventory counts them
        (``tenants_per_card``: a pod once, a process no pod owns once)."""
        memory_mib = sum(process.memory_used for process in processes) // MIB
        with self._lock:
            self._require(index)
            self._processes[index] = processes
            uuid = self._cards[index].uuid
        tenants = tenants_per_card((uuid, process.pid, process.pod) for process in processes)
        self._update(index, processes=tenants.get(uuid, 0), process_memory=memory_mib)

    def host_cards(self) -> list[HostCard]:
        with self._lock:
            return [self._host_card(self._cards[index]) for index in sorted(self._cards)]

    def gpu_processes(self) -> list[GpuProcess]:
        with self._lock:
            return [GpuProcess(pid=process.pid, device_uuid=self._cards[index].uuid,
                               memory_used=process.memory_used,
                               utilization=process.utilization)
                    for index in sorted(self._processes)
                    for process in self._processes[index]]

    def _host_card(self, card: ReportedCard) -> HostCard:
        figures = self._figures.get(card.index) or _HostFigures(
            card.process_memory * MIB, 0, 0)
        return HostCard(index=card.index, uuid=card.uuid, name=nvml_name(card.type),
                        memory_used=figures.memory_used, utilization=figures.utilization,
                        memory_utilization=figures.memory_utilization)

    def _require(self, index: int) -> None:
        if index not in self._cards:
            raise KeyError(f"the simulated node has no card with index {index}")

    def _update(self, index: int, **fields: object) -> None:
        with self._lock:
            self._require(index)
            self._cards[index] = msgspec.structs.replace(self._cards[index], **fields)
