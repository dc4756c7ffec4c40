"""The sequence rule of agent messages: a replay is dropped, a jump too far ahead is refused
and counted, a stale node takes any sequence, and after the daemon's own reconnection a
node's next message may skip any number."""

from __future__ import annotations

import logging

import msgspec
import pytest

from agent.vendors.nvidia.simulated import profile_cards
from common.wire import SCHEMA_VERSION, Inventory, inventory_subject
from pyhami.sandbox import DEFAULTS
from scheduler.service import SchedulerService, ServiceSettings
from scheduler.state import SEQUENCE_GAP_MAX, LiveState
from tests.fakes.node_list import NodeList, silent
from tests.harness import inventory_count

NODE = "n"
FORGED = 2**62


def inventory(sequence: int, processes: int = 0, instance: str = "a") -> Inventory:
    cards = profile_cards("t4x4", NODE)
    cards[0] = msgspec.structs.replace(cards[0], processes=processes)
    return Inventory(schema=SCHEMA_VERSION, node=NODE, agent_version="t", instance=instance,
                     sequence=sequence, timestamp=0.0, reason="change",
                     heartbeat_interval=10.0, cards=cards)


def processes(state: LiveState) -> int:
    node = state.fleet.node(NODE)
    assert node is not None
    return node.cards[0].processes


def fresh_state() -> LiveState:
    return LiveState(node_timeout=30, reservation_ttl=60)


def test_a_forged_jump_is_refused_and_the_real_agent_keeps_being_accepted() -> None:
    state = fresh_state()
    assert state.nodes.ingest(inventory(7), now=0).accepted
    forged = state.nodes.ingest(inventory(FORGED, processes=3), now=1)
    assert not forged.accepted
    assert forged.too_far_ahead is not None
    assert f"at most {SEQUENCE_GAP_MAX}" in forged.too_far_ahead
    assert processes(state) == 0
    assert state.nodes.ingest(inventory(8, processes=1), now=2).accepted
    assert processes(state) == 1


def test_a_gap_up_to_the_bound_is_taken_one_more_is_refused() -> None:
    state = fresh_state()
    assert state.nodes.ingest(inventory(1), now=0).accepted
    assert state.nodes.ingest(inventory(1 + SEQUENCE_GAP_MAX), now=1).accepted
    assert state.nodes.ingest(inventory(2 + 2 * SEQUENCE_GAP_MAX), now=2).too_far_ahead is not None


def test_a_replay_of_an_old_message_is_still_refused() -> None:
    state = fresh_state()
    for sequence in (1, 2, 3):
        assert state.nodes.ingest(inventory(sequence, processes=sequence), now=sequence).accepted
    for replayed in (3, 1):
        result = state.nodes.ingest(inventory(replayed, processes=9), now=4)
        assert (result.accepted, result.too_far_ahead) == (False, None)
    assert processes(state) == 3


def test_a_stale_node_takes_any_sequence_so_a_jump_within_the_bound_holds_it_no_longer() -> None:
    state = fresh_state()
    assert state.nodes.ingest(inventory(1), now=0).accepted
    # A forged message just within the bound is taken; the real agent's next ones then look
    # like replays, but only while the node is fresh.
    assert state.nodes.ingest(inventory(1 + SEQUENCE_GAP_MAX, processes=5), now=1).accepted
    assert not state.nodes.ingest(inventory(2, processes=1), now=2).accepted
    assert not state.nodes.ingest(inventory(3, processes=1), now=31).accepted  # heard 30 s ago
    assert list(state.nodes.stale_nodes(now=32)) == [NODE]
    assert state.nodes.ingest(inventory(4, processes=1), now=32).accepted
    assert processes(state) == 1
    assert state.nodes.stale_nodes(now=32) == {}


def test_a_stale_node_takes_even_a_huge_jump_and_then_the_bound_holds_again() -> None:
    state = fresh_state()
    assert state.nodes.ingest(inventory(1), now=0).accepted
    assert state.nodes.ingest(inventory(FORGED), now=40).accepted
    assert state.nodes.ingest(inventory(FORGED + 1), now=41).accepted
    ahead = state.nodes.ingest(inventory(FORGED + 2 + SEQUENCE_GAP_MAX), now=42)
    assert ahead.too_far_ahead is not None


def test_after_the_daemon_reconnects_each_node_may_skip_any_number_once_never_go_back() -> None:
    state = fresh_state()
    assert state.nodes.ingest(inventory(10), now=0).accepted
    state.nodes.forgive_gaps(now=5)
    assert not state.nodes.ingest(inventory(9, processes=9), now=6).accepted  # still a replay
    assert state.nodes.ingest(inventory(10 + 50 * SEQUENCE_GAP_MAX, processes=2), now=6).accepted
    assert processes(state) == 2
    # Heard since the reconnection: the bound is back.
    assert state.nodes.ingest(inventory(FORGED), now=7).too_far_ahead is not None


def test_a_new_agent_instance_starts_afresh_and_the_old_one_can_come_back() -> None:
    """A forged instance takes the node for one message only: the real agent's next
    message has its own instance and is taken."""
    state = fresh_state()
    assert state.nodes.ingest(inventory(5), now=0).accepted
    assert state.nodes.ingest(inventory(FORGED, processes=4, instance="forged"), now=1).accepted
    assert state.nodes.ingest(inventory(6, processes=1), now=2).accepted
    assert processes(state) == 1


def counted(service: SchedulerService, result: str) -> float:
    value = inventory_count(service, result)
    assert value is not None, f"no {result} sample"
    return value


def test_the_service_counts_a_jump_under_its_own_result_and_logs_it(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="scheduler.service")
    service = SchedulerService(ServiceSettings(DEFAULTS), NodeList(set()), silent,
                               clock=lambda: 0.0, wall_clock=lambda: 0.0)
    subject = inventory_subject(NODE)
    ingest = service.handlers.inventories.ingest
    assert ingest(subject, msgspec.msgpack.encode(inventory(1))) is not None
    assert ingest(subject, msgspec.msgpack.encode(inventory(FORGED))) is None
    assert ingest(subject, msgspec.msgpack.encode(inventory(1))) is None
    assert ingest(subject, msgspec.msgpack.encode(inventory(2))) is not None
    assert (counted(service, "accepted"), counted(service, "sequence_jump"),
            counted(service, "out_of_order")) == (2.0, 1.0, 1.0)
    assert [r.getMessage() for r in caplog.records] == [
        f"inventory refused: node {NODE!r}: sequence {FORGED} of agent instance 'a' runs "
        f"{FORGED - 1} ahead of its last, 1 (at most {SEQUENCE_GAP_MAX})"]
