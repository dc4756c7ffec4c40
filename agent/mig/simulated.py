# ruff: noqa: N802, N815 - NVML's own function and field names, kept so NvmlMigDevices runs unchanged
"""An in-memory NVML for MIG: the pynvml calls ``agent.mig.nvml.NvmlMigDevices`` makes,
answered from NVML's tables (``agent.mig.tables``) with NVML's rules enforced.

It serves the simulated inventory (a node of MIG cards with no GPU) and the tests, so it
refuses what a driver refuses, with the return code the driver gives, rather than
accept what real hardware would not:

- instances are made only in MIG mode, and not while a mode change waits for a reset;
- a GPU instance only at one of its profile's placements, on memory slices no other
  instance holds, and no more of a profile than its instance count;
- a compute instance only within its GPU instance's slices;
- a GPU instance with compute instances, or an instance or a mode with processes running
  on it, is not destroyed or changed (IN_USE);
- the arrays the list calls fill must be ctypes arrays of pynvml's types, as large as
  NVML documents; counts and placements come by pointer, as the C library takes them.

GPU and compute instances are ctypes pointers of pynvml's handle types (so they fit the
arrays a caller allocates) whose addresses are tokens, never dereferenced, never reused:
a handle to a destroyed instance is refused, as NVML refuses a stale one. GPU and MIG
device handles are small dataclasses.

Tests inject failures (``fail_next``), processes (``set_processes``) and mode changes
(``set_pending_mode``, ``reset_gpu``). Every call holds one lock: the agent calls it from
worker threads.

It is the project's one in-memory NVML: the tests' stand-in for the whole inventory
(``tests.fakes.nvml.NvmlStandIn``) is this library with the inventory's calls added
(``nvml_call`` marks them).
"""

from __future__ import annotations

import ctypes
import functools
import threading
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

import pynvml

from agent.mig.nvml import CI_ENGINE_PROFILE_SHARED, CI_PROFILE_BY_SLICES, NVML_DEVICE_MIG_ENABLE
from agent.mig.tables import GpuInstanceProfileInfo, MigCardTable

NVML_SUCCESS = 0
NOT_ATTRIBUTED = 0xFFFFFFFF
"""A process's GPU/compute instance id when it runs on no instance (NVML's "not
available" unsigned value)."""
_MIG_UUID_NAMESPACE = uuid.UUID("5f0c1a8e-4d0e-4b59-9a57-2f4c6b1e7d21")
_CI_SLICES = {constant: slices for slices, constant in CI_PROFILE_BY_SLICES.items()}
_FIRST_TOKEN = 0x1000
_TOKEN_STRIDE = 0x40


def _error(code: int) -> Exception:
    error: Exception = pynvml.NVMLError(code)
    return error


@dataclass(frozen=True, slots=True)
class SimulatedDevice:
    """A GPU's handle (``nvmlDeviceGetHandleByIndex``)."""

    index: int


@dataclass(frozen=True, slots=True)
class SimulatedMigDevice:
    """A MIG device's handle (``nvmlDeviceGetMigDeviceHandleByIndex``): one compute
    instance."""

    gpu: int
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True, slots=True)
class PlacementRecord:
    """``nvmlGpuInstancePlacement_t``."""

    start: int
    size: int


@dataclass(frozen=True, slots=True)
class GpuInstanceProfileRecord:
    """``nvmlGpuInstanceProfileInfo_t``. The tables hold no engine counts: one copy engine
    per slice, no decoders or encoders (nothing here reads them)."""

    id: int
    isP2pSupported: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int
    copyEngineCount: int
    decoderCount: int
    encoderCount: int
    jpegCount: int
    ofaCount: int
    memorySizeMB: int


@dataclass(frozen=True, slots=True)
class GpuInstanceRecord:
    """``nvmlGpuInstanceInfo_t``."""

    device: SimulatedDevice
    id: int
    profileId: int
    placement: PlacementRecord


@dataclass(frozen=True, slots=True)
class ComputeInstanceProfileRecord:
    """``nvmlComputeInstanceProfileInfo_t``: a profile's id is its constant, as on the
    drivers."""

    id: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int


@dataclass(frozen=True, slots=True)
class ComputeInstanceRecord:
    """``nvmlComputeInstanceInfo_t`` (the fields NVML fills but a placement)."""

    device: SimulatedDevice
    gpuInstance: object
    id: int
    profileId: int


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """``nvmlProcessInfo_t``: a simulated process holds no memory."""

    pid: int
    usedGpuMemory: int
    gpuInstanceId: int
    computeInstanceId: int


