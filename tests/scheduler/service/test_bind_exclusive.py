"""Bind is exclusive and idempotent (docs/reliability.md), against the real daemon.

One pod, one winning bind; a repeated bind changes nothing; a bind that fails books
nothing and never releases cards a bound pod holds; a pod asking for no GPU is bound
without any allocation. In standalone the store write is compare-and-set, so even two
daemons sharing one bucket cannot both bind a pod.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import aiohttp
import nats
import pytest

from common.core import Allocation, PodManifest, Usage, decode_devices
from common.core.annotations import ALLOCATED_ANNOTATION
from common.core.pod import ObjectMeta
from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsServer
from pyhami.sandbox import RunningDaemon, Sandbox, standalone_config
from scheduler.cluster import ClusterError
from scheduler.cluster.standalone import StandaloneCluster
from scheduler.service import SchedulerService
from tests.harness import Lab, PodClient, eventually

NODES = ["n1", "n2", "n3"]
T4_MEMORY = 15360


async def bind(session: aiohttp.ClientSession, url: str, pod: dict[str, Any],
               node: str) -> str:
    """POST /bind as kube-scheduler does; returns the answer's Error ("" on success)."""
    body = {"PodName": pod["name"], "PodNamespace": pod["namespace"], "PodUID": pod["uid"],
            "Node": node}
    async with session.post(f"{url}/bind", json=body) as response:
        assert response.status == 200, await response.text()
        answer: dict[str, str] = await response.json()
        return answer.get("Error") or ""


