"""``common.supervision.Supervisor`` as the agent uses it: a loop started with
``restart=False`` runs once, and its end ends ``until_stopped``."""

from __future__ import annotations

import asyncio

import pytest

from common.supervision import Loop, Supervisor


class Crashed(Exception):
    pass


async def crashes_soon() -> None:
    await asyncio.sleep(0.01)
    raise Crashed("the heartbeat broke")


async def returns_soon() -> None:
    await asyncio.sleep(0.01)


async def forever() -> None:
    await asyncio.Event().wait()


async def test_an_unrestarted_loop_that_crashes_ends_the_wait_with_its_crash() -> None:
    supervisor = Supervisor()
    supervisor.start("forever", forever)
    supervisor.start("heartbeat", crashes_soon, restart=False)
    with pytest.raises(Crashed, match="the heartbeat broke"):
        await asyncio.wait_for(supervisor.until_stopped(asyncio.Event()), 5)
    assert supervisor.crashes == {}  # not a restart: the owner ends
    await supervisor.stop()


@pytest.mark.parametrize(("loop", "set_stop"), [
    (returns_soon, False),
    (forever, True),
], ids=["an-unrestarted-loop-returns", "stop-is-set"])
async def test_the_wait_ends_quietly(loop: Loop, set_stop: bool) -> None:
    supervisor = Supervisor()
    stop = asyncio.Event()
    supervisor.start("loop", loop, restart=False)
    if set_stop:
        stop.set()
    await asyncio.wait_for(supervisor.until_stopped(stop), 5)
    await supervisor.stop()


async def test_a_restarted_loop_that_crashes_is_started_again() -> None:
    runs = 0

    async def crashes_once() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise Crashed("once")
        await asyncio.Event().wait()

    supervisor = Supervisor()
    supervisor.start("loop", crashes_once)
    for _ in range(200):
        if runs == 2:
            break
        await asyncio.sleep(0.01)
    assert runs == 2 and supervisor.crashes == {"loop": 1}
    await supervisor.stop()
