"""A pod group that goes ahead of other pods does so in bounded turns (issue 45): only a
group whole, not fitting and able to fit on idle cards; after ``patience``, for ``turn``
seconds; then it waits twice as long before its next turn, at most ``TURN_WAIT_MAX``."""

from __future__ import annotations

import pytest

from common.core import parse_pod
from common.core.groups import GroupRef, GroupSource
from pyhami.sandbox import DEFAULTS
from scheduler.state.groups import RETRY_AFTER, TURN_WAIT_MAX, Groups, Tried
from tests.builders import gpu_limits, manifest

PATIENCE, TURN = 60.0, 300.0
GROUP = GroupRef("default", "train-a", GroupSource.KUEUE, 2)
CLAIMED = frozenset({"gpu-node-1"})


def blocked_group(at: float = 0.0) -> Groups:
    groups = Groups()
    for name in ("w0", "w1"):
        pod = manifest(name, containers=[gpu_limits(1000)])
        groups.note(GROUP, f"default/{name}", pod, parse_pod(pod, DEFAULTS), bound=False)
    groups.blocked(GROUP.key, at, 0, CLAIMED)
    return groups


def ahead_at(groups: Groups, *times: float) -> list[bool]:
    return [groups.starving(t, PATIENCE, TURN) is not None for t in times]


@pytest.mark.parametrize(("times", "expected"), [
    pytest.param([59.9, 60.0], [False, True], id="after-its-patience"),
    pytest.param([60.0, 359.9, 360.0], [True, True, False], id="for-one-turn"),
    # The turn that ended (noticed at 360) starts a wait of 120 s: next turn 480..780.
    pytest.param([360.0, 479.9, 480.0, 779.9, 780.0], [False, False, True, True, False],
                 id="then-a-wait-twice-as-long"),
    # Then 240 s: 1020..1320.
    pytest.param([360.0, 780.0, 1019.9, 1020.0], [False, False, False, True],
                 id="doubling-again"),
])
def test_a_group_goes_ahead_in_turns_each_wait_twice_the_last(
        times: list[float], expected: list[bool]) -> None:
    assert ahead_at(blocked_group(), *times) == expected


def test_the_wait_for_a_turn_is_at_most_an_hour() -> None:
    groups = blocked_group()
    now = 0.0
    for _ in range(12):  # enough turns for patience x 2^n to pass an hour
        while groups.starving(now, PATIENCE, TURN) is None:
            now += 10.0
        while groups.starving(now, PATIENCE, TURN) is not None:
            now += 10.0
    ended = now
    while groups.starving(now, PATIENCE, TURN) is None:
        now += 10.0
    assert now - ended <= TURN_WAIT_MAX + 10.0


def test_the_group_ahead_keeps_the_nodes_its_members_would_use_until_its_turn_ends() -> None:
    ahead = blocked_group().starving(100.0, PATIENCE, TURN)
    assert ahead is not None
    assert (ahead.claimed, ahead.since, ahead.until) == (CLAIMED, 60.0, 360.0)


@pytest.mark.parametrize("event", ["never-fits", "fitted"])
def test_a_group_that_never_fits_or_fitted_is_not_ahead(event: str) -> None:
    groups = blocked_group()
    if event == "never-fits":
        groups.never_fits(GROUP.key)
    else:
        groups.unblocked(GROUP.key)
    assert ahead_at(groups, 60.0, 1000.0) == [False, False]


@pytest.mark.parametrize(("now", "changes", "offered", "kept"), [
    pytest.param(RETRY_AFTER / 2, 99, None, True, id="younger-than-the-retry-whatever-changed"),
    pytest.param(5.0, 7, frozenset({"a"}), True, id="nothing-changed"),
    pytest.param(5.0, 8, frozenset({"a"}), False, id="the-fleet-changed"),
    pytest.param(5.0, 7, frozenset({"a", "b"}), False, id="other-nodes-offered"),
])
def test_a_groups_failed_try_is_answered_again_while_it_holds(
        now: float, changes: int, offered: frozenset[str] | None, kept: bool) -> None:
    groups = blocked_group()
    tried = Tried(0.0, 7, frozenset({"a"}), "GroupDoesNotFit", "1 of 2 members fit", "...")
    groups.tried(GROUP.key, tried)
    assert (groups.last_try(GROUP.key, now, changes, offered) is tried) is kept
