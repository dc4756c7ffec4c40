# ruff: noqa: N802 - the NVML library's own names, kept so the real module fits
"""The real node: cards read through NVML (the nvidia-ml-py package, module ``pynvml``).

The library is injected, the real ``pynvml`` module by default, so that the
whole reading logic runs against any object with the same functions.

What is read once per card (its identity and topology: UUID, model, memory,
PCI bus, NUMA node, SM count, NVLink peers) and what on every ``read`` (compute
processes, which doubles as the health probe, and their pods: the card's tenants seen)
differ: topology does not change while the driver is loaded, usage does. Critical XID
events arrive on a watcher thread and make a card unhealthy until the agent restarts, as
the driver's own recovery (a GPU reset) restarts the agent's view too.

The source is also the node monitor's ``HostProbe`` (``agent.monitor.model``): each
card's memory used and utilization, and its processes with their memory and SM
utilization, read fresh at each call from a thread of the monitor's own, beside the
inventory's reads.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar, cast

from agent.errors import AgentError
from agent.monitor.model import GpuProcess, HostCard
from agent.monitor.processes import tenants_seen
from agent.vendors.port import InventoryError
from common.core.errors import ExternalFailure
from common.core.vendors import NVIDIA
from common.messaging import RateLimitedLog
from common.wire import ReportedCard

logger = logging.getLogger(__name__)

MIB = 1024 * 1024

# Values from nvml.h; they are part of the driver's ABI and do not change between versions.
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 1
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8

# XIDs an application causes (bad memory access, a stopped or killed context): the card is fine.
APPLICATION_XIDS = frozenset({31, 43, 45})

DEFAULT_SYSFS_ROOT = Path("/sys")
DEFAULT_EVENT_WAIT_MS = 1000
# How far back a process's SM utilization is read (nvmlDeviceGetProcessUtilization's
# timestamp): a few of NVML's sampling periods, as long as the monitor's own 5 s tick.
DEFAULT_UTILIZATION_WINDOW_S = 5.0
# Pods one card may hold at once, as HAMi's device plugin splits a card (deviceSplitCount);
# the node's split count replaces it (agent.registration).
DEFAULT_SPLIT_COUNT = 10


class PciInfo(Protocol):
    @property
    def busId(self) -> bytes | str: ...


class MemoryInfo(Protocol):
    @property
    def total(self) -> int: ...

    @property
    def used(self) -> int: ...


class Utilization(Protocol):
    """``nvmlDeviceGetUtilizationRates``: percent of the last sample period."""

    @property
    def gpu(self) -> int: ...

    @property
    def memory(self) -> int: ...


class ProcessInfo(Protocol):
    @property
    def pid(self) -> int: ...

    @property
    def usedGpuMemory(self) -> int | None: ...


class ProcessUtilizationSample(Protocol):
    """One sample of ``nvmlDeviceGetProcessUtilization``; ``timeStamp`` in microseconds."""

    @property
    def pid(self) -> int: ...

    @property
    def timeStamp(self) -> int: ...

    @property
    def smUtil(self) -> int: ...


class DeviceAttributes(Protocol):
    @property
    def multiprocessorCount(self) -> int: ...


class EventData(Protocol):
    @property
    def device(self) -> object: ...

    @property
    def eventType(self) -> int: ...

    @property
    def eventData(self) -> int: ...


class NvmlLibrary(Protocol):
    """The part of ``pynvml`` the agent uses. Handles and event sets are opaque."""

    NVMLError: type[Exception]
    NVML_NVLINK_MAX_LINKS: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object: ...
    def nvmlDeviceGetUUID(self, handle: object) -> str: ...
    def nvmlDeviceGetName(self, handle: object) -> str: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object) -> MemoryInfo: ...
    def nvmlDeviceGetPciInfo(self, handle: object) -> PciInfo: ...
    def nvmlDeviceGetNumaNodeId(self, handle: object) -> int: ...
    def nvmlDeviceGetAttributes(self, handle: object) -> DeviceAttributes: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> Sequence[ProcessInfo]: ...
    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Utilization: ...
    def nvmlDeviceGetProcessUtilization(self, handle: object, time_stamp: int,
                                        ) -> Sequence[ProcessUtilizationSample]: ...
    def nvmlDeviceGetNvLinkState(self, handle: object, link: int) -> int: ...
    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: object, link: int) -> PciInfo: ...
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: object, link: int) -> int: ...
    def nvmlEventSetCreate(self) -> object: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: object) -> int: ...
    def nvmlDeviceRegisterEvents(self, handle: object, event_types: int,
                                 event_set: object) -> None: ...
    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> EventData: ...
    def nvmlEventSetFree(self, event_set: object) -> None: ...


def _pynvml() -> NvmlLibrary:
    import pynvml  # noqa: PLC0415 - only the NVML source needs it

    return cast(NvmlLibrary, pynvml)


def _code(error: Exception) -> int | None:
    """NVML's return code carried by a pynvml error."""
    value = getattr(error, "value", None)
    return value if isinstance(value, int) else None


