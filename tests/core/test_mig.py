"""MIG cards: the profile and placement a container gets, as HAMi v2.10 chooses them,
worked out by hand on NVML's tables for the A100 80GB and the H100 80GB."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.mig.tables import A100_80GB, H100_80GB, H200_141GB, MigCardTable, register_profiles
from common.core import Allocation, CardGrant, Decision, Fleet
from common.core.annotations import (
    AnnotationError,
    decode_allocation,
    decode_devices,
    with_reservations,
)
from common.core.mig import (
    MIG_ALLOCATIONS_ANNOTATION,
    MigInstance,
    MigPlacement,
    MigReservationError,
    decode_reservations,
    encode_reservations,
    select_instance,
)
from tests.builders import (
    fleet_of,
    manifest,
    mig_node,
    mig_profiles_of,
    node,
    place,
    run,
)

MIG = {"nvidia.com/vgpu-mode": "mig"}


def chosen(decision: Decision) -> list[list[tuple[int, str, int]]]:
    """Per container: (card index, profile, placement start) of each instance."""
    return [[(c.index, c.instance.profile if c.instance else "-",
              c.instance.placement.start if c.instance else -1) for c in cards]
            for cards in decision.cards]


def booked(fleet: Fleet, *memories: int, table: MigCardTable = A100_80GB) -> None:
    for i, memory in enumerate(memories):
        assert place(fleet, manifest(f"held-{i}", gpumem=memory)).scheduled


class TestProfileAndPlacement:
    """Profiles by memory then slices, the first that covers the request with a free
    placement; 1g and 3g placed from the highest start, the others from the lowest."""

    @pytest.mark.parametrize(("table", "held", "memory", "expected"), [
        # A100 80GB: 1g.10gb 9,728 MiB, 2g.20gb 19,968, 3g.40gb 40,192, 7g.79gb 80,896.
        (A100_80GB, (), 8000, ("1g.10gb", 6)),
        (A100_80GB, (), 9728, ("1g.10gb", 6)),
        (A100_80GB, (), 9729, ("2g.20gb", 0)),
        (A100_80GB, (), 30000, ("3g.40gb", 4)),
        (A100_80GB, (), 50000, ("7g.79gb", 0)),
        (A100_80GB, (8000,), 8000, ("1g.10gb", 5)),
        # 1g at slice 6 leaves 3g only its low placement, and 2g its low ones.
        (A100_80GB, (8000,), 30000, ("3g.40gb", 0)),
        (A100_80GB, (8000,), 15000, ("2g.20gb", 0)),
        # 2g at 0 and 2g at 2: the 1g placements left are 4, 5, 6 (6 first).
        (A100_80GB, (15000, 15000), 8000, ("1g.10gb", 6)),
        # Both 3g halves taken: 1,536 MiB left on the card, and no slice for a 1g.
        (A100_80GB, (30000, 30000), 1000, None),
        # Six 1g instances (6 down to 1): the last 1g goes to 0; a 2g finds no pair.
        (A100_80GB, (8000,) * 6, 8000, ("1g.10gb", 0)),
        (A100_80GB, (8000,) * 6, 15000, None),
        # H100 80GB: 1g.10gb 9,984 MiB, 2g.20gb 20,096, 3g.40gb 40,448, 7g.80gb 81,152.
        (H100_80GB, (), 8000, ("1g.10gb", 6)),
        (H100_80GB, (), 9984, ("1g.10gb", 6)),
        (H100_80GB, (), 10000, ("2g.20gb", 0)),
        (H100_80GB, (), 40448, ("3g.40gb", 4)),
        (H100_80GB, (), 40449, ("7g.80gb", 0)),
        (H100_80GB, (40000,), 40000, ("3g.40gb", 0)),
        (H100_80GB, (10000,), 10000, ("2g.20gb", 2)),
        # H200, NVML's figures read on a real H200: 1g.18gb 16,384 MiB, 2g.35gb 33,280,
        # 3g.71gb 71,424, 7g.141gb 143,360.
        (H200_141GB, (), 16384, ("1g.18gb", 6)),
        (H200_141GB, (), 16385, ("2g.35gb", 0)),
        (H200_141GB, (), 71424, ("3g.71gb", 4)),
        (H200_141GB, (), 71425, ("7g.141gb", 0)),
        (H200_141GB, (33000,), 33000, ("2g.35gb", 2)),
    ])
    def test_the_instance_chosen_for_one_container(
            self, table: MigCardTable, held: tuple[int, ...], memory: int,
            expected: tuple[str, int] | None) -> None:
        fleet = fleet_of(mig_node(table=table))
        booked(fleet, *held)
        decision = run(fleet, manifest(gpumem=memory, annotations=MIG))
        if expected is None:
            assert decision.failed_nodes == {"n": "1/1 CardMigTopologyInfeasible"}
        else:
            assert chosen(decision) == [[(0, *expected)]]

    def test_the_grant_carries_the_profiles_memory_and_compute_share(self) -> None:
        fleet = fleet_of(mig_node())
        decision = run(fleet, manifest(gpumem=8000))
        # 14 of the 7g instance's 98 multiprocessors, rounded up: 15 %.
        assert decision.annotations()["hami.io/vgpu-devices-allocated"] == (
            "GPU-n-0,NVIDIA,9728,15:;")

    @pytest.mark.parametrize(("limits", "expected"), [
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50}, ("7g.79gb", 0)),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 20}, ("2g.20gb", 0)),
        # The whole card: the largest profile (HAMi asks 81,920 MiB, which none holds).
        ({"nvidia.com/gpu": 1}, ("7g.79gb", 0)),
    ])
    def test_a_share_of_the_card_is_a_share_of_its_memory(
            self, limits: dict[str, int], expected: tuple[str, int]) -> None:
        fleet = fleet_of(mig_node())
        decision = run(fleet, manifest(containers=[limits]))
        assert chosen(decision) == [[(0, *expected)]]

    def test_a_request_over_the_cards_free_memory_fails_the_memory_check_first(self) -> None:
        fleet = fleet_of(mig_node())
        booked(fleet, 50000)
        decision = run(fleet, manifest(gpumem=40000))
        assert decision.failed_nodes == {"n": "1/1 CardInsufficientMemory"}


class TestSeveralInstances:
    def test_one_container_takes_several_instances_of_one_card(self) -> None:
        fleet = fleet_of(mig_node(cards=2))
        decision = run(fleet, manifest(gpus=3, gpumem=8000))
        assert chosen(decision) == [[(0, "1g.10gb", 6), (0, "1g.10gb", 5),
                                     (0, "1g.10gb", 4)]]
        assert [r.device_index for r in decode_reservations(
            decision.annotations()[MIG_ALLOCATIONS_ANNOTATION])] == [0, 1, 2]

    def test_asking_more_cards_than_the_node_has_is_no_node_failure_on_mig(self) -> None:
        fleet = fleet_of(mig_node(cards=1))
        decision = run(fleet, manifest(gpus=2, gpumem=30000))
        assert chosen(decision) == [[(0, "3g.40gb", 4), (0, "3g.40gb", 0)]]

    def test_instances_spill_to_the_next_card_when_one_is_full(self) -> None:
        fleet = fleet_of(mig_node(cards=2))
        decision = run(fleet, manifest(gpus=3, gpumem=30000))
        assert chosen(decision) == [[(0, "3g.40gb", 4), (0, "3g.40gb", 0),
                                     (1, "3g.40gb", 4)]]

    def test_later_containers_see_the_instances_of_earlier_ones(self) -> None:
        fleet = fleet_of(mig_node())
        decision = run(fleet, manifest(containers=[
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 30000},
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 30000},
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}]))
        assert decision.failed_nodes == {"n": "1/1 CardMigTopologyInfeasible"}
        decision = run(fleet, manifest(containers=[
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 30000},
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000}]))
        assert chosen(decision) == [[(0, "3g.40gb", 4)], [(0, "1g.10gb", 3)]]

    def test_a_node_without_room_for_all_the_instances_says_so(self) -> None:
        fleet = fleet_of(mig_node())
        decision = run(fleet, manifest(gpus=3, gpumem=30000))
        assert decision.failed_nodes == {"n": "2/1 AllocatedCardsInsufficientRequest"}


class TestModes:
    @pytest.mark.parametrize(("mode", "on_mig", "on_shared"), [
        (None, True, True),
        ("mig", True, False),
        ("hami-core", False, True),
        ("mig,hami-core", True, True),
        ("hami-core, mig", True, True),
        ("mps", False, False),
    ])
    def test_vgpu_mode_picks_the_cards_as_hami_does(
            self, mode: str | None, on_mig: bool, on_shared: bool) -> None:
        annotations = {} if mode is None else {"nvidia.com/vgpu-mode": mode}
        for fleet, fits in ((fleet_of(mig_node(cards=2)), on_mig),
                            (fleet_of(node("n", 2)), on_shared)):
            decision = run(fleet, manifest(gpumem=8000, annotations=annotations))
            assert decision.scheduled is fits
            if not fits:
                assert decision.failed_nodes == {"n": "2/2 CardTypeMismatch"}

    @pytest.mark.parametrize("mode", ["", "MIG", "gpu", "mig;hami-core", "mig,"])
    def test_a_mode_hami_does_not_know_is_refused_naming_the_annotation(
            self, mode: str) -> None:
        decision = run(fleet_of(mig_node()), manifest(annotations={
            "nvidia.com/vgpu-mode": mode}))
        assert not decision.scheduled
        assert decision.reason is not None
        assert decision.reason.startswith("nvidia.com/vgpu-mode: ")

    def test_a_hami_core_pod_on_a_mixed_cluster_goes_to_the_shared_node(self) -> None:
        fleet = fleet_of(mig_node("a-mig"), node("b-shared", 1))
        decision = run(fleet, manifest(gpumem=8000, annotations={
            "nvidia.com/vgpu-mode": "hami-core"}))
        assert decision.node == "b-shared"
        assert decision.failed_nodes == {"a-mig": "1/1 CardTypeMismatch"}
        assert MIG_ALLOCATIONS_ANNOTATION not in decision.annotations()


class TestReservationAnnotation:
    def test_written_as_hamis_json_with_the_allocation(self) -> None:
        fleet = fleet_of(mig_node())
        decision = run(fleet, manifest(gpumem=8000, annotations=MIG))
        assert json.loads(decision.annotations()[MIG_ALLOCATIONS_ANNOTATION]) == [{
            "containerIndex": 0, "deviceIndex": 0, "gpuUUID": "GPU-n-0",
            "profile": "1g.10gb", "placement": {"start": 6, "size": 1}}]

    def test_container_index_counts_init_containers_first(self) -> None:
        fleet = fleet_of(mig_node())
        decision = run(fleet, manifest(
            init_containers=[{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000}],
            containers=[{}, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 15000}]))
        entries = decode_reservations(decision.annotations()[MIG_ALLOCATIONS_ANNOTATION])
        assert [(r.container_index, r.profile, r.placement.start) for r in entries] == [
            (0, "1g.10gb", 6), (2, "2g.20gb", 0)]

    def test_read_back_it_restores_the_instances_on_the_grants(self) -> None:
        fleet = fleet_of(mig_node())
        decision = run(fleet, manifest(gpus=2, gpumem=8000))
        notes = decision.annotations()
        containers = with_reservations(
            decode_devices(notes["hami.io/vgpu-devices-allocated"]),
            decode_reservations(notes[MIG_ALLOCATIONS_ANNOTATION]))
        assert decision.allocation is not None
        assert containers == decision.allocation.containers

    def test_runtime_identity_round_trips_and_is_left_out_until_set(self) -> None:
        text = ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-1","profile":"1g.10gb",'
                '"placement":{"start":6,"size":1},"migUUID":"MIG-1","gpuInstanceID":13,'
                '"computeInstanceID":0}]')
        entries = decode_reservations(text)
        assert entries[0].live and entries[0].compute_instance_id == 0
        assert encode_reservations(entries) == text

    @pytest.mark.parametrize(("text", "says"), [
        ("{", "is not a JSON list"),
        ('{"containerIndex":0}', "is not a JSON list"),
        ('[{"deviceIndex":0,"gpuUUID":"G","profile":"1g.10gb",'
         '"placement":{"start":0,"size":1},"containerIndex":-1}]', "0 is incomplete"),
        ('[{"containerIndex":0,"deviceIndex":0,"profile":"1g.10gb",'
         '"placement":{"start":0,"size":1}}]', "0 is incomplete"),
        ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.10gb",'
         '"placement":{"start":0,"size":0}}]', "0 is incomplete"),
        ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.10gb",'
         '"placement":{"start":0,"size":1},"migUUID":"MIG-1"}]', "partial runtime identity"),
        ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.10gb",'
         '"placement":{"start":0,"size":1},"gpuInstanceID":1,"computeInstanceID":0}]',
         "partial runtime identity"),
        ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.10gb",'
         '"placement":{"start":0,"size":1}},{"containerIndex":0,"deviceIndex":0,'
         '"gpuUUID":"G","profile":"1g.10gb","placement":{"start":1,"size":1}}]',
         "1 repeats container 0 device 0"),
        ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"big",'
         '"placement":{"start":0,"size":1}}]', "not of the form <n>g.<...>"),
        ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.10gb",'
         '"placement":{"start":0,"size":4294967295}}]', "beyond 64 slices"),
    ])
    def test_hamis_rules_refuse_a_malformed_annotation_naming_the_entry(
            self, text: str, says: str) -> None:
        with pytest.raises(MigReservationError) as error:
            decode_reservations(text)
        assert str(error.value).startswith(f"{MIG_ALLOCATIONS_ANNOTATION}: ")
        assert says in str(error.value)

    def test_an_empty_annotation_holds_no_reservation(self) -> None:
        assert decode_reservations("") == ()

    @pytest.mark.parametrize(("reservation", "says"), [
        ('"containerIndex":1,"deviceIndex":0,"gpuUUID":"GPU-n-0"', "is not in"),
        ('"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-other"', "names card"),
    ])
    def test_a_reservation_the_allocation_does_not_hold_is_refused(
            self, reservation: str, says: str) -> None:
        entries = decode_reservations(
            f'[{{{reservation},"profile":"1g.10gb","placement":{{"start":6,"size":1}}}}]')
        with pytest.raises(MigReservationError, match=says):
            with_reservations(decode_devices("GPU-n-0,NVIDIA,9728,15:;"), entries)


class TestLedger:
    def test_a_released_instance_frees_its_placement(self) -> None:
        fleet = fleet_of(mig_node())
        booked(fleet, 8000, 8000)
        assert fleet.instances("n", "GPU-n-0") == (MigPlacement(6, 1), MigPlacement(5, 1))
        fleet.release("default/held-0")
        assert fleet.instances("n", "GPU-n-0") == (MigPlacement(5, 1),)
        assert chosen(run(fleet, manifest(gpumem=8000))) == [[(0, "1g.10gb", 6)]]

    def test_a_copy_of_the_fleet_books_its_instances_apart(self) -> None:
        fleet = fleet_of(mig_node())
        booked(fleet, 30000)
        trial = fleet.copy()
        assert place(trial, manifest("t", gpumem=30000)).scheduled
        assert chosen(run(fleet, manifest(gpumem=30000))) == [[(0, "3g.40gb", 0)]]
        assert not run(trial, manifest(gpumem=30000)).scheduled


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from([4000, 9000, 9984, 15000, 20096, 30000,
                                                 40448, 60000]),
                                st.integers(1, 3), st.booleans()),
                      min_size=1, max_size=25),
       table=st.sampled_from([A100_80GB, H100_80GB, H200_141GB]))
def test_no_two_instances_on_a_card_overlap_and_each_is_a_placement_nvml_offers(
        steps: list[tuple[int, int, bool]], table: MigCardTable) -> None:
    fleet = fleet_of(mig_node(cards=2, table=table))
    offered = {(p.name, q) for p in mig_profiles_of(table)
               for q in p.placements}
    placed: list[str] = []
    for i, (memory, cards, release_one) in enumerate(steps):
        if release_one and placed:
            fleet.release(placed.pop(0))
        decision = place(fleet, manifest(f"p{i}", gpus=cards, gpumem=memory))
        if decision.scheduled:
            placed.append(decision.pod)
        for uuid in ("GPU-n-0", "GPU-n-1"):
            held = fleet.instances("n", uuid)
            for a in range(len(held)):
                for b in range(a + 1, len(held)):
                    assert not held[a].overlaps(held[b]), (uuid, held)
        for allocation in fleet.allocations().values():
            for grants in allocation.containers:
                for grant in grants:
                    assert grant.instance is not None
                    assert (grant.instance.profile, grant.instance.placement) in offered


def test_select_instance_prefers_less_memory_then_fewer_slices() -> None:
    profiles = mig_profiles_of(A100_80GB)
    # 3g.40gb and a 4g of the same memory: the 3g (fewer slices) first.
    with_4g = register_profiles(A100_80GB.profiles, ("4g.40gb", "3g.40gb"))
    found = select_instance(with_4g, (), 30000)
    assert found is not None and found.profile == "3g.40gb"
    assert select_instance(profiles, [MigPlacement(0, 8)], 1) is None


_reservation_fields = st.fixed_dictionaries({}, optional={
    "containerIndex": st.one_of(st.integers(-2, 3), st.integers(), st.text(max_size=3)),
    "deviceIndex": st.one_of(st.integers(-2, 3), st.none()),
    "gpuUUID": st.one_of(st.sampled_from(["GPU-n-0", "GPU-n-1", ""]), st.text(max_size=8)),
    "profile": st.one_of(st.sampled_from(["1g.10gb", "7g.79gb", "0g.x", "g.", ""]),
                         st.text(max_size=12)),
    "placement": st.one_of(st.fixed_dictionaries({}, optional={
        "start": st.one_of(st.integers(-1, 9), st.integers()),
        "size": st.one_of(st.integers(-1, 9), st.integers())}), st.text(max_size=4)),
    "migUUID": st.text(max_size=8), "gpuInstanceID": st.one_of(st.integers(), st.none()),
    "computeInstanceID": st.one_of(st.integers(), st.floats(), st.none())})


@settings(max_examples=300, deadline=None)
@given(document=st.one_of(st.lists(_reservation_fields, max_size=4), st.text(max_size=40),
                          _reservation_fields))
def test_fuzzed_reservation_annotations_are_read_or_refused_with_one_line(
        document: object) -> None:
    text = document if isinstance(document, str) else json.dumps(document)
    try:
        containers = decode_allocation("GPU-n-0,NVIDIA,9728,15:GPU-n-1,NVIDIA,9728,15:;",
                                       text)
    except AnnotationError as error:
        assert "\n" not in str(error)
        assert str(error).startswith(MIG_ALLOCATIONS_ANNOTATION)
        return
    for grants in containers:
        for grant in grants:
            if grant.instance is not None:
                assert 0 < grant.instance.placement.size <= 64


class TestConsistency:
    """HAMi's checks: a card the ledger's MIG reservations contradict is unhealthy while
    they do."""

    def test_a_mig_card_held_without_a_reservation_is_judged_unhealthy(self) -> None:
        fleet = fleet_of(mig_node(cards=2))
        fleet.allocate("default/odd", Allocation("n", ((CardGrant("GPU-n-0", 9728, 15),),)))
        assert fleet.inconsistencies() == {
            ("n", "GPU-n-0"): "a pod holds this MIG card without a MIG reservation"}
        decision = run(fleet, manifest(gpumem=8000, policy="binpack"))
        assert chosen(decision) == [[(1, "1g.10gb", 6)]]
        fleet.release("default/odd")
        assert fleet.inconsistencies() == {}
        assert chosen(run(fleet, manifest(gpumem=8000, policy="binpack"))) == [
            [(0, "1g.10gb", 6)]]

    def test_a_reservation_on_a_shared_card_makes_it_unhealthy(self) -> None:
        fleet = fleet_of(node("n", 1))
        fleet.allocate("default/odd", Allocation("n", ((CardGrant(
            "GPU-n-0", 1000, 0, MigInstance("1g.10gb", MigPlacement(6, 1))),),)))
        assert fleet.inconsistencies() == {
            ("n", "GPU-n-0"): "a MIG reservation names this card, which is not in MIG mode"}
        assert run(fleet, manifest(gpumem=1000)).failed_nodes == {"n": "1/1 CardNotHealth"}
