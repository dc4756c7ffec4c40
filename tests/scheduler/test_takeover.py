"""``Takeover``, what a daemon does as it begins to lead and as it stands by, on stand-ins
of the ports it is given: Kubernetes reconciles, standalone reloads, fences, rebuilds and
catches up once; a store that does not answer fails the takeover; standing by drops the
reservations and stops the catching up."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from common.supervision import Supervisor
from scheduler.leadership import AlwaysLeader, Takeover, TakeOverFailed
from scheduler.leadership import takeover as takeover_module


class Steps:
    """Every port at once, noting what was asked in order."""

    def __init__(self, fail_reload: bool = False) -> None:
        self.done: list[str] = []
        self._fail_reload = fail_reload

    async def rebuild(self) -> None:
        self.done.append("rebuild")

    async def reconcile(self) -> None:
        self.done.append("reconcile")

    async def stand_by(self) -> None:
        self.done.append("stand_by")

    async def reload(self) -> None:
        if self._fail_reload:
            raise nats.errors.TimeoutError
        self.done.append("reload")

    async def fence(self) -> int:
        self.done.append("fence")
        return 1

    async def catch_up(self) -> int:
        self.done.append("catch_up")
        return 0

    def retry_pending(self) -> None:
        self.done.append("retry_pending")


def takeover(steps: Steps, *, standalone: bool) -> Takeover:
    return Takeover(AlwaysLeader("me"), Supervisor(), ledger=steps, pods=steps, reservations=steps,
                    store=steps if standalone else None, retry_pending=steps.retry_pending)


async def test_a_daemon_beside_kube_scheduler_reconciles_with_a_fresh_list_when_elected() -> None:
    steps = Steps()
    await takeover(steps, standalone=False).elected()
    assert steps.done == ["reconcile"]


async def test_a_standalone_daemon_reads_fences_rebuilds_then_catches_up_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(takeover_module, "CATCH_UP_AFTER_S", 0.0)
    steps = Steps()
    taking = takeover(steps, standalone=True)
    await taking.elected()
    assert steps.done == ["reload", "fence", "rebuild", "retry_pending"]
    await asyncio.sleep(0.05)
    assert steps.done[-1] == "catch_up"
    assert steps.done.count("catch_up") == 1
    taking.stop()


async def test_a_store_that_does_not_answer_fails_the_takeover_and_rebuilds_nothing() -> None:
    steps = Steps(fail_reload=True)
    with pytest.raises(TakeOverFailed, match="the pod store could not be read and fenced"):
        await takeover(steps, standalone=True).elected()
    assert steps.done == []


async def test_standing_by_drops_the_reservations_and_stops_catching_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(takeover_module, "CATCH_UP_AFTER_S", 60.0)
    steps = Steps()
    taking = takeover(steps, standalone=True)
    await taking.elected()
    await taking.demoted()
    await asyncio.sleep(0.05)
    assert steps.done == ["reload", "fence", "rebuild", "retry_pending", "stand_by"]
    assert "catch_up" not in steps.done
