"""The daemon's live state on its own: ordering of agent messages, freshness, reservations."""

from __future__ import annotations

import msgspec

from agent.vendors.nvidia.simulated import profile_cards
from common.core import parse_pod
from common.wire import SCHEMA_VERSION, Inventory
from pyhami.sandbox import DEFAULTS
from scheduler.state import LiveState
from tests.builders import manifest


def inventory(sequence: int, instance: str = "a", processes: int = 0,
              node: str = "n") -> Inventory:
    cards = profile_cards("t4x4", node)
    cards[0] = msgspec.structs.replace(cards[0], processes=processes)
    return Inventory(schema=SCHEMA_VERSION, node=node, agent_version="t", instance=instance,
                     sequence=sequence, timestamp=0.0, reason="change",
                     heartbeat_interval=10.0, cards=cards)


def test_an_older_message_of_the_same_agent_is_dropped() -> None:
    state = LiveState(node_timeout=30, reservation_ttl=60)
    assert state.nodes.ingest(inventory(2, processes=1), now=0).accepted
    assert not state.nodes.ingest(inventory(1, processes=0), now=1).accepted
    assert state.fleet.node("n").cards[0].processes == 1  # type: ignore[union-attr]
    # A restarted agent (new instance) starts again at 1 and is believed.
    assert state.nodes.ingest(inventory(1, instance="b", processes=0), now=2).accepted
    assert state.fleet.node("n").cards[0].processes == 0  # type: ignore[union-attr]


def test_only_a_change_or_a_return_is_news() -> None:
    state = LiveState(node_timeout=30, reservation_ttl=60)
    assert state.nodes.ingest(inventory(1), now=0).changed
    assert not state.nodes.ingest(inventory(2), now=5).changed  # a heartbeat
    assert state.nodes.ingest(inventory(3, processes=1), now=6).changed
    assert state.nodes.ingest(inventory(4, processes=1), now=100).changed  # back from stale


def test_a_node_goes_stale_after_the_timeout() -> None:
    state = LiveState(node_timeout=30, reservation_ttl=60)
    state.nodes.ingest(inventory(1), now=0)
    assert state.nodes.stale_nodes(now=30) == {}
    assert list(state.nodes.stale_nodes(now=31)) == ["n"]
    decision = state.cache.filter(parse_pod(manifest(), DEFAULTS), ["n"], now=31)
    assert decision.node is None
    assert (decision.failed_nodes or {})["n"].startswith("NodeInventoryStale: ")


def test_going_stale_and_coming_back_are_each_reported_once() -> None:
    state = LiveState(node_timeout=30, reservation_ttl=60)
    state.nodes.ingest(inventory(1), now=0)
    assert state.nodes.newly_stale(now=30) == {}
    assert list(state.nodes.newly_stale(now=31)) == ["n"]
    assert state.nodes.newly_stale(now=40) == {}
    assert state.nodes.ingest(inventory(2), now=45).back_after == 45
    assert state.nodes.ingest(inventory(3), now=46).back_after is None
    assert state.nodes.newly_stale(now=47) == {}
    # Silent past the timeout and heard again before any check saw it: nothing to report.
    assert state.nodes.ingest(inventory(4), now=100).back_after is None


def test_an_unconfirmed_reservation_expires_and_a_confirmed_one_stays() -> None:
    state = LiveState(node_timeout=1000, reservation_ttl=60)
    state.nodes.ingest(inventory(1), now=0)
    first = state.cache.filter(parse_pod(manifest("a"), DEFAULTS), None, now=0)
    second = state.cache.filter(parse_pod(manifest("b"), DEFAULTS), None, now=10)
    assert first.node == second.node == "n"
    assert second.allocation is not None
    state.cache.confirm("default/b", second.allocation)
    assert list(state.cache.expire(now=59)) == []
    assert list(state.cache.expire(now=60)) == ["default/a"]
    assert state.fleet.allocation("default/a") is None
    assert state.fleet.allocation("default/b") is not None
    assert list(state.cache.expire(now=1000)) == []


def test_a_bind_that_outlived_its_reservation_books_the_cards_again() -> None:
    state = LiveState(node_timeout=1000, reservation_ttl=60)
    state.nodes.ingest(inventory(1), now=0)
    decision = state.cache.filter(parse_pod(manifest("a"), DEFAULTS), None, now=0)
    assert decision.allocation is not None
    assert list(state.cache.expire(now=60)) == ["default/a"]  # while the bind was under way
    state.cache.confirm("default/a", decision.allocation)
    assert state.fleet.allocation("default/a") == decision.allocation
    assert "default/a" in state.cache.bound and state.cache.reservation("default/a") is None


def test_filtering_a_bound_pod_again_keeps_its_cards_and_books_nothing_more() -> None:
    state = LiveState(node_timeout=1000, reservation_ttl=60)
    state.nodes.ingest(inventory(1), now=0)
    state.nodes.ingest(inventory(1, node="m"), now=0)
    request = parse_pod(manifest("a", policy="binpack"), DEFAULTS)
    first = state.cache.filter(request, None, now=0)
    assert first.allocation is not None and first.node is not None
    state.cache.confirm("default/a", first.allocation)
    other = ({"m", "n"} - {first.node}).pop()
    again = state.cache.filter(request, [other, first.node], now=1)
    assert (again.node, again.allocation) == (first.node, first.allocation)
    assert set(again.failed_nodes or {}) == {other}
    assert state.cache.reservation("default/a") is None
    assert list(state.cache.expire(now=1000)) == []  # nothing to expire: the booking stays
    assert state.fleet.allocation("default/a") == first.allocation
    elsewhere = state.cache.filter(request, [other], now=2)
    assert elsewhere.node is None
    assert "PodAlreadyBound" in (elsewhere.failed_nodes or {})[other]


