"""Only a node's own agent speaks for its node: a real nats-server configured by
``pyhami nats-auth init``, the daemon answering its auth callout, agents with node tokens."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from agent.service import Agent, AgentSettings
from agent.vendors.nvidia.simulated import SimulatedSource, profile_cards
from common import telemetry
from common.busaccess import DAEMON_USER, WATCH_USER, BusCredentials, agent_inbox_prefix
from common.certificates import Bundle
from common.messaging import NatsSettings, connect, tls_context
from common.natsjwt import node_token, signer_from_seed
from common.wire import (
    PendingAllocations,
    allocations_subject,
    decode_inventory,
    decode_pending,
    encode,
    inventory_subject,
)
from pyhami.cli import main
from pyhami.natsserver import LocalNatsServer
from pyhami.sandbox import RunningDaemon, standalone_config
from pyhami.watch._model import WatchModel
from pyhami.watch._shell import listen
from scheduler.busauth import AUTH_CALLOUT_SUBJECT
from scheduler.cluster.standalone import BUCKET
from scheduler.config import BusAuthConfig
from tests.harness import eventually, metric_sample


@dataclass
class SecuredBus:
    server: LocalNatsServer
    directory: Path

    @property
    def url(self) -> str:
        return self.server.url

    def secret(self, name: str) -> str:
        return (self.directory / name).read_text().strip()

    def token_file(self, node: str) -> Path:
        signer = signer_from_seed((self.directory / "issuer.seed").read_bytes(), "seed")
        path = self.directory / f"{node}.token"
        path.write_text(node_token(node, signer, int(time.time()), int(time.time()) + 3600))
        return path


@pytest.fixture
def bus(tmp_path: Path, nats_server_factory: Callable[..., LocalNatsServer]) -> SecuredBus:
    directory = tmp_path / "nats-auth"
    assert main(["nats-auth", "init", str(directory)]) == 0
    server = nats_server_factory(extra_args=["-c", str(directory / "nats.conf"), "-js",
                                             "-sd", str(tmp_path / "jetstream")])
    return SecuredBus(server, directory)


@pytest.fixture
async def daemon(bus: SecuredBus) -> AsyncIterator[RunningDaemon]:
    credentials = BusCredentials.read(bus.directory)
    # No password given: the daemon takes its own from the credentials.
    running = await RunningDaemon(standalone_config(
        bus.url, bus_auth=BusAuthConfig(credentials))).start()
    yield running
    await running.stop()


@asynccontextmanager
async def running_agent(node: str, settings: NatsSettings) -> AsyncIterator[Agent]:
    agent = Agent(AgentSettings(node, poll_interval=0.2, heartbeat_interval=0.3),
                  SimulatedSource(profile_cards("t4x4", node)), settings)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        yield agent
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


@contextmanager
def errors_seen() -> Iterator[tuple[list[str], Callable[[Exception], Any]]]:
    seen: list[str] = []

    async def record(error: Exception) -> None:
        seen.append(str(error))

    yield seen, record


def known_nodes(daemon: RunningDaemon) -> set[str]:
    assert daemon.service is not None
    return {node.name for node in daemon.service.state.fleet.nodes()}


async def test_a_client_without_credentials_cannot_connect(bus: SecuredBus) -> None:
    for options in ({}, {"user": WATCH_USER, "password": "wrong"},
                    {"user": DAEMON_USER, "password": bus.secret("watch.password")}):
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(bus.url, allow_reconnect=False, connect_timeout=5, **options)


async def test_an_agent_publishes_its_own_node_and_the_server_refuses_it_another(
        bus: SecuredBus, daemon: RunningDaemon) -> None:
    a_token = bus.token_file("node-a")
    async with running_agent("node-a", NatsSettings(servers=(bus.url,), token_file=a_token)):
        await eventually(lambda: _true_if("node-a" in known_nodes(daemon)),
                         "node-a's inventory reaching the daemon")
        # An agent set up as node-b holding node-a's token: every publish is refused.
        async with running_agent("node-b", NatsSettings(servers=(bus.url,),
                                                        token_file=a_token)) as impostor:
            await eventually(lambda: _true_if(impostor.connection.connected),
                             "the impostor connected")
            await asyncio.sleep(1.0)  # three heartbeats' worth of refused publishes
        assert "node-b" not in known_nodes(daemon)
    assert daemon.service is not None
    text = daemon.service.metrics.exposition().decode()
    assert 'pyhami_nats_auth_total{result="accepted"} 2.0' in text


async def test_the_server_refuses_a_forged_message_for_another_node(
        bus: SecuredBus, daemon: RunningDaemon) -> None:
    """The lock-out message (a copy of node-a's inventory with a huge sequence) sent with
    node-b's credentials never reaches the daemon: node-a stays fresh."""
    a_settings = NatsSettings(servers=(bus.url,), token_file=bus.token_file("node-a"))
    observer = await nats.connect(bus.url, user=DAEMON_USER,
                                  password=bus.secret("daemon.password"))
    copies: list[bytes] = []
    subscription = await observer.subscribe(inventory_subject("node-a"),
                                            cb=collecting(copies, lambda msg: msg.data))
    async with running_agent("node-a", a_settings):
        await eventually(lambda: _true_if(bool(copies)), "a message of node-a")
        original = decode_inventory(copies[-1])
        forged = encode(_with_sequence(original, 2**62))
        with errors_seen() as (seen, record):
            attacker = await nats.connect(bus.url, token=bus.token_file("node-b").read_text(),
                                          error_cb=record)
            await attacker.publish(inventory_subject("node-a"), forged)
            await attacker.flush()
            await eventually(lambda: _true_if(bool(seen)), "the server's refusal")
            assert "permissions violation" in seen[0].lower()
            await attacker.close()
        assert daemon.service is not None
        service = daemon.service
        accepted = service.shared.inventory_accepted
        await eventually(lambda: _true_if(service.shared.inventory_accepted > accepted + 2),
                         "the daemon accepting node-a's next messages")
        assert all(decode_inventory(data).sequence < 2**62 for data in copies)
    await subscription.unsubscribe()
    await observer.close()


async def test_agent_and_watcher_credentials_cannot_touch_the_pod_store(
        bus: SecuredBus, daemon: RunningDaemon) -> None:
    key = "default.forged"
    clients: list[Client] = []
    with errors_seen() as (seen, record):
        clients.append(await nats.connect(
            bus.url, token=bus.token_file("node-a").read_text(), error_cb=record))
        clients.append(await nats.connect(
            bus.url, user=WATCH_USER, password=bus.secret("watch.password"), error_cb=record))
        for client in clients:
            await client.publish(f"$KV.{BUCKET}.{key}", b'{"forged": true}')
            await client.flush()
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError,
                                nats.errors.Error)):
                await client.jetstream(timeout=2).key_value(BUCKET)
        await eventually(lambda: _true_if(len(seen) >= 2), "the server's refusals")
        assert all("permissions violation" in error.lower() for error in seen)
    for client in clients:
        await client.close()
    owner = await nats.connect(bus.url, user=DAEMON_USER, password=bus.secret("daemon.password"))
    store = await owner.jetstream().key_value(BUCKET)
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await store.get(key)
    await owner.close()


