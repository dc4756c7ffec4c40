"""What a fleet keeps between decisions (card checks per request shape, node scores)
follows every change, also past the end of its change log."""

from __future__ import annotations

import pytest

from common.core import fleet as fleet_module
from tests.builders import fleet_of, hold, indexes, manifest, node, place, run


def test_past_the_end_of_the_change_log_the_kept_checks_are_made_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fleet_module, "CHANGE_LOG_MAX", 3)
    fleet = fleet_of(node("a", cards=2), node("b", cards=2))
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100}
    # Four whole-card pods fill the four cards, the busiest node first (binpack).
    placed = [place(fleet, manifest(f"p{i}", containers=[limits])) for i in range(4)]
    assert [d.node for d in placed] == ["a", "a", "b", "b"]
    assert len(fleet.layout.changed) <= 3
    refused = run(fleet, manifest("late", containers=[limits]))
    assert refused.node is None
    # A whole card takes all its memory by default, and memory is checked before cores.
    assert refused.failed_nodes == {"a": "2/2 CardInsufficientMemory",
                                    "b": "2/2 CardInsufficientMemory"}


def test_a_report_that_changes_nothing_logs_no_change() -> None:
    fleet = fleet_of(node("a", cards=2))
    run(fleet, manifest())
    fleet.upsert_node(node("a", cards=2))
    assert fleet.layout.changed == []
    fleet.upsert_node(node("a", cards=2, processes=1))
    assert fleet.layout.changed == [0, 1]


def test_a_freed_card_is_chosen_again_by_a_shape_checked_before() -> None:
    fleet = fleet_of(node("a", cards=1), node("b", cards=1))
    hold(fleet, "default/x", "a", "GPU-a-0", cores=100)
    pod = manifest(containers=[{"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100}])
    assert run(fleet, pod).node == "b"
    hold(fleet, "default/y", "b", "GPU-b-0", cores=100)
    assert run(fleet, pod).node is None
    fleet.release("default/x")
    assert (run(fleet, pod).node, indexes(run(fleet, pod))) == ("a", [[0]])