@dataclass
class _ComputeInstance:
    id: int
    profile_id: int
    slices: int
    token: int
    serial: int
    """The GPU's creation count when it was made: a MIG device made again with the same
    ids is another device, with another UUID."""


@dataclass
class _GpuInstance:
    id: int
    profile: GpuInstanceProfileInfo
    start: int
    size: int
    token: int
    compute: dict[int, _ComputeInstance] = field(default_factory=dict)

    def overlaps(self, start: int, size: int) -> bool:
        return start < self.start + self.size and self.start < start + size


@dataclass
class _Gpu:
    index: int
    uuid: str
    table: MigCardTable
    current: bool
    pending: bool
    instances: dict[int, _GpuInstance] = field(default_factory=dict)
    compute_processes: dict[int | None, int] = field(default_factory=dict)
    """Process counts by the GPU instance they run on; None: on the GPU, no instance."""
    graphics_processes: dict[int | None, int] = field(default_factory=dict)
    created: int = 0

    def processes_on(self, gpu_instance_id: int | None) -> int:
        """Processes that pin an instance: its own, and any the GPU runs outside instances
        (nothing on the GPU is torn down under them)."""
        keys = {None, gpu_instance_id}
        return sum(count for processes in (self.compute_processes, self.graphics_processes)
                   for key, count in processes.items() if key in keys)

    def processes(self) -> int:
        return sum(self.compute_processes.values()) + sum(self.graphics_processes.values())


P = ParamSpec("P")
R = TypeVar("R")
Library = TypeVar("Library", bound="SimulatedMigLibrary")
NVML_CALLS: set[str] = set()
"""The pynvml functions the library answers: what ``fail_next`` may name."""


def nvml_call(needs_init: bool = True) -> Callable[
        [Callable[Concatenate[Library, P], R]], Callable[Concatenate[Library, P], R]]:
    """An NVML function: under the library's lock, refused before ``nvmlInit``
    (UNINITIALIZED, as NVML), and failing first where a test asked it to. A subclass
    answering more of NVML (the tests' stand-in) marks its calls with it too."""

    def decorate(function: Callable[Concatenate[Library, P], R]
                 ) -> Callable[Concatenate[Library, P], R]:
        name = function.__name__
        NVML_CALLS.add(name)

        @functools.wraps(function)
        def call(library: Library, /, *args: P.args, **kwargs: P.kwargs) -> R:
            with library._lock:
                library._enter(name, needs_init)
                return function(library, *args, **kwargs)

        return call

    return decorate