async def test_a_watcher_reads_decisions_and_inventories_but_publishes_no_inventory(
        bus: SecuredBus, daemon: RunningDaemon) -> None:
    received: list[str] = []
    with errors_seen() as (seen, record):
        watcher = await nats.connect(bus.url, user=WATCH_USER,
                                     password=bus.secret("watch.password"), error_cb=record)
        await watcher.subscribe("pyhami.>", cb=collecting(received, lambda msg: msg.subject))
        await watcher.flush()
        daemon_client = await nats.connect(bus.url, user=DAEMON_USER,
                                           password=bus.secret("daemon.password"))
        await daemon_client.publish(telemetry.DECISIONS_SUBJECT, b"decision")
        await daemon_client.flush()
        await eventually(lambda: _true_if(telemetry.DECISIONS_SUBJECT in received),
                         "the decision reaching the watcher")
        await watcher.publish(inventory_subject("node-a"), b"forged")
        await watcher.flush()
        await eventually(lambda: _true_if(bool(seen)), "the server's refusal")
        assert "permissions violation" in seen[0].lower()
        await daemon_client.close()
        await watcher.close()


async def test_a_bad_token_is_refused_and_counted(bus: SecuredBus,
                                                  daemon: RunningDaemon) -> None:
    for token in ("garbage", bus.token_file("node-a").read_text() + "x"):
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(bus.url, token=token, allow_reconnect=False, connect_timeout=5)
    assert daemon.service is not None
    text = daemon.service.metrics.exposition().decode()
    assert 'pyhami_nats_auth_total{result="refused"} 2.0' in text


def _with_sequence(inventory: Any, sequence: int) -> Any:
    import msgspec  # noqa: PLC0415

    return msgspec.structs.replace(inventory, sequence=sequence)


def collecting(into: list[Any], part: Callable[[Msg], Any]) -> Callable[[Msg], Any]:
    async def on_message(msg: Msg) -> None:
        into.append(part(msg))

    return on_message


async def _true_if(condition: bool) -> bool:
    return condition


