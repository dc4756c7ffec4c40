"""Choosing the node, and the reasons every other node gets."""

from __future__ import annotations

import pytest

from common.core import Defaults, Fleet, NodePolicy, decide, parse_default_chain, parse_pod
from pyhami.sandbox import DEFAULTS
from tests.builders import fleet_of, hold, manifest, node, place, run


class TestNodePolicy:
    def test_default_binpack_takes_the_busiest_node(self) -> None:
        fleet = fleet_of(node("a", 2), node("b", 2))
        hold(fleet, "default/x", "b", "GPU-b-0", memory=4000)
        assert run(fleet, manifest()).node == "b"

    def test_spread_annotation_takes_the_idlest_node(self) -> None:
        fleet = fleet_of(node("a", 2), node("b", 2))
        hold(fleet, "default/x", "a", "GPU-a-0", memory=4000)
        pod = manifest(annotations={"hami.io/node-scheduler-policy": "spread"})
        assert run(fleet, pod).node == "b"

    def test_the_cluster_default_node_policy_applies_without_annotation(self) -> None:
        fleet = fleet_of(node("a", 2), node("b", 2))
        hold(fleet, "default/x", "a", "GPU-a-0", memory=4000)
        spread = Defaults(parse_default_chain("spread"), NodePolicy.SPREAD)
        assert run(fleet, manifest(), spread).node == "b"
        assert run(fleet, manifest()).node == "a"

    def test_ties_go_to_the_name_that_sorts_first(self) -> None:
        fleet = fleet_of(node("zeta", 2), node("alpha", 2), node("mid", 2))
        assert run(fleet, manifest()).node == "alpha"
        pod = manifest(annotations={"hami.io/node-scheduler-policy": "spread"})
        assert run(fleet, pod).node == "alpha"

    def test_the_busiest_node_is_skipped_when_it_does_not_fit(self) -> None:
        fleet = fleet_of(node("a", 1), node("b", 1), node("c", 1))
        hold(fleet, "default/x", "a", "GPU-a-0", memory=15000)
        hold(fleet, "default/y", "b", "GPU-b-0", memory=2000)
        decision = run(fleet, manifest(gpumem=1000))
        assert decision.node == "b"
        assert decision.failed_nodes == {"a": "1/1 CardInsufficientMemory"}

    def test_node_score_counts_processes_the_agent_sees(self) -> None:
        fleet = fleet_of(node("a", 2), node("b", 2, processes=1))
        assert run(fleet, manifest()).node == "b"

    def test_only_the_nodes_asked_about_are_considered(self) -> None:
        fleet = fleet_of(node("a", 1), node("b", 1), node("c", 1, health=False))
        hold(fleet, "default/x", "a", "GPU-a-0")
        request = parse_pod(manifest(), DEFAULTS)
        decision = decide(fleet, request, nodes=["b", "c", "unknown"])
        assert decision.node == "b"
        assert decision.failed_nodes == {"c": "1/1 CardNotHealth"}


class TestFittingNodes:
    """``Decision.fitting``: every node that holds the pod with its score, best first."""

    @staticmethod
    def _fleet() -> Fleet:
        fleet = fleet_of(node("a", 1), node("b", 1), node("c", 1), node("d", 1))
        hold(fleet, "default/x", "a", "GPU-a-0", memory=15000)  # full: fails
        hold(fleet, "default/y", "c", "GPU-c-0", memory=2000)
        return fleet

    @pytest.mark.parametrize(("policy", "order"), [
        ("binpack", ["c", "b", "d"]),  # the busiest first, then the ties by name
        ("spread", ["b", "d", "c"]),
    ])
    def test_best_first_by_the_node_policy(self, policy: str, order: list[str]) -> None:
        pod = manifest(gpumem=1000, annotations={"hami.io/node-scheduler-policy": policy})
        decision = run(self._fleet(), pod)
        assert decision.fitting is not None
        assert list(decision.fitting) == order
        assert decision.node == order[0]
        assert decision.fitting["b"] == 0.0
        assert decision.fitting["c"] > 0.0
        assert "a" not in decision.fitting

    def test_only_the_nodes_asked_about(self) -> None:
        request = parse_pod(manifest(gpumem=1000), DEFAULTS)
        decision = decide(self._fleet(), request, nodes=["a", "d"])
        assert decision.fitting is not None
        assert list(decision.fitting) == ["d"]

    def test_kept_as_decided_when_the_fleet_changes_after(self) -> None:
        fleet = self._fleet()
        decision = run(fleet, manifest(gpumem=1000))
        hold(fleet, "default/z", "b", "GPU-b-0", memory=9000)
        assert decision.fitting is not None
        assert decision.fitting["b"] == 0.0

    def test_none_fit(self) -> None:
        decision = run(self._fleet(), manifest(gpumem=16000))
        assert decision.fitting is not None
        assert len(decision.fitting) == 0


class TestReasons:
    def test_every_failing_node_gets_its_own_reason(self) -> None:
        fleet = fleet_of(node("a", 2, health=False), node("b", 3), node("c", 1))
        for gpu in range(3):
            hold(fleet, f"default/b{gpu}", "b", f"GPU-b-{gpu}")
        decision = run(fleet, manifest(gpus=2, policy="mutex"))
        assert not decision.scheduled
        assert decision.node is None
        assert decision.failed_nodes == {
            "a": "2/2 CardNotHealth",
            "b": "3/3 ExclusiveDeviceAllocateConflict",
            "c": "1/1 NodeInsufficientDevice",
        }

    def test_reasons_are_sorted_as_strings(self) -> None:
        fleet = fleet_of(node("n", 12, count=1))
        for gpu in range(10):
            hold(fleet, f"default/p{gpu}", "n", f"GPU-n-{gpu}")
        decision = run(fleet, manifest(gpus=3))
        # "10/12 ..." sorts before "2/12 ..." as a string.
        assert decision.failed_nodes == {
            "n": "10/12 CardTimeSlicingExhausted, 2/12 AllocatedCardsInsufficientRequest"
        }

    def test_placing_pods_moves_the_node_score(self) -> None:
        fleet = fleet_of(node("a", 1), node("b", 1))
        assert place(fleet, manifest(name="p1")).node == "a"
        assert place(fleet, manifest(name="p2")).node == "a"
        fleet.release("default/p1")
        fleet.release("default/p2")
        hold(fleet, "default/q", "b", "GPU-b-0")
        assert run(fleet, manifest(name="p3")).node == "b"


# Sixteen nodes: one full (its failing row copied alone), three, and twelve (the whole
# table of counts copied): the reasons are the decision's, whatever changes after it.
@pytest.mark.parametrize("full", [1, 3, 12])
def test_the_reasons_of_failing_nodes_are_those_at_the_decision(full: int) -> None:
    fleet = fleet_of(*(node(f"n{i:02d}", cards=1) for i in range(16)))
    for i in range(full):
        hold(fleet, f"ns/filler-{i}", f"n{i:02d}", f"GPU-n{i:02d}-0", memory=15000)
    decision = run(fleet, manifest("p", gpumem=1000))
    assert decision.node is not None
    # The first full node freed, and a decision after it: the counts kept for the pod's
    # shape are brought up to date in place.
    fleet.release("ns/filler-0")
    assert run(fleet, manifest("q", gpumem=1000)).node is not None
    assert decision.failed_nodes == {f"n{i:02d}": "1/1 CardInsufficientMemory"
                                     for i in range(full)}
