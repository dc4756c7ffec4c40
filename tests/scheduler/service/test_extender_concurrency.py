"""Many filter and bind calls in flight at once never book a card twice."""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from common.core import decode_devices
from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsServer
from pyhami.sandbox import RunningDaemon, SimulatedAgent, standalone_config
from tests.harness import PodClient, eventually

pytestmark = pytest.mark.slow  # concurrent load on the daemon

NODES = 100
PODS = 500
PROFILES = ("t4x4", "a100x8-nvswitch", "h100x8-islands")


@dataclass
class Cluster:
    daemon: RunningDaemon
    pods: PodClient
    http: aiohttp.ClientSession
    nodes: list[SimulatedAgent]


@pytest.fixture
async def cluster(jetstream_server: LocalNatsServer,
                  http: aiohttp.ClientSession) -> AsyncIterator[Cluster]:
    nodes = [SimulatedAgent.start(f"node-{i:03d}", jetstream_server.url,
                                 PROFILES[i % len(PROFILES)], poll_interval=5.0)
             for i in range(NODES)]
    config = standalone_config(jetstream_server.url, drive_pending=False)
    daemon = await RunningDaemon(config).start()

    async def all_known() -> bool:
        assert daemon.service is not None
        return sum(1 for _ in daemon.service.state.fleet.nodes()) == NODES

    await eventually(all_known, "every node's inventory", timeout=60)
    yield Cluster(daemon, PodClient(http, daemon.url), http, nodes)
    await daemon.stop()
    await asyncio.gather(*(node.halt() for node in nodes))


async def schedule_concurrently(cluster: Cluster, pods: list[dict[str, Any]]) -> Counter[str]:
    """Submit every pod, then run one filter+bind pair per pod, many in flight at once."""
    created = [await cluster.pods.submit(pod) for pod in pods]
    names = [n.name for n in cluster.nodes]
    gate = asyncio.Semaphore(64)
    outcome: Counter[str] = Counter()

    async def schedule(pod: dict[str, Any], uid: str) -> None:
        async with gate:
            async with cluster.http.post(f"{cluster.daemon.url}/filter",
                                         json={"Pod": pod, "NodeNames": names}) as response:
                result = await response.json()
            if not result["NodeNames"]:
                outcome["unschedulable"] += 1
                return
            binding = {"PodName": pod["metadata"]["name"], "PodNamespace": "default",
                       "PodUID": uid, "Node": result["NodeNames"][0]}
            async with cluster.http.post(f"{cluster.daemon.url}/bind", json=binding) as response:
                outcome["bound" if (await response.json())["Error"] == "" else "bind_failed"] += 1

    await asyncio.gather(*(schedule(pod, c["uid"]) for pod, c in zip(pods, created, strict=True)))
    return outcome


async def booked_per_card(cluster: Cluster) -> dict[tuple[str, str], list[tuple[str, int, int]]]:
    """(node, uuid) -> [(pod, memory, cores)] read back from the pods' annotations."""
    booked: dict[tuple[str, str], list[tuple[str, int, int]]] = defaultdict(list)
    for pod in await cluster.pods.pods():
        if pod["node"] is None:
            continue
        for grants in decode_devices(pod["annotations"]["hami.io/vgpu-devices-allocated"]):
            for grant in grants:
                booked[(pod["node"], grant.uuid)].append((pod["name"], grant.memory, grant.cores))
    return booked


def check_capacity(cluster: Cluster,
                   booked: dict[tuple[str, str], list[tuple[str, int, int]]]) -> None:
    """Card by card against the inventory: memory, cores and slots, and the daemon's ledger."""
    assert cluster.daemon.service is not None
    fleet = cluster.daemon.service.state.fleet
    cards = {(node.name, card.uuid): card for node in cluster.nodes
             for card in node.source.read()}
    for key, grants in booked.items():
        card = cards[key]
        assert sum(m for _, m, _ in grants) <= card.memory, key
        assert sum(c for _, _, c in grants) <= card.cores, key
        assert len(grants) <= card.count, key
        usage = fleet.usage(*key)
        assert (usage.tenants, usage.memory, usage.cores) == (
            len(grants), sum(m for _, m, _ in grants), sum(c for _, _, c in grants)), key
    assert not cluster.daemon.service.state.cache.reservation_count


async def test_concurrent_mutex_pods_never_share_a_card(cluster: Cluster) -> None:
    pods = [lab_pod(f"mutex-{i}", {"hami.io/gpu-scheduler-policy": "mutex"},
                    limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})
            for i in range(PODS)]
    outcome = await schedule_concurrently(cluster, pods)
    assert outcome == Counter({"bound": PODS})
    booked = await booked_per_card(cluster)
    assert sum(len(g) for g in booked.values()) == PODS
    assert all(len(grants) == 1 for grants in booked.values())
    check_capacity(cluster, booked)


async def test_concurrent_mixed_pods_never_oversubscribe(cluster: Cluster) -> None:
    rng = random.Random(7)
    pods = []
    for i in range(PODS):
        limits = {"nvidia.com/gpu": rng.choice((1, 1, 1, 2)),
                  "nvidia.com/gpumem": rng.choice((2000, 4000, 8000, 12000)),
                  "nvidia.com/gpucores": rng.choice((0, 25, 50))}
        policy = rng.choice(("binpack", "spread", "binpack,numa", "mutex"))
        pods.append(lab_pod(f"mixed-{i}", {"hami.io/gpu-scheduler-policy": policy}, limits))
    outcome = await schedule_concurrently(cluster, pods)
    assert outcome["bind_failed"] == 0
    assert outcome["bound"] + outcome["unschedulable"] == PODS
    assert outcome["bound"] > PODS // 2
    check_capacity(cluster, await booked_per_card(cluster))