class SimulatedMigLibrary:
    """NVML's MIG calls over in-memory GPUs, one per ``MigCardTable``; see the module's
    docstring.

    ``needs_reset``: a MIG mode change waits for ``reset_gpu`` (pending), as on drivers
    that cannot reset the GPU themselves; otherwise it takes effect at once.
    """

    NVMLError = pynvml.NVMLError

    def __init__(self, tables: Sequence[MigCardTable], uuids: Sequence[str], *,
                 mig_enabled: bool = True, needs_reset: bool = False) -> None:
        if len(tables) != len(uuids):
            raise ValueError(f"{len(tables)} tables for {len(uuids)} GPU UUIDs")
        self._gpus = [_Gpu(index=index, uuid=gpu_uuid, table=table, current=mig_enabled,
                           pending=mig_enabled)
                      for index, (table, gpu_uuid) in enumerate(zip(tables, uuids, strict=True))]
        self._needs_reset = needs_reset
        self._lock = threading.RLock()
        self._initialized = 0
        self._failures: dict[str, deque[int]] = {}
        self._next_token = _FIRST_TOKEN
        self._gpu_instance_tokens: dict[int, tuple[int, int]] = {}
        self._compute_instance_tokens: dict[int, tuple[int, int, int]] = {}

    # Controls a test or the simulated inventory uses; not NVML's.

    def fail_next(self, call: str, code: int) -> None:
        """Make the next call of the pynvml function ``call`` raise NVML error ``code``
        before doing anything; several queue up in order."""
        if call not in NVML_CALLS:
            raise ValueError(f"{call} is none of the simulated NVML calls")
        with self._lock:
            self._failures.setdefault(call, deque()).append(code)

    def set_processes(self, gpu: int, count: int, *, gpu_instance_id: int | None = None,
                      graphics: bool = False) -> None:
        """``count`` compute (or graphics) processes running on the GPU, outside instances
        (None) or on one GPU instance, replacing the number set before."""
        with self._lock:
            state = self._gpus[gpu]
            if gpu_instance_id is not None and gpu_instance_id not in state.instances:
                raise ValueError(f"GPU {gpu} has no GPU instance {gpu_instance_id}")
            counts = state.graphics_processes if graphics else state.compute_processes
            counts[gpu_instance_id] = count

    def set_pending_mode(self, gpu: int, enabled: bool) -> None:
        """A MIG mode change that waits for a reset, as a driver leaves it."""
        with self._lock:
            self._gpus[gpu].pending = enabled

    def reset_gpu(self, gpu: int) -> None:
        """A GPU reset: the pending MIG mode takes effect. Refused (IN_USE) while processes
        run; a GPU leaving MIG mode loses its instances, as the hardware does."""
        with self._lock:
            state = self._gpus[gpu]
            if state.processes():
                raise _error(pynvml.NVML_ERROR_IN_USE)
            if state.current and not state.pending:
                self._drop_instances(state)
            state.current = state.pending

    # NVML.

    @nvml_call(needs_init=False)
    def nvmlInit(self) -> None:
        self._initialized += 1

    @nvml_call()
    def nvmlShutdown(self) -> None:
        self._initialized -= 1

    @nvml_call()
    def nvmlDeviceGetCount(self) -> int:
        return len(self._gpus)

    @nvml_call()
    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimulatedDevice:
        if not 0 <= index < len(self._gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return SimulatedDevice(index)

    @nvml_call()
    def nvmlDeviceGetUUID(self, device: object) -> str:
        if isinstance(device, SimulatedMigDevice):
            ci = self._mig_compute(device)
            return self._mig_uuid(self._gpus[device.gpu], device.gpu_instance_id, ci)
        return self._gpu(device).uuid

    @nvml_call()
    def nvmlDeviceGetName(self, device: object) -> str:
        return self._gpu(device).table.name

    @nvml_call()
    def nvmlDeviceGetMigMode(self, device: object) -> list[int]:
        state = self._gpu(device)
        return [int(state.current), int(state.pending)]

    @nvml_call()
    def nvmlDeviceSetMigMode(self, device: object, mode: int) -> int:
        """NVML_SUCCESS when the mode took effect, RESET_REQUIRED when it is pending."""
        state = self._gpu(device)
        if mode not in (0, NVML_DEVICE_MIG_ENABLE):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        enabled = mode == NVML_DEVICE_MIG_ENABLE
        if state.processes() or (not enabled and state.instances):
            raise _error(pynvml.NVML_ERROR_IN_USE)
        state.pending = enabled
        if self._needs_reset and state.current != enabled:
            return int(pynvml.NVML_ERROR_RESET_REQUIRED)
        state.current = enabled
        return NVML_SUCCESS

    @nvml_call()
    def nvmlDeviceGetComputeRunningProcesses(self, device: object) -> list[ProcessRecord]:
        state = self._gpu(device)
        return self._process_records(state, state.compute_processes, 1000)

    @nvml_call()
    def nvmlDeviceGetGraphicsRunningProcesses(self, device: object) -> list[ProcessRecord]:
        state = self._gpu(device)
        return self._process_records(state, state.graphics_processes, 5000)

    @nvml_call()
    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: object, profile: int,
                                            version: int = 2) -> GpuInstanceProfileRecord:
        """Answered in either MIG mode, as NVML does on a MIG-capable GPU."""
        state = self._gpu(device)
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT or version not in (1, 2):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        info = state.table.profile(profile)
        if info is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return GpuInstanceProfileRecord(
            id=info.id, isP2pSupported=0, sliceCount=info.slices,
            instanceCount=info.instances, multiprocessorCount=info.multiprocessors,
            copyEngineCount=info.slices, decoderCount=0, encoderCount=0, jpegCount=0,
            ofaCount=0, memorySizeMB=info.memory_mib)

    @nvml_call()
    def nvmlDeviceGetGpuInstancePossiblePlacements(self, device: object, profile_id: int,
                                                   placements_ref: object,
                                                   count_ref: object) -> int:
        """No array (None): the count only. An array must hold every placement."""
        state = self._mig_gpu(device)
        info = self._profile_by_id(state, profile_id)
        count = _uint_target(count_ref)
        if placements_ref is not None:
            placements = _array_of(placements_ref, pynvml.c_nvmlGpuInstancePlacement_t,
                                   len(info.placements))
            for index, (start, size) in enumerate(info.placements):
                placements[index].start = start
                placements[index].size = size
        count.value = len(info.placements)
        return NVML_SUCCESS

    @nvml_call()
    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device: object, profile_id: int,
                                                 placement_ref: object) -> Any:
        state = self._mig_gpu(device)
        if state.current != state.pending:
            raise _error(pynvml.NVML_ERROR_RESET_REQUIRED)
        info = self._profile_by_id(state, profile_id)
        placement = _referenced(placement_ref, pynvml.c_nvmlGpuInstancePlacement_t)
        start, size = int(placement.start), int(placement.size)
        if (start, size) not in info.placements:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        same_profile = sum(1 for gi in state.instances.values() if gi.profile.id == profile_id)
        if same_profile >= info.instances or any(
                gi.overlaps(start, size) for gi in state.instances.values()):
            raise _error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = _smallest_free(state.instances, 1)
        token = self._new_token()
        state.instances[gi_id] = _GpuInstance(gi_id, info, start, size, token)
        self._gpu_instance_tokens[token] = (state.index, gi_id)
        return ctypes.cast(token, pynvml.c_nvmlGpuInstance_t)

    @nvml_call()
    def nvmlDeviceGetGpuInstances(self, device: object, profile_id: int,
                                  gpu_instances_ref: object, count_ref: object) -> int:
        """The array must hold the profile's instance count, however many exist."""
        state = self._mig_gpu(device)
        info = self._profile_by_id(state, profile_id)
        count = _uint_target(count_ref)
        refs = _array_of(gpu_instances_ref, pynvml.c_nvmlGpuInstance_t, info.instances)
        listed = [gi for _, gi in sorted(state.instances.items()) if gi.profile.id == profile_id]
        for index, gi in enumerate(listed):
            refs[index] = ctypes.cast(gi.token, pynvml.c_nvmlGpuInstance_t)
        count.value = len(listed)
        return NVML_SUCCESS

    @nvml_call()
    def nvmlGpuInstanceGetInfo(self, gpu_instance: object) -> GpuInstanceRecord:
        state, gi = self._gpu_instance(gpu_instance)
        return GpuInstanceRecord(device=SimulatedDevice(state.index), id=gi.id,
                                 profileId=gi.profile.id,
                                 placement=PlacementRecord(gi.start, gi.size))

    @nvml_call()
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
            self, gpu_instance: object, profile: int, eng_profile: int, version: int = 2,
    ) -> ComputeInstanceProfileRecord:
        """A compute-instance profile fits a GPU instance when its slices do and the card
        has a GPU-instance profile of that many slices."""
        state, gi = self._gpu_instance(gpu_instance)
        if (not 0 <= profile < pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT
                or eng_profile != CI_ENGINE_PROFILE_SHARED or version not in (1, 2)):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        record = self._compute_profile(state, gi, profile)
        if record is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return record

    @nvml_call()
    def nvmlGpuInstanceCreateComputeInstance(self, gpu_instance: object, profile_id: int
                                             ) -> Any:
        state, gi = self._gpu_instance(gpu_instance)
        record = self._compute_profile(state, gi, profile_id)
        if record is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        used = sum(ci.slices for ci in gi.compute.values())
        same_profile = sum(1 for ci in gi.compute.values() if ci.profile_id == profile_id)
        if used + record.sliceCount > gi.profile.slices or same_profile >= record.instanceCount:
            raise _error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = _smallest_free(gi.compute, 0)
        token = self._new_token()
        state.created += 1
        gi.compute[ci_id] = _ComputeInstance(ci_id, profile_id, record.sliceCount, token,
                                             state.created)
        self._compute_instance_tokens[token] = (state.index, gi.id, ci_id)
        return ctypes.cast(token, pynvml.c_nvmlComputeInstance_t)

    @nvml_call()
    def nvmlGpuInstanceGetComputeInstances(self, gpu_instance: object, profile_id: int,
                                           compute_instances_ref: object,
                                           count_ref: object) -> int:
        """The array must hold the profile's instance count, however many exist."""
        state, gi = self._gpu_instance(gpu_instance)
        record = self._compute_profile(state, gi, profile_id)
        if record is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        count = _uint_target(count_ref)
        refs = _array_of(compute_instances_ref, pynvml.c_nvmlComputeInstance_t,
                         record.instanceCount)
        listed = [ci for _, ci in sorted(gi.compute.items()) if ci.profile_id == profile_id]
        for index, ci in enumerate(listed):
            refs[index] = ctypes.cast(ci.token, pynvml.c_nvmlComputeInstance_t)
        count.value = len(listed)
        return NVML_SUCCESS

    @nvml_call()
    def nvmlComputeInstanceGetInfo(self, compute_instance: object) -> ComputeInstanceRecord:
        state, gi, ci = self._compute_instance(compute_instance)
        return ComputeInstanceRecord(device=SimulatedDevice(state.index),
                                     gpuInstance=ctypes.cast(gi.token,
                                                             pynvml.c_nvmlGpuInstance_t),
                                     id=ci.id, profileId=ci.profile_id)

    @nvml_call()
    def nvmlComputeInstanceDestroy(self, compute_instance: object) -> int:
        state, gi, ci = self._compute_instance(compute_instance)
        if state.processes_on(gi.id):
            raise _error(pynvml.NVML_ERROR_IN_USE)
        del gi.compute[ci.id]
        del self._compute_instance_tokens[ci.token]
        return NVML_SUCCESS

    @nvml_call()
    def nvmlGpuInstanceDestroy(self, gpu_instance: object) -> int:
        state, gi = self._gpu_instance(gpu_instance)
        if gi.compute or state.processes_on(gi.id):
            raise _error(pynvml.NVML_ERROR_IN_USE)
        self._forget(state, gi)
        return NVML_SUCCESS

    @nvml_call()
    def nvmlDeviceGetMaxMigDeviceCount(self, device: object) -> int:
        """As many MIG devices as the card has compute slices (its most instances)."""
        return max(info.instances for info in self._gpu(device).table.profiles)

    @nvml_call()
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: object, index: int
                                            ) -> SimulatedMigDevice:
        """MIG devices in order of GPU then compute instance id; NOT_FOUND past the last."""
        state = self._mig_gpu(device)
        most = max(info.instances for info in state.table.profiles)
        if not 0 <= index < most:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        devices = [SimulatedMigDevice(state.index, gi.id, ci.id)
                   for _, gi in sorted(state.instances.items())
                   for _, ci in sorted(gi.compute.items())]
        if index >= len(devices):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return devices[index]

    @nvml_call()
    def nvmlDeviceGetGpuInstanceId(self, mig_device: object) -> int:
        self._mig_compute(mig_device)
        assert isinstance(mig_device, SimulatedMigDevice)
        return mig_device.gpu_instance_id

    @nvml_call()
    def nvmlDeviceGetComputeInstanceId(self, mig_device: object) -> int:
        self._mig_compute(mig_device)
        assert isinstance(mig_device, SimulatedMigDevice)
        return mig_device.compute_instance_id

    # The rules' parts.

    def _enter(self, call: str, needs_init: bool) -> None:
        queued = self._failures.get(call)
        if queued:
            raise _error(queued.popleft())
        if needs_init and self._initialized <= 0:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, device: object) -> _Gpu:
        if not isinstance(device, SimulatedDevice) or not 0 <= device.index < len(self._gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._gpus[device.index]

    def _mig_gpu(self, device: object) -> _Gpu:
        """A GPU in MIG mode now: NVML lists, places and makes instances on no other."""
        state = self._gpu(device)
        if not state.current:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return state

    def _profile_by_id(self, state: _Gpu, profile_id: int) -> GpuInstanceProfileInfo:
        info = next((p for p in state.table.profiles if p.id == profile_id), None)
        if info is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return info

    def _compute_profile(self, state: _Gpu, gi: _GpuInstance, profile: int
                         ) -> ComputeInstanceProfileRecord | None:
        slices = _CI_SLICES.get(profile)
        card_slices = {info.slices for info in state.table.profiles}
        if slices is None or slices > gi.profile.slices or slices not in card_slices:
            return None
        return ComputeInstanceProfileRecord(
            id=profile, sliceCount=slices, instanceCount=gi.profile.slices // slices,
            multiprocessorCount=gi.profile.multiprocessors * slices // gi.profile.slices)

    def _gpu_instance(self, ref: object) -> tuple[_Gpu, _GpuInstance]:
        found = self._gpu_instance_tokens.get(_token(ref, pynvml.c_nvmlGpuInstance_t))
        if found is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu, gi_id = found
        state = self._gpus[gpu]
        return state, state.instances[gi_id]

    def _compute_instance(self, ref: object) -> tuple[_Gpu, _GpuInstance, _ComputeInstance]:
        found = self._compute_instance_tokens.get(_token(ref, pynvml.c_nvmlComputeInstance_t))
        if found is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu, gi_id, ci_id = found
        state = self._gpus[gpu]
        gi = state.instances[gi_id]
        return state, gi, gi.compute[ci_id]

    def _mig_compute(self, mig_device: object) -> _ComputeInstance:
        """The compute instance a MIG device handle names, while it exists."""
        if not isinstance(mig_device, SimulatedMigDevice):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        state = self._gpu(SimulatedDevice(mig_device.gpu))
        gi = state.instances.get(mig_device.gpu_instance_id)
        ci = gi.compute.get(mig_device.compute_instance_id) if gi is not None else None
        if ci is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ci

    def _mig_uuid(self, state: _Gpu, gi_id: int, ci: _ComputeInstance) -> str:
        """Stable for one MIG device, another for a device made again with the same ids."""
        name = f"{state.uuid}/{gi_id}/{ci.id}/{ci.serial}"
        return f"MIG-{uuid.uuid5(_MIG_UUID_NAMESPACE, name)}"

    def _process_records(self, state: _Gpu, counts: dict[int | None, int], first_pid: int
                         ) -> list[ProcessRecord]:
        """One record per process counted, pids numbered from ``first_pid`` per GPU; one on
        an instance runs on its first compute instance."""
        records: list[ProcessRecord] = []
        for gi_id, count in counts.items():
            gi = state.instances.get(gi_id) if gi_id is not None else None
            ci_id = min(gi.compute, default=NOT_ATTRIBUTED) if gi is not None else NOT_ATTRIBUTED
            for _ in range(count):
                records.append(ProcessRecord(
                    pid=first_pid + state.index * 100 + len(records), usedGpuMemory=0,
                    gpuInstanceId=NOT_ATTRIBUTED if gi_id is None else gi_id,
                    computeInstanceId=ci_id))
        return records

    def _new_token(self) -> int:
        token = self._next_token
        self._next_token += _TOKEN_STRIDE
        return token

    def _forget(self, state: _Gpu, gi: _GpuInstance) -> None:
        for ci in gi.compute.values():
            del self._compute_instance_tokens[ci.token]
        del self._gpu_instance_tokens[gi.token]
        del state.instances[gi.id]
        state.compute_processes.pop(gi.id, None)
        state.graphics_processes.pop(gi.id, None)

    def _drop_instances(self, state: _Gpu) -> None:
        for gi in list(state.instances.values()):
            self._forget(state, gi)


def _smallest_free(used: dict[int, Any], first: int) -> int:
    """The smallest id from ``first`` not in use: drivers hand out small ids and reuse
    them."""
    candidate = first
    while candidate in used:
        candidate += 1
    return candidate


def _token(ref: object, handle_type: Any) -> int:
    """The address an instance handle points at (its token); 0 for anything else."""
    if not isinstance(ref, handle_type):
        return 0
    return int(ctypes.cast(ref, ctypes.c_void_p).value or 0)


def _referenced(ref: object, target_type: Any) -> Any:
    """What a pointer argument points at: a ``ctypes.pointer`` or ``ctypes.byref`` of
    ``target_type``. Anything else is refused, as C would misread it."""
    if isinstance(ref, ctypes.POINTER(target_type)):
        return ref.contents
    target = getattr(ref, "_obj", None) if type(ref).__name__ == "CArgObject" else None
    if isinstance(target, target_type):
        return target
    raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)


def _uint_target(ref: object) -> ctypes.c_uint:
    target: ctypes.c_uint = _referenced(ref, ctypes.c_uint)
    return target


def _array_of(ref: object, element_type: Any, needed: int) -> Any:
    """A ctypes array of ``element_type`` that holds ``needed`` elements: a wrong type is
    INVALID_ARGUMENT, too short an array INSUFFICIENT_SIZE."""
    if not isinstance(ref, ctypes.Array) or getattr(type(ref), "_type_", None) is not element_type:
        raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if len(ref) < needed:
        raise _error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    return ref
