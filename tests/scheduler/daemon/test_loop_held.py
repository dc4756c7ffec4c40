"""No request holds the daemon's loop for as long as its work takes (issue 45): a pod
group's placement, a decision per member, runs in slices (``in_slices``) between which
the daemon answers its health probe and everything else."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import aiohttp
import msgspec
import pytest

from agent.service import Agent, AgentSettings
from agent.vendors.nvidia.simulated import SimulatedSource
from common.core.groups import GROUP_MAX
from common.messaging import NatsSettings
from common.wire import ReportedCard
from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsServer
from pyhami.sandbox import RunningDaemon, SimulatedAgent, servers_of, standalone_config
from tests.harness import PodClient, eventually
from tests.linkgraphs import node_of_links, random_graph
from tests.scheduler.daemon.test_groups import WHOLE_CARD, member

NODES = 4


class Ticker:
    """How long the loop goes, at most, without coming back to a task that is ready."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0)
            self.longest = max(self.longest, time.perf_counter() - before)

    def stop(self) -> float:
        self._task.cancel()
        return self.longest


@pytest.mark.slow  # a 1,024-member group on 32 cards: load
async def test_the_health_probe_answers_while_the_largest_group_is_placed(
        jetstream_server: LocalNatsServer, http: aiohttp.ClientSession) -> None:
    """A group of 1,024 whole-card members on 32 cards: its /filter places every member,
    then every member again on idle cards (it never fits). /healthz, asked all along,
    answers while that /filter is under way, not only after it."""
    nodes = [SimulatedAgent.start(f"gpu-node-{n}", jetstream_server.url, "a100x8-nvswitch")
             for n in range(NODES)]
    daemon = await RunningDaemon(standalone_config(jetstream_server.url,
                                                   drive_pending=False)).start()
    pods = PodClient(http, daemon.url)
    try:
        async def all_known() -> bool:
            assert daemon.service is not None
            return sum(1 for _ in daemon.service.state.fleet.nodes()) == NODES

        await eventually(all_known, "every node's inventory", timeout=30)
        members: list[dict[str, Any]] = []
        for i in range(GROUP_MAX):
            pod = member(f"m-{i:04d}", "largest", count=GROUP_MAX)
            pod["spec"]["containers"][0]["resources"]["limits"] = dict(WHOLE_CARD)
            members.append(pod)
        await asyncio.gather(*(pods.submit(pod) for pod in members))

        answered: list[float] = []
        filtering = asyncio.Event()

        async def probe() -> None:
            while True:
                async with http.get(f"{daemon.url}/healthz") as answer:
                    assert answer.status == 200
                if filtering.is_set():
                    answered.append(time.perf_counter())
                await asyncio.sleep(0)

        prober = asyncio.create_task(probe())
        await asyncio.sleep(0.05)
        filtering.set()
        ticker = Ticker()
        started = time.perf_counter()
        async with http.post(f"{daemon.url}/filter", json={
                "Pod": members[0], "NodeNames": [n.name for n in nodes]}) as answer:
            result = await answer.json()
        ended = time.perf_counter()
        prober.cancel()
        longest = ticker.stop()
        failed = result["FailedNodes"]
        assert set(failed.values()) == {
            f"GroupNeverFits: group largest: 32 of {GROUP_MAX} members fit on idle cards"}
        during = [t for t in answered if started < t < ended]
        gaps = [b - a for a, b in zip([started, *during], [*during, ended], strict=True)]
        print(f"/filter took {ended - started:.3f}s; /healthz answered {len(during)} times "
              f"meanwhile (longest wait {max(gaps) * 1e3:.1f} ms, client and daemon sharing "
              f"the loop); the loop came back to a ready task after at most "
              f"{longest * 1e3:.1f} ms")
        assert during, "no /healthz answer while the group was placed"
    finally:
        await daemon.stop()
        for node in nodes:
            await node.halt()


HOSTILE = 3


async def test_agents_reporting_adversarial_links_cost_each_filter_a_bounded_search(
        jetstream_server: LocalNatsServer, http: aiohttp.ClientSession) -> None:
    """Three agents report 256 cards linked at random (G(256, 0.5): sets of about 11 linked
    cards, none of 13; proving it takes millions of steps). A topology-aware pod asking 13
    is refused on each with the search-limit reason, the decision's searches sharing one
    budget, and /healthz answers between the /filters."""
    stop = asyncio.Event()
    agents = []
    for n in range(HOSTILE):
        name = f"hostile-{n}"
        cards = [msgspec.convert(msgspec.to_builtins(card), ReportedCard)
                 for card in node_of_links(name, random_graph(256, 0.5,
                                                              random.Random(45))).cards]
        agent = Agent(AgentSettings(name, poll_interval=5.0, heartbeat_interval=0.5),
                      SimulatedSource(cards), NatsSettings(servers=servers_of(
                          jetstream_server.url)))
        agents.append(asyncio.create_task(agent.run(stop)))
    daemon = await RunningDaemon(standalone_config(jetstream_server.url,
                                                   drive_pending=False)).start()
    try:
        async def all_known() -> bool:
            assert daemon.service is not None
            return sum(1 for _ in daemon.service.state.fleet.nodes()) == HOSTILE

        await eventually(all_known, "every node's inventory", timeout=30)
        pod = lab_pod("wide", {"hami.io/gpu-scheduler-policy": "topology-aware"},
                      limits={"nvidia.com/gpu": 13, "nvidia.com/gpumem": 1000})
        await PodClient(http, daemon.url).submit(pod)
        ticker = Ticker()
        probes = 0
        for _ in range(5):
            async with http.post(f"{daemon.url}/filter", json={
                    "Pod": pod, "NodeNames": [f"hostile-{n}" for n in range(HOSTILE)]}) as answer:
                result = await answer.json()
            assert set(result["FailedNodes"].values()) == {
                "256/256 TopologyNotFit (search limit reached)"}
            async with http.get(f"{daemon.url}/healthz") as answer:
                probes += answer.status == 200
        longest = ticker.stop()
        print(f"the loop came back to a ready task after at most {longest * 1e3:.1f} ms")
        assert probes == 5
    finally:
        await daemon.stop()
        stop.set()
        await asyncio.gather(*agents, return_exceptions=True)
