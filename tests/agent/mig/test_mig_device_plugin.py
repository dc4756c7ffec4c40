"""A node in MIG mode through its device plugin, against a fake kubelet and a real
nats-server (a responder plays the daemon): Allocate makes the reserved instance and names
its MIG UUID, the outcome carries its runtime identity, and the instance is destroyed once
no pod holds it."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from agent.deviceplugin import plugin
from agent.deviceplugin.plugin import PluginSettings
from agent.mig.nvml import NvmlMigDevices
from agent.mig.setup import mig_node
from agent.mig.simulated import SimulatedMigLibrary
from agent.mig.tables import A100_80GB
from agent.service import Agent, AgentSettings
from agent.vendors.nvidia.plugin import DEVICE_PLUGIN
from agent.vendors.nvidia.simulated import SimulatedSource, profile_cards
from common.core.annotations import CardGrant, encode_devices, mig_reservations
from common.core.deviceconfig import CHART_MIG_PROFILE_ALLOWLIST
from common.core.mig import MigInstance, MigPlacement, encode_reservations
from common.messaging import NatsSettings
from common.wire import (
    AllocationOutcome,
    HoldingPod,
    PendingAllocations,
    PendingContainer,
    PendingPod,
    allocated_subject,
    allocations_subject,
    decode_outcome,
    encode,
)
from pyhami.natsserver import LocalNatsServer
from tests.fakes.kubelet import WAIT_S, FakeKubelet

NODE = "gpu-mig-1"
CARDS = [card.uuid for card in profile_cards("a100x8-mig", NODE)]


class Daemon:
    def __init__(self) -> None:
        self.pending: list[PendingPod] = []
        self.holding: list[HoldingPod] = []
        self.outcomes: asyncio.Queue[AllocationOutcome] = asyncio.Queue()

    async def on_request(self, message: Msg) -> None:
        await message.respond(encode(PendingAllocations(
            node=NODE, pods=list(self.pending), holding=list(self.holding))))

    async def on_outcome(self, message: Msg) -> None:
        outcome = decode_outcome(message.data)
        self.pending = [pod for pod in self.pending if pod.uid != outcome.uid]
        await self.outcomes.put(outcome)


def mig_pod(name: str, *instances: tuple[str, int, int, int]) -> tuple[PendingPod, HoldingPod]:
    """A pod whose one container holds ``instances`` (card, profile memory, start, size)."""
    profile = {1: "1g.10gb", 2: "2g.20gb", 4: "3g.40gb", 8: "7g.79gb"}
    grants = [CardGrant(card, memory, 0, MigInstance(profile[size], MigPlacement(start, size)))
              for card, memory, start, size in
              [(CARDS[c], m, s, z) for c, m, s, z in instances]]
    devices = encode_devices([grants])
    reserved = encode_reservations(mig_reservations(((*grants,),)))
    pending = PendingPod(namespace="lab", name=name, uid=f"uid-{name}", devices=devices,
                         bind_time=100, containers=(PendingContainer(name="c0"),),
                         mig_allocations=reserved)
    holding = HoldingPod(namespace="lab", name=name, uid=f"uid-{name}",
                         mig_allocations=reserved)
    return pending, holding


@asynccontextmanager
async def mig_agent(url: str, library: SimulatedMigLibrary
                    ) -> AsyncIterator[tuple[FakeKubelet, Daemon]]:
    root = Path(tempfile.mkdtemp(prefix="mig-", dir="/tmp"))
    kubelet_dir, hami_dir = root / "kubelet", root / "vgpu"
    kubelet_dir.mkdir()
    hami_dir.mkdir()
    daemon = Daemon()
    client = await nats.connect(url)
    await client.subscribe(allocations_subject(NODE), cb=daemon.on_request)
    await client.subscribe(allocated_subject(NODE), cb=daemon.on_outcome)
    await client.flush()
    kubelet = FakeKubelet(kubelet_dir, CARDS)
    await kubelet.start()
    source = SimulatedSource(profile_cards("a100x8-mig", NODE))
    node = mig_node(source, NvmlMigDevices(library), CHART_MIG_PROFILE_ALLOWLIST)
    agent = Agent(AgentSettings(NODE, poll_interval=0.2, heartbeat_interval=30.0),
                  node.source, NatsSettings(servers=(url,), reconnect_max_wait=0.5),
                  device_plugin=PluginSettings(vendor=DEVICE_PLUGIN, kubelet_dir=kubelet_dir,
                                               hami_core_dir=hami_dir, lock_dir=root / "vgpulock",
                                               watch_interval=0.1),
                  mig=node.manager)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        yield kubelet, daemon
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()
        await client.close()


def instances_on(library: SimulatedMigLibrary, gpu: int) -> list[tuple[int, int]]:
    devices = NvmlMigDevices(library)
    devices.open()  # NVML counts its starts: the agent's own is not disturbed
    try:
        return sorted((i.placement.start, i.placement.size) for i in devices.instances(gpu))
    finally:
        devices.close()


async def test_allocate_makes_the_reserved_instance_and_the_reconcile_destroys_it_later(
        nats_server: LocalNatsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "MIG_RECONCILE_S", 0.2)
    library = SimulatedMigLibrary([A100_80GB] * len(CARDS), CARDS)
    async with mig_agent(nats_server.url, library) as (kubelet, daemon):
        devices = await kubelet.next_list()
        pending, holding = mig_pod("small", (0, 9728, 6, 1))
        daemon.pending, daemon.holding = [pending], [holding]
        response = await kubelet.admit(1)
        outcome = await asyncio.wait_for(daemon.outcomes.get(), WAIT_S)
        made = instances_on(library, 0)
        mig_uuid = response.envs["NVIDIA_VISIBLE_DEVICES"]
        daemon.holding = []  # the pod is gone

        async def destroyed() -> None:
            while instances_on(library, 0):
                await asyncio.sleep(0.05)

        await asyncio.wait_for(destroyed(), WAIT_S)
    # Seven devices a card: the largest instance count of its profiles.
    assert len(devices) == 8 * 7
    assert made == [(6, 1)]
    assert mig_uuid.startswith("MIG-")
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": mig_uuid}
    assert list(response.mounts) == []  # no HAMi-core on a MIG instance
    assert outcome.ok
    (runtime,) = outcome.mig_instances
    assert (runtime.container_index, runtime.device_index, runtime.mig_uuid) == (0, 0,
                                                                                  mig_uuid)


async def test_an_instance_nvml_refuses_fails_the_call_and_the_pod(
        nats_server: LocalNatsServer) -> None:
    library = SimulatedMigLibrary([A100_80GB] * len(CARDS), CARDS)
    async with mig_agent(nats_server.url, library) as (kubelet, daemon):
        await kubelet.next_list()
        # Slice 7 is no placement NVML offers for a 1g: the scheduler's reservation is bad.
        pending, holding = mig_pod("bad", (0, 9728, 7, 1))
        daemon.pending, daemon.holding = [pending], [holding]
        with pytest.raises(Exception, match="invalid placement 7"):
            await kubelet.admit(1)
        outcome = await asyncio.wait_for(daemon.outcomes.get(), WAIT_S)
    assert not outcome.ok
    assert "invalid placement 7+1 for profile 1g.10gb" in outcome.reason
    assert instances_on(library, 0) == []