async def test_the_stack_runs_over_mutual_tls_with_the_projects_certificates(
        tmp_path: Path, nats_server_factory: Callable[..., LocalNatsServer]) -> None:
    """As docker-compose.yml sets it up: `pyhami certs init`, then `pyhami nats-auth init
    --tls --verify-clients`; every client verifies the server and shows a certificate."""
    assert main(["certs", "init", str(tmp_path / "certs"), "--ip", "127.0.0.1"]) == 0
    directory = tmp_path / "auth"
    assert main(["nats-auth", "init", str(directory), "--tls", str(tmp_path / "certs"),
                 "--verify-clients", "--agents", "node-a"]) == 0
    server = nats_server_factory(extra_args=["-c", str(directory / "nats.conf"), "-js",
                                             "-sd", str(tmp_path / "jetstream")], scheme="tls")
    bundle = Bundle.in_directory(tmp_path / "certs")
    tls = {"ca": bundle.ca, "cert": bundle.client, "key": bundle.client_key}
    credentials = BusCredentials.read(directory)
    daemon = await RunningDaemon(standalone_config(
        server.url, nats=NatsSettings(servers=(server.url,), **tls),
        bus_auth=BusAuthConfig(credentials))).start()
    try:
        settings = NatsSettings(servers=(server.url,), token_file=directory / "node-a.token",
                                **tls)
        async with running_agent("node-a", settings):
            await eventually(lambda: _true_if("node-a" in known_nodes(daemon)),
                             "node-a's inventory over TLS")
        # The right token but no client certificate: the server ends the TLS session (during
        # the handshake, or just after it with TLS 1.3) before anything is authorized.
        no_certificate = NatsSettings(servers=(server.url,), ca=bundle.ca)
        with pytest.raises((OSError, nats.errors.Error)):
            await nats.connect(server.url, tls=tls_context(no_certificate),
                               token=(directory / "node-a.token").read_text().strip(),
                               allow_reconnect=False, connect_timeout=5)
        # Plain NATS to a TLS-only server: refused.
        with pytest.raises((OSError, nats.errors.Error)):
            await nats.connect(server.url.replace("tls://", "nats://"),
                               allow_reconnect=False, connect_timeout=5)
    finally:
        await daemon.stop()


async def test_pyhami_watch_as_the_watcher_sees_the_nodes_without_asking_anything(
        bus: SecuredBus, daemon: RunningDaemon, caplog: pytest.LogCaptureFixture) -> None:
    """The read-only user may not ask the agents to resync: watch does not try (the server
    would refuse it) and the nodes appear with their agents' heartbeats."""
    model = WatchModel()
    settings = NatsSettings(servers=(bus.url,), user=WATCH_USER,
                            password=bus.secret("watch.password"))
    a_settings = NatsSettings(servers=(bus.url,), token_file=bus.token_file("node-a"))
    async with running_agent("node-a", a_settings):
        client = await listen(settings, model)
        try:
            await eventually(lambda: _true_if("node-a" in model.nodes),
                             "node-a in the watcher's view")
        finally:
            await client.close()
    assert "permissions violation" not in caplog.text.lower()


async def test_an_agent_asks_for_its_own_nodes_allocations_only(
        bus: SecuredBus, daemon: RunningDaemon, caplog: pytest.LogCaptureFixture) -> None:
    """The agent's connection settings carry its inbox: the answer comes back to it."""
    settings = NatsSettings(servers=(bus.url,), token_file=bus.token_file("node-a"),
                            inbox_prefix=agent_inbox_prefix("node-a"))
    agent = await connect(settings, "pyhami-agent")
    try:
        reply = await agent.request(allocations_subject("node-a"), b"", timeout=5)
        assert decode_pending(reply.data) == PendingAllocations(node="node-a", pods=[],
                                                                holding=[])
        # The daemon answers every valid node's request: no answer means the server refused.
        with pytest.raises(nats.errors.TimeoutError):
            await agent.request(allocations_subject("node-b"), b"", timeout=1)
        await eventually(lambda: _true_if('publish to "pyhami.allocations.node-b"' in (
            caplog.text.lower())), "the server's refusal")
    finally:
        await agent.close()


async def test_an_agent_cannot_read_another_agents_answers(
        bus: SecuredBus, daemon: RunningDaemon) -> None:
    with errors_seen() as (seen, record):
        agent = await nats.connect(bus.url, token=bus.token_file("node-a").read_text(),
                                   error_cb=record)
        try:
            await agent.subscribe(f"{agent_inbox_prefix('node-b')}.>")
            await agent.flush()
            await eventually(lambda: _true_if(bool(seen)), "the server's refusal")
            assert "permissions violation for subscription" in seen[0].lower()
        finally:
            await agent.close()


async def test_only_the_server_can_ask_the_daemon_who_a_client_is(
        bus: SecuredBus, daemon: RunningDaemon) -> None:
    """A forged authorization request never reaches the responder: nats-server refuses
    the callout subject to every client, the daemon's own user included."""
    with errors_seen() as (seen, record):
        sender = await nats.connect(bus.url, user=DAEMON_USER,
                                    password=bus.secret("daemon.password"), error_cb=record)
        try:
            with pytest.raises(nats.errors.TimeoutError):
                await sender.request(AUTH_CALLOUT_SUBJECT, b"not a jwt", timeout=0.5)
            await eventually(lambda: _true_if(bool(seen)), "the server's refusal")
        finally:
            await sender.close()
    assert "permissions violation" in seen[0].lower()
    assert daemon.service is not None
    text = daemon.service.metrics.exposition().decode()
    assert metric_sample(text, 'pyhami_nats_auth_total{result="malformed"}') == 0.0
