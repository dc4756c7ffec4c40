"""Inventory sequences and forged messages on a real nats-server, against a running agent
and daemon: a copy of the agent's message numbered 2^62 no longer locks the agent out, a
message on another node's subject speaks for nobody, and the messages a daemon missed
while off the bus do not make the next one look forged."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import msgspec
import nats
import nats.errors
import pytest
from nats.aio.client import Client

from agent.vendors.nvidia.simulated import profile_cards
from common.messaging import MAX_CONTROL_LINE
from common.wire import (
    RESYNC_SUBJECT,
    SCHEMA_VERSION,
    Inventory,
    decode_inventory,
    decode_resync,
    encode,
    inventory_subject,
)
from pyhami.natsserver import LocalNatsServer
from pyhami.sandbox import RunningDaemon, SimulatedAgent, standalone_config
from scheduler.cluster.standalone import StandaloneCluster
from scheduler.service import SchedulerService
from scheduler.state import SEQUENCE_GAP_MAX
from tests.harness import Lab, PodClient, eventually, inventory_count

NODE = "t4-a"


@pytest.fixture
async def t4_lab(jetstream_server: LocalNatsServer,
                 http: aiohttp.ClientSession) -> AsyncIterator[Lab]:
    """One simulated four-T4 node named t4-a, its real agent, and the standalone daemon."""
    node = SimulatedAgent.start(NODE, jetstream_server.url)
    daemon = await RunningDaemon(standalone_config(jetstream_server.url)).start()
    yield Lab(jetstream_server, node, daemon, PodClient(http, daemon.url))
    await daemon.stop()
    await node.halt()


@pytest.fixture
async def intruder(t4_lab: Lab) -> AsyncIterator[Client]:
    """A client of the lab's nats-server that the bus lets publish anything."""
    client = await nats.connect(t4_lab.nats.url)
    yield client
    await client.close()


def service(lab: Lab) -> SchedulerService:
    assert lab.daemon.service is not None
    return lab.daemon.service


def counted(lab: Lab, result: str) -> float:
    return inventory_count(service(lab), result) or 0.0


async def until_counted(lab: Lab, result: str) -> None:
    async def seen() -> bool:
        return counted(lab, result) >= 1

    await eventually(seen, f"an inventory message counted as {result}")


async def next_message_of_the_agent(client: Client) -> Inventory:
    subscription = await client.subscribe(inventory_subject(NODE))
    try:
        message = await subscription.next_msg(timeout=10)
    finally:
        await subscription.unsubscribe()
    return decode_inventory(message.data, message.subject)


def processes_on_card_0(lab: Lab) -> int:
    node = service(lab).state.fleet.node(NODE)
    assert node is not None
    return node.cards[0].processes


async def test_a_copy_of_the_agents_message_numbered_2_to_the_62_does_not_lock_it_out(
        t4_lab: Lab, intruder: Client) -> None:
    """The attack once left the node stale until its agent restarted."""
    last = await next_message_of_the_agent(intruder)
    forged = msgspec.structs.replace(last, sequence=2**62)
    await intruder.publish(inventory_subject(NODE), encode(forged))
    await intruder.flush()  # the server has it: the daemon gets it before the change
    t4_lab.node.source.set_processes(0, 2, memory_mib=1000)

    async def change_shows() -> bool:
        return processes_on_card_0(t4_lab) == 2

    await eventually(change_shows, "the agent's change to reach the daemon")
    assert counted(t4_lab, "sequence_jump") == 1
    assert counted(t4_lab, "out_of_order") == 0
    daemon = service(t4_lab)
    assert daemon.state.nodes.stale_nodes(daemon.shared.clock()) == {}


async def test_a_message_on_another_subject_naming_t4_a_is_refused_and_t4_a_keeps_its_cards(
        t4_lab: Lab, intruder: Client) -> None:
    """The daemon trusts the subject, not the node named in the body, whatever the bus
    allows. The agent is stopped first, so no message of its own could repair t4-a."""
    emptied = msgspec.structs.replace(await next_message_of_the_agent(intruder), cards=[],
                                      instance="evil", sequence=1)
    await t4_lab.node.halt()
    await intruder.publish(inventory_subject("evil"), encode(emptied))
    await intruder.flush()
    await until_counted(t4_lab, "wrong_subject")
    state = service(t4_lab).state
    node = state.fleet.node(NODE)
    assert node is not None
    assert [card.uuid for card in node.cards] == [f"GPU-{NODE}-{i}" for i in range(4)]
    assert state.fleet.node("evil") is None


def quiet_node_inventory(sequence: int, processes: int) -> Inventory:
    cards = profile_cards("t4x4", "quiet-node")
    cards[0] = msgspec.structs.replace(cards[0], processes=processes)
    return Inventory(schema=SCHEMA_VERSION, node="quiet-node", agent_version="t", instance="a",
                     sequence=sequence, timestamp=0.0, reason="change",
                     heartbeat_interval=10.0, cards=cards)


async def test_after_the_daemon_reconnects_a_node_may_skip_more_than_the_bound(
        t4_lab: Lab, intruder: Client) -> None:
    """The daemon's client is closed by a server error and replaced; the next message of
    an agent numbered far past its last (it sent many while the daemon was off the bus) is
    taken, not refused as a jump."""
    await intruder.publish(inventory_subject("quiet-node"), encode(quiet_node_inventory(1, 0)))
    await intruder.flush()

    async def known() -> bool:
        return service(t4_lab).state.fleet.node("quiet-node") is not None

    await eventually(known, "quiet-node to be known")
    resyncs = await intruder.subscribe(RESYNC_SUBJECT)
    await intruder.flush()
    cluster = service(t4_lab).cluster
    assert isinstance(cluster, StandaloneCluster)
    with pytest.raises(nats.errors.Error):  # nats-server's -ERR closes the daemon's client
        await cluster._bucket._kv.put("k" * (MAX_CONTROL_LINE + 100), b"")
    request = decode_resync((await resyncs.next_msg(timeout=15)).data)
    assert request.requested_by == "pyhami-scheduler"  # the daemon is back and said so

    skipped = quiet_node_inventory(1 + 5 * SEQUENCE_GAP_MAX, processes=3)
    await intruder.publish(inventory_subject("quiet-node"), encode(skipped))
    await intruder.flush()

    async def taken() -> bool:
        node = service(t4_lab).state.fleet.node("quiet-node")
        return node is not None and node.cards[0].processes == 3

    await eventually(taken, "the message after the gap to be taken")
    assert counted(t4_lab, "sequence_jump") == 0
