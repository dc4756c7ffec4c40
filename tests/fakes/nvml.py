# ruff: noqa: N802 - the stand-in answers to NVML's own function names
"""The NVML the tests run ``agent.vendors.nvidia.nvml`` against (there is no GPU in the
tests).

There is one in-memory NVML: the product's ``agent.mig.simulated.SimulatedMigLibrary``
(the simulated inventory's MIG cards run on it). ``NvmlStandIn`` is that library with
the calls the inventory and the host probe make answered too, from ``StandInCard``
records, so the tests' NVML keeps its rules: ``nvmlInit`` first, one lock, handles it
made itself, ``fail_next``, and MIG on a card whose model has MIG tables.

It raises ``pynvml``'s own errors, so everything from the library call up is the
production code path. Cards can fail a call ("GPU is lost"), not support one, and raise
Xid events.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

from agent.mig.simulated import SimulatedDevice, SimulatedMigLibrary, nvml_call
from agent.mig.tables import MigCardTable, table_for

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

    def mig_table(self) -> MigCardTable:
        """NVML's MIG tables of the card's model; a model without MIG has none."""
        return table_for(self.name) or MigCardTable(self.name, self.memory_bytes // MIB, ())


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class NvmlStandIn(SimulatedMigLibrary):
    """The simulated NVML answering the calls the agent's inventory makes as well, from
    ``StandInCard`` records (the cards start out of MIG mode)."""

    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, cards: Sequence[StandInCard], *, remote_type_known: bool = True,
                 init_error: int | None = None) -> None:
        super().__init__([card.mig_table() for card in cards], [card.uuid for card in cards],
                         mig_enabled=False)
        self.cards = list(cards)
        self.remote_type_known = remote_type_known
        self.init_error = init_error
        self.events: queue.Queue[SimpleNamespace] = queue.Queue()
        self.registered: list[str] = []
        self.utilization_since: list[int] = []  # nvmlDeviceGetProcessUtilization's timestamps
        self.freed = False
        self.shut_down = False

    def handle_of(self, card: StandInCard) -> SimulatedDevice:
        """The handle NVML gives for ``card``."""
        return SimulatedDevice(self.cards.index(card))

    def raise_xid(self, card: StandInCard | None, xid: int) -> None:
        """An Xid critical error on ``card`` (None: one NVML attributes to no device)."""
        device = None if card is None else self.handle_of(card)
        self.events.put(SimpleNamespace(device=device,
                                        eventType=pynvml.nvmlEventTypeXidCriticalError,
                                        eventData=xid, gpuInstanceId=0, computeInstanceId=0))

    def _card(self, handle: object, call: str) -> StandInCard:
        card = self.cards[self._gpu(handle).index]
        if call in card.failing:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if call in card.unsupported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return card

    # NVML: the calls the simulated library answers, read from the card.

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise _error(self.init_error)
        super().nvmlInit()

    def nvmlShutdown(self) -> None:
        super().nvmlShutdown()
        self.shut_down = True

    @nvml_call()
    def nvmlDeviceGetUUID(self, handle: object) -> str:
        return self._card(handle, "nvmlDeviceGetUUID").uuid

    @nvml_call()
    def nvmlDeviceGetName(self, handle: object) -> str:
        return self._card(handle, "nvmlDeviceGetName").name

    @nvml_call()
    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[Any]:
        # The card's processes, with the bytes they hold (the simulated MIG cards' hold none).
        card = self._card(handle, "nvmlDeviceGetComputeRunningProcesses")
        if card.processes is not None:
            return [SimpleNamespace(pid=process.pid, usedGpuMemory=process.used)
                    for process in card.processes]
        return [SimpleNamespace(pid=1000 + n, usedGpuMemory=used)
                for n, used in enumerate(card.process_memory)]

    # NVML: the inventory's and the host probe's calls.

    @nvml_call()
    def nvmlDeviceGetMemoryInfo(self, handle: object) -> SimpleNamespace:
        card = self._card(handle, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=card.memory_bytes,
                               free=card.memory_bytes - card.memory_used_bytes,
                               used=card.memory_used_bytes)

    @nvml_call()
    def nvmlDeviceGetUtilizationRates(self, handle: object) -> SimpleNamespace:
        gpu, memory = self._card(handle, "nvmlDeviceGetUtilizationRates").utilization
        return SimpleNamespace(gpu=gpu, memory=memory)

    @nvml_call()
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

    @nvml_call()
    def nvmlDeviceGetPciInfo(self, handle: object) -> SimpleNamespace:
        return SimpleNamespace(busId=self._card(handle, "nvmlDeviceGetPciInfo").bus_id.encode())

    @nvml_call()
    def nvmlDeviceGetNumaNodeId(self, handle: object) -> int:
        card = self._card(handle, "nvmlDeviceGetNumaNodeId")
        if card.numa is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return card.numa

    @nvml_call()
    def nvmlDeviceGetAttributes(self, handle: object) -> SimpleNamespace:
        card = self._card(handle, "nvmlDeviceGetAttributes")
        if card.sm_count is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(multiprocessorCount=card.sm_count)

    def _link(self, handle: object, link: int, call: str) -> Link:
        card = self._card(handle, call)
        if card.links is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(card.links):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return card.links[link]

    @nvml_call()
    def nvmlDeviceGetNvLinkState(self, handle: object, link: int) -> int:
        return 1 if self._link(handle, link, "nvmlDeviceGetNvLinkState").active else 0

    @nvml_call()
    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: object, link: int) -> SimpleNamespace:
        remote = self._link(handle, link, "nvmlDeviceGetNvLinkRemotePciInfo").remote_bus_id
        return SimpleNamespace(busId=remote.encode())

    @nvml_call()
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: object, link: int) -> int:
        if not self.remote_type_known:
            raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self._link(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType").remote_type

    @nvml_call()
    def nvmlEventSetCreate(self) -> object:
        return self.events

    @nvml_call()
    def nvmlDeviceGetSupportedEventTypes(self, handle: object) -> int:
        self._card(handle, "nvmlDeviceGetSupportedEventTypes")
        return int(pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeSingleBitEccError)

    @nvml_call()
    def nvmlDeviceRegisterEvents(self, handle: object, event_types: int,
                                 event_set: object) -> None:
        assert event_set is self.events
        assert event_types == pynvml.nvmlEventTypeXidCriticalError
        self.registered.append(self._card(handle, "nvmlDeviceRegisterEvents").uuid)

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        # Not under the library's lock: it blocks for up to timeout_ms, as NVML's does,
        # while the agent's other threads go on calling.
        assert event_set is self.events
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise _error(pynvml.NVML_ERROR_TIMEOUT) from None

    @nvml_call()
    def nvmlEventSetFree(self, event_set: object) -> None:
        self.freed = True
