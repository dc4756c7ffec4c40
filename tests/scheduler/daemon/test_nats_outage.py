"""The connection to NATS never dies for good, and nothing pyhami sends exceeds the
server's limits.

nats-py closes its client for good on a server -ERR such as "maximum control
line exceeded" (a subject longer than nats-server's 4096-byte control line, as a
4,100-character pod name once made of a store key). These tests provoke that
real error on a real nats-server.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import msgspec
import nats
import nats.errors
import pytest
from nats.aio.msg import Msg

from agent.vendors.nvidia.simulated import profile_cards
from common.messaging import MAX_CONTROL_LINE, Connection, NatsSettings
from common.wire import SCHEMA_VERSION, Inventory, encode, inventory_subject
from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsServer
from pyhami.sandbox import RunningDaemon, SimulatedAgent, standalone_config
from scheduler.cluster.standalone import StandaloneCluster
from tests.harness import PodClient, eventually

OVER_LONG_SUBJECT = "x" * (MAX_CONTROL_LINE + 100)


async def provoke_server_error(connection: Connection) -> None:
    """Send what nats-server answers with -ERR, on the connection's own client."""
    client = connection.client
    assert client is not None
    await client.publish(OVER_LONG_SUBJECT, b"")

    async def closed() -> bool:
        return client.is_closed

    await eventually(closed, "nats-py to close the client on the server's -ERR", timeout=5)
    assert "maximum control line exceeded" in str(client.last_error)


async def test_a_client_closed_by_a_server_error_is_replaced_and_subscribed_again(
        nats_server: LocalNatsServer) -> None:
    connection = Connection(NatsSettings(servers=(nats_server.url,)), "test")
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_message(message: Msg) -> None:
        received.put_nowait(message.data)

    ups: list[bool] = []

    async def on_up(_: object, new_client: bool) -> None:
        ups.append(new_client)

    await connection.subscribe("greetings", on_message)
    connection.when_up(on_up)
    running = asyncio.create_task(connection.run())
    sender = await nats.connect(nats_server.url)
    try:
        first = await asyncio.wait_for(connection.wait_up(), 10)
        await provoke_server_error(connection)
        assert not connection.connected

        async def replaced() -> bool:
            return connection.connected and connection.client is not first

        await eventually(replaced, "a new client", timeout=10)
        assert connection.replaced == 1
        assert ups == [True, True]
        await sender.publish("greetings", b"still here")
        assert await asyncio.wait_for(received.get(), 5) == b"still here"
    finally:
        await sender.close()
        await connection.close()
        running.cancel()


async def test_what_the_server_would_refuse_is_counted_not_sent(
        nats_server: LocalNatsServer) -> None:
    connection = Connection(NatsSettings(servers=(nats_server.url,)), "test")
    running = asyncio.create_task(connection.run())
    try:
        client = await asyncio.wait_for(connection.wait_up(), 10)
        assert await connection.publish(OVER_LONG_SUBJECT, b"") == "too_large"
        assert await connection.publish("big", b"x" * (client.max_payload + 1)) == "too_large"
        assert await connection.publish("fine", b"x") is None
        await client.flush(timeout=5)  # the server answered: no -ERR came back
        assert connection.client is client and client.is_connected
        assert connection.unsent["too_large"] == 2
    finally:
        await connection.close()
        running.cancel()


async def test_publishing_without_a_server_returns_the_reason_and_never_raises(
        nats_server: LocalNatsServer) -> None:
    connection = Connection(NatsSettings(servers=(nats_server.url,)), "test")
    assert await connection.publish("anything", b"") == "disconnected"  # before connecting
    running = asyncio.create_task(connection.run())
    try:
        await asyncio.wait_for(connection.wait_up(), 10)
        nats_server.kill()

        async def down() -> bool:
            return not connection.connected

        await eventually(down, "the connection to notice the server is gone", timeout=10)
        assert await connection.publish("anything", b"") == "disconnected"
        assert connection.down_for() > 0
    finally:
        await connection.close()
        running.cancel()


async def test_the_daemon_and_an_agent_reconnect_after_a_server_error_and_keep_scheduling(
        jetstream_server: LocalNatsServer, http: aiohttp.ClientSession) -> None:
    node = SimulatedAgent.start("gpu-node-1", jetstream_server.url)
    daemon = await RunningDaemon(standalone_config(jetstream_server.url)).start()
    pods = PodClient(http, daemon.url)
    service = daemon.service
    assert service is not None
    try:
        await pods.submit_and_place(lab_pod("before"))
        # The daemon's store write with an over-long key, as a 4,100-character pod name made.
        cluster = service.cluster
        assert isinstance(cluster, StandaloneCluster)
        with pytest.raises(nats.errors.Error):  # no answer comes: the client was closed
            await cluster._bucket._kv.put("k" * (MAX_CONTROL_LINE + 100), b"")

        async def daemon_replaced() -> bool:
            async with http.get(f"{daemon.url}/statusz") as response:
                nats_status = msgspec.json.decode(await response.read())["nats"]
            return bool(nats_status["connected"] and nats_status["clients_replaced"] == 1)

        await eventually(daemon_replaced, "the daemon to connect again", timeout=15)
        await provoke_server_error(node.agent.connection)

        async def agent_replaced() -> bool:
            return node.agent.connection.connected and node.agent.connection.replaced == 1

        await eventually(agent_replaced, "the agent to connect again", timeout=15)
        heard = service.inventory_accepted

        async def inventories_arrive() -> bool:
            return service.inventory_accepted > heard + 2

        await eventually(inventories_arrive, "inventories after the error", timeout=10)
        assert not service.state.nodes.stale_nodes(time.monotonic())
        await pods.submit_and_place(lab_pod("after"))  # the store works again
        async with http.get(f"{daemon.url}/readyz") as response:
            assert response.status == 200
    finally:
        await daemon.stop()
        await node.halt()


async def test_a_node_name_too_long_for_a_subject_never_cuts_the_daemon_off(
        jetstream_server: LocalNatsServer, http: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture) -> None:
    """An inventory naming a 5,000-character node (refused at the door, or accepted and
    then reported on): its usage subject would exceed the control line. Nothing of it
    may reach the server."""
    node = SimulatedAgent.start("gpu-node-1", jetstream_server.url)
    daemon = await RunningDaemon(standalone_config(jetstream_server.url)).start()
    pods = PodClient(http, daemon.url)
    long_name = "n" * 5000
    sender = await nats.connect(jetstream_server.url)
    try:
        await sender.publish(inventory_subject("gpu-node-2"), encode(Inventory(
            schema=SCHEMA_VERSION, node=long_name, agent_version="t", instance="i", sequence=1,
            timestamp=0.0, reason="start", heartbeat_interval=10.0,
            cards=profile_cards("t4x4", long_name))))
        await sender.flush(timeout=5)
        for index in range(3):  # every decision publishes the usage of the nodes it changed
            await pods.submit_and_place(lab_pod(f"pod-{index}"))
        service = daemon.service
        assert service is not None
        if service.state.fleet.node(long_name) is not None:  # accepted: its usage was held back
            assert any("was not sent (too_large" in r.getMessage() for r in caplog.records)
        async with http.get(f"{daemon.url}/statusz") as response:
            nats_status = msgspec.json.decode(await response.read())["nats"]
        assert nats_status == {"connected": True, "down_for_s": 0.0, "clients_replaced": 0,
                               "server": jetstream_server.url.removeprefix("nats://")}
    finally:
        await sender.close()
        await daemon.stop()
        await node.halt()
