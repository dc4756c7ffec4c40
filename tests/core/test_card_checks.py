"""The per-card checks, their order, and the reason each one reports."""

from __future__ import annotations

from typing import Any

import pytest

from common.core import Node, PodManifest
from tests.builders import (
    T4_MEMORY,
    fleet_of,
    hold,
    indexes,
    manifest,
    node,
    node_with,
    place,
    run,
)


def reason_for(fleet_node: Node, pod: PodManifest) -> str:
    decision = run(fleet_of(fleet_node), pod)
    assert not decision.scheduled
    assert decision.failed_nodes is not None
    return decision.failed_nodes[fleet_node.name]


class TestEachReason:
    @pytest.mark.parametrize(("node_fields", "pod_fields", "reason"), [
        ({"cards": 1, "health": False}, {}, "1/1 CardNotHealth"),
        ({"cards": 2, "annotations": {"hami.io/device-cordon": " GPU-n-0 ,GPU-n-1"}}, {},
         "2/2 CardCordoned"),
        ({"cards": 2}, {"annotations": {"nvidia.com/use-gputype": "a100,H100"}},
         "2/2 CardTypeMismatch"),
        ({"cards": 2}, {"annotations": {"nvidia.com/nouse-gputype": "tesla"}},
         "2/2 CardTypeMismatch"),
        ({"cards": 2}, {"annotations": {"nvidia.com/use-gpuuuid": "GPU-other"}},
         "2/2 CardUuidMismatch"),
        ({"cards": 2}, {"annotations": {"nvidia.com/nouse-gpuuuid": "GPU-n-0, GPU-n-1"}},
         "2/2 CardUuidMismatch"),
        # Tenants the agent sees (``processes``) take slots.
        ({"cards": 1, "count": 3, "processes": 3}, {}, "1/1 CardTimeSlicingExhausted"),
        ({"cards": 1, "processes": 1}, {"policy": "mutex"}, "1/1 ExclusiveDeviceAllocateConflict"),
    ], ids=["unhealthy-card", "cordoned-by-node-annotation", "use-gputype", "nouse-gputype",
            "use-gpuuuid", "nouse-gpuuuid", "processes-fill-the-slots",
            "a-process-keeps-a-mutex-pod-away"])
    def test_a_card_failing_one_check_reports_its_reason(self, node_fields: dict[str, Any],
                                                         pod_fields: dict[str, Any],
                                                         reason: str) -> None:
        assert reason_for(node("n", **node_fields), manifest(**pod_fields)) == reason

    @pytest.mark.parametrize(("seen", "more"), [(1, 3), (3, 3), (4, 0)],
                             ids=["the-booked-pod-seen", "two-more-seen", "four-seen"])
    def test_tenants_seen_and_booked_overlap_in_the_slots(self, seen: int, more: int) -> None:
        # A split-4 card whose agent sees ``seen`` tenants, one pod booked on it: the booked
        # pod is among those seen (the larger figure counts, not the sum).
        fleet = fleet_of(node("n", 1, count=4, processes=seen))
        hold(fleet, "default/booked", "n", "GPU-n-0")
        placed = [place(fleet, manifest(f"p{i}")).scheduled for i in range(4)]
        assert placed == [True] * more + [False] * (4 - more)

    def test_time_slicing_exhausted(self) -> None:
        fleet = fleet_of(node("n", 1, count=2))
        hold(fleet, "default/a", "n", "GPU-n-0")
        hold(fleet, "default/b", "n", "GPU-n-0")
        decision = run(fleet, manifest())
        assert decision.failed_nodes == {"n": "1/1 CardTimeSlicingExhausted"}

    def test_mutex_refuses_a_card_with_one_small_tenant(self) -> None:
        fleet = fleet_of(node("n", 1))
        hold(fleet, "default/tiny", "n", "GPU-n-0", memory=1)
        decision = run(fleet, manifest(policy="mutex"))
        assert decision.failed_nodes == {"n": "1/1 ExclusiveDeviceAllocateConflict"}

    def test_insufficient_memory(self) -> None:
        fleet = fleet_of(node("n", 1))
        hold(fleet, "default/big", "n", "GPU-n-0", memory=T4_MEMORY - 999)
        decision = run(fleet, manifest(gpumem=1000))
        assert decision.failed_nodes == {"n": "1/1 CardInsufficientMemory"}
        assert run(fleet, manifest(gpumem=999)).scheduled

    def test_insufficient_core(self) -> None:
        fleet = fleet_of(node("n", 1))
        hold(fleet, "default/a", "n", "GPU-n-0", cores=80)
        pod = manifest(containers=[{"nvidia.com/gpumem": 10, "nvidia.com/gpucores": 30}])
        assert run(fleet, pod).failed_nodes == {"n": "1/1 CardInsufficientCore"}
        pod = manifest(containers=[{"nvidia.com/gpumem": 10, "nvidia.com/gpucores": 20}])
        assert run(fleet, pod).scheduled

    def test_a_whole_card_request_needs_a_card_without_tenants(self) -> None:
        fleet = fleet_of(node("n", 1))
        hold(fleet, "default/a", "n", "GPU-n-0", memory=10, cores=0)
        pod = manifest(containers=[{"nvidia.com/gpumem": 10, "nvidia.com/gpucores": 100}])
        assert run(fleet, pod).failed_nodes == {"n": "1/1 ExclusiveDeviceAllocateConflict"}

    def test_zero_core_request_on_a_fully_core_booked_card(self) -> None:
        fleet = fleet_of(node("n", 1))
        hold(fleet, "default/a", "n", "GPU-n-0", memory=10, cores=100)
        decision = run(fleet, manifest(gpumem=10))
        assert decision.failed_nodes == {"n": "1/1 CardComputeUnitsExhausted"}


