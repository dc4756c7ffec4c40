"""The agent as HAMi's node monitor, over a real nats-server: its ``/metrics`` listener names
a container's cache file by the daemon's list of pods, and its inventories carry the
measured usage to the daemon."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import nats
from nats.aio.msg import Msg
from prometheus_client.parser import text_string_to_metric_families

from agent.monitor.containers import CacheSettings
from agent.monitor.monitor import MonitorSettings
from agent.service import Agent, AgentSettings
from agent.vendors.nvidia.simulated import SimulatedSource, profile_cards
from common.messaging import NatsSettings
from common.wire import (
    HoldingContainer,
    HoldingPod,
    Inventory,
    PendingAllocations,
    allocations_subject,
    decode_inventory,
    encode,
    inventory_subject,
)
from pyhami.natsserver import LocalNatsServer, free_port
from tests.fakes.hami_core_cache import FakeCache, Proc, Used, write_cache

NODE = "gpu-node-1"
MIB = 1024 * 1024
CARDS = profile_cards("t4x4", NODE)
UID = "3f2e1d0c-9b8a-4765-a432-10fedcba9876"
WAIT_S = 10.0


@asynccontextmanager
async def agent_with_monitor(url: str, containers: Path, port: int
                             ) -> AsyncIterator[asyncio.Queue[Inventory]]:
    """An agent with its monitor on ``port``; a stand-in daemon listing one pod holding card
    0, and the inventories the agent publishes."""
    client = await nats.connect(url)
    holding = [HoldingPod(namespace="lab", name="train", uid=UID, containers=(
        HoldingContainer(name="main", cards=(CARDS[0].uuid,)),))]

    async def answer(message: Msg) -> None:
        await message.respond(encode(PendingAllocations(node=NODE, pods=[], holding=holding)))

    inventories: asyncio.Queue[Inventory] = asyncio.Queue()

    async def published(message: Msg) -> None:
        await inventories.put(decode_inventory(message.data))

    await client.subscribe(allocations_subject(NODE), cb=answer)
    await client.subscribe(inventory_subject(NODE), cb=published)
    await client.flush()
    source = SimulatedSource(list(CARDS))
    source.set_usage(0, memory_used=2500 * MIB, utilization=40)
    agent = Agent(AgentSettings(NODE, poll_interval=0.2, heartbeat_interval=30.0,
                                usage_interval=0.3), source,
                  NatsSettings(servers=(url,), reconnect_max_wait=0.5),
                  monitor=MonitorSettings(metrics=("127.0.0.1", port), monitor_interval=0.2,
                                          caches=CacheSettings(containers_dir=containers)),
                  probe=source)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        yield inventories
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await client.close()


async def scrape(port: int) -> dict[tuple[str, str], float]:
    """The card 0 series by (metric, pod); none while the listener is not up yet."""
    try:
        async with aiohttp.ClientSession() as session, session.get(
                f"http://127.0.0.1:{port}/metrics") as response:
            assert response.status == 200
            text = await response.text()
    except aiohttp.ClientConnectionError:
        return {}
    return {(sample.name, sample.labels.get("pod", "")): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.labels.get("device_uuid") == CARDS[0].uuid}


async def test_metrics_name_the_cache_file_and_inventories_carry_the_usage(
        nats_server: LocalNatsServer, tmp_path: Path) -> None:
    containers = tmp_path / "containers"
    write_cache(containers / f"{UID}_main" / "x.cache", FakeCache(
        uuids={0: CARDS[0].uuid.encode()}, limits={0: 4000 * MIB},
        procs=[Proc(used={0: Used(total=1800 * MIB)}, sm_util={0: 25})]))
    port = free_port()
    async with agent_with_monitor(nats_server.url, containers, port) as inventories:
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while ("hami_vgpu_memory_used_bytes", "train") not in (found := await scrape(port)):
            assert asyncio.get_running_loop().time() < deadline, found
            await asyncio.sleep(0.1)
        while True:
            inventory = await asyncio.wait_for(inventories.get(), WAIT_S)
            if inventory.measured is not None and inventory.measured.containers:
                break
    assert found[("hami_vgpu_memory_used_bytes", "train")] == 1800 * MIB
    assert found[("hami_vgpu_memory_limit_bytes", "train")] == 4000 * MIB
    assert found[("hami_container_device_utilization_ratio", "train")] == 25
    assert found[("hami_host_gpu_memory_used_bytes", "")] == 2500 * MIB
    (container,) = inventory.measured.containers
    assert (container.pod_uid, container.container, container.memory_used,
            container.source) == (UID, "main", 1800, "hami-core")
