"""Check 4, the device plugin's hand-over: the agent, reading the real card through NVML,
serves the kubelet's device plugin API (to ``tests.fakes.kubelet``, a real gRPC kubelet
side on a unix socket); a pod bound to the node with a slice of the real card (3000 MiB,
30 %) is admitted, and the Allocate answer is checked against this machine: the card's
UUID in ``NVIDIA_VISIBLE_DEVICES``, the limits HAMi-core reads, and every mount's host path
there as the plugin promised it.

The answer names no device node: like HAMi's, pyhami's plugin leaves that to NVIDIA's
container runtime, which adds ``/dev/nvidiactl``, ``/dev/nvidia-uvm`` and the card's
``/dev/nvidia<minor>`` for the UUIDs in ``NVIDIA_VISIBLE_DEVICES``; the check says whether
those exist here. HAMi-core itself is not installed here: where the check runs "with
HAMi-core", ``libvgpu.so`` is a placeholder file the plugin finds, not a library anything
loads.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pynvml
import pytest
from nats.aio.msg import Msg

from agent.deviceplugin._v1beta1 import api_pb2
from agent.deviceplugin.plugin import PluginSettings
from agent.service import Agent, AgentSettings
from agent.vendors.nvidia.nvml import NvmlSource
from agent.vendors.nvidia.plugin import DEVICE_PLUGIN
from common.core.annotations import CardGrant, encode_devices
from common.messaging import NatsSettings
from common.wire import (
    AllocationOutcome,
    PendingAllocations,
    PendingContainer,
    PendingPod,
    allocated_subject,
    allocations_subject,
    decode_outcome,
    encode,
)
from pyhami.natsserver import LocalNatsServer
from tests.fakes.kubelet import FakeKubelet
from tests.gpu.machine import gpu_marks
from tests.gpu.report import CheckLog

pytestmark = gpu_marks()

NODE = "gpu-check"
WAIT_S = 30.0
MEMORY_MIB, CORES = 3000, 30


class Daemon:
    """Plays the daemon on NATS: the one pending pod on request, its outcome kept."""

    def __init__(self, pod: PendingPod) -> None:
        self.pending = [pod]
        self.outcomes: asyncio.Queue[AllocationOutcome] = asyncio.Queue()

    async def on_request(self, message: Msg) -> None:
        await message.respond(encode(PendingAllocations(node=NODE, pods=list(self.pending),
                                                        holding=[])))

    async def on_outcome(self, message: Msg) -> None:
        outcome = decode_outcome(message.data)
        self.pending = [pod for pod in self.pending if pod.uid != outcome.uid]
        await self.outcomes.put(outcome)


@dataclass
class Admission:
    registration: api_pb2.RegisterRequest
    devices: list[api_pb2.Device]
    answer: api_pb2.ContainerAllocateResponse
    outcome: AllocationOutcome
    seconds: float


@pytest.fixture
def folders() -> Iterator[Path]:
    # Short: a unix socket's path must fit in 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="gpu-dp-", dir="/tmp"))
    (root / "kubelet").mkdir()
    (root / "vgpu").mkdir()
    yield root
    shutil.rmtree(root)


async def _admit(url: str, root: Path, card: str, pod: PendingPod) -> Admission:
    daemon = Daemon(pod)
    client = await nats.connect(url)
    await client.subscribe(allocations_subject(NODE), cb=daemon.on_request)
    await client.subscribe(allocated_subject(NODE), cb=daemon.on_outcome)
    await client.flush()
    kubelet = FakeKubelet(root / "kubelet", [card])
    await kubelet.start()
    agent = Agent(AgentSettings(NODE, poll_interval=0.5, heartbeat_interval=30.0),
                  NvmlSource(), NatsSettings(servers=(url,), reconnect_max_wait=0.5),
                  device_plugin=PluginSettings(
                      vendor=DEVICE_PLUGIN, kubelet_dir=root / "kubelet",
                      hami_core_dir=root / "vgpu", lock_dir=root / "vgpulock", watch_interval=0.1,
                      numa_topology=True))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        registration = await asyncio.wait_for(kubelet.registrations.get(), WAIT_S)
        devices: list[api_pb2.Device] = []
        while not devices:  # the first list may come before the first inventory
            devices = await asyncio.wait_for(kubelet.lists.get(), WAIT_S)
        started = time.monotonic()
        answer = await asyncio.wait_for(kubelet.admit(1), WAIT_S)
        seconds = time.monotonic() - started
        outcome = await asyncio.wait_for(daemon.outcomes.get(), WAIT_S)
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
        await kubelet.stop()
        await client.close()
    return Admission(registration, devices, answer, outcome, seconds)


def _real_card() -> tuple[str, int, int]:
    """GPU 0's UUID, its NUMA node as the agent reads it, and its device minor number."""
    source = NvmlSource()
    source.open()
    try:
        first = source.read()[0]
    finally:
        source.close()
    pynvml.nvmlInit()
    try:
        minor = pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByUUID(first.uuid))
    finally:
        pynvml.nvmlShutdown()
    return first.uuid, first.numa, minor


