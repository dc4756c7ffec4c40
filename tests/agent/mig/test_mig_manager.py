"""The node's MIG instances over the simulated NVML (placements enforced as the driver
enforces them): made at Allocate, all or none; adopted or reset at start; destroyed once no
active pod references them, and only then."""

from __future__ import annotations

import contextlib
import re

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.mig.manager import InstanceKey, MigManager
from agent.mig.nvml import NvmlMigDevices
from agent.mig.port import MigError
from agent.mig.simulated import SimulatedMigLibrary
from agent.mig.tables import A100_80GB, GpuInstanceProfileInfo, MigCardTable, register_profiles
from common.core.mig import MigPlacement, MigReservation

GPUS = ("GPU-a", "GPU-b")
ALLOWED = ("1g.10gb", "2g.20gb", "3g.40gb", "7g.79gb")


def profiles_by_name(table: MigCardTable) -> dict[str, GpuInstanceProfileInfo]:
    registered = register_profiles(table.profiles, ALLOWED)
    return {p.name: next(i for i in table.profiles if i.slices == p.slices)
            for p in registered}


def node(*, mig_enabled: bool = True, needs_reset: bool = False
         ) -> tuple[SimulatedMigLibrary, NvmlMigDevices, MigManager]:
    library = SimulatedMigLibrary([A100_80GB] * len(GPUS), GPUS, mig_enabled=mig_enabled,
                                  needs_reset=needs_reset)
    devices = NvmlMigDevices(library)
    devices.open()
    manager = MigManager(devices, {gpu: profiles_by_name(A100_80GB) for gpu in GPUS})
    manager.open()
    return library, devices, manager


def key(profile: str, start: int, gpu: str = "GPU-a") -> InstanceKey:
    size = {"1g": 1, "2g": 2, "3g": 4, "4g": 4, "7g": 8}[profile[:2]]
    return InstanceKey(gpu, profile, start, size)


def live(devices: NvmlMigDevices, gpu: int = 0) -> list[tuple[int, int]]:
    return sorted((i.placement.start, i.placement.size) for i in devices.instances(gpu))


def reservation(k: InstanceKey, *, container: int = 0, device: int = 0, mig_uuid: str = "",
                gi: int | None = None, ci: int | None = None) -> MigReservation:
    return MigReservation(container_index=container, device_index=device, gpu_uuid=k.gpu,
                          profile=k.profile, placement=k.placement, mig_uuid=mig_uuid,
                          gpu_instance_id=gi, compute_instance_id=ci)


