"""``NvmlMigDevices`` over ``SimulatedMigLibrary``: MIG's NVML calls end to end, with the
simulated library refusing what NVML refuses, so every path from the pynvml call up is the
production code (ctypes arrays and pointers included)."""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Callable

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.mig.nvml import NvmlMigDevices
from agent.mig.port import LiveInstance, MigError, MigMode
from agent.mig.simulated import SimulatedMigLibrary
from agent.mig.tables import (
    A100_80GB,
    GI_PROFILE_1_SLICE,
    GI_PROFILE_BY_SLICES,
    H100_80GB,
    H200_141GB,
    TABLES,
    GpuInstanceProfileInfo,
    MigCardTable,
    profile_name,
)
from common.core.mig import MigPlacement

GPU_UUIDS = ("GPU-8a3e6b1c-0000-4000-8000-000000000000", "GPU-8a3e6b1c-0000-4000-8000-000000000001")
ONE_SLICE, TWO_SLICE, THREE_SLICE, FOUR_SLICE, SEVEN_SLICE = 19, 14, 9, 5, 0
"""The profile ids NVML answers on every card (``nvidia-smi mig -lgip``'s IDs)."""
CREATE = "nvmlDeviceCreateGpuInstanceWithPlacement"


def on(table: MigCardTable, *, mig_enabled: bool = True, needs_reset: bool = False
       ) -> tuple[SimulatedMigLibrary, NvmlMigDevices]:
    """Two GPUs of ``table``, the library opened."""
    library = SimulatedMigLibrary([table, table], GPU_UUIDS, mig_enabled=mig_enabled,
                                  needs_reset=needs_reset)
    devices = NvmlMigDevices(library)
    devices.open()
    return library, devices


def offered(table: MigCardTable) -> list[tuple[GpuInstanceProfileInfo, MigPlacement]]:
    return [(profile, MigPlacement(start, size)) for profile in table.profiles
            for start, size in profile.placements]


EVERY_OFFERED = [pytest.param(table, profile, placement,
                              id=f"{table.name}-{profile.slices}g@{placement.start}")
                 for table in TABLES for profile, placement in offered(table)]


@pytest.mark.parametrize("table", TABLES, ids=lambda table: table.name)
def test_profiles_read_from_nvml_are_the_cards_table(table: MigCardTable) -> None:
    """Those HAMi asks for, one per slice count: not the H200's ``+me`` or ``1g.35gb``."""
    _, devices = on(table)
    asked = set(GI_PROFILE_BY_SLICES.values())
    assert devices.profiles(0) == [p for p in table.profiles if p.constant in asked]
    assert devices.gpu_count() == 2
    assert devices.gpu_uuid(1) == GPU_UUIDS[1]
    assert devices.gpu_name(1) == table.name  # NVML's own, which the allowlist is matched in


@pytest.mark.parametrize(("table", "profile", "placement"), EVERY_OFFERED)
def test_an_instance_is_made_at_every_offered_placement(
        table: MigCardTable, profile: GpuInstanceProfileInfo, placement: MigPlacement) -> None:
    _, devices = on(table)
    made = devices.create(0, profile.id, placement)
    assert (made.gpu, made.profile_id, made.placement) == (0, profile.id, placement)
    assert made.compute_instance_ids == (0,)
    assert made.mig_uuid.startswith("MIG-")
    assert devices.instances(0) == [made]
    assert devices.instances(1) == []


@pytest.mark.parametrize(("profile_id", "placement"), [
    (ONE_SLICE, MigPlacement(7, 1)),  # slice 7 serves only the 7g instance's memory
    (TWO_SLICE, MigPlacement(1, 2)),  # 2g instances start at even slices
    (THREE_SLICE, MigPlacement(2, 4)),
    (FOUR_SLICE, MigPlacement(4, 4)),
    (SEVEN_SLICE, MigPlacement(0, 7)),  # the right start, the wrong size
    (ONE_SLICE, MigPlacement(0, 2)),
])
@pytest.mark.parametrize("table", TABLES, ids=lambda table: table.name)
def test_a_placement_the_profile_does_not_offer_is_refused(
        table: MigCardTable, profile_id: int, placement: MigPlacement) -> None:
    _, devices = on(table)
    with pytest.raises(MigError) as refused:
        devices.create(0, profile_id, placement)
    assert str(refused.value).startswith(f"GPU 0: {CREATE} failed: ")
    assert "Invalid Argument" in str(refused.value)
    assert devices.instances(0) == []


