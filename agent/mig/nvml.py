# ruff: noqa: N802 - the NVML library's own names, kept so the real module fits
"""``MigDevices`` over pynvml: the NVML calls that read MIG mode and profiles, and create,
list and destroy GPU and compute instances.

The library is injected (the ``pynvml`` module on a GPU node, ``SimulatedMigLibrary``
everywhere else) and whoever owns it opens and closes it. NVML's list calls fill arrays
the caller allocates, so this module builds them as any C caller of pynvml must: ctypes
arrays of pynvml's own structure and handle types, sized as NVML documents (the number
of placements a first call with no array reports; a profile's instance count for its
instances), with a ``c_uint`` count passed by pointer. The simulated library fills the
same arrays, which keeps one code path for both.

Every NVML error becomes ``MigError`` on one line that names the GPU's index, the call
and NVML's error with its code.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import ParamSpec, Protocol, TypeVar, cast

import pynvml

from agent.mig.port import LiveInstance, MigError, MigMode
from agent.mig.tables import GI_PROFILE_BY_SLICES, GpuInstanceProfileInfo
from common.core.mig import MigPlacement

logger = logging.getLogger(__name__)

NVML_DEVICE_MIG_ENABLE = 1
CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
"""nvml.h's ``NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE`` by its slice count: the compute
instance that spans a whole GPU instance of ``n`` slices."""
CI_ENGINE_PROFILE_SHARED = 0
"""``NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED``: the compute instance shares the GPU
instance's copy engines and decoders, the only engine profile NVML offers."""
GI_PROFILE_CONSTANTS = range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
"""Every ``NVML_GPU_INSTANCE_PROFILE_*`` the installed pynvml knows: instances are listed
per profile, and one made by someone else (``nvidia-smi mig``, a ``+me`` profile) still
occupies slices, so listing asks every profile, not only the ones the agent makes."""
CI_PROFILE_CONSTANTS = range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
"""Every ``NVML_COMPUTE_INSTANCE_PROFILE_*``: destroying a GPU instance first destroys its
compute instances of any profile."""
PROFILE_ABSENT = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT,
                            pynvml.NVML_ERROR_NOT_FOUND})
"""What NVML answers for a profile constant the GPU (or GPU instance) does not have."""


class Placement(Protocol):
    """``nvmlGpuInstancePlacement_t``: ``size`` memory slices from ``start``."""

    @property
    def start(self) -> int: ...

    @property
    def size(self) -> int: ...


class GpuInstanceProfile(Protocol):
    """The fields of ``nvmlGpuInstanceProfileInfo_t`` (v2) read here."""

    @property
    def id(self) -> int: ...

    @property
    def sliceCount(self) -> int: ...

    @property
    def instanceCount(self) -> int: ...

    @property
    def multiprocessorCount(self) -> int: ...

    @property
    def memorySizeMB(self) -> int: ...


class GpuInstanceInfo(Protocol):
    """The fields of ``nvmlGpuInstanceInfo_t`` read here."""

    @property
    def id(self) -> int: ...

    @property
    def profileId(self) -> int: ...

    @property
    def placement(self) -> Placement: ...


class ComputeInstanceProfile(Protocol):
    """The field of ``nvmlComputeInstanceProfileInfo_t`` (v2) read here."""

    @property
    def id(self) -> int: ...

    @property
    def instanceCount(self) -> int: ...


class ComputeInstanceInfo(Protocol):
    """The field of ``nvmlComputeInstanceInfo_t`` read here."""

    @property
    def id(self) -> int: ...


