"""Containers of one pod placed in order; init containers at their peak."""

from __future__ import annotations

from typing import Any

import pytest

from common.core import Allocation, CardGrant, Usage, decode_devices, encode_devices
from tests.builders import T4_MEMORY, fleet_of, hold, indexes, manifest, node, place, run

GPU = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}


class TestAppContainers:
    @pytest.mark.parametrize(("node_fields", "policy", "cards"), [
        ({"cards": 2, "count": 1}, None, [[0], [1]]),
        ({"cards": 2}, "binpack", [[0], [0]]),
        ({"cards": 3}, "mutex", [[0], [1]]),
    ], ids=["each-container-sees-the-cards-taken-before-it",
            "binpack-keeps-stacking-the-pods-containers",
            "mutex-applies-to-the-pods-own-earlier-containers"])
    def test_two_containers_take_their_cards_in_order(self, node_fields: dict[str, Any],
                                                      policy: str | None,
                                                      cards: list[list[int]]) -> None:
        fleet = fleet_of(node("n", **node_fields))
        decision = run(fleet, manifest(policy=policy, containers=[GPU, GPU]))
        assert indexes(decision) == cards

    def test_a_later_container_that_does_not_fit_fails_the_node(self) -> None:
        fleet = fleet_of(node("n", 2, count=1))
        decision = run(fleet, manifest(containers=[GPU, GPU, GPU]))
        assert decision.failed_nodes == {
            "n": "2/2 CardTimeSlicingExhausted"
        }

    def test_scores_count_existing_usage_only_not_the_pod_itself(self) -> None:
        fleet = fleet_of(node("n", 2))
        hold(fleet, "default/x", "n", "GPU-n-1")
        # Spread: card 0 is idle, the pod's first container takes it; the second
        # still ranks card 0 first since its own container does not raise the score.
        decision = run(fleet, manifest(containers=[GPU, GPU]))
        assert indexes(decision) == [[0], [0]]

    def test_containers_without_gpu_are_bare_in_the_annotation(self) -> None:
        fleet = fleet_of(node("n", 1))
        decision = run(fleet, manifest(containers=[{}, GPU]))
        assert decision.annotations()["hami.io/vgpu-devices-allocated"] == (
            ";GPU-n-0,NVIDIA,1000,0:;"
        )
        assert indexes(decision) == [[0]]


class TestInitContainers:
    def test_init_containers_come_first_in_the_annotation(self) -> None:
        fleet = fleet_of(node("n", 2))
        decision = run(fleet, manifest(policy="binpack", init_containers=[GPU],
                                       containers=[{"nvidia.com/gpumem": 2000}]))
        assert decision.annotations()["hami.io/vgpu-devices-allocated"] == (
            "GPU-n-0,NVIDIA,1000,0:;GPU-n-0,NVIDIA,2000,0:;"
        )

    def test_an_init_container_is_placed_without_the_app_containers(self) -> None:
        fleet = fleet_of(node("n", 1, count=1))
        decision = run(fleet, manifest(init_containers=[GPU], containers=[GPU]))
        assert indexes(decision) == [[0], [0]]

    def test_init_cards_count_at_their_peak_not_summed(self) -> None:
        fleet = fleet_of(node("n", 1))
        decision = place(fleet, manifest(
            init_containers=[{"nvidia.com/gpumem": 5000, "nvidia.com/gpucores": 10}],
            containers=[{"nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 40}, GPU],
        ))
        assert decision.scheduled
        # App: 2 tenants, 2000 MiB, 40 cores; init peak: 1, 5000, 10.
        assert fleet.usage("n", "GPU-n-0") == Usage(tenants=2, memory=5000, cores=40)


class TestLedger:
    def test_release_returns_the_cards(self) -> None:
        fleet = fleet_of(node("n", 1, count=1))
        assert place(fleet, manifest(name="a")).scheduled
        assert not run(fleet, manifest(name="b")).scheduled
        fleet.release("default/a")
        assert run(fleet, manifest(name="b")).scheduled
        assert fleet.usage("n", "GPU-n-0") == Usage()

    def test_replacing_an_allocation_releases_the_old_one(self) -> None:
        fleet = fleet_of(node("n", 2))
        fleet.allocate("default/a", Allocation("n", ((CardGrant("GPU-n-0", 100, 0),),)))
        fleet.allocate("default/a", Allocation("n", ((CardGrant("GPU-n-1", 200, 0),),)))
        assert fleet.usage("n", "GPU-n-0") == Usage()
        assert fleet.usage("n", "GPU-n-1") == Usage(1, 200, 0)

    def test_usage_on_an_unreported_card_is_kept_and_reported(self) -> None:
        fleet = fleet_of(node("n", 1))
        fleet.allocate("default/a", Allocation("n", ((CardGrant("GPU-gone", 100, 0),),)))
        assert fleet.orphans() == {("n", "GPU-gone"): Usage(1, 100, 0)}

    def test_a_node_reporting_again_keeps_its_usage(self) -> None:
        fleet = fleet_of(node("n", 1, count=2))
        hold(fleet, "default/a", "n", "GPU-n-0", memory=T4_MEMORY - 1000)
        assert run(fleet, manifest()).scheduled
        fleet.upsert_node(node("n", 1, count=2, processes=2))  # changed in place
        assert run(fleet, manifest()).failed_nodes == {"n": "1/1 CardTimeSlicingExhausted"}
        fleet.upsert_node(node("n", 1, count=2))
        assert run(fleet, manifest(gpumem=1000)).scheduled
        assert not run(fleet, manifest(gpumem=1001)).scheduled
        fleet.upsert_node(node("n", 1, count=2, memory=T4_MEMORY + 1))  # rebuilt
        assert run(fleet, manifest(gpumem=1001)).scheduled
        assert fleet.usage("n", "GPU-n-0") == Usage(1, T4_MEMORY - 1000, 0)

    def test_encode_round_trips_through_decode(self) -> None:
        containers = ((CardGrant("GPU-a", 1000, 30), CardGrant("GPU-b", 2, 0)), (),
                      (CardGrant("GPU-c", 0, 100),))
        text = encode_devices(containers)
        assert text == "GPU-a,NVIDIA,1000,30:GPU-b,NVIDIA,2,0:;;GPU-c,NVIDIA,0,100:;"
        assert decode_devices(text) == containers