@pytest.mark.parametrize("hami_core", [False, True], ids=["no-hami-core", "hami-core"])
def test_allocate_hands_the_real_card_over(seen: CheckLog, folders: Path,
                                           hami_core: bool) -> None:
    card, numa, minor = _real_card()
    if hami_core:
        (folders / "vgpu" / "libvgpu.so").write_bytes(b"a placeholder, not HAMi-core\n")
    pod = PendingPod(namespace="gpu-check", name="alloc", uid=str(uuid.uuid4()),
                     devices=encode_devices([[CardGrant(card, MEMORY_MIB, CORES)]]),
                     bind_time=int(time.time()), containers=(PendingContainer(name="cuda"),))
    with LocalNatsServer() as server:
        admission = asyncio.run(_admit(server.url, folders, card, pod))
    answer = admission.answer
    envs = dict(answer.envs)
    mounts = [(m.container_path, m.host_path, m.read_only) for m in answer.mounts]
    seen.saw("allocate_seconds", round(admission.seconds, 3))
    seen.saw("envs", envs)
    seen.saw("mounts", mounts)
    seen.saw("device_specs", [(d.container_path, d.host_path, d.permissions)
                              for d in answer.devices])
    seen.saw("registered", {"resource": admission.registration.resource_name,
                            "version": admission.registration.version})
    seen.compare("the outcome", (admission.outcome.uid, admission.outcome.ok,
                                 admission.outcome.reason), (pod.uid, True, ""),
                 ours_name="plugin", theirs_name="expected")
    _judge_devices(seen, admission.devices, card, numa)
    expected = {"NVIDIA_VISIBLE_DEVICES": card, "CUDA_DEVICE_MEMORY_LIMIT_0": f"{MEMORY_MIB}m",
                "CUDA_DEVICE_SM_LIMIT": str(CORES)}
    for name, value in expected.items():
        seen.compare(name, envs.get(name), value, ours_name="Allocate", theirs_name="expected")
    cache = envs.get("CUDA_DEVICE_MEMORY_SHARED_CACHE", "")
    if hami_core:
        if not re.fullmatch(r"/usr/local/vgpu/[0-9a-f-]{36}\.cache", cache):
            seen.differs(f"CUDA_DEVICE_MEMORY_SHARED_CACHE {cache!r}")
        _judge_mounts(seen, folders, pod.uid, mounts)
    else:
        seen.compare("CUDA_DEVICE_MEMORY_SHARED_CACHE", cache, f"/tmp/vgpu/{pod.uid}.cache",
                     ours_name="Allocate", theirs_name="expected")
        seen.compare("mounts without HAMi-core", mounts, [], ours_name="Allocate",
                     theirs_name="expected")
    _judge_device_nodes(seen, minor)
    seen.assert_same()


def _judge_devices(seen: CheckLog, devices: list[api_pb2.Device], card: str,
                   numa: int) -> None:
    """ListAndWatch: ten devices of the card, healthy, on its NUMA node where it has one."""
    seen.saw("listed", [(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in devices])
    seen.compare("the devices listed", sorted(d.ID for d in devices),
                 sorted(f"{card}-{n}" for n in range(10)), ours_name="ListAndWatch",
                 theirs_name="expected")
    seen.compare("their health", {d.health for d in devices}, {"Healthy"},
                 ours_name="ListAndWatch", theirs_name="expected")
    seen.compare("their NUMA nodes", {tuple(n.ID for n in d.topology.nodes) for d in devices},
                 {(numa,) if numa >= 0 else ()}, ours_name="ListAndWatch",
                 theirs_name="the card's")


def _judge_mounts(seen: CheckLog, root: Path, uid: str,
                  mounts: list[tuple[str, str, bool]]) -> None:
    vgpu = root / "vgpu"
    folder = vgpu / "containers" / f"{uid}_cuda"
    seen.compare("mounts", mounts, [
        ("/usr/local/vgpu/libvgpu.so", str(vgpu / "libvgpu.so"), True),
        ("/usr/local/vgpu", str(folder), False),
        ("/tmp/vgpulock", str(root / "vgpulock"), False),
        ("/etc/ld.so.preload", str(vgpu / "ld.so.preload"), True)],
        ours_name="Allocate", theirs_name="expected")
    for _, host, _ in mounts:
        if not Path(host).exists():
            seen.differs(f"mounted host path {host} does not exist")
    if folder.is_dir():
        seen.compare("the container folder's mode", oct(stat.S_IMODE(folder.stat().st_mode)),
                     oct(0o777), ours_name="made", theirs_name="HAMi's")
        seen.compare("the container folder's content", sorted(folder.iterdir()), [],
                     ours_name="made", theirs_name="expected")
    preload = vgpu / "ld.so.preload"
    if preload.is_file():
        seen.compare("ld.so.preload", preload.read_text(), "/usr/local/vgpu/libvgpu.so\n",
                     ours_name="written", theirs_name="expected")


def _judge_device_nodes(seen: CheckLog, minor: int) -> None:
    """What NVIDIA's container runtime would mount for the card: these must exist here."""
    needed = ["/dev/nvidiactl", f"/dev/nvidia{minor}"]
    extra = ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
             "/dev/nvidia-caps"]
    present = {path: Path(path).exists() for path in [*needed, *extra]}
    seen.saw("device_nodes", present)
    for path in needed:
        if not present[path]:
            seen.differs(f"{path} does not exist: the runtime could not hand the card over")