class TestEnsure:
    def test_makes_each_instance_at_its_placement_with_a_mig_uuid(self) -> None:
        _, devices, manager = node()
        made = manager.ensure([key("1g.10gb", 6), key("3g.40gb", 0)])
        assert [(m.placement.start, m.placement.size) for m in made] == [(6, 1), (0, 4)]
        assert all(m.mig_uuid.startswith("MIG-") for m in made)
        assert len({m.mig_uuid for m in made}) == 2
        assert live(devices) == [(0, 4), (6, 1)]

    def test_is_idempotent_per_key(self) -> None:
        _, devices, manager = node()
        first = manager.ensure([key("1g.10gb", 6)])
        again = manager.ensure([key("1g.10gb", 6)])
        assert again == first
        assert live(devices) == [(6, 1)]

    def test_a_failure_part_way_destroys_what_the_call_made(self) -> None:
        library, devices, manager = node()
        manager.ensure([key("1g.10gb", 5)])
        library.fail_next("nvmlDeviceCreateGpuInstanceWithPlacement",
                          pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        with pytest.raises(MigError, match="nvmlDeviceCreateGpuInstanceWithPlacement"):
            # The 1g at 6 is made, the 3g fails: the 1g goes again; the 1g at 5 held before
            # stays.
            manager.ensure([key("1g.10gb", 6), key("3g.40gb", 0), key("1g.10gb", 5)])
        assert live(devices) == [(5, 1)]
        assert set(manager.held()) == {key("1g.10gb", 5)}

    @pytest.mark.parametrize(("wanted", "says"), [
        (key("1g.10gb", 7), "invalid placement 7+1 for profile 1g.10gb"),
        (InstanceKey("GPU-a", "3g.40gb", 2, 4), "invalid placement 2+4"),
        (key("4g.40gb", 0), "offers no MIG profile '4g.40gb'"),
        (key("1g.10gb", 6, gpu="GPU-z"), "offers no MIG profile"),
    ])
    def test_a_reservation_nvml_does_not_offer_is_refused_before_anything_is_made(
            self, wanted: InstanceKey, says: str) -> None:
        _, devices, manager = node()
        with pytest.raises(MigError, match=re.escape(says)):
            manager.ensure([key("1g.10gb", 6), wanted])
        assert live(devices) == []

    def test_an_overlapping_placement_is_refused_by_nvml_and_nothing_is_left(self) -> None:
        _, devices, manager = node()
        manager.ensure([key("3g.40gb", 4)])
        with pytest.raises(MigError):
            manager.ensure([key("1g.10gb", 0), key("1g.10gb", 6)])
        assert live(devices) == [(4, 4)]


class TestReconcile:
    def test_destroys_only_what_no_active_pod_references(self) -> None:
        _, devices, manager = node()
        manager.ensure([key("1g.10gb", 6), key("1g.10gb", 5), key("2g.20gb", 0)])
        destroyed = manager.reconcile({key("1g.10gb", 5)})
        assert sorted(destroyed) == [key("1g.10gb", 6), key("2g.20gb", 0)]
        assert live(devices) == [(5, 1)]

    def test_an_instance_still_running_a_process_stays_until_it_can_go(self) -> None:
        library, devices, manager = node()
        made = manager.ensure([key("1g.10gb", 6)])[0]
        library.set_processes(0, 1, gpu_instance_id=made.gpu_instance_id)
        assert manager.reconcile(set()) == []
        assert set(manager.held()) == {key("1g.10gb", 6)}
        library.set_processes(0, 0, gpu_instance_id=made.gpu_instance_id)
        assert manager.reconcile(set()) == [key("1g.10gb", 6)]
        assert live(devices) == []

    def test_an_instance_made_after_the_references_were_read_is_not_judged(self) -> None:
        _, devices, manager = node()
        manager.ensure([key("1g.10gb", 6)])
        held_before = set(manager.held())
        # An Allocate makes an instance for a pod bound after the daemon's answer.
        manager.ensure([key("1g.10gb", 5)])
        assert manager.reconcile(set(), held_before) == [key("1g.10gb", 6)]
        assert live(devices) == [(5, 1)]

    def test_never_touches_an_instance_it_did_not_make_or_adopt(self) -> None:
        _, devices, manager = node()
        info = profiles_by_name(A100_80GB)["1g.10gb"]
        devices.create(0, info.id, MigPlacement(0, 1))  # made by someone else
        manager.ensure([key("1g.10gb", 6)])
        manager.reconcile(set())
        assert live(devices) == [(0, 1)]


class TestStartUp:
    def test_an_idle_gpu_is_put_in_mig_mode_and_emptied(self) -> None:
        _, devices, manager = node(mig_enabled=False)
        started = manager.start_up([])
        assert started.reset == GPUS
        assert devices.mig_mode(0).current
        assert started.problems == ()

    def test_a_gpu_that_needs_a_reset_to_enter_mig_mode_is_named(self) -> None:
        _, _, manager = node(mig_enabled=False, needs_reset=True)
        started = manager.start_up([])
        assert started.reset == ()
        assert any("GPU GPU-a" in p and "reset" in p for p in started.problems)

    def test_a_pending_mode_change_leaves_the_gpu_alone(self) -> None:
        library, devices, manager = node()
        made = manager.ensure([key("1g.10gb", 6)])
        library.set_pending_mode(0, False)
        fresh = MigManager(devices, {gpu: profiles_by_name(A100_80GB) for gpu in GPUS})
        fresh.open()
        started = fresh.start_up([])
        assert any("GPU GPU-a: a MIG mode change waits for a GPU reset" in p
                   for p in started.problems)
        assert live(devices) == [(6, 1)]  # not reset
        assert made

    def test_a_busy_gpu_is_never_reset(self) -> None:
        library, devices, _ = node()
        info = profiles_by_name(A100_80GB)["1g.10gb"]
        devices.create(0, info.id, MigPlacement(0, 1))
        library.set_processes(0, 1)
        manager = MigManager(devices, {gpu: profiles_by_name(A100_80GB) for gpu in GPUS})
        manager.open()
        started = manager.start_up([])
        assert started.reset == ("GPU-b",)
        assert live(devices) == [(0, 1)]

    def test_live_instances_the_annotations_account_for_are_adopted(self) -> None:
        _, devices, first = node()
        made = first.ensure([key("1g.10gb", 6), key("3g.40gb", 0)])
        # The agent restarts: a new manager over the same GPUs.
        manager = MigManager(devices, {gpu: profiles_by_name(A100_80GB) for gpu in GPUS})
        manager.open()
        one, other = made
        started = manager.start_up([
            reservation(key("1g.10gb", 6), mig_uuid=one.mig_uuid, gi=one.gpu_instance_id,
                        ci=one.compute_instance_ids[0]),
            # The runtime identity is wrong: not adopted, and said so.
            reservation(key("3g.40gb", 0), device=1, mig_uuid="MIG-other",
                        gi=other.gpu_instance_id, ci=other.compute_instance_ids[0])])
        assert started.adopted == (key("1g.10gb", 6),)
        assert any("3g.40gb at slice 0 on GPU-a is not live" in p for p in started.problems)
        assert started.reset == ("GPU-b",)
        # Adopted: kept while referenced, destroyed once not.
        assert manager.reconcile({key("1g.10gb", 6)}) == []
        assert manager.reconcile(set()) == [key("1g.10gb", 6)]


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.tuples(
    st.lists(st.sampled_from([key("1g.10gb", s) for s in range(7)]
                             + [key("2g.20gb", s) for s in (0, 2, 4)]
                             + [key("3g.40gb", s) for s in (0, 4)] + [key("7g.79gb", 0)]
                             + [key("1g.10gb", 6, gpu="GPU-b")]),
             max_size=3),
    st.sets(st.integers(0, 5))), min_size=1, max_size=12))
def test_after_each_reconcile_every_held_instance_is_referenced_and_none_overlap(
        steps: list[tuple[list[InstanceKey], set[int]]]) -> None:
    _, devices, manager = node()
    for wanted, kept in steps:
        with contextlib.suppress(MigError):
            manager.ensure(wanted)
        held = sorted(manager.held())
        referenced = {k for i, k in enumerate(held) if i in kept}
        manager.reconcile(referenced)
        assert set(manager.held()) <= referenced
        for gpu in range(len(GPUS)):
            placements = [i.placement for i in devices.instances(gpu)]
            for a in range(len(placements)):
                for b in range(a + 1, len(placements)):
                    assert not placements[a].overlaps(placements[b])
        # Every instance on the GPUs is one the manager holds: none is left unowned.
        on_gpus = {(gpu, i.gpu_instance_id) for gpu in range(len(GPUS))
                   for i in devices.instances(gpu)}
        assert on_gpus == {(GPUS.index(k.gpu), i.gpu_instance_id)
                           for k, i in manager.held().items()}