class TestOrder:
    def test_the_first_failing_check_is_the_cards_reason(self) -> None:
        # Card 0: unhealthy and cordoned; card 1: cordoned and wrong uuid;
        # card 2: wrong uuid and full; card 3: full slots and busy (mutex).
        fleet = fleet_of(node_with(
            "n", {"health": False}, {}, {}, {"count": 1},
            annotations={"hami.io/device-cordon": "GPU-n-0,GPU-n-1"},
        ))
        hold(fleet, "default/a", "n", "GPU-n-2", memory=T4_MEMORY)
        hold(fleet, "default/b", "n", "GPU-n-3")
        pod = manifest(policy="mutex", annotations={"nvidia.com/use-gpuuuid": "GPU-n-0,GPU-n-3"})
        assert run(fleet, pod).failed_nodes == {
            "n": "1/4 CardCordoned, 1/4 CardNotHealth, 1/4 CardTimeSlicingExhausted, "
            "1/4 CardUuidMismatch"
        }

    def test_mutex_conflict_is_reported_before_memory(self) -> None:
        fleet = fleet_of(node("n", 1))
        hold(fleet, "default/a", "n", "GPU-n-0", memory=T4_MEMORY)
        assert run(fleet, manifest(policy="mutex")).failed_nodes == {
            "n": "1/1 ExclusiveDeviceAllocateConflict"
        }
        assert run(fleet, manifest()).failed_nodes == {"n": "1/1 CardInsufficientMemory"}

    def test_memory_is_checked_before_cores(self) -> None:
        fleet = fleet_of(node("n", 1))
        hold(fleet, "default/a", "n", "GPU-n-0", memory=T4_MEMORY, cores=100)
        pod = manifest(containers=[{"nvidia.com/gpumem": 1, "nvidia.com/gpucores": 1}])
        assert run(fleet, pod).failed_nodes == {"n": "1/1 CardInsufficientMemory"}