class MigNvmlLibrary(Protocol):
    """The part of ``pynvml`` MIG uses, with pynvml's names and argument order. Handles are
    opaque; ``*_ref`` arguments are ctypes arrays or pointers, passed on to C as they are."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> object: ...
    def nvmlDeviceGetUUID(self, device: object, /) -> str: ...
    def nvmlDeviceGetName(self, device: object, /) -> str: ...
    def nvmlDeviceGetMigMode(self, device: object, /) -> Sequence[int]: ...
    def nvmlDeviceSetMigMode(self, device: object, mode: int, /) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, device: object, /) -> Sequence[object]: ...
    def nvmlDeviceGetGraphicsRunningProcesses(self, device: object, /) -> Sequence[object]: ...
    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: object, profile: int, /
                                            ) -> GpuInstanceProfile: ...
    def nvmlDeviceGetGpuInstancePossiblePlacements(self, device: object, profile_id: int,
                                                   placements_ref: object, count_ref: object,
                                                   /) -> int: ...
    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device: object, profile_id: int,
                                                 placement_ref: object, /) -> object: ...
    def nvmlDeviceGetGpuInstances(self, device: object, profile_id: int,
                                  gpu_instances_ref: object, count_ref: object, /) -> int: ...
    def nvmlGpuInstanceGetInfo(self, gpu_instance: object, /) -> GpuInstanceInfo: ...
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gpu_instance: object, profile: int,
                                                     eng_profile: int, /
                                                     ) -> ComputeInstanceProfile: ...
    def nvmlGpuInstanceCreateComputeInstance(self, gpu_instance: object, profile_id: int, /
                                             ) -> object: ...
    def nvmlGpuInstanceGetComputeInstances(self, gpu_instance: object, profile_id: int,
                                           compute_instances_ref: object, count_ref: object,
                                           /) -> int: ...
    def nvmlComputeInstanceGetInfo(self, compute_instance: object, /) -> ComputeInstanceInfo: ...
    def nvmlComputeInstanceDestroy(self, compute_instance: object, /) -> int: ...
    def nvmlGpuInstanceDestroy(self, gpu_instance: object, /) -> int: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, device: object, /) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: object, index: int, /) -> object: ...
    def nvmlDeviceGetGpuInstanceId(self, mig_device: object, /) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, mig_device: object, /) -> int: ...


def pynvml_library() -> MigNvmlLibrary:
    """The real library: the ``pynvml`` module (nvidia-ml-py)."""
    return cast(MigNvmlLibrary, pynvml)


def nvml_return_code(error: Exception) -> int | None:
    """NVML's return code carried by a pynvml error."""
    value = getattr(error, "value", None)
    return value if isinstance(value, int) else None


def _failure(gpu: int | None, call: str, error: Exception) -> MigError:
    """One line: the GPU, the call, NVML's words for the error and its code (the words alone
    are ambiguous across driver versions, the code is what nvml.h documents)."""
    words = " ".join(str(error).split()) or type(error).__name__
    code = nvml_return_code(error)
    where = f"GPU {gpu}: " if gpu is not None else ""
    coded = code is not None and str(code) not in words
    return MigError(f"{where}{call} failed: {words}" + (f" (NVML error {code})" if coded else ""))


P = ParamSpec("P")
T = TypeVar("T")


