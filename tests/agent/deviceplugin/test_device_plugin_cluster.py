"""The device plugin's Allocate while NATS is away (issue 29): on a cluster of three real
nats-servers, the agent's server killed while the kubelet admits a container, Allocate is
answered through another server within the patience; with no daemon at all, Allocate is
refused once the patience is spent, with the reason."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from agent.deviceplugin.plugin import PluginSettings
from agent.deviceplugin.source import ASK_PATIENCE_S, REQUEST_TIMEOUT_S, RETRY_PAUSE_S
from agent.service import Agent, AgentSettings
from agent.vendors.nvidia.plugin import DEVICE_PLUGIN
from agent.vendors.nvidia.simulated import SimulatedSource, profile_cards
from common.core.annotations import ALLOCATED_ANNOTATION, decode_devices
from common.messaging import NatsSettings
from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsCluster, LocalNatsServer
from pyhami.sandbox import RunningDaemon, servers_of, standalone_config
from tests.agent.deviceplugin.test_device_plugin_kubelet import CARDS, NODE, folders
from tests.fakes.kubelet import WAIT_S, FakeKubelet
from tests.harness import PodClient

__all__ = ["folders"]  # the fixture, shared

@contextlib.asynccontextmanager
async def agent_with_plugin(nats_url: str, folders: tuple[Path, Path],
                            patience: float = ASK_PATIENCE_S) -> AsyncIterator[
                                tuple[Agent, FakeKubelet]]:
    """A real agent serving the device plugin to the fake kubelet, on ``nats_url``."""
    kubelet_dir, hami_dir = folders
    kubelet = FakeKubelet(kubelet_dir, CARDS)
    await kubelet.start()
    agent = Agent(AgentSettings(NODE, poll_interval=0.2, heartbeat_interval=0.5),
                  SimulatedSource(profile_cards("t4x4", NODE)),
                  NatsSettings(servers=servers_of(nats_url)),
                  device_plugin=PluginSettings(vendor=DEVICE_PLUGIN, kubelet_dir=kubelet_dir,
                                               hami_core_dir=hami_dir, watch_interval=0.1,
                                               allocate_patience=patience))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(kubelet.registrations.get(), WAIT_S)
        yield agent, kubelet
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()


def server_index(cluster: LocalNatsCluster, agent: Agent) -> int | None:
    server = agent.connection.server
    return None if server is None else cluster.index_of_port(int(server.rpartition(":")[2]))


@pytest.mark.slow  # a cluster of three nats-servers
async def test_allocate_is_answered_through_another_server_when_the_agents_is_killed(
        nats_cluster: LocalNatsCluster, folders: tuple[Path, Path],
        http: aiohttp.ClientSession) -> None:
    async with agent_with_plugin(nats_cluster.url, folders) as (agent, kubelet):
        daemon = await RunningDaemon(standalone_config(nats_cluster.url)).start()
        try:
            pods = PodClient(http, daemon.url)
            await pods.submit_and_place(lab_pod("admitted-during-the-switch"))
            pod = await pods.get("admitted-during-the-switch")
            ((grant,),) = decode_devices(pod["annotations"][ALLOCATED_ANNOTATION])
            lost = server_index(nats_cluster, agent)
            assert lost is not None
            killed_at = time.monotonic()
            nats_cluster.kill(lost)
            # The kubelet admits the container at once: the plugin's question to the daemon
            # finds no server, and is asked again through the next one.
            response = await asyncio.wait_for(kubelet.admit(1), ASK_PATIENCE_S + 5)
            took = time.monotonic() - killed_at
            assert response.envs["NVIDIA_VISIBLE_DEVICES"] == grant.uuid
            assert server_index(nats_cluster, agent) not in (None, lost)
            print(f"Allocate answered {took:.2f} s after the agent's server was killed")
            assert took < ASK_PATIENCE_S

            # Not asserted: the bind-phase success the plugin then reports is lost when
            # the killed server led the pod bucket (the daemon's write times out during the
            # stream's election and is not tried again): docs/reliability.md, left.
        finally:
            await daemon.stop()


def test_the_patience_is_20_seconds_unless_set() -> None:
    assert PluginSettings(vendor=DEVICE_PLUGIN).allocate_patience == ASK_PATIENCE_S == 20.0


@pytest.mark.parametrize("patience", [1.0, 3.0], ids=["1s", "3s"])
async def test_with_no_daemon_allocate_is_refused_once_the_patience_is_spent(
        nats_server: LocalNatsServer, folders: tuple[Path, Path], patience: float) -> None:
    """NATS up, no daemon listening: the question is asked again until the patience is
    spent, then the container is refused UNAVAILABLE with the reason (never a hang)."""
    async with agent_with_plugin(nats_server.url, folders, patience) as (_, kubelet):
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(kubelet.admit(1), patience + REQUEST_TIMEOUT_S + 5)
        took = time.monotonic() - started
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    details = refused.value.details() or ""
    assert "the daemon did not answer on" in details, details
    print(f"patience {patience:g} s: refused after {took:.2f} s: {details}")
    # The last pause is not slept when it would pass the patience.
    assert patience - RETRY_PAUSE_S - 0.1 <= took <= patience + 1.0
