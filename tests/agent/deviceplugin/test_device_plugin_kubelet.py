"""The agent's device plugin against a fake kubelet and a real nats-server.

The fake kubelet (``tests.fakes.kubelet``) is a real gRPC Registration server on a
temporary ``kubelet.sock``, calling the plugin as the kubelet does. A small responder plays
the daemon on the wire: it answers ``allocations_subject`` with the pods it holds as
pending and drops a pod once its outcome arrives.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import nats
import pytest
from nats.aio.msg import Msg

from agent.deviceplugin import plugin
from agent.deviceplugin.allocation import card_of
from agent.deviceplugin.outcomes import CONFIRM_INTERVAL_S
from agent.deviceplugin.plugin import PluginSettings
from agent.service import Agent, AgentSettings
from agent.vendors.nvidia.plugin import DEVICE_PLUGIN, PLUGIN_SOCKET
from agent.vendors.nvidia.simulated import SimulatedSource, profile_cards
from common.core.annotations import CardGrant, encode_devices
from common.core.deviceconfig import DeviceConfig, FilterDevices, NodeDeviceConfig, NodeSettings
from common.core.vendors import ResourceNames
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

NODE = "gpu-node-1"
CHART_DEFAULTS = NodeDeviceConfig()
CARDS = [card.uuid for card in profile_cards("t4x4", NODE)]


class Daemon:
    """Plays the daemon on the wire: pending pods on request, outcomes collected."""

    def __init__(self) -> None:
        self.pending: list[PendingPod] = []
        self.holding: list[HoldingPod] | None = None
        """None: answers as a daemon that predates the list."""
        self.outcomes: asyncio.Queue[AllocationOutcome] = asyncio.Queue()
        self.requests = 0
        self.lose = 0
        """Outcomes to lose on the way (the pod stays pending), the next ones first."""

    async def on_request(self, message: Msg) -> None:
        self.requests += 1
        await message.respond(encode(PendingAllocations(
            node=NODE, pods=list(self.pending),
            holding=None if self.holding is None else list(self.holding))))

    async def on_outcome(self, message: Msg) -> None:
        outcome = decode_outcome(message.data)
        if self.lose:
            self.lose -= 1
            return
        self.pending = [pod for pod in self.pending if pod.uid != outcome.uid]
        await self.outcomes.put(outcome)

    async def next_outcome(self) -> AllocationOutcome:
        return await asyncio.wait_for(self.outcomes.get(), WAIT_S)


@pytest.fixture
def folders() -> Iterator[tuple[Path, Path]]:
    # Short: a unix socket path must fit in 108 bytes, and pytest's tmp_path may not.
    root = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    kubelet, hami = root / "kubelet", root / "vgpu"
    kubelet.mkdir()
    hami.mkdir()
    yield kubelet, hami
    shutil.rmtree(root)


@asynccontextmanager
async def node(url: str, kubelet_dir: Path, hami_dir: Path, source: SimulatedSource,
               device: NodeDeviceConfig = CHART_DEFAULTS, *, sweep_interval: float = 60.0,
               ) -> AsyncIterator[tuple[FakeKubelet, Daemon]]:
    daemon = Daemon()
    client = await nats.connect(url)
    await client.subscribe(allocations_subject(NODE), cb=daemon.on_request)
    await client.subscribe(allocated_subject(NODE), cb=daemon.on_outcome)
    await client.flush()
    kubelet = FakeKubelet(kubelet_dir, CARDS)
    await kubelet.start()
    agent = Agent(AgentSettings(NODE, poll_interval=0.2, heartbeat_interval=30.0,
                                device=device), source,
                  NatsSettings(servers=(url,), reconnect_max_wait=0.5),
                  device_plugin=PluginSettings(
                      vendor=DEVICE_PLUGIN, kubelet_dir=kubelet_dir, hami_core_dir=hami_dir,
                      lock_dir=hami_dir.parent / "vgpulock", watch_interval=0.1,
                      resource_name=device.device.resources.count,
                      preferred_allocation=device.enable_get_preferred_allocation,
                      numa_topology=device.settings.enable_numa_topology,
                      folder_grace=0.01, folder_sweep_interval=sweep_interval))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        yield kubelet, daemon
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()
        await client.close()


def t4x4() -> SimulatedSource:
    return SimulatedSource(profile_cards("t4x4", NODE))


def pending_pod(name: str, containers: list[list[CardGrant]], bind_time: int) -> PendingPod:
    return PendingPod(namespace="lab", name=name, uid=f"uid-{name}",
                      devices=encode_devices(containers), bind_time=bind_time,
                      containers=tuple(PendingContainer(name=f"c{position}")
                                       for position in range(len(containers))))


async def test_the_plugin_registers_and_lists_count_devices_per_card(
        nats_server: LocalNatsServer, folders: tuple[Path, Path]) -> None:
    kubelet_dir, hami_dir = folders
    async with node(nats_server.url, kubelet_dir, hami_dir, t4x4()) as (kubelet, _):
        request = await asyncio.wait_for(kubelet.registrations.get(), WAIT_S)
        devices = await kubelet.next_list()
    assert (request.version, request.endpoint, request.resource_name) == (
        "v1beta1", PLUGIN_SOCKET, "nvidia.com/gpu")
    assert not request.options.get_preferred_allocation_available
    assert len(devices) == 40
    assert {card_of(d.ID) for d in devices} == set(CARDS)
    assert {d.health for d in devices} == {"Healthy"}
    assert {tuple(n.ID for n in d.topology.nodes) for d in devices} == {()}  # HAMi's default


CONFIGURED = NodeDeviceConfig(
    DeviceConfig(resources=ResourceNames(count="example.com/vgpu"),
                 node=NodeSettings(device_split_count=3, enable_numa_topology=True)),
    filter_devices=FilterDevices(uuids=(CARDS[0],), indexes=(2,)),
    enable_get_preferred_allocation=True)


async def test_the_node_config_names_the_resource_and_shapes_the_list(
        nats_server: LocalNatsServer, folders: tuple[Path, Path]) -> None:
    kubelet_dir, hami_dir = folders
    async with node(nats_server.url, kubelet_dir, hami_dir, t4x4(),
                    CONFIGURED) as (kubelet, _):
        request = await asyncio.wait_for(kubelet.registrations.get(), WAIT_S)
        devices = await kubelet.next_list()
        options = kubelet.options
    assert request.resource_name == "example.com/vgpu"
    assert request.options.get_preferred_allocation_available
    assert options is not None and options.get_preferred_allocation_available
    # The filtered cards (by UUID and by index) are not advertised; the others 3 times each.
    assert sorted(d.ID for d in devices) == sorted(
        f"{uuid}-{replica}" for uuid in (CARDS[1], CARDS[3]) for replica in range(3))
    assert {tuple(n.ID for n in d.topology.nodes) for d in devices} == {(0,)}


async def test_a_card_turning_unhealthy_shows_in_the_next_list(
        nats_server: LocalNatsServer, folders: tuple[Path, Path]) -> None:
    source = t4x4()
    async with node(nats_server.url, *folders, source) as (kubelet, _):
        await kubelet.next_list()
        source.set_health(2, False, "Xid 79")
        devices = await kubelet.next_list()
        source.set_health(2, True)
        recovered = await kubelet.next_list()
    unhealthy = {card_of(d.ID) for d in devices if d.health == "Unhealthy"}
    assert unhealthy == {CARDS[2]}
    assert sum(d.health == "Unhealthy" for d in devices) == 10
    assert {d.health for d in recovered} == {"Healthy"}


async def test_a_kubelet_restart_makes_the_plugin_register_again(
        nats_server: LocalNatsServer, folders: tuple[Path, Path]) -> None:
    async with node(nats_server.url, *folders, t4x4()) as (kubelet, _):
        await asyncio.wait_for(kubelet.registrations.get(), WAIT_S)
        await kubelet.next_list()
        await kubelet.restart()
        again = await asyncio.wait_for(kubelet.registrations.get(), WAIT_S)
        devices = await kubelet.next_list()
    assert again.resource_name == "nvidia.com/gpu"
    assert len(devices) == 40


async def test_allocate_gives_the_chosen_cards_limits_and_hami_core(
        nats_server: LocalNatsServer, folders: tuple[Path, Path]) -> None:
    kubelet_dir, hami_dir = folders
    (hami_dir / "libvgpu.so").write_bytes(b"\x7fELF")
    first = pending_pod("first", [[CardGrant(CARDS[3], 3000, 30)]], bind_time=100)
    second = pending_pod("second", [[CardGrant(CARDS[1], 5000, 50),
                                      CardGrant(CARDS[2], 6000, 50)]], bind_time=101)
    async with node(nats_server.url, kubelet_dir, hami_dir, t4x4()) as (kubelet, daemon):
        await kubelet.next_list()
        daemon.pending = [first, second]
        one = await kubelet.admit(1)
        first_outcome = await daemon.next_outcome()
        two = await kubelet.admit(2)
        second_outcome = await daemon.next_outcome()
    cache = one.envs.pop("CUDA_DEVICE_MEMORY_SHARED_CACHE")
    assert dict(one.envs) == {
        "NVIDIA_VISIBLE_DEVICES": CARDS[3],
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "LIBCUDA_LOG_LEVEL": "1",
    }
    assert re.fullmatch(r"/usr/local/vgpu/[0-9a-f-]{36}\.cache", cache), cache
    folder, lock = hami_dir / "containers" / "uid-first_c0", hami_dir.parent / "vgpulock"
    assert [(m.container_path, m.host_path, m.read_only) for m in one.mounts] == [
        ("/usr/local/vgpu/libvgpu.so", str(hami_dir / "libvgpu.so"), True),
        ("/usr/local/vgpu", str(folder), False),
        ("/tmp/vgpulock", str(lock), False),
        ("/etc/ld.so.preload", str(hami_dir / "ld.so.preload"), True)]
    assert (hami_dir / "ld.so.preload").read_text() == "/usr/local/vgpu/libvgpu.so\n"
    assert [stat.S_IMODE(path.stat().st_mode) for path in (folder, lock)] == [0o777, 0o777]
    assert (first_outcome.name, first_outcome.ok) == ("first", True)
    assert two.envs["NVIDIA_VISIBLE_DEVICES"] == f"{CARDS[1]},{CARDS[2]}"
    assert (two.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], two.envs["CUDA_DEVICE_MEMORY_LIMIT_1"]) == (
        "5000m", "6000m")
    assert (second_outcome.name, second_outcome.ok) == ("second", True)


@pytest.mark.parametrize("device", [
    pytest.param(CHART_DEFAULTS, id="hamis-default-name"),
    pytest.param(NodeDeviceConfig(DeviceConfig(resources=ResourceNames(
        count="example.com/vgpu"))), id="configured-name"),
])
async def test_a_refused_allocate_fails_the_call_and_the_pod(
        nats_server: LocalNatsServer, folders: tuple[Path, Path],
        device: NodeDeviceConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusals name the resource the plugin registered, whatever it is called."""
    monkeypatch.setattr(plugin, "UNLISTED_PATIENCE_S", 0.6)
    wide = pending_pod("wide", [[CardGrant(CARDS[0], 1000, 10),
                                 CardGrant(CARDS[1], 1000, 10)]], bind_time=100)
    resource = device.device.resources.count
    async with node(nats_server.url, *folders, t4x4(), device) as (kubelet, daemon):
        await kubelet.next_list()
        with pytest.raises(grpc.aio.AioRpcError) as nobody:
            await kubelet.admit(1)
        daemon.pending = [wide]
        with pytest.raises(grpc.aio.AioRpcError) as mismatch:
            await kubelet.admit(1)
        outcome = await daemon.next_outcome()
    assert nobody.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert nobody.value.details() == (
        f"no pod bound to node {NODE} waits for 1 device(s) of {resource}")
    assert mismatch.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert mismatch.value.details() == (
        "pod lab/wide: its container #0 was given 2 card(s) but the kubelet asks for 1 "
        f"device(s) of {resource}")
    assert (outcome.name, outcome.ok) == ("wide", False)
    assert outcome.reason == mismatch.value.details()


