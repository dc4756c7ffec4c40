"""/metrics written from what the last scrape kept equals the full rendering: after random
changes (pods booked, released and replaced, nodes added, changed, removed and forgotten,
cards measured, agents heard, a scrape left half way), in both exposition formats, the
text of one ``Metrics`` scraped again and again is byte for byte the card gauges written
afresh followed by prometheus_client's writing of the registry (the collectors' families,
built anew). The same holds of the gzip body ``/metrics`` sends a scraper that accepts it:
one gzip member (the kept blocks as they are, the rest compressed at the scrape) whose
text is the full rendering."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import cast

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.exposition import choose_encoder

from common.core import Allocation, CardGrant, Fleet
from common.core.mig import MigInstance, MigPlacement
from common.core.model import Card, Node
from common.wire import Measured, MeasuredCard
from scheduler.metrics import CardGauges, Metrics, Sources
from scheduler.service import SchedulerService
from scheduler.web.extender import accepts_gzip, metrics_app

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
# The classic format, OpenMetrics, and both with another escaping of names (``dots``
# changes this module's names: its families are then written by prometheus_client).
ACCEPTS = ["", OPENMETRICS, "text/plain; version=1.0.0; escaping=allow-utf-8",
           f"{OPENMETRICS}; escaping=dots"]
NODES = ["a", "b", 'odd "node" \\ 1', "d", "e", "f"]
TYPES = ["NVIDIA-A100", 'NVIDIA "T4" \\ rev\nB']


@dataclass
class State:
    """A fleet and the other sources ``/metrics`` reads, changed at will."""

    fleet: Fleet = field(default_factory=Fleet)
    heard: dict[str, float] = field(default_factory=dict)
    stale: set[str] = field(default_factory=set)
    enforced: dict[str, bool] = field(default_factory=dict)
    measured: dict[str, Measured] = field(default_factory=dict)
    over: dict[str, int] = field(default_factory=dict)
    pods: int = 0

    def sources(self) -> Sources:
        return Sources(fleet=lambda: self.fleet, last_heard=lambda: dict(self.heard),
                       stale=lambda: frozenset(self.stale), ready=lambda: True,
                       leading=lambda: True, slices_enforced=lambda: dict(self.enforced),
                       measured=lambda: self.measured, over_slice=lambda: dict(self.over))

    def cards(self, name: str) -> list[Card]:
        node = self.fleet.node(name)
        return node.cards if node is not None else []


def _node(data: st.DataObject, name: str) -> Node:
    count = data.draw(st.integers(1, 3))
    return Node(name=name, cards=[
        Card(uuid=f"GPU-{name}-{index}", index=index, type=data.draw(st.sampled_from(TYPES)),
             memory=data.draw(st.sampled_from([0, 15360, 81920])),
             cores=data.draw(st.sampled_from([100, 150])), health=data.draw(st.booleans()),
             physical_memory=data.draw(st.sampled_from([None, 7680])))
        for index in range(count)])


def _change(data: st.DataObject, state: State, metrics: Metrics) -> None:
    """One random change of the state (or a scrape left half way)."""
    name = data.draw(st.sampled_from(NODES))
    kind = data.draw(st.sampled_from(["node", "node", "remove", "forget", "book", "book",
                                 "release", "measure", "heard", "stale", "over", "copy",
                                 "half"]))
    if kind == "node":
        state.fleet.upsert_node(_node(data, name))
    elif kind == "remove":
        state.fleet.remove_node(name)
    elif kind == "forget":  # the node and everything known of it
        state.fleet.remove_node(name)
        for known in (state.heard, state.enforced, state.measured, state.over):
            known.pop(name, None)
        state.stale.discard(name)
    elif kind == "book":
        cards = state.cards(name) or [Card(uuid=f"GPU-{name}-gone", index=0, type="x",
                                           memory=1)]
        key = data.draw(st.sampled_from([f"ns/p{state.pods}", *sorted(state.fleet.allocations())]))
        state.pods += 1
        grants = st.lists(st.sampled_from(cards), min_size=0, max_size=2)
        made = st.none() | st.builds(
            MigInstance, st.just("1g.10gb"), st.just(MigPlacement(start=0, size=1)),
            mig_uuid=st.sampled_from(["", "MIG-1", 'MIG-"2"']), gpu_instance_id=st.just(1),
            compute_instance_id=st.just(0))
        containers = tuple(
            tuple(CardGrant(card.uuid, data.draw(st.integers(0, 4000)),
                            data.draw(st.integers(0, 100)), data.draw(made))
                  for card in data.draw(grants))
            for _ in range(data.draw(st.integers(1, 2))))
        state.fleet.allocate(key, Allocation(node=name, containers=containers))
    elif kind == "release" and state.fleet.allocations():
        state.fleet.release(data.draw(st.sampled_from(sorted(state.fleet.allocations()))))
    elif kind == "measure":
        uuids = [card.uuid for card in state.cards(name)] + [f"GPU-{name}-gone"]
        state.measured[name] = Measured(at=data.draw(st.sampled_from([1.0, 2.0])), cards=[
            MeasuredCard(uuid=uuid, memory_used=data.draw(st.none() | st.integers(0, 9000)),
                         utilization=data.draw(st.none() | st.integers(0, 100)))
            for uuid in data.draw(st.lists(st.sampled_from(uuids), unique=True))])
    elif kind == "heard":
        state.heard[name] = data.draw(st.floats(0, 2e9, allow_nan=False))
        state.enforced[name] = data.draw(st.booleans())
    elif kind == "stale":
        state.stale ^= {name}
    elif kind == "over":
        state.over[name] = data.draw(st.integers(0, 3))
    elif kind == "copy":  # the daemon may hold another fleet of the same state
        state.fleet = state.fleet.copy()
    elif kind == "half":  # a scraper that went away: nothing kept from the half scrape
        pieces = metrics.pieces(data.draw(st.sampled_from(ACCEPTS)),
                                gzip=data.draw(st.booleans()))[1]
        for _ in range(data.draw(st.integers(0, 40))):
            next(pieces, None)


def _full(state: State, metrics: Metrics, accept: str) -> bytes:
    """The whole text as prometheus_client writes the registry, after the card gauges
    written afresh."""
    cards = CardGauges(state.sources().fleet, cards_per_piece=16,
                       measured=state.sources().measured).text().encode()
    return cards + choose_encoder(accept)[0](metrics.registry)


def gunzip_one_member(body: bytes) -> bytes:
    """The text of ``body``, which must be exactly one gzip member (curl's ``--compressed``
    reads no further than the first)."""
    reader = zlib.decompressobj(16 + zlib.MAX_WBITS)
    text = reader.decompress(body)
    assert reader.eof and not reader.unused_data and not reader.unconsumed_tail
    return text


def scraped(metrics: Metrics, accept: str, gzip: bool) -> bytes:
    """The text of what ``/metrics`` sends, with or without gzip."""
    body = b"".join(metrics.pieces(accept, gzip=gzip)[1])
    return gunzip_one_member(body) if gzip else body


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_kept_text_equals_the_full_rendering_after_random_changes(data: st.DataObject) -> None:
    state = State()
    # A few cards (pods) a block, so that blocks come, go and are kept.
    metrics = Metrics(state.sources(), cards_per_block=16, pods_per_block=2)
    for _ in range(data.draw(st.integers(1, 25))):
        for _ in range(data.draw(st.integers(1, 3))):
            _change(data, state, metrics)
        accept = data.draw(st.sampled_from(ACCEPTS))
        kept = scraped(metrics, accept, gzip=data.draw(st.booleans()))
        # A new Metrics would have its own counters' creation times: the card gauges are
        # written afresh, the rest by prometheus_client from the same registry.
        assert kept == _full(state, metrics, accept)


def test_a_scrape_with_nothing_changed_gives_the_same_text_twice() -> None:
    state = State()
    state.fleet.upsert_node(Node(name="a", cards=[
        Card(uuid="GPU-a0", index=0, type="NVIDIA-A100", memory=81920)]))
    state.fleet.allocate("ns/p", Allocation(node="a", containers=(
        (CardGrant("GPU-a0", 1000, 10),),)))
    state.heard["a"] = 5.0
    metrics = Metrics(state.sources())
    for accept in ACCEPTS:
        first = scraped(metrics, accept, gzip=False)
        assert scraped(metrics, accept, gzip=True) == first == _full(state, metrics, accept)
        assert scraped(metrics, accept, gzip=False) == first


def _small_state() -> State:
    state = State()
    for name in NODES:
        state.fleet.upsert_node(Node(name=name, cards=[
            Card(uuid=f"GPU-{name}-{index}", index=index, type=TYPES[index % 2], memory=81920)
            for index in range(8)]))
        state.fleet.allocate(f"ns/{name}", Allocation(node=name, containers=(
            (CardGrant(f"GPU-{name}-1", 1000, 10),),)))
        state.heard[name] = 5.0
    return state


@pytest.mark.parametrize("accept", ["", OPENMETRICS])
async def test_metrics_app_sends_gzip_to_a_scraper_that_accepts_it_and_text_otherwise(
        accept: str) -> None:
    """Through the daemon's metrics listener: a scraper that accepts gzip (as Prometheus
    does) gets one gzip member, Content-Encoding gzip, whose text is the full rendering;
    one that does not gets the same text plain."""
    state = _small_state()
    metrics = Metrics(state.sources())
    service = cast(SchedulerService, SimpleNamespace(metrics=metrics))
    async with TestServer(metrics_app(service)) as server, \
            ClientSession(auto_decompress=False) as session:
        for name, (encoding, gzip) in zip(NODES, (
                ("gzip", True), ("deflate, gzip;q=0.5", True), ("identity", False),
                ("gzip;q=0", False), ("", False)), strict=False):
            headers = {"Accept": accept, "Accept-Encoding": encoding}
            async with session.get(server.make_url("/metrics"), headers=headers) as response:
                assert response.status == 200
                body = await response.read()
                assert response.headers["Content-Type"] == choose_encoder(accept)[1]
                assert response.headers.get("Content-Encoding") == ("gzip" if gzip else None)
            text = gunzip_one_member(body) if gzip else body
            assert text == _full(state, metrics, accept)
            state.fleet.release(f"ns/{name}")  # a change between scrapes


@pytest.mark.parametrize(("header", "gzip"), [
    ("gzip", True), ("GZIP, deflate", True), ("br;q=1.0, gzip;q=0.8", True), ("*", True),
    ("x-gzip", True), ("", False), ("identity", False), ("gzip;q=0", False),
    ("gzip; q=0.000", False), ("*;q=0", False), ("deflate, *;q=0.1", True),
    ("gzip;q=0, *", False), ("gzip;q=junk", False)])
def test_accept_encoding_is_read_as_http_means_it(header: str, gzip: bool) -> None:
    assert accepts_gzip(header) is gzip
