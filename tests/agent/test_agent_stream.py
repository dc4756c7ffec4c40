"""The agent against a real nats-server: what a subscriber receives, and when."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import nats
from nats.aio.subscription import Subscription

from agent.service import Agent, AgentSettings
from agent.vendors.nvidia.simulated import SimulatedSource, profile_cards
from common.messaging import NatsSettings
from common.wire import (
    INVENTORY_SUBJECTS,
    RESYNC_SUBJECT,
    Inventory,
    ResyncRequest,
    decode_inventory,
    encode,
)
from pyhami.natsserver import LocalNatsServer

NODE = "gpu-node-1"
POLL_S = 0.3
# Room for the read, the publish and the delivery on a busy two-core machine.
DELIVERY_SLACK_S = 0.2


class Inbox:
    def __init__(self, subscription: Subscription) -> None:
        self._subscription = subscription

    async def next(self, timeout: float = 5.0) -> Inventory:
        message = await self._subscription.next_msg(timeout=timeout)
        return decode_inventory(message.data)


@asynccontextmanager
async def inbox(url: str) -> AsyncIterator[Inbox]:
    client = await nats.connect(url)
    subscription = await client.subscribe(INVENTORY_SUBJECTS)
    await client.flush()
    try:
        yield Inbox(subscription)
    finally:
        await client.close()


@asynccontextmanager
async def running_agent(url: str, source: SimulatedSource, *, heartbeat: float = 30.0,
                        cordoned: tuple[str, ...] = ()) -> AsyncIterator[None]:
    settings = AgentSettings(NODE, poll_interval=POLL_S, heartbeat_interval=heartbeat,
                             cordoned=cordoned)
    stop = asyncio.Event()
    task = asyncio.create_task(
        Agent(settings, source, NatsSettings(servers=(url,), reconnect_max_wait=0.5)).run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def t4x4() -> SimulatedSource:
    return SimulatedSource(profile_cards("t4x4", NODE))


async def test_a_subscriber_decodes_the_simulated_nodes_inventory(
        nats_server: LocalNatsServer) -> None:
    async with inbox(nats_server.url) as received, running_agent(nats_server.url, t4x4()):
        message = await received.next()
    assert (message.node, message.reason, message.sequence) == (NODE, "start", 1)
    assert message.cards == profile_cards("t4x4", NODE)
    node = message.to_node()
    assert node.name == NODE
    assert [(d.uuid, d.type, d.memory, d.numa, d.links) for d in node.cards] == [
        (f"GPU-{NODE}-{i}", "NVIDIA-Tesla T4", 15360, 0, {}) for i in range(4)]


async def _time_to_arrival(received: Inbox, change: Callable[[], None]) -> tuple[float, Inventory]:
    started = time.monotonic()
    change()
    message = await received.next(timeout=POLL_S + DELIVERY_SLACK_S)
    return time.monotonic() - started, message


async def test_a_change_of_processes_or_health_arrives_within_one_poll_interval(
        nats_server: LocalNatsServer) -> None:
    source = t4x4()
    async with inbox(nats_server.url) as received, running_agent(nats_server.url, source):
        start = await received.next()
        waited, busy = await _time_to_arrival(received, lambda: source.set_processes(2, 3, 2048))
        assert waited <= POLL_S + DELIVERY_SLACK_S
        assert (busy.reason, busy.sequence) == ("change", start.sequence + 1)
        assert (busy.cards[2].processes, busy.cards[2].process_memory) == (3, 2048)
        assert busy.to_node().cards[2].processes == 3

        waited, sick = await _time_to_arrival(
            received, lambda: source.set_health(1, False, "critical XID 79"))
        assert waited <= POLL_S + DELIVERY_SLACK_S
        assert (sick.cards[1].health, sick.cards[1].health_detail) == (False, "critical XID 79")
        assert sick.cards[2].processes == 3
        assert not sick.to_node().cards[1].health


async def test_heartbeats_repeat_the_state_when_nothing_changes(
        nats_server: LocalNatsServer) -> None:
    heartbeat = 0.4
    async with (inbox(nats_server.url) as received,
                running_agent(nats_server.url, t4x4(), heartbeat=heartbeat)):
        start = await received.next()
        first = await received.next(timeout=heartbeat + DELIVERY_SLACK_S)
        second = await received.next(timeout=heartbeat + DELIVERY_SLACK_S)
    assert [m.reason for m in (first, second)] == ["heartbeat", "heartbeat"]
    assert [m.sequence for m in (start, first, second)] == [1, 2, 3]
    assert second.timestamp - first.timestamp >= heartbeat * 0.9
    assert second.cards == start.cards
    assert start.heartbeat_interval == heartbeat


async def test_cordoned_cards_reach_the_core_as_the_cordon_annotation(
        nats_server: LocalNatsServer) -> None:
    cordoned = (f"GPU-{NODE}-1", f"GPU-{NODE}-3")
    async with (inbox(nats_server.url) as received,
                running_agent(nats_server.url, t4x4(), cordoned=cordoned)):
        message = await received.next()
    assert message.cordoned == list(cordoned)
    assert message.to_node().annotations == {"hami.io/device-cordon": ",".join(cordoned)}


async def test_a_resync_request_is_answered_at_once_by_the_agents_it_names(
        nats_server: LocalNatsServer) -> None:
    async with inbox(nats_server.url) as received, running_agent(nats_server.url, t4x4()):
        start = await received.next()
        daemon = await nats.connect(nats_server.url)
        try:
            await daemon.publish(RESYNC_SUBJECT, encode(ResyncRequest(nodes=["another-node"])))
            await daemon.publish(RESYNC_SUBJECT, encode(ResyncRequest(requested_by="daemon")))
            answer = await received.next(timeout=1.0)
            await daemon.publish(RESYNC_SUBJECT, b"")
            second = await received.next(timeout=1.0)
        finally:
            await daemon.close()
    # The request for another node got no answer: the next message answers the second request.
    assert (answer.reason, answer.sequence) == ("resync", start.sequence + 1)
    assert (second.reason, second.sequence) == ("resync", start.sequence + 2)
    assert answer.cards == start.cards


async def _jetstream_server(factory: Callable[..., LocalNatsServer],
                            directory: Path) -> LocalNatsServer:
    """A server whose stream keeps every inventory it receives, across restarts, so that a
    message the agent sends before this test's subscriber is (back) there can still be read."""
    server = factory(extra_args=["-js", "-sd", str(directory)])
    admin = await nats.connect(server.url)
    await admin.jetstream().add_stream(name="INVENTORY", subjects=[INVENTORY_SUBJECTS])
    await admin.close()
    return server