class TestUseAndNouse:
    def test_use_gpuuuid_pins_the_card(self) -> None:
        pod = manifest(annotations={"nvidia.com/use-gpuuuid": " GPU-n-2 "})
        assert indexes(run(fleet_of(node("n", 4)), pod)) == [[2]]

    def test_nouse_gpuuuid_skips_the_card(self) -> None:
        pod = manifest(annotations={"nvidia.com/nouse-gpuuuid": "GPU-n-0"})
        assert indexes(run(fleet_of(node("n", 4)), pod)) == [[1]]

    def test_uuid_match_is_exact_not_substring(self) -> None:
        pod = manifest(annotations={"nvidia.com/use-gpuuuid": "GPU-n"})
        assert not run(fleet_of(node("n", 2)), pod).scheduled

    def test_gputype_is_a_case_insensitive_substring(self) -> None:
        fleet = fleet_of(node_with("n", {"type": "NVIDIA-Tesla T4"},
                                   {"type": "NVIDIA-A100-SXM4-80GB"}))
        pod = manifest(annotations={"nvidia.com/use-gputype": "a100"})
        assert indexes(run(fleet, pod)) == [[1]]
        pod = manifest(annotations={"nvidia.com/nouse-gputype": "T4"})
        assert indexes(run(fleet, pod)) == [[1]]


    @pytest.mark.parametrize(("wanted", "chosen"), [
        ("A100", [[1]]), ("nvidia a100", [[1]]), ("h100", [[2]]), ("H200", [[3]]),
        ("NVIDIA-Tesla", [[0]]), ("NVIDIA-NVIDIA", []),
    ], ids=["a100", "a100-with-the-vendor", "h100", "h200", "prefixed-tesla",
            "doubled-prefix-matches-nothing"])
    def test_gputype_matches_the_types_as_hami_registers_them(
            self, wanted: str, chosen: list[list[int]]) -> None:
        # The NVML name, NVIDIA- before it only where it lacks NVIDIA (the agent's types).
        fleet = fleet_of(node_with("n", {"type": "NVIDIA-Tesla T4"},
                                   {"type": "NVIDIA A100-SXM4-80GB"},
                                   {"type": "NVIDIA H100 80GB HBM3"}, {"type": "NVIDIA H200"}))
        pod = manifest(annotations={"nvidia.com/use-gputype": wanted})
        assert indexes(run(fleet, pod)) == chosen


class TestScoringWeights:
    @pytest.mark.parametrize(
        ("weights", "expected"),
        [
            # Card 0: 2 tenants of 100 MiB; card 1: 1 tenant of 6000 MiB.
            ("slot=1,core=0,memory=0", 0),
            ("memory=1,slot=0,core=0", 1),
            ("slot=1,core=1,memory=1", 1),
            ("slot=10, core=0, memory=1", 0),
        ],
    )
    def test_weights_change_the_binpack_choice(self, weights: str, expected: int) -> None:
        fleet = fleet_of(node("n", 2))
        hold(fleet, "default/a", "n", "GPU-n-0", memory=100)
        hold(fleet, "default/b", "n", "GPU-n-0", memory=100)
        hold(fleet, "default/c", "n", "GPU-n-1", memory=6000)
        pod = manifest(policy="binpack",
                       annotations={"hami.io/device-scoring-weights": weights})
        assert indexes(run(fleet, pod)) == [[expected]]

    def test_score_formula_on_the_worked_example(self) -> None:
        fleet = fleet_of(node("n", 1))
        hold(fleet, "default/a", "n", "GPU-n-0", memory=1000, cores=30)
        pod = manifest(annotations={"hami.io/device-scoring-weights": "slot=2,core=3,memory=0"})
        decision = run(fleet, pod, explain=True)
        assert decision.explain is not None
        # 10 * (2 * 1/10 + 3 * 30/100 + 0) = 11.0
        assert decision.explain[0].score == 11.0
