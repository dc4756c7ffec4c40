"""Shared fixtures."""

from __future__ import annotations

import os

# The suite runs gRPC (the device plugin's tests) and then starts processes (the control
# plane, nats-server) from the same process: gRPC's fork handlers, run in each child between
# fork and exec, can abort it (kube-scheduler exiting with SIGABRT before it starts). No
# child here runs gRPC, so the handlers are not wanted. Set before gRPC is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import aiohttp
import pytest

from pyhami.natsserver import LocalNatsCluster, LocalNatsServer
from pyhami.sandbox import RunningDaemon, SimulatedAgent, standalone_config
from tests.harness import Lab, PodClient


@pytest.fixture
def nats_server_factory() -> Iterator[Callable[..., LocalNatsServer]]:
    """Starts real nats-server processes on free loopback ports; all are stopped afterwards.

    Call it with ``extra_args`` (nats-server flags) and ``scheme`` (``tls`` for TLS URLs).
    """
    servers: list[LocalNatsServer] = []

    def start(extra_args: Sequence[str] = (), scheme: str = "nats") -> LocalNatsServer:
        server = LocalNatsServer(extra_args=extra_args, scheme=scheme)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill()


@pytest.fixture
def nats_server(nats_server_factory: Callable[..., LocalNatsServer]) -> LocalNatsServer:
    """A real nats-server on a free loopback port; ``.url`` to connect, ``.kill()``/``.start()``
    to crash and restart it on the same port."""
    return nats_server_factory()


@pytest.fixture
def jetstream_server(nats_server_factory: Callable[..., LocalNatsServer],
                     tmp_path: Path) -> LocalNatsServer:
    """A real nats-server with JetStream on disk, as the standalone daemon needs."""
    return nats_server_factory(extra_args=["-js", "-sd", str(tmp_path / "jetstream")])


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[LocalNatsCluster]:
    """Three real nats-servers routed into one cluster on loopback, each with JetStream on
    its own folder, formed (one JetStream meta leader) before the test starts;
    ``.url`` names all three, ``.kill(i)``/``.start(i)`` crash and restart one on its ports."""
    cluster = LocalNatsCluster(tmp_path / "nats-cluster")
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client:
        yield client


@pytest.fixture
async def lab(jetstream_server: LocalNatsServer,
              http: aiohttp.ClientSession) -> AsyncIterator[Lab]:
    """The article's lab, live: one simulated four-T4 node, the standalone daemon, its pod API."""
    node = SimulatedAgent.start("gpu-node-1", jetstream_server.url)
    daemon = await RunningDaemon(standalone_config(jetstream_server.url)).start()
    lab = Lab(jetstream_server, node, daemon, PodClient(http, daemon.url))
    yield lab
    await lab.daemon.stop()  # the one running now: a test may have restarted it
    await node.halt()