@pytest.mark.parametrize(("first", "second"), [
    ((SEVEN_SLICE, MigPlacement(0, 8)), (ONE_SLICE, MigPlacement(0, 1))),
    ((THREE_SLICE, MigPlacement(4, 4)), (TWO_SLICE, MigPlacement(4, 2))),
    ((ONE_SLICE, MigPlacement(3, 1)), (FOUR_SLICE, MigPlacement(0, 4))),
    ((TWO_SLICE, MigPlacement(2, 2)), (THREE_SLICE, MigPlacement(0, 4))),
    ((ONE_SLICE, MigPlacement(6, 1)), (ONE_SLICE, MigPlacement(6, 1))),
])
@pytest.mark.parametrize("table", TABLES, ids=lambda table: table.name)
def test_a_placement_overlapping_an_instance_is_refused(
        table: MigCardTable, first: tuple[int, MigPlacement],
        second: tuple[int, MigPlacement]) -> None:
    _, devices = on(table)
    kept = devices.create(0, *first)
    with pytest.raises(MigError) as refused:
        devices.create(0, *second)
    assert str(refused.value).startswith(f"GPU 0: {CREATE} failed: ")
    assert "23" in str(refused.value)  # NVML_ERROR_INSUFFICIENT_RESOURCES
    assert devices.instances(0) == [kept]
    # The other GPU's slices are its own.
    assert devices.create(1, *second).placement == second[1]


@pytest.mark.parametrize("table", TABLES, ids=lambda table: table.name)
def test_a_profiles_placements_fill_its_instance_count_and_no_more(
        table: MigCardTable) -> None:
    """Most profiles offer as many placements as instances; a ``+me`` one offers every
    1g placement for its one instance."""
    for profile in table.profiles:
        _, devices = on(table)
        placements = [MigPlacement(start, size) for start, size in profile.placements]
        made = [devices.create(0, profile.id, placement)
                for placement in placements[:profile.instances]]
        assert len(devices.instances(0)) == profile.instances == len(made)
        assert len({instance.gpu_instance_id for instance in made}) == len(made)
        for placement in placements[profile.instances:]:
            with pytest.raises(MigError, match=CREATE):
                devices.create(0, profile.id, placement)


def test_no_more_instances_of_a_profile_than_its_instance_count() -> None:
    """Free slices do not make room beyond NVML's instance count."""
    capped = MigCardTable("capped", 81920, (GpuInstanceProfileInfo(
        GI_PROFILE_1_SLICE, ONE_SLICE, 9728, 1, 2, 14, tuple((s, 1) for s in range(7))),))
    _, devices = on(capped)
    devices.create(0, ONE_SLICE, MigPlacement(0, 1))
    devices.create(0, ONE_SLICE, MigPlacement(1, 1))
    with pytest.raises(MigError, match=CREATE):
        devices.create(0, ONE_SLICE, MigPlacement(2, 1))
    assert [i.placement.start for i in devices.instances(0)] == [0, 1]


@pytest.mark.parametrize("table", TABLES, ids=lambda table: table.name)
def test_destroying_an_instance_frees_its_slices(table: MigCardTable) -> None:
    _, devices = on(table)
    whole = devices.create(0, SEVEN_SLICE, MigPlacement(0, 8))
    devices.destroy(0, whole.gpu_instance_id)
    assert devices.instances(0) == []
    small = [devices.create(0, ONE_SLICE, MigPlacement(start, 1)) for start in range(7)]
    devices.destroy(0, small[3].gpu_instance_id)
    assert [i.placement.start for i in devices.instances(0)] == [0, 1, 2, 4, 5, 6]
    assert devices.create(0, ONE_SLICE, MigPlacement(3, 1)).placement == MigPlacement(3, 1)


