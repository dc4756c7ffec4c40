"""/readyz tells the truth: 503, saying why, while NATS has been gone longer than the grace
or a background task has crashed; crashed tasks are logged and started again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

import aiohttp
import pytest

from common.core import PodManifest, parse_pod
from common.supervision import Supervisor, restart_delay
from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsServer
from pyhami.sandbox import DEFAULTS, RunningDaemon, SimulatedAgent, standalone_config
from scheduler.cluster import PodChange
from scheduler.service import Filtered, SchedulerService, ServiceSettings
from tests.builders import manifest
from tests.fakes.node_list import NodeList, inventory_message, silent
from tests.harness import Lab, eventually


async def readiness(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with http.get(f"{url}/readyz") as response:
        return response.status, await response.text()


async def test_a_crashing_task_is_logged_with_its_traceback_and_started_again(
        caplog: pytest.LogCaptureFixture) -> None:
    supervisor = Supervisor()
    runs = 0
    healthy = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs < 3:
            raise RuntimeError(f"failure {runs}")
        healthy.set()
        await asyncio.Event().wait()

    supervisor.start("flaky", flaky)
    try:
        await asyncio.sleep(0.1)
        assert supervisor.problems() == [
            "background task flaky crashed (RuntimeError: failure 1); restarting in 0.5s"]
        await asyncio.wait_for(healthy.wait(), restart_delay(1) + restart_delay(2) + 2)
        assert supervisor.problems() == []
        assert supervisor.crashes == {"flaky": 2}
        crashes = [r for r in caplog.records if r.getMessage() == "background task flaky crashed"]
        assert len(crashes) == 2
        assert all(r.exc_info is not None for r in crashes)  # logged with the traceback
    finally:
        await supervisor.stop()


def test_restarts_back_off_up_to_a_limit() -> None:
    assert [restart_delay(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert restart_delay(100) == 30.0


def test_a_crash_handling_one_message_drops_only_that_message(
        caplog: pytest.LogCaptureFixture) -> None:
    supervisor = Supervisor()
    handled = []
    for message in ("good", "bad", "good again"):
        with supervisor.contained("inventory message"):
            if message == "bad":
                raise ValueError("cannot handle it")
            handled.append(message)
    assert handled == ["good", "good again"]
    assert supervisor.crashes == {"inventory message": 1}
    assert caplog.records[0].exc_info is not None


async def test_readiness_drops_while_nats_is_gone_beyond_the_grace(
        jetstream_server: LocalNatsServer, http: aiohttp.ClientSession) -> None:
    daemon = await RunningDaemon(standalone_config(jetstream_server.url, nats_grace=1.0)).start()
    try:
        assert await readiness(http, daemon.url) == (200, "ready\n")
        jetstream_server.kill()

        async def not_ready() -> bool:
            return (await readiness(http, daemon.url))[0] == 503

        await eventually(not_ready, "/readyz to fail", timeout=10)
        status, why = await readiness(http, daemon.url)
        assert status == 503
        assert why.startswith("NATS disconnected for ")
        assert why.endswith("(grace 1s)\n")
        async with http.get(f"{daemon.url}/statusz") as response:
            body = await response.json()
        assert body["ready"] is False
        assert body["not_ready_because"] == [why.strip()]
        assert body["nats"]["connected"] is False
        jetstream_server.start()

        async def ready() -> bool:
            return (await readiness(http, daemon.url))[0] == 200

        await eventually(ready, "/readyz to recover", timeout=20)
    finally:
        await daemon.stop()


async def test_readiness_drops_while_a_background_task_is_down_and_recovers(
        jetstream_server: LocalNatsServer, http: aiohttp.ClientSession,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    node = SimulatedAgent.start("gpu-node-1", jetstream_server.url)
    daemon = await RunningDaemon(standalone_config(jetstream_server.url)).start()
    service = daemon.service
    assert service is not None
    expire = service.state.cache.expire
    failures = 0

    def broken_once(now: float) -> object:
        nonlocal failures
        if failures == 0:
            failures += 1
            raise RuntimeError("the ledger is confused")
        return expire(now)

    try:
        monkeypatch.setattr(service.state.cache, "expire", broken_once)

        async def not_ready() -> bool:
            return (await readiness(http, daemon.url))[0] == 503

        await eventually(not_ready, "/readyz to fail", timeout=5)
        assert (await readiness(http, daemon.url))[1] == (
            "background task expire-reservations crashed (RuntimeError: the ledger is "
            "confused); restarting in 0.5s\n")
        assert any(r.getMessage() == "background task expire-reservations crashed"
                   and r.exc_info is not None for r in caplog.records
                   if r.levelno == logging.ERROR)

        async def ready() -> bool:
            return (await readiness(http, daemon.url))[0] == 200

        await eventually(ready, "/readyz to recover once the task runs again", timeout=5)
    finally:
        await daemon.stop()
        await node.halt()


class LostWatch(NodeList):
    """A cluster whose pod watch fails at once, every time."""

    async def changes(self) -> AsyncIterator[PodChange]:
        raise RuntimeError("watch lost")
        yield  # pragma: no cover


async def test_following_the_cluster_again_releases_pods_deleted_while_it_was_down() -> None:
    service = SchedulerService(ServiceSettings(DEFAULTS), LostWatch(set()), silent)
    service.handlers.inventories.ingest(*inventory_message("n", 1))
    decision = service.state.cache.filter(parse_pod(manifest("gone"), DEFAULTS), ["n"], now=0)
    assert decision.allocation is not None
    service.state.cache.confirm("default/gone", decision.allocation)
    with pytest.raises(RuntimeError):
        await service.handlers.pods.follow_cluster()
    # The first start follows on from the rebuild.
    assert service.state.fleet.allocation("default/gone") is not None
    with pytest.raises(RuntimeError):  # started again: the pod list is read first
        await service.handlers.pods.follow_cluster()
    assert service.state.fleet.allocation("default/gone") is None
    assert "default/gone" not in service.state.cache.bound


async def test_a_pod_whose_scheduling_crashes_does_not_stall_the_pending_loop(
        lab: Lab, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    service = lab.daemon.service
    assert service is not None
    decide = service.verbs.filter

    async def crashing_for_poison(pod: PodManifest, names: Sequence[str]) -> Filtered:
        if pod.metadata.name == "poison":
            raise RuntimeError("a bug met by one pod")
        return await decide(pod, names)

    monkeypatch.setattr(service.verbs, "filter", crashing_for_poison)
    await lab.pods.submit(lab_pod("poison"))
    await lab.pods.submit_and_place(lab_pod("after-poison"))  # submitted later, placed
    assert (await lab.pods.get("poison"))["node"] is None
    crashes = [r for r in caplog.records if "pending pod default/poison" in r.getMessage()]
    assert crashes and crashes[0].exc_info is not None  # logged with its traceback
    async with lab.pods.session.get(f"{lab.daemon.url}/readyz") as response:
        assert response.status == 200