def test_filtering_a_pod_again_replaces_its_reservation() -> None:
    state = LiveState(node_timeout=1000, reservation_ttl=60)
    state.nodes.ingest(inventory(1), now=0)
    request = parse_pod(manifest("a", policy="binpack"), DEFAULTS)
    state.cache.filter(request, None, now=0)
    state.cache.filter(request, None, now=1)
    card = state.fleet.usage("n", "GPU-n-0")
    assert card.tenants == 1


def test_the_node_annotation_cordons_cards_beside_the_agents_own() -> None:
    state = LiveState(node_timeout=1000, reservation_ttl=60)
    state.nodes.ingest(inventory(1), now=0)
    request = parse_pod(manifest("a", policy="binpack"), DEFAULTS)
    assert state.nodes.set_cluster_cordons({"n": frozenset({"GPU-n-0", "GPU-n-1"})}) == {"n"}
    decision = state.cache.preview(request, None, now=1)
    assert [c.index for c in decision.cards[0]] == [2]
    # A later inventory from the agent keeps the annotation's cordons.
    state.nodes.ingest(inventory(2, processes=1), now=2)
    assert [c.index for c in state.cache.preview(request, None, now=3).cards[0]] == [2]
    assert state.nodes.set_cluster_cordons({"n": frozenset({"GPU-n-0", "GPU-n-1"})}) == set()
    assert state.nodes.set_cluster_cordons({}) == {"n"}
    assert [c.index for c in state.cache.preview(request, None, now=4).cards[0]] == [0]


def node_inventory(node: str, uuids: list[str], sequence: int = 1) -> Inventory:
    cards = [msgspec.structs.replace(profile_cards("t4x4", node)[0], uuid=uuid, index=i)
             for i, uuid in enumerate(uuids)]
    return Inventory(schema=SCHEMA_VERSION, node=node, agent_version="t", instance="a",
                     sequence=sequence, timestamp=0.0, reason="change",
                     heartbeat_interval=10.0, cards=cards)


def test_a_card_another_live_node_reports_is_refused_until_that_node_goes_stale() -> None:
    state = LiveState(node_timeout=30, reservation_ttl=60)
    assert state.nodes.ingest(node_inventory("a", ["GPU-0", "GPU-1"]), now=0).accepted
    claim = state.nodes.ingest(node_inventory("b", ["GPU-9", "GPU-1"]), now=10)
    assert not claim.accepted
    assert claim.conflict == "node 'b' lists card 'GPU-1', which live node 'a' reports"
    assert state.fleet.node("b") is None
    # Node a's agent is silent beyond the timeout: the card may have moved to b.
    assert state.nodes.ingest(node_inventory("b", ["GPU-9", "GPU-1"], sequence=2), now=31).accepted
    returning = state.nodes.ingest(node_inventory("a", ["GPU-0", "GPU-1"], sequence=2), now=32)
    assert returning.conflict == "node 'a' lists card 'GPU-1', which live node 'b' reports"


def test_a_node_that_reports_its_same_cards_again_holds_them_again() -> None:
    state = LiveState(node_timeout=30, reservation_ttl=60)
    assert state.nodes.ingest(node_inventory("a", ["GPU-0", "GPU-1"]), now=0).accepted
    assert state.nodes.ingest(node_inventory("b", ["GPU-9", "GPU-1"]), now=31).accepted
    # b is silent past the timeout in turn; a's cards, the same as before, are its again.
    assert state.nodes.ingest(node_inventory("a", ["GPU-0", "GPU-1"], sequence=2), now=62).accepted
    returning = state.nodes.ingest(node_inventory("b", ["GPU-9", "GPU-1"], sequence=2), now=63)
    assert returning.conflict == "node 'b' lists card 'GPU-1', which live node 'a' reports"


def test_a_card_a_node_stopped_reporting_is_free_for_another_node() -> None:
    state = LiveState(node_timeout=30, reservation_ttl=60)
    assert state.nodes.ingest(node_inventory("a", ["GPU-0", "GPU-1"]), now=0).accepted
    assert state.nodes.ingest(node_inventory("a", ["GPU-0"], sequence=2), now=1).accepted
    assert state.nodes.ingest(node_inventory("b", ["GPU-1"]), now=2).accepted


def test_a_forgotten_nodes_cards_are_free_for_another_node_at_once() -> None:
    state = LiveState(node_timeout=30, reservation_ttl=60)
    assert state.nodes.ingest(node_inventory("a", ["GPU-0"]), now=0).accepted
    state.nodes.forget("a")
    assert state.nodes.ingest(node_inventory("b", ["GPU-0"]), now=1).accepted


def test_a_preview_as_if_the_pod_held_nothing_leaves_the_ledger_as_it_is() -> None:
    state = LiveState(node_timeout=1000, reservation_ttl=60)
    state.nodes.ingest(inventory(1), now=0)
    request = parse_pod(manifest("a", policy="binpack", gpumem=15000), DEFAULTS)
    held = state.cache.filter(request, None, now=0).allocation
    assert held is not None
    state.cache.confirm("default/a", held)
    snapshot = state.fleet.snapshot
    usage = (snapshot.used.copy(), snapshot.usedmem.copy(), snapshot.node_scores().copy())
    # Held, the pod's own card is full; as if it held nothing, that card is the binpack pick.
    assert state.cache.preview(request, None, now=1).allocation != held
    preview = state.cache.preview(request, None, now=1, holding_nothing=True)
    assert preview.allocation == held
    assert state.fleet.snapshot is snapshot
    assert all((now == before).all() for now, before in zip(
        (snapshot.used, snapshot.usedmem, snapshot.node_scores()), usage, strict=True))
    assert state.fleet.allocation("default/a") == held