async def _equals(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


def allocations_on_the_pods(pods: list[dict[str, Any]]) -> dict[str, Allocation]:
    """The ledger as a restart would rebuild it: from the bound pods' annotations."""
    return {f"{p['namespace']}/{p['name']}": Allocation(
                p["node"], decode_devices(p["annotations"][ALLOCATED_ANNOTATION]), 0)
            for p in pods if p["node"] is not None and ALLOCATED_ANNOTATION in p["annotations"]}


def assert_no_card_over_its_capacity(service: SchedulerService) -> None:
    fleet = service.state.fleet
    for node in fleet.nodes():
        for device in node.cards:
            usage = fleet.usage(node.name, device.uuid)
            assert usage.memory <= device.memory, (node.name, device.uuid, usage)
            assert usage.tenants <= device.count, (node.name, device.uuid, usage)
            assert usage.cores <= device.cores, (node.name, device.uuid, usage)


def running(daemon: RunningDaemon | None) -> SchedulerService:
    assert daemon is not None and daemon.service is not None
    return daemon.service


async def restart(lab: Lab) -> SchedulerService:
    await lab.daemon.stop()
    lab.daemon = await RunningDaemon(standalone_config(lab.nats.url)).start()
    lab.pods.url = lab.daemon.url
    return running(lab.daemon)


# Item 3: a repeated bind ---------------------------------------------------------------


async def test_a_repeated_bind_of_a_bound_pod_changes_nothing(
        lab: Lab, http: aiohttp.ClientSession) -> None:
    allocated = await lab.pods.submit_and_place(lab_pod("first"))
    card = allocated.split(",", 1)[0]
    pod = await lab.pods.get("first")
    service = running(lab.daemon)
    booked = service.state.fleet.usage("gpu-node-1", card)
    assert booked == Usage(tenants=1, memory=1000, cores=0)

    for _ in range(3):
        assert await bind(http, lab.daemon.url, pod, "gpu-node-1") == ""
    refused = await bind(http, lab.daemon.url, pod, "gpu-node-2")
    assert refused == "pod default/first is already bound to gpu-node-1"

    assert service.state.fleet.usage("gpu-node-1", card) == booked
    assert (await lab.pods.get("first"))["annotations"] == pod["annotations"]
    # The card keeps the first pod's 1000 MiB: a pod asking for the rest of it and more
    # lands on another card.
    big = lab_pod("big", {"nvidia.com/use-gpuuuid": card},
                  limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": T4_MEMORY - 999})
    await lab.pods.submit(big)
    waiting = await lab.pods.pending_with("big", "FilteringFailed")
    assert waiting["node"] is None
    assert_no_card_over_its_capacity(service)

    restarted = await restart(lab)
    assert restarted.state.fleet.allocations() == allocations_on_the_pods(await lab.pods.pods())
    assert restarted.state.fleet.usage("gpu-node-1", card) == booked


# Item 6: a pod without GPUs --------------------------------------------------------------


async def test_a_pod_asking_for_no_gpu_is_bound_without_an_allocation(lab: Lab) -> None:
    plain = lab_pod("plain", limits={"cpu": 1})
    await lab.pods.submit(plain)
    placed = await lab.pods.placed("plain")

    assert placed["node"] == "gpu-node-1"
    assert not any(name.startswith("hami.io/") for name in placed["annotations"])
    bound_once = [("Normal", "BindingSucceed",
                   "Successfully binding node [gpu-node-1] to default/plain", 1)]

    async def events() -> list[tuple[str, str, str, int]]:
        pod = await lab.pods.get("plain")
        return [(e["type"], e["reason"], e["message"], e["count"]) for e in pod["events"]]

    # HAMi's Normal Event on the bind (written after the answer), and no Warning.
    await eventually(lambda: _equals(events(), bound_once), "the BindingSucceed Event")
    service = running(lab.daemon)
    assert service.state.fleet.allocations() == {}
    assert "default/plain" not in service.state.cache.bound
    await asyncio.sleep(1.5)  # three rounds of the pending loop: it is not bound again
    assert await events() == bound_once


async def test_an_allocation_its_author_wrote_on_a_pod_without_gpus_books_nothing(
        lab: Lab) -> None:
    forged = lab_pod("forged", limits={"cpu": 1})
    whole_card = "GPU-gpu-node-1-0,NVIDIA,15000,100:;"
    forged["metadata"]["annotations"] = {ALLOCATED_ANNOTATION: whole_card}
    await lab.pods.submit(forged)
    placed = await lab.pods.placed("forged")
    assert ALLOCATED_ANNOTATION not in placed["annotations"]  # the bind removed it
    restarted = await restart(lab)  # the ledger rebuilt from the store
    assert restarted.state.fleet.allocations() == {}


# Item 4: concurrent binds -----------------------------------------------------------------


@pytest.fixture
async def three_nodes() -> AsyncIterator[Sandbox]:
    """Three four-T4 nodes; no pending loop, so only the test's binds place pods."""
    async with Sandbox([(name, "t4x4") for name in NODES], drive_pending=False) as sandbox:
        yield sandbox


async def test_of_concurrent_binds_of_one_pod_exactly_one_places_it(
        three_nodes: Sandbox, http: aiohttp.ClientSession) -> None:
    pods = PodClient(http, three_nodes.url)
    pod = await pods.submit(lab_pod("contested"))
    targets = [node for node in NODES for _ in range(3)]
    answers = await asyncio.gather(*(bind(http, three_nodes.url, pod, node)
                                     for node in targets))

    placed = await pods.get("contested")
    assert placed["node"] in NODES
    winners = [node for node, error in zip(targets, answers, strict=True) if not error]
    assert winners == [placed["node"]] * 3  # the winner, and the repeats to its node
    service = running(three_nodes.daemon)
    assert service.state.fleet.allocations() == allocations_on_the_pods([placed])


async def test_many_pods_bound_concurrently_never_overcommit_a_card(
        three_nodes: Sandbox, http: aiohttp.ClientSession) -> None:
    pods = PodClient(http, three_nodes.url)
    # Two fit on a T4: 24 places for 30 pods, so binds also fail for want of room.
    submitted = [await pods.submit(lab_pod(f"p{i}", limits={"nvidia.com/gpu": 1,
                                                             "nvidia.com/gpumem": 6000}))
                 for i in range(30)]
    targets = [(pod, node) for pod in submitted for node in NODES * 2]
    answers = await asyncio.gather(*(bind(http, three_nodes.url, pod, node)
                                     for pod, node in targets))

    final = {p["name"]: p for p in await pods.pods()}
    for (pod, node), error in zip(targets, answers, strict=True):
        if not error:
            assert final[pod["name"]]["node"] == node
    assert 0 < sum(p["node"] is not None for p in final.values()) <= 24
    daemon = three_nodes.daemon
    assert daemon is not None
    service = running(daemon)
    assert_no_card_over_its_capacity(service)
    assert service.state.fleet.allocations() == allocations_on_the_pods(list(final.values()))
    assert service.state.cache.reservation_count == 0

    await daemon.stop()
    three_nodes.daemon = await RunningDaemon(daemon.config).start()
    restarted = running(three_nodes.daemon)

    async def nodes_back() -> bool:
        return all(restarted.state.fleet.node(name) is not None for name in NODES)

    await eventually(nodes_back, "the nodes to report again")
    assert restarted.state.fleet.allocations() == allocations_on_the_pods(list(final.values()))
    assert_no_card_over_its_capacity(restarted)


async def test_two_daemons_sharing_the_store_cannot_both_bind_a_pod(
        jetstream_server: LocalNatsServer) -> None:
    connections = [await nats.connect(jetstream_server.url) for _ in range(2)]
    try:
        first = await StandaloneCluster.open(connections[0], refusal=lambda: None)
        pod = await first.submit(PodManifest(metadata=ObjectMeta(name="shared")))
        # The second sees the pod pending too.
        second = await StandaloneCluster.open(connections[1], refusal=lambda: None)
        outcomes = await asyncio.gather(
            first.bind("default", "shared", pod.uid, "n1", {"hami.io/vgpu-node": "n1"}),
            second.bind("default", "shared", pod.uid, "n2", {"hami.io/vgpu-node": "n2"}),
            return_exceptions=True)

        refused = [o for o in outcomes if isinstance(o, ClusterError)]
        assert len(refused) == 1, outcomes
        assert "the pod changed meanwhile" in str(refused[0])
        winner = "n1" if outcomes[0] is None else "n2"
        for cluster in (first, second):  # the loser took the winner's version
            seen = await cluster.get_pod("default", "shared")
            assert seen is not None
            assert (seen.node, seen.annotations["hami.io/vgpu-node"]) == (winner, winner)
    finally:
        for connection in connections:
            await connection.close()