def test_destroying_an_instance_nvml_does_not_list_is_refused() -> None:
    _, devices = on(A100_80GB)
    kept = devices.create(0, ONE_SLICE, MigPlacement(0, 1))
    with pytest.raises(MigError, match=r"^GPU 0: nvmlDeviceGetGpuInstances: no GPU instance 9$"):
        devices.destroy(0, 9)
    assert devices.instances(0) == [kept]


def test_destroy_takes_every_compute_instance_of_any_profile() -> None:
    """An instance someone else split into several compute instances (nvidia-smi) is listed
    with all of them, and destroyed whole."""
    library, devices = on(A100_80GB)
    handle = library.nvmlDeviceGetHandleByIndex(0)
    placement = pynvml.c_nvmlGpuInstancePlacement_t(0, 4)
    gpu_instance = library.nvmlDeviceCreateGpuInstanceWithPlacement(
        handle, THREE_SLICE, ctypes.pointer(placement))
    for compute_profile in (0, 1):  # 1c and 2c: the 3g instance's three slices
        library.nvmlGpuInstanceCreateComputeInstance(gpu_instance, compute_profile)
    [listed] = devices.instances(0)
    assert listed.compute_instance_ids == (0, 1)
    assert listed.mig_uuid == library.nvmlDeviceGetUUID(
        library.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0))
    devices.destroy(0, listed.gpu_instance_id)
    assert devices.instances(0) == []


def test_an_instance_with_processes_is_not_destroyed() -> None:
    library, devices = on(A100_80GB)
    made = devices.create(0, TWO_SLICE, MigPlacement(2, 2))
    library.set_processes(0, 1, gpu_instance_id=made.gpu_instance_id)
    with pytest.raises(MigError, match=r"^GPU 0: nvmlComputeInstanceDestroy failed: .*code 19$"):
        devices.destroy(0, made.gpu_instance_id)
    assert devices.instances(0) == [made]
    library.set_processes(0, 0, gpu_instance_id=made.gpu_instance_id)
    devices.destroy(0, made.gpu_instance_id)
    assert devices.instances(0) == []


def test_a_pending_mode_change_refuses_instances() -> None:
    library, devices = on(A100_80GB)
    library.set_pending_mode(0, False)
    assert devices.mig_mode(0) == MigMode(current=True, pending=False)
    assert devices.mig_mode(0).changing
    with pytest.raises(MigError, match=rf"^GPU 0: {CREATE} failed: GPU requires restart"):
        devices.create(0, ONE_SLICE, MigPlacement(0, 1))
    assert devices.instances(0) == []
    assert devices.create(1, ONE_SLICE, MigPlacement(0, 1)).gpu == 1


@pytest.mark.parametrize(("needs_reset", "after_enable"), [
    (False, MigMode(current=True, pending=True)),
    (True, MigMode(current=False, pending=True)),
])
def test_mig_is_enabled_on_an_idle_gpu(needs_reset: bool, after_enable: MigMode) -> None:
    library, devices = on(A100_80GB, mig_enabled=False, needs_reset=needs_reset)
    assert devices.mig_mode(0) == MigMode(current=False, pending=False)
    assert devices.enable_mig(0) == after_enable
    library.reset_gpu(0)
    assert devices.mig_mode(0) == MigMode(current=True, pending=True)
    assert devices.mig_mode(1) == MigMode(current=False, pending=False)
    assert devices.create(0, SEVEN_SLICE, MigPlacement(0, 8)).placement == MigPlacement(0, 8)


def test_mig_mode_is_not_changed_under_a_running_process() -> None:
    library, devices = on(A100_80GB, mig_enabled=False)
    library.set_processes(0, 1)
    with pytest.raises(MigError, match=r"^GPU 0: nvmlDeviceSetMigMode failed: .*code 19$"):
        devices.enable_mig(0)
    assert devices.mig_mode(0) == MigMode(current=False, pending=False)


