# ruff: noqa: N802 - the stand-in answers to NVML's own function names
"""A stand-in for the NVML library (there is no GPU in the tests), for
``agent.vendors.nvidia.nvml``.

``NvmlStandIn`` answers the same calls as ``pynvml`` from ``StandInCard`` records and
raises ``pynvml``'s own errors, so everything from the library call up is the production
code path. Cards can fail a call ("GPU is lost"), not support one, and raise Xid events.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

MIB = 1024 * 1024
# What NVML says is at the far end of an NVLink: a GPU, an IBM NPU, an NVSwitch.
GPU, IBMNPU, SWITCH = 0, 1, 2


@dataclass(frozen=True)
class Link:
    """One NVLink of a card: the bus id at its far end, what is there, whether it is up."""

    remote_bus_id: str
    remote_type: int = GPU
    active: bool = True


@dataclass(frozen=True)
class StandInProcess:
    """One compute process on a card: its host pid and the bytes it holds (None: NVML has
    no figure)."""

    pid: int
    used: int | None


@dataclass(frozen=True)
class StandInSample:
    """One process utilization sample (``timestamp`` in microseconds, NVML's)."""

    pid: int
    sm: int
    timestamp: int


@dataclass
class StandInCard:
    """One card of the stand-in: what NVML reports of it, and the calls it fails."""

    uuid: str
    bus_id: str
    name: str = "Tesla T4"
    memory_bytes: int = 15360 * MIB
    numa: int | None = None  # None: the driver has no NUMA id for it
    sm_count: int | None = 40
    links: list[Link] | None = None  # None: the card has no NVLink at all
    process_memory: list[int | None] = field(default_factory=list)  # bytes per process
    # Processes with their pids (replacing ``process_memory``'s pids 1000, 1001... when given).
    processes: list[StandInProcess] | None = None
    memory_used_bytes: int = 0
    utilization: tuple[int, int] = (0, 0)  # utilization.gpu, utilization.memory
    # nvmlDeviceGetProcessUtilization's samples; None: NVML answers NOT_FOUND (none).
    samples: list[StandInSample] | None = None
    failing: set[str] = field(default_factory=set)  # calls that fail with "GPU is lost"
    unsupported: set[str] = field(default_factory=set)  # calls the driver does not support


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class NvmlStandIn:
    """Answers the NVML calls the agent makes, from ``StandInCard`` records."""

    NVMLError = pynvml.NVMLError
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, cards: list[StandInCard], *, remote_type_known: bool = True,
                 init_error: int | None = None) -> None:
        self.cards = cards
        self.remote_type_known = remote_type_known
        self.init_error = init_error
        self.events: queue.Queue[SimpleNamespace] = queue.Queue()
        self.registered: list[str] = []
        self.utilization_since: list[int] = []  # nvmlDeviceGetProcessUtilization's timestamps
        self.freed = False
        self.shut_down = False

    def _card(self, handle: object, call: str) -> StandInCard:
        if not isinstance(handle, StandInCard):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if call in handle.failing:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if call in handle.unsupported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return handle

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise _error(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> StandInCard:
        return self.cards[index]

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        return self._card(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: object) -> str:
        return self._card(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> SimpleNamespace:
        card = self._card(handle, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=card.memory_bytes,
                               free=card.memory_bytes - card.memory_used_bytes,
                               used=card.memory_used_bytes)

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> SimpleNamespace:
        gpu, memory = self._card(handle, "nvmlDeviceGetUtilizationRates").utilization
        return SimpleNamespace(gpu=gpu, memory=memory)

    def nvmlDeviceGetProcessUtilization(self, handle: object, time_stamp: int,
                                        ) -> list[SimpleNamespace]:
        card = self._card(handle, "nvmlDeviceGetProcessUtilization")
        self.utilization_since.append(time_stamp)
        if card.samples is None:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        if not card.samples:
            # pynvml raises its error with NVML_SUCCESS when the driver counts no sample.
            raise _error(pynvml.NVML_SUCCESS)
        fresh = [SimpleNamespace(pid=sample.pid, timeStamp=sample.timestamp, smUtil=sample.sm,
                                 memUtil=0, encUtil=0, decUtil=0)
                 for sample in card.samples if sample.timestamp > time_stamp]
        if not fresh:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return fresh

    def nvmlDeviceGetPciInfo(self, handle: object) -> SimpleNamespace:
        return SimpleNamespace(busId=self._card(handle, "nvmlDeviceGetPciInfo").bus_id.encode())

    def nvmlDeviceGetNumaNodeId(self, handle: object) -> int:
        card = self._card(handle, "nvmlDeviceGetNumaNodeId")
        if card.numa is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return card.numa

    def nvmlDeviceGetAttributes(self, handle: object) -> SimpleNamespace:
        card = self._card(handle, "nvmlDeviceGetAttributes")
        if card.sm_count is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(multiprocessorCount=card.sm_count)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[SimpleNamespace]:
        card = self._card(handle, "nvmlDeviceGetComputeRunningProcesses")
        if card.processes is not None:
            return [SimpleNamespace(pid=process.pid, usedGpuMemory=process.used)
                    for process in card.processes]
        return [SimpleNamespace(pid=1000 + n, usedGpuMemory=used)
                for n, used in enumerate(card.process_memory)]

    def _link(self, handle: object, link: int, call: str) -> Link:
        card = self._card(handle, call)
        if card.links is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(card.links):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return card.links[link]

    def nvmlDeviceGetNvLinkState(self, handle: object, link: int) -> int:
        return 1 if self._link(handle, link, "nvmlDeviceGetNvLinkState").active else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: object, link: int) -> SimpleNamespace:
        remote = self._link(handle, link, "nvmlDeviceGetNvLinkRemotePciInfo").remote_bus_id
        return SimpleNamespace(busId=remote.encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: object, link: int) -> int:
        if not self.remote_type_known:
            raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self._link(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType").remote_type

    def nvmlEventSetCreate(self) -> object:
        return self.events

    def nvmlDeviceGetSupportedEventTypes(self, handle: object) -> int:
        self._card(handle, "nvmlDeviceGetSupportedEventTypes")
        return pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeSingleBitEccError

    def nvmlDeviceRegisterEvents(self, handle: object, event_types: int,
                                 event_set: object) -> None:
        assert event_set is self.events
        assert event_types == pynvml.nvmlEventTypeXidCriticalError
        self.registered.append(self._card(handle, "nvmlDeviceRegisterEvents").uuid)

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        assert event_set is self.events
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise _error(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, event_set: object) -> None:
        self.freed = True

    def raise_xid(self, device: object, xid: int) -> None:
        self.events.put(SimpleNamespace(device=device,
                                        eventType=pynvml.nvmlEventTypeXidCriticalError,
                                        eventData=xid, gpuInstanceId=0, computeInstanceId=0))
