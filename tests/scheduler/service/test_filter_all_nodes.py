"""``--filter-nodes all``: /filter answers every node that holds the pod, /prioritize ranks
them, and /bind places the cards on whichever node kube-scheduler took; never a card
booked twice. The real standalone daemon, driven as kube-scheduler drives it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from common.core import decode_devices
from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsServer
from pyhami.sandbox import DEFAULTS, RunningDaemon, SimulatedAgent, standalone_config
from scheduler.service import SchedulerService, ServiceSettings
from scheduler.service.shared import FilterNodes
from tests.harness import PodClient, eventually

NODES = ["node-a", "node-b", "node-c"]
WHOLE_NODE = {"nvidia.com/gpu": 4, "nvidia.com/gpumem-percentage": 100}


@dataclass
class Extender:
    daemon: RunningDaemon
    pods: PodClient
    http: aiohttp.ClientSession

    @property
    def service(self) -> SchedulerService:
        assert self.daemon.service is not None
        return self.daemon.service

    async def filter(self, pod: dict[str, Any]) -> dict[str, Any]:
        async with self.http.post(f"{self.daemon.url}/filter",
                                  json={"Pod": pod, "NodeNames": NODES}) as response:
            assert response.status == 200, await response.text()
            answer: dict[str, Any] = await response.json()
            return answer

    async def prioritize(self, pod: dict[str, Any], nodes: list[str]) -> dict[str, int]:
        async with self.http.post(f"{self.daemon.url}/prioritize",
                                  json={"Pod": pod, "NodeNames": nodes}) as response:
            assert response.status == 200, await response.text()
            return {entry["Host"]: entry["Score"] for entry in await response.json()}

    async def bind(self, pod: dict[str, Any], node: str) -> str:
        body = {"PodName": pod["metadata"]["name"], "PodNamespace": "default",
                "PodUID": pod["metadata"]["uid"], "Node": node}
        async with self.http.post(f"{self.daemon.url}/bind", json=body) as response:
            assert response.status == 200, await response.text()
            return str((await response.json())["Error"] or "")

    async def submit(self, pod: dict[str, Any]) -> dict[str, Any]:
        created = await self.pods.submit(pod)
        return {**pod, "metadata": {**pod["metadata"], "uid": created["uid"]}}


async def _extender(server: LocalNatsServer, http: aiohttp.ClientSession,
                    mode: FilterNodes) -> AsyncIterator[Extender]:
    nodes = [SimulatedAgent.start(name, server.url) for name in NODES]
    config = standalone_config(server.url, drive_pending=False,
                               service=ServiceSettings(DEFAULTS, filter_nodes=mode))
    daemon = await RunningDaemon(config).start()
    extender = Extender(daemon, PodClient(http, daemon.url), http)

    async def all_known() -> bool:
        return sum(1 for _ in extender.service.state.fleet.nodes()) == len(NODES)

    await eventually(all_known, "every node's inventory", timeout=30)
    yield extender
    await daemon.stop()
    await asyncio.gather(*(node.halt() for node in nodes))


@pytest.fixture
async def every_node(jetstream_server: LocalNatsServer,
                     http: aiohttp.ClientSession) -> AsyncIterator[Extender]:
    async for extender in _extender(jetstream_server, http, FilterNodes.ALL):
        yield extender


@pytest.fixture
async def one_node(jetstream_server: LocalNatsServer,
                   http: aiohttp.ClientSession) -> AsyncIterator[Extender]:
    async for extender in _extender(jetstream_server, http, FilterNodes.ONE):
        yield extender


def _cards(pod: dict[str, Any]) -> list[str]:
    allocated = pod["annotations"]["hami.io/vgpu-devices-allocated"]
    return [grant.uuid for grants in decode_devices(allocated) for grant in grants]


async def test_the_default_answers_the_one_node_pyhami_chose(one_node: Extender) -> None:
    pod = await one_node.submit(lab_pod("only"))
    answer = await one_node.filter(pod)
    assert answer["NodeNames"] == ["node-a"]


async def test_every_fitting_node_is_answered_the_chosen_one_first(
        every_node: Extender) -> None:
    busy = await every_node.submit(lab_pod("busy", limits=WHOLE_NODE))
    assert (await every_node.filter(busy))["NodeNames"] == NODES
    assert await every_node.bind(busy, "node-c") == ""
    # binpack (the default node policy): the busiest node that holds the pod first.
    pod = await every_node.submit(lab_pod("small"))
    answer = await every_node.filter(pod)
    assert answer["NodeNames"] == ["node-a", "node-b"]
    assert answer["FailedNodes"] == {"node-c": "4/4 CardInsufficientMemory"}
    scores = await every_node.prioritize(pod, answer["NodeNames"])
    assert scores == {"node-a": scores["node-b"], "node-b": scores["node-a"]}


async def test_bind_places_the_cards_on_the_node_kube_scheduler_took(
        every_node: Extender) -> None:
    pod = await every_node.submit(lab_pod("elsewhere"))
    answer = await every_node.filter(pod)
    assert answer["NodeNames"][0] == "node-a"  # reserved there
    assert await every_node.bind(pod, "node-c") == ""
    bound = await every_node.pods.get("elsewhere")
    assert bound["node"] == "node-c"
    fleet = every_node.service.state.fleet
    on_c = {d.uuid for node in fleet.nodes() if node.name == "node-c" for d in node.cards}
    assert _cards(bound) and set(_cards(bound)) <= on_c
    held = fleet.allocation("default/elsewhere")
    assert held is not None and held.node == "node-c"
    # The reservation on node-a went with it: node-a's cards hold nothing.
    assert all(fleet.usage("node-a", d.uuid).tenants == 0
               for node in fleet.nodes() if node.name == "node-a" for d in node.cards)


async def test_a_node_taken_by_another_pod_meanwhile_is_refused_at_bind(
        every_node: Extender) -> None:
    first = await every_node.submit(lab_pod("first", limits=WHOLE_NODE))
    second = await every_node.submit(lab_pod("second", limits=WHOLE_NODE))
    assert (await every_node.filter(first))["NodeNames"] == NODES  # reserved on node-a
    assert (await every_node.filter(second))["NodeNames"] == ["node-b", "node-c"]
    # kube-scheduler takes node-b for both: the first comes too late.
    assert await every_node.bind(second, "node-b") == ""
    error = await every_node.bind(first, "node-b")
    assert "node node-b cannot hold pod default/first" in error
    fleet = every_node.service.state.fleet
    for node in fleet.nodes():
        for device in node.cards:
            usage = fleet.usage(node.name, device.uuid)
            assert usage.memory <= device.memory and usage.tenants <= device.count
    assert await every_node.bind(first, "node-c") == ""
    assert (await every_node.pods.get("first"))["node"] == "node-c"