def sysfs_bus_id(raw: bytes | str) -> str:
    """NVML's bus id (``00000000:3B:00.0``) as sysfs names the device (``0000:3b:00.0``)."""
    text = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw).strip("\x00 ").lower()
    domain, separator, rest = text.partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}" if separator else text
    except ValueError:
        return text


class RemoteKind(enum.Enum):
    GPU = "gpu"
    SWITCH = "switch"
    OTHER = "other"
    """An IBM NPU (a POWER CPU's NVLink port): no GPU peer."""
    UNKNOWN = "unknown"
    """The driver cannot say: the bus id decides."""


@dataclass(frozen=True)
class RemoteEnd:
    """The far end of one active NVLink of a card."""

    kind: RemoteKind
    bus_id: str | None = None


def resolve_links(ends: Mapping[str, Sequence[RemoteEnd] | None],
                  card_of_bus: Mapping[str, str]) -> dict[str, dict[str, int] | None]:
    """Each card's NVLink peers ``{peer_uuid: lanes}`` from the far ends of its active links.

    ``ends`` maps a card's UUID to its links' far ends, None when they could not
    be read (the card's topology is then unknown). A far end that is an
    NVSwitch, or whose bus id is no card's, is a switch port: all cards with a
    switch port reach each other, weighted by the fewer switch lanes of the two.
    """
    direct: dict[str, Counter[str]] = {}
    switch_lanes: dict[str, int] = {}
    for uuid, card_ends in ends.items():
        if card_ends is None:
            continue
        peers: Counter[str] = Counter()
        for end in card_ends:
            peer = card_of_bus.get(end.bus_id) if end.bus_id is not None else None
            if end.kind is RemoteKind.SWITCH or (end.kind is RemoteKind.UNKNOWN and peer is None):
                switch_lanes[uuid] = switch_lanes.get(uuid, 0) + 1
            elif end.kind is not RemoteKind.OTHER and peer is not None and peer != uuid:
                peers[peer] += 1
        direct[uuid] = peers
    links: dict[str, dict[str, int] | None] = {
        uuid: None for uuid, card_ends in ends.items() if card_ends is None}
    for uuid, peers in direct.items():
        lanes = dict(peers)
        if uuid in switch_lanes:
            for other, other_lanes in switch_lanes.items():
                if other != uuid:
                    lanes[other] = lanes.get(other, 0) + min(switch_lanes[uuid], other_lanes)
        links[uuid] = dict(sorted(lanes.items()))
    return links


@dataclass(frozen=True)
class _Identity:
    handle: object
    index: int
    uuid: str
    name: str
    """NVML's name (the monitor's, MIG's); ``model`` is the type HAMi registers for it."""
    model: str
    memory: int
    bus_id: str
    numa: int
    sm_count: int | None


class CardReadError(AgentError, ExternalFailure):
    """One NVML call about one card failed; the text names the call and NVML's error."""


class ProbeFailed(CardReadError):
    """A monitor's NVML call about one card failed: the card is left out of that answer."""

    def __init__(self, call: str, error: Exception) -> None:
        super().__init__(f"{call}: {error}")
        self.call = call


T = TypeVar("T")