def test_a_gpu_out_of_mig_mode_has_no_instances_or_placements_to_list() -> None:
    _, devices = on(A100_80GB, mig_enabled=False)
    with pytest.raises(MigError, match=r"^GPU 0: nvmlDeviceGetGpuInstances failed: Not Supp"):
        devices.instances(0)
    with pytest.raises(MigError, match=r"^GPU 0: nvmlDeviceGetGpuInstancePossiblePlacements"):
        devices.profiles(0)
    with pytest.raises(MigError, match=CREATE):
        devices.create(0, ONE_SLICE, MigPlacement(0, 1))


@pytest.mark.parametrize(("count", "graphics", "gpu_instance", "busy"), [
    (0, False, False, False),
    (1, False, False, True),
    (2, True, False, True),
    (1, False, True, True),
])
def test_a_gpu_is_busy_with_any_process_on_it(count: int, graphics: bool, gpu_instance: bool,
                                              busy: bool) -> None:
    library, devices = on(A100_80GB)
    made = devices.create(0, ONE_SLICE, MigPlacement(0, 1))
    library.set_processes(0, count, graphics=graphics,
                          gpu_instance_id=made.gpu_instance_id if gpu_instance else None)
    assert devices.busy(0) is busy
    assert devices.busy(1) is False


@pytest.mark.parametrize("call", ["nvmlDeviceGetComputeRunningProcesses",
                                  "nvmlDeviceGetGraphicsRunningProcesses",
                                  "nvmlDeviceGetHandleByIndex"])
def test_a_gpu_whose_processes_cannot_be_listed_is_busy(call: str) -> None:
    library, devices = on(A100_80GB)
    library.fail_next(call, pynvml.NVML_ERROR_GPU_IS_LOST)
    assert devices.busy(0) is True
    assert devices.busy(0) is False  # the failure was the next call's only


@pytest.mark.parametrize("call", ["nvmlGpuInstanceGetInfo",
                                  "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                                  "nvmlGpuInstanceCreateComputeInstance",
                                  "nvmlComputeInstanceGetInfo",
                                  "nvmlDeviceGetMaxMigDeviceCount"])
