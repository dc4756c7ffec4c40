"""Standalone through a NATS outage (docs/reliability.md): an answered error means nothing
was applied. No ghost pod, no ghost booking, also after the daemon restarts.

The outages are real: nats-server killed and started again on its port, or frozen
(SIGSTOP) so that a write leaves the daemon and gets no answer until the server resumes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from common.core import Allocation, Usage, decode_devices
from common.core.annotations import ALLOCATED_ANNOTATION
from pyhami.demo import lab_pod
from pyhami.sandbox import Sandbox
from scheduler.service import SchedulerService
from tests.harness import Lab, PodClient, eventually, stored_entries

NODE = "gpu-node-1"


async def status_of(http: aiohttp.ClientSession, method: str, url: str,
                    pod: dict[str, Any] | None = None) -> int:
    async with http.request(method, url, json=pod) as response:
        return response.status


def service_of(lab: Lab) -> SchedulerService:
    assert lab.daemon.service is not None
    return lab.daemon.service


def booked(lab: Lab) -> dict[str, Usage]:
    """The daemon's ledger: the usage of every card that holds something."""
    fleet = service_of(lab).state.fleet
    node = fleet.node(NODE)
    assert node is not None
    return {d.uuid: fleet.usage(NODE, d.uuid) for d in node.cards
            if fleet.usage(NODE, d.uuid) != Usage()}


def ledger_of_the_pods(pods: list[dict[str, Any]]) -> dict[str, Allocation]:
    return {f"{p['namespace']}/{p['name']}": Allocation(
                p["node"], decode_devices(p["annotations"][ALLOCATED_ANNOTATION]), 0)
            for p in pods if p["node"] is not None}


async def stored_pod_names(nats_url: str) -> set[str]:
    """The pods in the bucket (not its quotas, whose keys start with '_'), read with a
    client of our own."""
    entries = await stored_entries(nats_url, lambda key: not key.startswith("_"))
    return {key.partition(".")[2] for key in entries}


async def restart_daemon(lab: Lab) -> SchedulerService:
    await lab.restart_daemon()
    return service_of(lab)


async def test_writes_during_an_outage_are_refused_and_never_applied_later(
        lab: Lab, http: aiohttp.ClientSession) -> None:
    await lab.pods.submit_and_place(lab_pod("kept"))
    before = booked(lab)
    pods_url = f"{lab.daemon.url}/api/pods"

    lab.nats.kill()
    await asyncio.sleep(0.3)  # the daemon's client sees the connection drop
    for i in range(5):
        started = time.monotonic()
        assert await status_of(http, "POST", pods_url, lab_pod(f"refused-{i}")) == 503
        assert time.monotonic() - started < 1.0  # refused, not buffered until a timeout
    assert await status_of(http, "DELETE", f"{pods_url}/default/kept") == 503
    assert [p["name"] for p in await lab.pods.pods()] == ["kept"]
    assert booked(lab) == before

    lab.nats.start()

    async def reconnected() -> bool:
        return await status_of(http, "GET", f"{pods_url}/default/kept") == 200 and (
            await status_of(http, "POST", pods_url, lab_pod("after")) == 201)

    await eventually(reconnected, "the daemon to write the store again", timeout=30)
    assert await stored_pod_names(lab.nats.url) == {"kept", "after"}
    await lab.pods.placed("after")

    restarted = await restart_daemon(lab)
    pods = await lab.pods.pods()
    assert sorted(p["name"] for p in pods) == ["after", "kept"]  # no ghost
    assert restarted.state.fleet.allocations() == ledger_of_the_pods(pods)
    assert len(booked(lab)) == 2

    await lab.pods.delete("kept")  # and now the delete goes through, freeing its card
    await lab.pods.delete("after")
    assert booked(lab) == {}


async def test_a_write_that_got_no_answer_is_undone_when_it_lands_late(
        lab: Lab, http: aiohttp.ClientSession) -> None:
    await lab.pods.submit_and_place(lab_pod("kept"))
    before = booked(lab)
    pods_url = f"{lab.daemon.url}/api/pods"

    lab.nats.pause()  # the writes leave the daemon, and no answer comes
    try:
        assert await status_of(http, "POST", pods_url, lab_pod("unanswered")) == 503
        assert await status_of(http, "DELETE", f"{pods_url}/default/kept") == 503
    finally:
        lab.nats.resume()  # both writes land now

    async def settled() -> bool:
        return await stored_pod_names(lab.nats.url) == {"kept"}

    await eventually(settled, "the late writes to be undone")

    async def deciding_again() -> bool:
        # Cut off from NATS past its renew deadline, the daemon stood by; it decides
        # again once it has its lease back.
        async with http.get(f"{lab.daemon.url}/readyz") as answer:
            return answer.status == 200

    await eventually(deciding_again, "the daemon to take its lease back")
    assert [p["name"] for p in await lab.pods.pods()] == ["kept"]
    assert booked(lab) == before

    restarted = await restart_daemon(lab)
    pods = await lab.pods.pods()
    assert [p["name"] for p in pods] == ["kept"]  # no ghost, and the kept pod is back
    assert restarted.state.fleet.allocations() == ledger_of_the_pods(pods)
    assert booked(lab) == before
    # The client's retry of the submit now succeeds, as a first submit would.
    assert await status_of(http, "POST", f"{lab.daemon.url}/api/pods",
                           lab_pod("unanswered")) == 201
    with_retry = await stored_pod_names(lab.nats.url)
    assert with_retry == {"kept", "unanswered"}


async def test_a_bind_during_an_outage_is_an_error_that_books_nothing(
        http: aiohttp.ClientSession) -> None:
    async with Sandbox([(NODE, "t4x4")]) as sandbox:  # no pending loop: the test binds
        assert sandbox.nats is not None and sandbox.daemon is not None
        service = sandbox.daemon.service
        assert service is not None
        pod = await PodClient(http, sandbox.url).submit(lab_pod("waiting"))
        body = {"PodName": "waiting", "PodNamespace": "default", "PodUID": pod["uid"],
                "Node": NODE}

        sandbox.nats.kill()
        await asyncio.sleep(0.3)
        async with http.post(f"{sandbox.url}/bind", json=body) as response:
            answer = await response.json()
        assert "the NATS connection is down; nothing was written" in answer["Error"]
        assert service.state.fleet.allocations() == {}
        assert service.state.cache.reservation_count == 0

        sandbox.nats.start()

        async def bound() -> bool:
            async with http.post(f"{sandbox.url}/bind", json=body) as response:
                return not (await response.json()).get("Error")

        await eventually(bound, "the bind to go through once NATS is back", timeout=30)
        placed = await PodClient(http, sandbox.url).get("waiting")
        assert service.state.fleet.allocations() == ledger_of_the_pods([placed])