class NvmlSource:
    """An ``InventorySource`` reading the node's cards through NVML, and the node monitor's
    ``HostProbe``.

    The inventory's ``read`` and the probe's calls may run at once on two threads (NVML
    itself is thread-safe): the cards identified so far are shared under a lock held only
    to identify new cards and to copy the list, never around the probe's NVML calls.

    ``proc_root`` is where a process's pod is read (``<proc_root>/<pid>/cgroup``, the host's
    /proc: the agent shares the host's pid namespace), for each card's tenants seen. None
    attributes nothing: each process NVML lists is a tenant of its own, the conservative
    figure (a pod running four processes fills four slots).
    """

    def __init__(self, library: NvmlLibrary | None = None,
                 sysfs_root: Path = DEFAULT_SYSFS_ROOT,
                 event_wait_ms: int = DEFAULT_EVENT_WAIT_MS, *,
                 proc_root: Path | None = None,
                 utilization_window_s: float = DEFAULT_UTILIZATION_WINDOW_S,
                 wall_clock: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._nvml = library if library is not None else _pynvml()
        self._sysfs_root = sysfs_root
        self._event_wait_ms = event_wait_ms
        self._proc_root = proc_root
        self._utilization_window_s = utilization_window_s
        self._wall_clock = wall_clock
        self._handles: list[object] = []
        self._identities: dict[int, _Identity] = {}
        self._links: dict[str, dict[str, int] | None] = {}
        self._identities_lock = threading.Lock()
        self._probe_failures: Counter[str] = Counter()
        self._probe_lock = threading.Lock()
        self._probe_log = RateLimitedLog(clock, logger)
        self._unidentified_logged: set[int] = set()
        self._xid_faults: dict[str, int] = {}
        self._unattributed_xid: int | None = None
        self._faults_lock = threading.Lock()
        self._stopping = threading.Event()
        self._event_set: object | None = None
        self._watcher: threading.Thread | None = None

    def open(self) -> None:
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            raise InventoryError(f"NVML could not start: {error}") from None
        try:
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(index)
                             for index in range(nvml.nvmlDeviceGetCount())]
        except nvml.NVMLError as error:
            nvml.nvmlShutdown()
            raise InventoryError(f"NVML could not list the cards: {error}") from None
        self._identify_new()
        self._watch_xids()

    def close(self) -> None:
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None
        nvml = self._nvml
        try:
            if self._event_set is not None:
                nvml.nvmlEventSetFree(self._event_set)
                self._event_set = None
            nvml.nvmlShutdown()
        except nvml.NVMLError as error:
            logger.warning("NVML did not shut down cleanly: %s", error)

    def read(self) -> list[ReportedCard]:
        """Every identified card now; each card's ``processes`` is its tenants seen
        (``agent.monitor.processes.tenants_seen``: a pod once, a process no pod owns once),
        its processes' pods read from ``proc_root``."""
        with self._identities_lock:
            self._identify_new()
            identities = [identity for _, identity in sorted(self._identities.items())]
            links = dict(self._links)
        running = [self._running(identity) for identity in identities]
        tenants = tenants_seen([(identity.uuid, process.pid)
                                for identity, (processes, _) in zip(identities, running,
                                                                    strict=True)
                                for process in processes], self._proc_root)
        return [self._card(identity, links.get(identity.uuid), processes, problem,
                           tenants.get(identity.uuid, 0))
                for identity, (processes, problem) in zip(identities, running, strict=True)]

    def host_cards(self) -> list[HostCard]:
        """Each identified card's memory used and utilization now (``HostProbe``).

        NVML's NOT_SUPPORTED leaves a figure None (HAMi then writes no sample); any other
        failure leaves the card out of this answer, counted and logged at a bounded rate.
        """
        cards = []
        for identity in self._identified():
            try:
                cards.append(self._host_card(identity))
            except ProbeFailed as error:
                self._probe_failed(identity, error)
        return cards

    def gpu_processes(self) -> list[GpuProcess]:
        """Every compute process on every identified card, with its memory and its SM
        utilization over the last ``utilization_window_s`` (``HostProbe``).

        A card whose driver cannot list processes (NOT_SUPPORTED) has none; one with no
        utilization samples (NOT_SUPPORTED, NOT_FOUND) gives its processes 0 %; any other
        failure leaves the card's processes out, counted and logged at a bounded rate.
        """
        # NVML's timestamps are microseconds of the wall clock: samples newer than this.
        since = max(0, int((self._wall_clock() - self._utilization_window_s) * 1_000_000))
        processes = []
        for identity in self._identified():
            try:
                processes.extend(self._gpu_processes(identity, since))
            except ProbeFailed as error:
                self._probe_failed(identity, error)
        return processes

    def probe_failures(self) -> dict[str, int]:
        """How many times each NVML call left a card out of the probe's answers, by call."""
        with self._probe_lock:
            return dict(self._probe_failures)

    def _identified(self) -> list[_Identity]:
        with self._identities_lock:
            return [identity for _, identity in sorted(self._identities.items())]

    def _probe(self, call: str, function: Callable[[], T],
               absent: frozenset[int] = frozenset({NVML_ERROR_NOT_SUPPORTED})) -> T | None:
        """``function``'s answer; None where NVML answers one of the ``absent`` codes (it has
        no figure); ``ProbeFailed`` for any other NVML error."""
        try:
            return function()
        except self._nvml.NVMLError as error:
            if _code(error) in absent:
                return None
            raise ProbeFailed(call, error) from None

    def _host_card(self, identity: _Identity) -> HostCard:
        nvml = self._nvml
        handle = identity.handle
        memory = self._probe("nvmlDeviceGetMemoryInfo",
                             lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        rates = self._probe("nvmlDeviceGetUtilizationRates",
                            lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        return HostCard(index=identity.index, uuid=identity.uuid, name=identity.name,
                        memory_used=None if memory is None else memory.used,
                        utilization=None if rates is None else rates.gpu,
                        memory_utilization=None if rates is None else rates.memory)

    def _gpu_processes(self, identity: _Identity, since: int) -> list[GpuProcess]:
        nvml = self._nvml
        handle = identity.handle
        running = self._probe("nvmlDeviceGetComputeRunningProcesses",
                              lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        if not running:
            return []
        # NOT_FOUND: no sample since ``since``. pynvml raises its error with code 0 (success)
        # when the driver answers with no samples at all: no sample either.
        samples = self._probe(
            "nvmlDeviceGetProcessUtilization",
            lambda: nvml.nvmlDeviceGetProcessUtilization(handle, since),
            absent=frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND, NVML_SUCCESS}))
        # A process may have several samples in the window: its latest one counts.
        latest: dict[int, ProcessUtilizationSample] = {}
        for sample in samples or ():
            known = latest.get(sample.pid)
            if known is None or sample.timeStamp > known.timeStamp:
                latest[sample.pid] = sample
        return [GpuProcess(pid=process.pid, device_uuid=identity.uuid,
                           memory_used=process.usedGpuMemory or 0,
                           utilization=latest[process.pid].smUtil
                           if process.pid in latest else 0)
                for process in running]

    def _probe_failed(self, identity: _Identity, error: ProbeFailed) -> None:
        with self._probe_lock:
            self._probe_failures[error.call] += 1
        self._probe_log.warning(f"{error.call} {identity.uuid}",
                                "card %d (%s) left out of the monitor's reading: %s",
                                identity.index, identity.uuid, error)

    def _identify_new(self) -> None:
        """Identify the cards not identified yet; their arrival changes everyone's links."""
        found = False
        for index, handle in enumerate(self._handles):
            if index in self._identities:
                continue
            try:
                self._identities[index] = self._identify(index, handle)
                found = True
            except CardReadError as error:
                # Without its identity a card cannot be named, so it is left out until it reads.
                if index not in self._unidentified_logged:
                    logger.error("card %d left out: %s", index, error)
                    self._unidentified_logged.add(index)
        if found:
            self._links = self._read_links()

    def _call(self, function: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except self._nvml.NVMLError as error:
            raise CardReadError(f"{function}: {error}") from None

    def _identify(self, index: int, handle: object) -> _Identity:
        nvml = self._nvml
        uuid = self._call("nvmlDeviceGetUUID", lambda: nvml.nvmlDeviceGetUUID(handle))
        name = self._call("nvmlDeviceGetName", lambda: nvml.nvmlDeviceGetName(handle))
        memory = self._memory(handle)
        pci = self._call("nvmlDeviceGetPciInfo", lambda: nvml.nvmlDeviceGetPciInfo(handle))
        bus_id = sysfs_bus_id(pci.busId)
        return _Identity(handle=handle, index=index, uuid=uuid, name=name,
                         model=NVIDIA.card_type(name), memory=memory, bus_id=bus_id,
                         numa=self._numa(handle, bus_id), sm_count=self._sm_count(handle))

    def _memory(self, handle: object) -> int:
        """The card's MiB; 0 where NVML has no figure (NOT_SUPPORTED, as on unified-memory
        cards like the GB10): HAMi's ``preConfiguredDeviceMemory`` then gives it."""
        nvml = self._nvml
        try:
            return nvml.nvmlDeviceGetMemoryInfo(handle).total // MIB
        except nvml.NVMLError as error:
            if _code(error) == NVML_ERROR_NOT_SUPPORTED:
                return 0
            raise CardReadError(f"nvmlDeviceGetMemoryInfo: {error}") from None

    def _numa(self, handle: object, bus_id: str) -> int:
        """NVML's NUMA id where the driver has it, else the PCI device's in sysfs; else 0
        on a host of one NUMA node (a virtual machine's PCI devices often carry -1 there,
        where ``nvidia-smi topo -m`` and HAMi both say 0: seen on an H200 by the GPU
        check); else -1, unknown."""
        nvml = self._nvml
        try:
            numa = nvml.nvmlDeviceGetNumaNodeId(handle)
        except (nvml.NVMLError, AttributeError):  # AttributeError: a pynvml without the call
            numa = -1
        if numa >= 0:
            return numa
        path = self._sysfs_root / "bus" / "pci" / "devices" / bus_id / "numa_node"
        try:
            numa = max(-1, int(path.read_text().strip()))
        except (OSError, ValueError):
            numa = -1
        if numa < 0 and self._numa_nodes() == 1:
            return 0
        return numa

    def _numa_nodes(self) -> int:
        """How many NUMA nodes the host has (``<sysfs>/devices/system/node/node<N>``); 0
        when sysfs does not say."""
        try:
            return sum(1 for entry in (self._sysfs_root / "devices" / "system" / "node").iterdir()
                       if entry.name.startswith("node") and entry.name[4:].isdigit())
        except OSError:
            return 0

    def _sm_count(self, handle: object) -> int | None:
        nvml = self._nvml
        try:
            return nvml.nvmlDeviceGetAttributes(handle).multiprocessorCount
        except (nvml.NVMLError, AttributeError):  # some drivers answer only for MIG devices
            return None

    def _read_links(self) -> dict[str, dict[str, int] | None]:
        identities = list(self._identities.values())
        card_of_bus = {identity.bus_id: identity.uuid for identity in identities}
        return resolve_links({identity.uuid: self._remote_ends(identity)
                              for identity in identities}, card_of_bus)

    def _remote_ends(self, identity: _Identity) -> list[RemoteEnd] | None:
        nvml = self._nvml
        ends = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                if nvml.nvmlDeviceGetNvLinkState(identity.handle, link) != NVML_FEATURE_ENABLED:
                    continue
                kind = self._remote_kind(identity.handle, link)
                bus_id = None
                if kind in (RemoteKind.GPU, RemoteKind.UNKNOWN):
                    remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(identity.handle, link)
                    bus_id = sysfs_bus_id(remote.busId)
            except nvml.NVMLError as error:
                # A card without NVLink, or with fewer links than the library's maximum.
                if _code(error) in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT):
                    continue
                logger.warning("card %d: NVLink %d unreadable, topology unknown: %s",
                               identity.index, link, error)
                return None
            ends.append(RemoteEnd(kind, bus_id))
        return ends

    def _remote_kind(self, handle: object, link: int) -> RemoteKind:
        nvml = self._nvml
        try:
            kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except (nvml.NVMLError, AttributeError):  # older drivers and pynvml lack the call
            return RemoteKind.UNKNOWN
        if kind == NVML_NVLINK_DEVICE_TYPE_GPU:
            return RemoteKind.GPU
        if kind == NVML_NVLINK_DEVICE_TYPE_SWITCH:
            return RemoteKind.SWITCH
        if kind == NVML_NVLINK_DEVICE_TYPE_IBMNPU:
            return RemoteKind.OTHER
        return RemoteKind.UNKNOWN

    def _running(self, identity: _Identity) -> tuple[Sequence[ProcessInfo], str | None]:
        """The card's compute processes, and the problem the call met (the health probe)."""
        nvml = self._nvml
        try:
            return nvml.nvmlDeviceGetComputeRunningProcesses(identity.handle), None
        except nvml.NVMLError as error:
            # A driver that cannot list processes (some virtualized cards) is no fault of the card.
            if _code(error) == NVML_ERROR_NOT_SUPPORTED:
                return (), None
            return (), f"nvmlDeviceGetComputeRunningProcesses: {error}"

    def _card(self, identity: _Identity, links: dict[str, int] | None,
              running: Sequence[ProcessInfo], problem: str | None, tenants: int,
              ) -> ReportedCard:
        problems = [] if problem is None else [problem]
        process_memory = sum(process.usedGpuMemory or 0 for process in running) // MIB
        with self._faults_lock:
            xid = self._xid_faults.get(identity.uuid, self._unattributed_xid)
        if xid is not None:
            problems.append(f"critical XID {xid}")
        return ReportedCard(uuid=identity.uuid, index=identity.index, type=identity.model,
                            memory=identity.memory, count=DEFAULT_SPLIT_COUNT, numa=identity.numa,
                            health=not problems, links=links,
                            processes=tenants, sm_count=identity.sm_count,
                            process_memory=process_memory, health_detail="; ".join(problems))

    def _watch_xids(self) -> None:
        """Register every card for critical XID events and start the watcher thread."""
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as error:
            logger.warning("XID events unavailable, health comes from reads only: %s", error)
            return
        registered = 0
        xid = NVML_EVENT_TYPE_XID_CRITICAL_ERROR
        for index, handle in enumerate(self._handles):
            try:
                if nvml.nvmlDeviceGetSupportedEventTypes(handle) & xid:
                    nvml.nvmlDeviceRegisterEvents(handle, xid, event_set)
                    registered += 1
            except nvml.NVMLError as error:
                logger.warning("card %d: XID events unavailable: %s", index, error)
        if not registered:
            nvml.nvmlEventSetFree(event_set)
            return
        self._event_set = event_set
        self._watcher = threading.Thread(target=self._wait_for_events, args=(event_set,),
                                         name="nvml-xid-events", daemon=True)
        self._watcher.start()

    def _wait_for_events(self, event_set: object) -> None:
        nvml = self._nvml
        while not self._stopping.is_set():
            try:
                event = nvml.nvmlEventSetWait(event_set, self._event_wait_ms)
            except nvml.NVMLError as error:
                if _code(error) != NVML_ERROR_TIMEOUT:
                    logger.warning("waiting for XID events failed: %s", error)
                    self._stopping.wait(1.0)
                continue
            self._record(event)

    def _record(self, event: EventData) -> None:
        if not event.eventType & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
            return
        xid = event.eventData
        nvml = self._nvml
        try:
            uuid: str | None = nvml.nvmlDeviceGetUUID(event.device)
        except nvml.NVMLError:
            uuid = None  # the event does not say which card: every card is suspect
        where = uuid or "an unidentified card"
        if xid in APPLICATION_XIDS:
            logger.info("XID %d (an application error) on %s: the card stays healthy", xid, where)
            return
        logger.error("critical XID %d on %s: reported unhealthy", xid, where)
        with self._faults_lock:
            if uuid is None:
                self._unattributed_xid = xid
            else:
                self._xid_faults[uuid] = xid