async def test_allocate_asks_again_while_the_daemon_lists_no_pod_for_it(
        nats_server: LocalNatsServer, folders: tuple[Path, Path]) -> None:
    """A daemon that has just taken the lease may not have read its predecessor's last
    bind yet: the plugin asks again, and serves the pod once it is listed."""
    late = pending_pod("late", [[CardGrant(CARDS[2], 2000, 20)]], bind_time=100)
    async with node(nats_server.url, *folders, t4x4()) as (kubelet, daemon):
        await kubelet.next_list()
        before = daemon.requests

        async def listed_later() -> None:
            await asyncio.sleep(1.2)
            daemon.pending = [late]

        listing = asyncio.create_task(listed_later())
        granted = await kubelet.admit(1)
        await listing
        outcome = await daemon.next_outcome()
    assert granted.envs["NVIDIA_VISIBLE_DEVICES"] == CARDS[2]
    assert (outcome.name, outcome.ok) == ("late", True)
    assert daemon.requests - before >= 3  # the first answer, and asked again after it


@pytest.mark.slow  # waits out the confirmation rounds
async def test_an_outcome_lost_on_the_way_is_sent_again_until_the_daemon_has_it(
        nats_server: LocalNatsServer, folders: tuple[Path, Path]) -> None:
    """An outcome lost (a server dying with it, a lease moving before it was written)
    would leave the pod allocating for ever: the plugin sends it again while the daemon
    still lists the pod as waiting, and stops once it no longer does."""
    lost = pending_pod("lost", [[CardGrant(CARDS[1], 2000, 20)]], bind_time=100)
    async with node(nats_server.url, *folders, t4x4()) as (kubelet, daemon):
        await kubelet.next_list()
        daemon.pending = [lost]
        daemon.lose = 2
        await kubelet.admit(1)
        outcome = await asyncio.wait_for(daemon.outcomes.get(), 3 * WAIT_S)
        requests = daemon.requests
        await asyncio.sleep(2 * CONFIRM_INTERVAL_S + 0.5)
        repeated = daemon.outcomes.qsize()
    assert (outcome.name, outcome.ok) == ("lost", True)
    assert daemon.lose == 0  # the third sending was taken
    assert repeated == 0  # once taken, not sent again
    assert daemon.requests - requests <= 1  # and the daemon is no longer asked