async def test_an_agent_started_before_its_server_sends_what_it_polled_meanwhile(
        nats_server_factory: Callable[..., LocalNatsServer], tmp_path: Path) -> None:
    server = await _jetstream_server(nats_server_factory, tmp_path / "jetstream")
    server.kill()
    source = t4x4()
    async with running_agent(server.url, source):
        await asyncio.sleep(POLL_S * 2)
        source.set_processes(0, 1, 500)
        await asyncio.sleep(POLL_S * 2)
        server.start()
        stored = await _stored_until(server.url, "start")
    assert [(m.reason, m.sequence) for m in stored] == [("start", 1)]
    assert stored[0].cards[0].processes == 1


async def test_after_the_server_is_killed_and_restarted_the_agent_republishes_the_latest_state(
        nats_server_factory: Callable[..., LocalNatsServer], tmp_path: Path) -> None:
    server = await _jetstream_server(nats_server_factory, tmp_path / "jetstream")
    source = t4x4()
    async with inbox(server.url) as received, running_agent(server.url, source):
        start = await received.next()
        server.kill()
        source.set_processes(1, 2, 1000)  # observed while there is no server
        await asyncio.sleep(POLL_S * 3)
        server.start()
        after = await _stored_until(server.url, "reconnect", after_sequence=start.sequence)
    # A poll may get the change out between the reconnection and the agent's own republish.
    assert [m.reason for m in after] in (["reconnect"], ["change", "reconnect"])
    assert [m.sequence for m in after] == list(range(start.sequence + 1,
                                                     start.sequence + 1 + len(after)))
    assert all(m.instance == start.instance for m in after)
    for message in after:
        assert (message.cards[1].processes, message.cards[1].process_memory) == (2, 1000)


async def _stored_until(url: str, reason: str, after_sequence: int = 0,
                        timeout: float = 15.0) -> list[Inventory]:
    """The stored messages numbered after ``after_sequence``, up to the first with ``reason``."""
    client = await nats.connect(url)
    try:
        stored = await client.jetstream().subscribe(INVENTORY_SUBJECTS, ordered_consumer=True)
        deadline = time.monotonic() + timeout
        messages: list[Inventory] = []
        while not messages or messages[-1].reason != reason:
            message = decode_inventory((await stored.next_msg(
                timeout=max(0.1, deadline - time.monotonic()))).data)
            if message.sequence > after_sequence:
                messages.append(message)
        return messages
    finally:
        await client.close()
