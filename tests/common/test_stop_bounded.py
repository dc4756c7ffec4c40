"""Stopping stays bounded even when a cancellation is lost.

nats-py catches ``CancelledError`` while it flushes its write buffer, so a task
cancelled at that moment runs on as if nothing had happened. The demo's Ctrl-C
once hung for 30 s that way. What stops pyhami's loops must not rely on the
cancellation arriving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from common.messaging import Connection, NatsSettings
from common.supervision import STOP_TIMEOUT_S, Supervisor
from pyhami.natsserver import LocalNatsServer


async def test_a_task_that_swallows_its_cancellation_does_not_hold_the_supervisor(
        caplog: pytest.LogCaptureFixture) -> None:
    supervisor = Supervisor()
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            # What nats-py does to a cancellation that lands in its flush:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)

    supervisor.start("stubborn", stubborn)
    await asyncio.sleep(0.1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with caplog.at_level(logging.ERROR):
        await asyncio.wait_for(supervisor.stop(), STOP_TIMEOUT_S + 3)
    assert loop.time() - started < STOP_TIMEOUT_S + 1
    assert any("stubborn did not stop" in r.getMessage() for r in caplog.records)
    release.set()


async def test_closing_a_connection_ends_its_run_without_any_cancellation(
        nats_server: LocalNatsServer) -> None:
    connection = Connection(NatsSettings(servers=(nats_server.url,)), "stop-test")
    running = asyncio.create_task(connection.run())
    await asyncio.wait_for(connection.wait_up(), 10)
    await connection.close()  # no cancel: as if the task's cancellation had been lost
    await asyncio.wait_for(running, 5)
    assert running.done() and running.exception() is None
    client = connection.client
    assert client is not None and client.is_closed