class NvmlMigDevices:
    """``MigDevices`` over a pynvml-shaped library; see the module's docstring.

    It keeps no state between calls (no cached handles or profiles): NVML is the record, so
    an instance someone else made or destroyed is seen at the next call. The calls are not
    serialised here; the caller (``agent.mig.manager``) does that.
    """

    def __init__(self, library: MigNvmlLibrary) -> None:
        self._nvml = library

    def open(self) -> None:
        """``nvmlInit``, for an owner that has not opened the library itself."""
        self._call(None, "nvmlInit", self._nvml.nvmlInit)

    def close(self) -> None:
        """``nvmlShutdown``; a failure is logged, as there is nothing left to do about it."""
        nvml = self._nvml
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as error:
            logger.warning("%s", _failure(None, "nvmlShutdown", error))

    def gpu_count(self) -> int:
        return self._call(None, "nvmlDeviceGetCount", self._nvml.nvmlDeviceGetCount)

    def gpu_uuid(self, gpu: int) -> str:
        return self._call(gpu, "nvmlDeviceGetUUID", self._nvml.nvmlDeviceGetUUID,
                          self._handle(gpu))

    def gpu_name(self, gpu: int) -> str:
        return self._call(gpu, "nvmlDeviceGetName", self._nvml.nvmlDeviceGetName,
                          self._handle(gpu))

    def mig_mode(self, gpu: int) -> MigMode:
        current, pending = self._call(gpu, "nvmlDeviceGetMigMode",
                                      self._nvml.nvmlDeviceGetMigMode, self._handle(gpu))
        return MigMode(current=current == NVML_DEVICE_MIG_ENABLE,
                       pending=pending == NVML_DEVICE_MIG_ENABLE)

    def enable_mig(self, gpu: int) -> MigMode:
        # The activation status only repeats what the modes read next say.
        self._call(gpu, "nvmlDeviceSetMigMode", self._nvml.nvmlDeviceSetMigMode,
                   self._handle(gpu), NVML_DEVICE_MIG_ENABLE)
        return self.mig_mode(gpu)

    def busy(self, gpu: int) -> bool:
        """Never raises: a GPU whose processes cannot be listed is not known to be idle, and
        the one thing ``busy`` guards (a reset) must not happen under a running process."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu)
            return bool(nvml.nvmlDeviceGetComputeRunningProcesses(handle)) or bool(
                nvml.nvmlDeviceGetGraphicsRunningProcesses(handle))
        except nvml.NVMLError as error:
            logger.warning("GPU %d counts as busy: its processes cannot be listed: %s",
                           gpu, " ".join(str(error).split()))
            return True

    def profiles(self, gpu: int) -> list[GpuInstanceProfileInfo]:
        """The profiles of ``GI_PROFILE_BY_SLICES`` the GPU has, in constant order. The
        placements need MIG mode on: on a GPU without it NVML refuses (``MigError``)."""
        handle = self._handle(gpu)
        constants = sorted(set(GI_PROFILE_BY_SLICES.values()))
        return [GpuInstanceProfileInfo(
            constant=constant, id=info.id, memory_mib=info.memorySizeMB,
            slices=info.sliceCount, instances=info.instanceCount,
            multiprocessors=info.multiprocessorCount,
            placements=self._placements(gpu, handle, info.id))
            for constant, info in self._profile_infos(gpu, handle, constants)]

    def instances(self, gpu: int) -> list[LiveInstance]:
        """Every GPU instance of every profile, by id. NVML lists none on a GPU whose MIG
        mode is off: it refuses (``MigError``)."""
        handle = self._handle(gpu)
        listed = self._gpu_instances(gpu, handle)
        uuids = self._mig_devices(gpu, handle)
        live = []
        for _, info in listed:
            compute = sorted((ci, uuid) for (gi, ci), uuid in uuids.items() if gi == info.id)
            live.append(LiveInstance(
                gpu=gpu, gpu_instance_id=info.id, profile_id=info.profileId,
                placement=MigPlacement(info.placement.start, info.placement.size),
                compute_instance_ids=tuple(ci for ci, _ in compute),
                mig_uuid=compute[0][1] if compute else ""))
        return sorted(live, key=lambda instance: instance.gpu_instance_id)

    def create(self, gpu: int, profile_id: int, placement: MigPlacement) -> LiveInstance:
        """All or nothing: once the GPU instance exists, any later failure (its compute
        instance, reading either back, finding its MIG device) destroys what was made before
        ``MigError`` is raised, so no instance is left that nobody asked for."""
        nvml = self._nvml
        handle = self._handle(gpu)
        profile = self._profile_with_id(gpu, handle, profile_id)
        wanted = pynvml.c_nvmlGpuInstancePlacement_t(placement.start, placement.size)
        gpu_instance = self._call(gpu, "nvmlDeviceCreateGpuInstanceWithPlacement",
                                  nvml.nvmlDeviceCreateGpuInstanceWithPlacement,
                                  handle, profile_id, ctypes.pointer(wanted))
        compute_instance: object | None = None
        try:
            info = self._call(gpu, "nvmlGpuInstanceGetInfo", nvml.nvmlGpuInstanceGetInfo,
                              gpu_instance)
            compute_profile = self._spanning_compute_profile(gpu, gpu_instance,
                                                             profile.sliceCount)
            compute_instance = self._call(gpu, "nvmlGpuInstanceCreateComputeInstance",
                                          nvml.nvmlGpuInstanceCreateComputeInstance,
                                          gpu_instance, compute_profile.id)
            compute_id = self._call(gpu, "nvmlComputeInstanceGetInfo",
                                    nvml.nvmlComputeInstanceGetInfo, compute_instance).id
            uuid = self._mig_devices(gpu, handle).get((info.id, compute_id))
            if uuid is None:
                raise MigError(f"GPU {gpu}: nvmlDeviceGetMigDeviceHandleByIndex: no MIG device "
                               f"for GPU instance {info.id}, compute instance {compute_id}")
        except MigError as error:
            raise self._rolled_back(gpu, gpu_instance, compute_instance, error) from None
        return LiveInstance(gpu=gpu, gpu_instance_id=info.id, profile_id=info.profileId,
                            placement=MigPlacement(info.placement.start, info.placement.size),
                            compute_instance_ids=(compute_id,), mig_uuid=uuid)

    def destroy(self, gpu: int, gpu_instance_id: int) -> None:
        """An id NVML does not list is refused (``MigError``): the caller asked to destroy
        something it believes exists, and that belief was wrong."""
        nvml = self._nvml
        handle = self._handle(gpu)
        found = next((gi for gi, info in self._gpu_instances(gpu, handle)
                      if info.id == gpu_instance_id), None)
        if found is None:
            raise MigError(f"GPU {gpu}: nvmlDeviceGetGpuInstances: no GPU instance "
                           f"{gpu_instance_id}")
        for compute_instance in self._compute_instances(gpu, found):
            self._call(gpu, "nvmlComputeInstanceDestroy", nvml.nvmlComputeInstanceDestroy,
                       compute_instance)
        self._call(gpu, "nvmlGpuInstanceDestroy", nvml.nvmlGpuInstanceDestroy, found)

    def _call(self, gpu: int | None, call: str, function: Callable[P, T],
              *args: P.args, **kwargs: P.kwargs) -> T:
        """``function(*args)``; an NVML error becomes ``MigError`` naming ``call``."""
        try:
            return function(*args, **kwargs)
        except self._nvml.NVMLError as error:
            raise _failure(gpu, call, error) from None

    def _optional(self, gpu: int, call: str, function: Callable[P, T],
                  *args: P.args, **kwargs: P.kwargs) -> T | None:
        """``function(*args)``; None where NVML says the profile asked for is not there."""
        try:
            return function(*args, **kwargs)
        except self._nvml.NVMLError as error:
            if nvml_return_code(error) in PROFILE_ABSENT:
                return None
            raise _failure(gpu, call, error) from None

    def _handle(self, gpu: int) -> object:
        return self._call(gpu, "nvmlDeviceGetHandleByIndex",
                          self._nvml.nvmlDeviceGetHandleByIndex, gpu)

    def _profile_infos(self, gpu: int, handle: object, constants: Iterable[int]
                       ) -> list[tuple[int, GpuInstanceProfile]]:
        found = []
        for constant in constants:
            info = self._optional(gpu, "nvmlDeviceGetGpuInstanceProfileInfo",
                                  self._nvml.nvmlDeviceGetGpuInstanceProfileInfo,
                                  handle, constant)
            if info is not None:
                found.append((constant, info))
        return found

    def _profile_with_id(self, gpu: int, handle: object, profile_id: int) -> GpuInstanceProfile:
        for _, info in self._profile_infos(gpu, handle, GI_PROFILE_CONSTANTS):
            if info.id == profile_id:
                return info
        raise MigError(f"GPU {gpu}: nvmlDeviceGetGpuInstanceProfileInfo: no profile has id "
                       f"{profile_id}")

    def _placements(self, gpu: int, handle: object, profile_id: int
                    ) -> tuple[tuple[int, int], ...]:
        """NVML's documented two calls: no array to learn the count, then an array of it."""
        call = "nvmlDeviceGetGpuInstancePossiblePlacements"
        function = self._nvml.nvmlDeviceGetGpuInstancePossiblePlacements
        count = ctypes.c_uint(0)
        self._call(gpu, call, function, handle, profile_id, None, ctypes.pointer(count))
        if count.value == 0:
            return ()
        placements = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
        self._call(gpu, call, function, handle, profile_id, placements, ctypes.pointer(count))
        return tuple((placements[i].start, placements[i].size)
                     for i in range(min(count.value, len(placements))))

    def _gpu_instances(self, gpu: int, handle: object
                       ) -> list[tuple[object, GpuInstanceInfo]]:
        """Every GPU instance with its info. NVML's array must hold as many instances as
        the profile allows (its instance count), whatever number exists."""
        nvml = self._nvml
        found: list[tuple[object, GpuInstanceInfo]] = []
        listed: set[int] = set()
        for _, profile in self._profile_infos(gpu, handle, GI_PROFILE_CONSTANTS):
            if profile.id in listed:
                continue
            listed.add(profile.id)
            refs = (pynvml.c_nvmlGpuInstance_t * max(1, profile.instanceCount))()
            count = ctypes.c_uint(0)
            self._call(gpu, "nvmlDeviceGetGpuInstances", nvml.nvmlDeviceGetGpuInstances,
                       handle, profile.id, refs, ctypes.pointer(count))
            for index in range(min(count.value, len(refs))):
                gpu_instance = refs[index]
                found.append((gpu_instance, self._call(gpu, "nvmlGpuInstanceGetInfo",
                                                       nvml.nvmlGpuInstanceGetInfo,
                                                       gpu_instance)))
        return found

    def _spanning_compute_profile(self, gpu: int, gpu_instance: object, slices: int
                                  ) -> ComputeInstanceProfile:
        """The compute-instance profile of the GPU instance's own slice count: one compute
        instance that uses all of it, as HAMi makes them."""
        call = "nvmlGpuInstanceGetComputeInstanceProfileInfo"
        constant = CI_PROFILE_BY_SLICES.get(slices)
        if constant is None:
            raise MigError(f"GPU {gpu}: {call}: no compute-instance profile spans {slices} "
                           "slices")
        return self._call(gpu, call, self._nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                          gpu_instance, constant, CI_ENGINE_PROFILE_SHARED)

    def _compute_instances(self, gpu: int, gpu_instance: object) -> list[object]:
        """Every compute instance of a GPU instance, of any compute-instance profile."""
        nvml = self._nvml
        found: list[object] = []
        listed: set[int] = set()
        for constant in CI_PROFILE_CONSTANTS:
            profile = self._optional(gpu, "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                                     nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                                     gpu_instance, constant, CI_ENGINE_PROFILE_SHARED)
            if profile is None or profile.id in listed:
                continue
            listed.add(profile.id)
            refs = (pynvml.c_nvmlComputeInstance_t * max(1, profile.instanceCount))()
            count = ctypes.c_uint(0)
            self._call(gpu, "nvmlGpuInstanceGetComputeInstances",
                       nvml.nvmlGpuInstanceGetComputeInstances, gpu_instance, profile.id,
                       refs, ctypes.pointer(count))
            found.extend(refs[index] for index in range(min(count.value, len(refs))))
        return found

    def _mig_devices(self, gpu: int, handle: object) -> dict[tuple[int, int], str]:
        """Each MIG device's UUID by its (GPU instance, compute instance) ids. NVML numbers
        MIG devices up to a maximum and answers NOT_FOUND for an index nobody holds; the
        indices in use need not be contiguous."""
        nvml = self._nvml
        most = self._call(gpu, "nvmlDeviceGetMaxMigDeviceCount",
                          nvml.nvmlDeviceGetMaxMigDeviceCount, handle)
        devices: dict[tuple[int, int], str] = {}
        for index in range(most):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except nvml.NVMLError as error:
                if nvml_return_code(error) == pynvml.NVML_ERROR_NOT_FOUND:
                    continue
                raise _failure(gpu, "nvmlDeviceGetMigDeviceHandleByIndex", error) from None
            gi = self._call(gpu, "nvmlDeviceGetGpuInstanceId", nvml.nvmlDeviceGetGpuInstanceId,
                            mig)
            ci = self._call(gpu, "nvmlDeviceGetComputeInstanceId",
                            nvml.nvmlDeviceGetComputeInstanceId, mig)
            devices[(gi, ci)] = self._call(gpu, "nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID, mig)
        return devices

    def _rolled_back(self, gpu: int, gpu_instance: object, compute_instance: object | None,
                     error: MigError) -> MigError:
        """``error``, once what ``create`` made is destroyed again; a failed rollback is
        told on the same line, as the instance is then left on the GPU."""
        nvml = self._nvml
        try:
            if compute_instance is not None:
                self._call(gpu, "nvmlComputeInstanceDestroy", nvml.nvmlComputeInstanceDestroy,
                           compute_instance)
            self._call(gpu, "nvmlGpuInstanceDestroy", nvml.nvmlGpuInstanceDestroy,
                       gpu_instance)
        except MigError as rollback:
            return MigError(f"{error}; the GPU instance made was left on the GPU, as "
                            f"destroying it again failed: {rollback}")
        return MigError(f"{error}; the GPU instance made was destroyed again")
