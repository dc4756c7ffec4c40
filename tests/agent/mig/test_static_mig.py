"""Static MIG: GPUs an operator cut into MIG devices, served as they are. ``single``: each
device a whole card of its own under the node's resource; ``mixed``: each profile a
resource of its own with HAMi's pass-through Allocate."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import grpc
import nats
import pytest

from agent.cli import inventory_spec, static_mig_for
from agent.deviceplugin._v1beta1 import api_pb2, api_pb2_grpc
from agent.deviceplugin.allocation import allocate, device_id
from agent.deviceplugin.plugin import PluginSettings
from agent.mig.nvml import NvmlMigDevices
from agent.mig.setup import mig_node
from agent.mig.simulated import SimulatedMigLibrary
from agent.mig.static import MIG_DEVICE_INDEX_BASE, StaticMigSource
from agent.mig.tables import A100_80GB
from agent.registration import registered_cards
from agent.service import Agent, AgentSettings
from agent.vendors.nvidia.containers import NvidiaContainers
from agent.vendors.nvidia.plugin import DEVICE_PLUGIN
from agent.vendors.nvidia.simulated import SimulatedSource, profile_cards
from common.core.annotations import CardGrant, encode_devices
from common.core.deviceconfig import (
    CHART_MIG_PROFILE_ALLOWLIST,
    DeviceConfig,
    NodeDeviceConfig,
    NodeSettings,
)
from common.core.errors import SettingsError
from common.core.mig import MigPlacement
from common.messaging import NatsSettings
from common.wire import (
    PendingAllocations,
    PendingContainer,
    PendingPod,
    allocations_subject,
    encode,
)
from pyhami.natsserver import LocalNatsServer
from tests.fakes.kubelet import WAIT_S, FakeKubelet

NODE = "gpu-static-1"
GPU_MODEL = "NVIDIA A100-SXM4-80GB"  # NVML names it so: HAMi registers it unprefixed


def partitioned(strategy: str) -> tuple[StaticMigSource, list[str]]:
    """Eight A100s; an operator cut GPU 0 into a 3g.40gb and two 1g.10gb, GPU 1 into a
    7g.80gb; the others are not in MIG mode."""
    source = SimulatedSource(profile_cards("a100x8-nvswitch", NODE))
    uuids = [card.uuid for card in source.read()]
    library = SimulatedMigLibrary([A100_80GB] * 8, uuids, mig_enabled=False)
    devices = NvmlMigDevices(library)
    devices.open()
    for gpu in (0, 1):
        devices.enable_mig(gpu)
    ids = {info.slices: info.id for info in devices.profiles(0)}
    made = [devices.create(0, ids[3], MigPlacement(0, 4)),
            devices.create(0, ids[1], MigPlacement(6, 1)),
            devices.create(0, ids[1], MigPlacement(5, 1)),
            devices.create(1, ids[7], MigPlacement(0, 8))]
    static = StaticMigSource(source, devices, strategy)  # type: ignore[arg-type]
    static.open()
    return static, [m.mig_uuid for m in made]


def test_single_serves_each_mig_device_as_a_whole_card_and_the_other_gpus_as_before(
        ) -> None:
    static, mig = partitioned("single")
    cards = static.read()
    whole = [c for c in cards if c.uuid.startswith("MIG-")]
    assert len(cards) == 6 + 4  # six GPUs not in MIG mode, four MIG devices
    assert [(c.uuid, c.index, c.type, c.memory, c.count) for c in whole] == [
        (mig[0], MIG_DEVICE_INDEX_BASE + 0, f"{GPU_MODEL} MIG 3g.40gb", 40192, 1),
        (mig[2], MIG_DEVICE_INDEX_BASE + 1, f"{GPU_MODEL} MIG 1g.10gb", 9728, 1),
        (mig[1], MIG_DEVICE_INDEX_BASE + 2, f"{GPU_MODEL} MIG 1g.10gb", 9728, 1),
        (mig[3], MIG_DEVICE_INDEX_BASE + 8, f"{GPU_MODEL} MIG 7g.80gb", 80896, 1)]
    # Registered whole: no split count, no scaling.
    config = NodeDeviceConfig(DeviceConfig(
        node=NodeSettings(device_split_count=5, device_memory_scaling=2.0)))
    registered = {c.uuid: c for c in registered_cards(cards, config)}
    assert (registered[mig[0]].count, registered[mig[0]].memory) == (1, 40192)
    assert registered[cards[0].uuid].count == 5


def test_mixed_leaves_the_partitioned_gpus_to_the_mig_resources() -> None:
    static, mig = partitioned("mixed")
    cards = static.read()
    assert len(cards) == 6
    assert not any(c.uuid.startswith("MIG-") for c in cards)
    assert [(d.uuid, d.resource_suffix) for d in static.mig_devices] == [
        (mig[0], "mig-3g.40gb"), (mig[2], "mig-1g.10gb"), (mig[1], "mig-1g.10gb"),
        (mig[3], "mig-7g.80gb")]


def test_a_whole_mig_device_is_handed_over_without_hami_core() -> None:
    static, mig = partitioned("single")
    pod = PendingPod(namespace="lab", name="p", uid="uid-p", bind_time=1,
                     devices=encode_devices([[CardGrant(mig[1], 9728, 100)]]),
                     containers=(PendingContainer(name="c"),))
    result = allocate([pod], {}, [[device_id(mig[1], 0)]], node=NODE,
                      node_cards=[c.uuid for c in static.read()],
                      runtime=NvidiaContainers(None))
    (container,) = result.allocations
    assert container.envs == {"NVIDIA_VISIBLE_DEVICES": mig[1]}
    assert container.mounts == ()


@pytest.mark.parametrize(("strategy", "inventory", "dynamic", "says"), [
    ("single", "sim:t4x4", False, "reads the MIG devices through NVML"),
    ("mixed", "nvml", True, "use one or the other"),
])
def test_a_strategy_that_cannot_work_is_refused_at_start(
        strategy: str, inventory: str, dynamic: bool, says: str) -> None:
    source = SimulatedSource(profile_cards("a100x8-mig", NODE))
    node = (mig_node(source, NvmlMigDevices(SimulatedMigLibrary(
        [A100_80GB] * 8, [c.uuid for c in source.read()])), CHART_MIG_PROFILE_ALLOWLIST)
        if dynamic else None)
    with pytest.raises(SettingsError, match=says):
        static_mig_for(strategy, inventory_spec(inventory), node, source)  # type: ignore[arg-type]
    assert static_mig_for("none", inventory_spec(inventory), node, source) is None


async def test_mixed_registers_each_profile_and_passes_the_kubelets_choice_through(
        nats_server: LocalNatsServer) -> None:
    static, mig = partitioned("mixed")
    root = Path(tempfile.mkdtemp(prefix="smig-", dir="/tmp"))
    kubelet_dir = root / "kubelet"
    kubelet_dir.mkdir()
    client = await nats.connect(nats_server.url)

    async def answer(message: object) -> None:
        await message.respond(encode(PendingAllocations(  # type: ignore[attr-defined]
            node=NODE, pods=[], holding=[])))

    await client.subscribe(allocations_subject(NODE), cb=answer)
    kubelet = FakeKubelet(kubelet_dir, [])
    await kubelet.start()
    agent = Agent(AgentSettings(NODE, poll_interval=0.2, heartbeat_interval=30.0), static,
                  NatsSettings(servers=(nats_server.url,)),
                  device_plugin=PluginSettings(vendor=DEVICE_PLUGIN, kubelet_dir=kubelet_dir,
                                               hami_core_dir=root / "vgpu",
                                               lock_dir=root / "lock", watch_interval=0.1,
                                               mig_strategy="mixed"),
                  static_mig=static)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        registered = {}
        while len(registered) < 4:
            request = await asyncio.wait_for(kubelet.registrations.get(), WAIT_S)
            registered[request.resource_name] = request.endpoint
        async with grpc.aio.insecure_channel(
                f"unix://{kubelet_dir / registered['nvidia.com/mig-1g.10gb']}") as channel:
            plugin = api_pb2_grpc.DevicePluginStub(channel)
            listed = await asyncio.wait_for(
                plugin.ListAndWatch(api_pb2.Empty()).read(), WAIT_S)
            answer_ok = await plugin.Allocate(api_pb2.AllocateRequest(container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=[mig[1]])]))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await plugin.Allocate(api_pb2.AllocateRequest(container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=[mig[0]])]))
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()
        await client.close()
    assert set(registered) == {"nvidia.com/gpu", "nvidia.com/mig-3g.40gb",
                               "nvidia.com/mig-1g.10gb", "nvidia.com/mig-7g.80gb"}
    assert sorted(d.ID for d in listed.devices) == sorted([mig[1], mig[2]])
    assert dict(answer_ok.container_responses[0].envs) == {"NVIDIA_VISIBLE_DEVICES": mig[1]}
    # The 3g device is another resource's.
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"unknown device {mig[0]}" in (refused.value.details() or "")
