"""What a fleet keeps between decisions (card checks per request shape, node scores)
follows every change, also past the end of its change log."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.core import Node, parse_pod
from common.core import fleet as fleet_module
from common.core.fleet import Snapshot
from common.core.placement import PodView
from pyhami.sandbox import DEFAULTS
from tests.builders import (
    T4,
    card,
    fleet_of,
    gpu_limits,
    hold,
    indexes,
    manifest,
    node,
    place,
    run,
)

CORDON = "hami.io/device-cordon"


def test_past_the_end_of_the_change_log_the_kept_checks_are_made_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fleet_module, "CHANGE_LOG_MAX", 3)
    fleet = fleet_of(node("a", cards=2), node("b", cards=2))
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100}
    # Four whole-card pods fill the four cards, the busiest node first (binpack).
    placed = [place(fleet, manifest(f"p{i}", containers=[limits])) for i in range(4)]
    assert [d.node for d in placed] == ["a", "a", "b", "b"]
    assert len(fleet.snapshot.changed) <= 3
    refused = run(fleet, manifest("late", containers=[limits]))
    assert refused.node is None
    # A whole card takes all its memory by default, and memory is checked before cores.
    assert refused.failed_nodes == {"a": "2/2 CardInsufficientMemory",
                                    "b": "2/2 CardInsufficientMemory"}


def test_a_report_that_changes_nothing_logs_no_change() -> None:
    fleet = fleet_of(node("a", cards=2))
    run(fleet, manifest())
    fleet.upsert_node(node("a", cards=2))
    assert fleet.snapshot.changed == []
    fleet.upsert_node(node("a", cards=2, processes=1))
    assert fleet.snapshot.changed == [0, 1]


def test_a_freed_card_is_chosen_again_by_a_shape_checked_before() -> None:
    fleet = fleet_of(node("a", cards=1), node("b", cards=1))
    hold(fleet, "default/x", "a", "GPU-a-0", cores=100)
    pod = manifest(containers=[{"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100}])
    assert run(fleet, pod).node == "b"
    hold(fleet, "default/y", "b", "GPU-b-0", cores=100)
    assert run(fleet, pod).node is None
    fleet.release("default/x")
    assert (run(fleet, pod).node, indexes(run(fleet, pod))) == ("a", [[0]])


@st.composite
def _cards_in_any_state(draw: st.DrawFn) -> Snapshot:
    """A node of one to eight cards of two types and sizes, each in any state the checks
    look at: usage at, below and past capacity, unhealthy, cordoned, contradicted."""
    size = draw(st.integers(1, 8))
    cordoned = [f"GPU-n-{i}" for i in range(size) if draw(st.integers(0, 5)) == 0]
    snapshot = Snapshot([Node(name="n", annotations={CORDON: ",".join(cordoned)}, cards=[
        card(i, type=draw(st.sampled_from([T4, "NVIDIA-A100"])),
             memory=draw(st.sampled_from([0, 15360, 81920])),
             cores=draw(st.sampled_from([0, 100])), count=draw(st.integers(1, 4)),
             health=draw(st.integers(0, 5)) > 0)
        for i in range(size)])])
    for position in range(size):
        snapshot.used[position] = draw(st.integers(0, 5))
        snapshot.usedmem[position] = draw(st.sampled_from([0, 1000, 15360, 81920, 90000]))
        snapshot.usedcores[position] = draw(st.sampled_from([0, 30, 70, 100, 130]))
        snapshot.inconsistent[position] = draw(st.integers(0, 9)) == 0
    return snapshot


@settings(max_examples=400, derandomize=True, deadline=None)
@given(snapshot=_cards_in_any_state(),
       limits=st.builds(gpu_limits, st.sampled_from([None, 0, 1000, 15360, 20000]),
                        percent=st.sampled_from([None, 0, 25, 100]),
                        cores=st.sampled_from([None, 0, 30, 100])),
       policy=st.sampled_from(["binpack", "mutex,spread"]),
       annotations=st.sampled_from([{}, {"nvidia.com/use-gputype": "a100"},
                                    {"nvidia.com/nouse-gpuuuid": "GPU-n-0"}]))
def test_one_card_checked_on_its_own_answers_as_every_card_checked_at_once(
    snapshot: Snapshot, limits: dict[str, int], policy: str, annotations: dict[str, str],
) -> None:
    # Kept checks are brought up to date for a few changed cards one by one, on Python
    # integers: each card's code must be what the fleet-wide numpy checks give it.
    pod = parse_pod(manifest(containers=[limits], policy=policy, annotations=annotations),
                    DEFAULTS)
    view = PodView(snapshot, pod)
    request = pod.gpu_containers[0]
    expected = view._capacity_codes(request, slice(None), None).tolist()
    assert [view._card_code(request, card) for card in range(len(expected))] == expected
