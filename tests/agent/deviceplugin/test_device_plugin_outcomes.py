"""The outcomes the device plugin keeps until the daemon is seen to have written them."""

from __future__ import annotations

import pytest

from agent.deviceplugin import outcomes
from agent.deviceplugin.outcomes import CONFIRM_AFTER_S, KEEP_S, OwedOutcomes
from common.wire import AllocationOutcome


def ok(name: str) -> AllocationOutcome:
    return AllocationOutcome(namespace="lab", name=name, uid=f"uid-{name}", ok=True)


def sent_at(owed: OwedOutcomes, when: float, *names: str) -> None:
    for name in names:
        owed.sent(ok(name), when)


def test_an_owed_outcome_is_due_until_sent_and_awaited_after() -> None:
    owed = OwedOutcomes()
    owed.owe([ok("a"), ok("b")])
    assert [o.name for o in owed.due()] == ["a", "b"]
    assert not owed.awaiting
    sent_at(owed, 10.0, "a")
    assert [o.name for o in owed.due()] == ["b"]
    assert owed.awaiting


@pytest.mark.parametrize(("sent", "asked", "listed", "confirmed", "again", "kept"), [
    pytest.param(10.0, 11.0, False, 1, [], 0, id="not-listed-is-confirmed"),
    pytest.param(10.0, 11.0, True, 0, [], 1, id="listed-too-soon-waits"),
    pytest.param(10.0, 10.0 + CONFIRM_AFTER_S, True, 0, ["a"], 1, id="listed-later-again"),
    pytest.param(10.0, 9.0, False, 0, [], 1, id="answer-older-than-the-send-says-nothing"),
    pytest.param(10.0, 10.0, False, 0, [], 1, id="asked-as-it-was-sent-says-nothing"),
])
def test_the_daemons_answer_settles_what_was_sent_before_it_was_asked(
        sent: float, asked: float, listed: bool, *, confirmed: int, again: list[str],
        kept: int) -> None:
    owed = OwedOutcomes()
    owed.owe([ok("a")])
    sent_at(owed, sent, "a")
    settled = owed.reconcile({"uid-a"} if listed else set(), asked)
    assert settled.confirmed == confirmed
    assert [o.name for o in settled.again] == again
    assert [o.name for o in owed.due()] == again
    assert len(owed) == kept


def test_an_outcome_sent_again_keeps_its_first_time_and_is_given_up_after_keep_s() -> None:
    owed = OwedOutcomes()
    owed.owe([ok("a")])
    sent_at(owed, 0.0, "a")
    moment = 0.0
    while moment + CONFIRM_AFTER_S < KEEP_S:
        moment += CONFIRM_AFTER_S
        assert [o.name for o in owed.reconcile({"uid-a"}, moment).again] == ["a"]
        sent_at(owed, moment, "a")
    settled = owed.reconcile({"uid-a"}, KEEP_S + CONFIRM_AFTER_S)
    assert [o.name for o in settled.given_up] == ["a"]
    assert len(owed) == 0 and not owed.awaiting


def test_a_newer_outcome_for_a_pod_replaces_the_one_sent() -> None:
    owed = OwedOutcomes()
    owed.owe([ok("a")])
    sent_at(owed, 1.0, "a")
    failed = AllocationOutcome(namespace="lab", name="a", uid="uid-a", ok=False, reason="no")
    owed.owe([failed])
    assert owed.due() == [failed]
    owed.sent(ok("a"), 2.0)  # the older one's send does not count for the newer
    assert owed.due() == [failed]


def test_beyond_the_bound_the_oldest_outcome_is_given_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outcomes, "KEPT_MAX", 2)
    owed = OwedOutcomes()
    assert owed.owe([ok("a"), ok("b")]) == ()
    assert [o.name for o in owed.owe([ok("c")])] == ["a"]
    assert [o.name for o in owed.due()] == ["b", "c"]