def test_a_failure_after_the_gpu_instance_is_made_destroys_it_again(call: str) -> None:
    library, devices = on(A100_80GB)
    library.fail_next(call, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    with pytest.raises(MigError) as failed:
        devices.create(0, THREE_SLICE, MigPlacement(4, 4))
    assert str(failed.value).startswith(f"GPU 0: {call} failed: ")
    assert str(failed.value).endswith("; the GPU instance made was destroyed again")
    assert devices.instances(0) == []
    assert devices.create(0, THREE_SLICE, MigPlacement(4, 4)).placement == MigPlacement(4, 4)


def test_a_rollback_that_fails_says_the_instance_was_left() -> None:
    library, devices = on(A100_80GB)
    library.fail_next("nvmlGpuInstanceCreateComputeInstance", pynvml.NVML_ERROR_UNKNOWN)
    library.fail_next("nvmlGpuInstanceDestroy", pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(MigError) as failed:
        devices.create(0, ONE_SLICE, MigPlacement(2, 1))
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith("GPU 0: nvmlGpuInstanceCreateComputeInstance failed: ")
    assert "left on the GPU" in message and "nvmlGpuInstanceDestroy failed: GPU is lost" in message
    [left] = devices.instances(0)
    assert (left.placement, left.compute_instance_ids, left.mig_uuid) == (
        MigPlacement(2, 1), (), "")


def test_mig_uuids_are_reported_and_distinct() -> None:
    _, devices = on(H100_80GB)
    made = [devices.create(gpu, ONE_SLICE, MigPlacement(start, 1))
            for gpu, start in itertools.product((0, 1), range(7))]
    uuids = [instance.mig_uuid for instance in made]
    assert all(uuid.startswith("MIG-") and len(uuid) == 40 for uuid in uuids)
    assert len(set(uuids)) == 14
    assert [i.mig_uuid for i in devices.instances(0) + devices.instances(1)] == uuids
    # The same ids made again are another MIG device.
    devices.destroy(0, made[0].gpu_instance_id)
    again = devices.create(0, ONE_SLICE, MigPlacement(0, 1))
    assert again.gpu_instance_id == made[0].gpu_instance_id
    assert again.mig_uuid not in uuids


Action = Callable[[NvmlMigDevices, LiveInstance], object]


@pytest.mark.parametrize(("action", "call"), [
    (lambda devices, _: devices.mig_mode(1), "nvmlDeviceGetMigMode"),
    (lambda devices, _: devices.gpu_uuid(1), "nvmlDeviceGetUUID"),
    (lambda devices, _: devices.gpu_uuid(1), "nvmlDeviceGetHandleByIndex"),
    (lambda devices, _: devices.gpu_name(1), "nvmlDeviceGetName"),
    (lambda devices, _: devices.profiles(1), "nvmlDeviceGetGpuInstanceProfileInfo"),
    (lambda devices, _: devices.profiles(1), "nvmlDeviceGetGpuInstancePossiblePlacements"),
    (lambda devices, _: devices.instances(1), "nvmlDeviceGetGpuInstances"),
    (lambda devices, _: devices.instances(1), "nvmlGpuInstanceGetInfo"),
    (lambda devices, _: devices.instances(1), "nvmlDeviceGetMigDeviceHandleByIndex"),
    (lambda devices, _: devices.instances(1), "nvmlDeviceGetGpuInstanceId"),
    (lambda devices, _: devices.create(1, ONE_SLICE, MigPlacement(0, 1)), CREATE),
    (lambda devices, made: devices.destroy(1, made.gpu_instance_id),
     "nvmlGpuInstanceGetComputeInstances"),
    (lambda devices, made: devices.destroy(1, made.gpu_instance_id),
     "nvmlComputeInstanceDestroy"),
    (lambda devices, made: devices.destroy(1, made.gpu_instance_id), "nvmlGpuInstanceDestroy"),
    (lambda devices, _: devices.enable_mig(1), "nvmlDeviceSetMigMode"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_an_nvml_error_is_one_line_naming_the_gpu_the_call_and_the_error(
        action: Action, call: str) -> None:
    library, devices = on(A100_80GB)
    made = devices.create(1, ONE_SLICE, MigPlacement(6, 1))
    library.fail_next(call, pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(MigError) as failed:
        action(devices, made)
    assert str(failed.value) == f"GPU 1: {call} failed: GPU is lost (NVML error 15)"


def test_calls_need_the_library_opened_and_close_shuts_it() -> None:
    library = SimulatedMigLibrary([A100_80GB], GPU_UUIDS[:1])
    devices = NvmlMigDevices(library)
    with pytest.raises(MigError, match=r"^nvmlDeviceGetCount failed: Uninitialized"):
        devices.gpu_count()
    devices.open()
    assert devices.gpu_count() == 1
    devices.close()
    with pytest.raises(MigError, match="Uninitialized"):
        devices.mig_mode(0)


class TestSimulatedLibraryHoldsCallersToNvmlsTerms:
    """What would misbehave on a driver is refused by the simulated library too."""

    def _opened(self) -> tuple[SimulatedMigLibrary, object]:
        library = SimulatedMigLibrary([A100_80GB], GPU_UUIDS[:1])
        library.nvmlInit()
        return library, library.nvmlDeviceGetHandleByIndex(0)

    def test_a_placement_passed_by_value_is_refused(self) -> None:
        library, handle = self._opened()
        placement = pynvml.c_nvmlGpuInstancePlacement_t(0, 1)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            library.nvmlDeviceCreateGpuInstanceWithPlacement(handle, ONE_SLICE, placement)
        made = library.nvmlDeviceCreateGpuInstanceWithPlacement(handle, ONE_SLICE,
                                                                ctypes.byref(placement))
        assert library.nvmlGpuInstanceGetInfo(made).placement.start == 0

    def test_arrays_must_hold_what_nvml_documents(self) -> None:
        library, handle = self._opened()
        count = ctypes.c_uint(0)
        library.nvmlDeviceGetGpuInstancePossiblePlacements(handle, ONE_SLICE, None,
                                                           ctypes.pointer(count))
        assert count.value == 7
        short = (pynvml.c_nvmlGpuInstancePlacement_t * 6)()
        with pytest.raises(pynvml.NVMLError_InsufficientSize):
            library.nvmlDeviceGetGpuInstancePossiblePlacements(handle, ONE_SLICE, short,
                                                               ctypes.pointer(count))
        # The instance list must hold the profile's instance count (7), not what exists.
        with pytest.raises(pynvml.NVMLError_InsufficientSize):
            library.nvmlDeviceGetGpuInstances(handle, ONE_SLICE,
                                              (pynvml.c_nvmlGpuInstance_t * 1)(),
                                              ctypes.pointer(count))
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            library.nvmlDeviceGetGpuInstances(handle, ONE_SLICE,
                                              (pynvml.c_nvmlComputeInstance_t * 7)(),
                                              ctypes.pointer(count))

    def test_a_gpu_instance_with_compute_instances_or_a_stale_handle_is_refused(self) -> None:
        library, handle = self._opened()
        placement = pynvml.c_nvmlGpuInstancePlacement_t(0, 8)
        gpu_instance = library.nvmlDeviceCreateGpuInstanceWithPlacement(
            handle, SEVEN_SLICE, ctypes.pointer(placement))
        compute_instance = library.nvmlGpuInstanceCreateComputeInstance(gpu_instance, 4)
        with pytest.raises(pynvml.NVMLError_InUse):
            library.nvmlGpuInstanceDestroy(gpu_instance)
        with pytest.raises(pynvml.NVMLError_InsufficientResources):
            library.nvmlGpuInstanceCreateComputeInstance(gpu_instance, 0)
        library.nvmlComputeInstanceDestroy(compute_instance)
        library.nvmlGpuInstanceDestroy(gpu_instance)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            library.nvmlGpuInstanceGetInfo(gpu_instance)

    def test_failures_are_injected_by_call_name_only(self) -> None:
        library, _ = self._opened()
        with pytest.raises(ValueError, match="none of the simulated NVML calls"):
            library.fail_next("nvmlDeviceGetMigModee", pynvml.NVML_ERROR_UNKNOWN)


@settings(max_examples=60, deadline=None)
@given(table=st.sampled_from(TABLES),
       steps=st.lists(st.tuples(st.booleans(), st.integers(0, 99), st.integers(0, 99)),
                      max_size=25))
def test_random_creates_and_destroys_never_overlap_and_refusals_change_nothing(
        table: MigCardTable, steps: list[tuple[bool, int, int]]) -> None:
    """Each create picks an offered placement of a random profile; it must succeed exactly
    when its slices are free and its profile has room, and a refusal changes nothing."""
    _, devices = on(table)
    for creating, first, second in steps:
        before = devices.instances(0)
        if creating or not before:
            profile = table.profiles[first % len(table.profiles)]
            placement = MigPlacement(*profile.placements[second % len(profile.placements)])
            room = sum(1 for i in before if i.profile_id == profile.id) < profile.instances
            free = not any(i.placement.overlaps(placement) for i in before)
            try:
                made = devices.create(0, profile.id, placement)
            except MigError:
                assert not (room and free)
                assert devices.instances(0) == before
            else:
                assert room and free
                assert made.placement == placement
                assert sorted([*before, made], key=_by_id) == devices.instances(0)
        else:
            victim = before[first % len(before)]
            devices.destroy(0, victim.gpu_instance_id)
            assert devices.instances(0) == [i for i in before if i != victim]
        live = devices.instances(0)
        assert not any(a.placement.overlaps(b.placement)
                       for a, b in itertools.combinations(live, 2))


def _by_id(instance: LiveInstance) -> int:
    return instance.gpu_instance_id


@pytest.mark.parametrize(("table", "names"), [
    (A100_80GB, ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    (H100_80GB, ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    # A half (70.5 GiB) rounds up, as NVIDIA names it; +me and 1g.35gb by their memory.
    (H200_141GB, ["1g.18gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb", "1g.18gb",
                 "1g.35gb"]),
], ids=lambda value: value.name if isinstance(value, MigCardTable) else "")
def test_profile_names_are_nvidias(table: MigCardTable, names: list[str]) -> None:
    assert [profile_name(info, table.memory_mib) for info in table.profiles] == names