async def test_without_hami_core_allocate_mounts_nothing(
        nats_server: LocalNatsServer, folders: tuple[Path, Path],
        caplog: pytest.LogCaptureFixture) -> None:
    one = pending_pod("one", [[CardGrant(CARDS[0], 2000, 20)]], bind_time=100)
    async with node(nats_server.url, *folders, t4x4()) as (kubelet, daemon):
        await kubelet.next_list()
        daemon.pending = [one]
        response = await kubelet.admit(1)
    assert list(response.mounts) == []
    assert response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    assert sum("memory slices are not enforced" in r.getMessage() for r in caplog.records) == 1


async def test_a_container_folder_that_cannot_be_made_fails_the_call_and_the_pod(
        nats_server: LocalNatsServer, folders: tuple[Path, Path]) -> None:
    kubelet_dir, hami_dir = folders
    (hami_dir / "libvgpu.so").write_bytes(b"\x7fELF")
    (hami_dir / "containers").write_text("a file where the folder should be")
    first = pending_pod("first", [[CardGrant(CARDS[3], 3000, 30)]], bind_time=100)
    async with node(nats_server.url, kubelet_dir, hami_dir, t4x4()) as (kubelet, daemon):
        await kubelet.next_list()
        daemon.pending = [first]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await kubelet.admit(1)
        outcome = await daemon.next_outcome()
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = refused.value.details() or ""
    assert details.startswith(f"cannot make HAMi-core's folder {hami_dir}/containers/uid-first_c0")
    assert (outcome.name, outcome.ok, outcome.reason) == ("first", False, details)


async def test_the_folders_of_pods_no_longer_holding_cards_are_swept(
        nats_server: LocalNatsServer, folders: tuple[Path, Path]) -> None:
    kubelet_dir, hami_dir = folders
    containers = hami_dir / "containers"
    for folder in ("uid-gone_c0", "uid-live_c0", "uid-live_c1"):
        (containers / folder).mkdir(parents=True)
    async with node(nats_server.url, kubelet_dir, hami_dir, t4x4(),
                    sweep_interval=0.05) as (_, daemon):
        # A daemon that does not list the pods holding cards: nothing is removed.
        while daemon.requests < 3:
            await asyncio.sleep(0.05)
        assert len(list(containers.iterdir())) == 3
        daemon.holding = [HoldingPod(namespace="lab", name="live", uid="uid-live")]
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while (containers / "uid-gone_c0").exists():
            assert asyncio.get_running_loop().time() < deadline, "the gone pod's folder kept"
            await asyncio.sleep(0.05)
    assert sorted(path.name for path in containers.iterdir()) == ["uid-live_c0", "uid-live_c1"]
