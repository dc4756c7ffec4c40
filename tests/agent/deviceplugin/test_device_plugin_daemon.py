"""The loop closed without Kubernetes: the real standalone daemon places a pod, the real
agent's device plugin hands that pod's cards to the container the kubelet admits, and the
daemon marks the pod ``bind-phase: success``. The kubelet is the fake one of
``tests.fakes.kubelet`` (a real gRPC Registration server)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from agent.deviceplugin.plugin import PluginSettings
from agent.service import Agent, AgentSettings
from agent.vendors.nvidia.plugin import DEVICE_PLUGIN
from agent.vendors.nvidia.simulated import SimulatedSource, profile_cards
from common.core.annotations import ALLOCATED_ANNOTATION, BIND_PHASE_ANNOTATION, decode_devices
from common.messaging import NatsSettings
from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsServer
from pyhami.sandbox import RunningDaemon, standalone_config
from tests.agent.deviceplugin.test_device_plugin_kubelet import CARDS, NODE, folders
from tests.fakes.kubelet import WAIT_S, FakeKubelet
from tests.harness import PodClient, eventually

__all__ = ["folders"]  # the fixture, shared


@dataclass
class Node:
    kubelet: FakeKubelet
    pods: PodClient
    daemon: RunningDaemon


@pytest.fixture(params=[False, True], ids=["without-hami-core", "with-hami-core"])
async def placed_node(request: pytest.FixtureRequest, jetstream_server: LocalNatsServer,
                      folders: tuple[Path, Path],
                      http: aiohttp.ClientSession) -> AsyncIterator[Node]:
    kubelet_dir, hami_dir = folders
    if request.param:
        (hami_dir / "libvgpu.so").write_bytes(b"\x7fELF")
    kubelet = FakeKubelet(kubelet_dir, CARDS)
    await kubelet.start()
    agent = Agent(AgentSettings(NODE, poll_interval=0.2, heartbeat_interval=0.5),
                  SimulatedSource(profile_cards("t4x4", NODE)),
                  NatsSettings(servers=(jetstream_server.url,)),
                  device_plugin=PluginSettings(vendor=DEVICE_PLUGIN, kubelet_dir=kubelet_dir,
                                               hami_core_dir=hami_dir, watch_interval=0.1))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    daemon = await RunningDaemon(standalone_config(jetstream_server.url)).start()
    try:
        await asyncio.wait_for(kubelet.registrations.get(), WAIT_S)
        yield Node(kubelet, PodClient(http, daemon.url), daemon)
    finally:
        await daemon.stop()
        stop.set()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()


async def test_the_container_gets_the_cards_the_daemon_chose_and_the_pod_succeeds(
        placed_node: Node) -> None:
    kubelet, pods = placed_node.kubelet, placed_node.pods
    names = ["first", "second"]
    for name in names:
        await pods.submit_and_place(lab_pod(name, {"hami.io/gpu-scheduler-policy": "binpack"}))
    for name in names:  # admitted back to back, in the order they were bound
        pod = await pods.get(name)
        ((grant,),) = decode_devices(pod["annotations"][ALLOCATED_ANNOTATION])
        response = await kubelet.admit(1)
        assert response.envs["NVIDIA_VISIBLE_DEVICES"] == grant.uuid
        assert response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{grant.memory}m"
        assert response.envs["CUDA_DEVICE_SM_LIMIT"] == str(grant.cores)

        async def succeeded(pod_name: str = name) -> bool:
            current = await pods.get(pod_name)
            return current["annotations"].get(BIND_PHASE_ANNOTATION) == "success"

        await eventually(succeeded, f"{name}'s bind-phase success")


async def test_the_daemon_says_where_slices_are_not_enforced(placed_node: Node) -> None:
    """The agent reports whether HAMi-core is on its node; the daemon's metric says it."""
    service = placed_node.daemon.service
    assert service is not None
    enforced = (placed_node.kubelet.folder.parent / "vgpu" / "libvgpu.so").exists()
    line = f'pyhami_node_memory_slices_enforced{{node="{NODE}"}} {float(enforced)}'

    async def reported() -> bool:
        return line in service.metrics.exposition().decode()

    await eventually(reported, line)
