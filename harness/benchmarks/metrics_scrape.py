"""The CPU of one /metrics scrape at N nodes of 8 cards, as the daemon writes it: the
classic text format through ``Metrics.pieces`` (what ``/metrics`` sends), timed with
``time.process_time``.

    python harness/benchmarks/metrics_scrape.py [--nodes 1000 5000] [--scrapes 7]
                                                 [--changed 0.01] [--profile] [--whole]
                                                 [--gzip | --http] [--memory]

``--gzip``: the bytes sent to a scraper that accepts gzip, as Prometheus does: with code
that has ``Metrics.pieces(accept, gzip=...)``, its gzip body; without (before), the plain
pieces compressed as aiohttp's ``enable_compression()`` does (zlib's default level, 6).
``--http``: the real thing: the daemon's ``metrics_app`` serves the fleet in a child
process, and the CPU is the child's (``time.process_time`` there, read before and after
each ``GET /metrics`` with ``Accept-Encoding: gzip``; the fleet changed there too).
``--memory``: what ``Metrics`` holds after scrapes (tracemalloc: after the first scrape,
after scrapes with changes, and the peak during one), in another pass of its own.

The fleet: N nodes of 8 cards (two kinds of card), two pods of one card each on every
node, every node heard from, its slices enforced and its cards measured. Printed per size,
the median over ``--scrapes`` scrapes of: the first scrape; a scrape with nothing changed
since the last one; a scrape after ``--changed`` of the nodes changed (a pod booked or
released there, its measured figures and its last-heard time new); the same after every
agent reported too (each node's figures in a new ``Measured``, the same but for those
changed), as agents that send their measured usage with every message do. ``--profile`` prints
the top functions of one scrape after changes. RSS: the process's after the scrapes
(the fleet, the sources and what ``Metrics`` keeps), and its peak.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import inspect
import os
import pstats
import random
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from functools import partial
from types import SimpleNamespace
from typing import Any, cast

from aiohttp import web

from common.core import Allocation, CardGrant, Fleet
from common.core.model import Card, Node
from common.wire import Measured, MeasuredCard
from scheduler.cli import GC_YOUNG_THRESHOLD
from scheduler.metrics import CardGauges, Metrics, Sources
from scheduler.web.extender import metrics_app

CARDS = 8
KINDS = (("NVIDIA-A100-SXM4-80GB", 81920), ("Tesla-T4", 15360))


class State:
    """A fleet and what the daemon's other sources read, changed at will."""

    def __init__(self, nodes: int, seed: int = 1) -> None:
        self.random = random.Random(seed)
        self.fleet = Fleet()
        self.heard: dict[str, float] = {}
        self.measured: dict[str, Measured] = {}
        self.enforced: dict[str, bool] = {}
        self.names = [f"node-{i:05d}" for i in range(nodes)]
        self.pods = 0
        for i, name in enumerate(self.names):
            kind, memory = KINDS[i % len(KINDS)]
            self.fleet.upsert_node(Node(name=name, cards=[
                Card(uuid=f"GPU-{name}-{c}", index=c, type=kind, memory=memory)
                for c in range(CARDS)]))
            self.heard[name] = 1.7e9 + i
            self.enforced[name] = True
            self.measure(name)
            for _ in range(2):
                self.book(name)

    def book(self, name: str) -> None:
        card = self.random.randrange(CARDS)
        self.pods += 1
        self.fleet.allocate(f"ns-{self.pods % 50}/pod-{self.pods}", Allocation(
            node=name, containers=((CardGrant(f"GPU-{name}-{card}", 4096, 25),),)))

    def measure(self, name: str) -> None:
        self.measured[name] = Measured(at=time.time(), cards=[
            MeasuredCard(uuid=f"GPU-{name}-{c}", memory_used=self.random.randrange(80000),
                         utilization=self.random.randrange(101)) for c in range(CARDS)])

    def change(self, share: float) -> None:
        """``share`` of the nodes: a pod booked or released there, measured again, heard."""
        for name in self.random.sample(self.names, max(1, int(len(self.names) * share))):
            held = [key for key, a in self.fleet.allocations().items() if a.node == name]
            if held and self.random.random() < 0.5:
                self.fleet.release(held[0])
            else:
                self.book(name)
            self.measure(name)
            self.heard[name] += 15.0

    def reported(self, share: float) -> None:
        """Every agent reported (its measured figures in a new message, mostly the same),
        and ``share`` of the nodes changed."""
        for name, figures in self.measured.items():
            self.measured[name] = Measured(at=figures.at + 10, cards=list(figures.cards))
        self.change(share)

    def metrics(self) -> Metrics:
        metrics = Metrics(Sources(
            fleet=lambda: self.fleet, last_heard=lambda: dict(self.heard), stale=frozenset,
            ready=lambda: True, leading=lambda: True, slices_enforced=lambda: self.enforced,
            measured=lambda: self.measured, over_slice=dict))
        if LEVEL is not None:  # another compression level of the kept blocks
            metrics.cards = CardGauges(  # type: ignore[call-arg,unused-ignore]
                lambda: self.fleet, measured=lambda: self.measured, level=LEVEL)
        return metrics


LEVEL: int | None = None
"""``--level``: the compression level of the card gauges' kept blocks (code that keeps
them compressed), else its default."""


WHOLE = False
"""``--whole``: time ``Metrics.exposition()`` (the text joined in one bytes object) rather
than the pieces ``/metrics`` sends one after the other."""
GZIP = False
"""``--gzip``: time the bytes sent to a scraper that accepts gzip."""


def gzip_pieces(metrics: Metrics) -> Iterator[bytes]:
    """The body a scraper that accepts gzip gets: ``Metrics``' own gzip where it has one,
    else the text compressed as aiohttp compresses it (``enable_compression()``: zlib's
    default level, a gzip header)."""
    if "gzip" in inspect.signature(metrics.pieces).parameters:
        yield from cast(Any, metrics).pieces("text/plain", gzip=True)[1]
        return
    compressor = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED,
                                  16 + zlib.MAX_WBITS)
    for piece in metrics.pieces("text/plain")[1]:
        yield compressor.compress(piece)
    yield compressor.flush()


def scrape(metrics: Metrics) -> tuple[float, int]:
    """One scrape's CPU seconds and bytes."""
    start = time.process_time()
    if WHOLE:
        size = len(metrics.exposition())
    elif GZIP:
        size = sum(len(piece) for piece in gzip_pieces(metrics))
    else:
        size = sum(len(piece) for piece in metrics.pieces("text/plain")[1])
    return time.process_time() - start, size


def median_of(scrapes: int, before: Callable[[], object], metrics: Metrics) -> float:
    times = []
    for _ in range(scrapes):
        before()
        times.append(scrape(metrics)[0])
    return statistics.median(times)


def rss() -> float:
    """This process's resident memory now, MB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def serve(nodes: int, port: int, changed: float) -> None:
    """``--serve``: the fleet behind the daemon's ``metrics_app`` on ``port``, and routes to
    read this process's CPU and to change the fleet (the ``--http`` child)."""
    state = State(nodes)
    app = metrics_app(cast(Any, SimpleNamespace(metrics=state.metrics())))

    async def cpu(_: web.Request) -> web.Response:
        return web.Response(text=repr(time.process_time()))

    async def change(request: web.Request) -> web.Response:
        if request.query.get("reported"):
            state.reported(changed)
        else:
            state.change(changed)
        return web.Response(text="changed")

    app.add_routes([web.get("/cpu", cpu), web.get("/change", change)])
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    gc.freeze()
    web.run_app(app, host="127.0.0.1", port=port, print=lambda *_: print("ready", flush=True))


def http(nodes: int, scrapes: int, changed: float) -> None:
    """``--http``: scrapes of a child process serving ``metrics_app``, as Prometheus
    scrapes (Accept-Encoding: gzip, the classic format), its CPU for each."""
    port = 20000 + os.getpid() % 10000
    level = [] if LEVEL is None else ["--level", str(LEVEL)]
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(nodes), "--port",
                              str(port), "--changed", str(changed), *level],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        base = f"http://127.0.0.1:{port}"

        def get(path: str, headers: dict[str, str] | None = None) -> bytes:
            request = urllib.request.Request(base + path, headers=headers or {})
            with urllib.request.urlopen(request, timeout=120) as response:
                body: bytes = response.read()
                return body

        def scraped() -> tuple[float, int]:
            before = float(get("/cpu"))
            size = len(get("/metrics", {"Accept-Encoding": "gzip"}))
            return float(get("/cpu")) - before, size

        def median(change: str | None) -> float:
            times = []
            for _ in range(scrapes):
                if change is not None:
                    get(change)
                times.append(scraped()[0])
            return statistics.median(times)

        first, size = scraped()
        same = median(None)
        one = median("/change")
        reported = median("/change?reported=1")
        print(f"{nodes} nodes x {CARDS} cards over HTTP, gzip accepted, {size:,} bytes "
              f"sent: first scrape {first:.3f} s, nothing changed {same:.3f} s, "
              f"{changed:.0%} of nodes changed {one:.3f} s, and every agent reported "
              f"{reported:.3f} s (the serving process's CPU)", flush=True)
    finally:
        child.terminate()
        child.wait()


def memory(nodes: int, changed: float) -> None:
    """``--memory``: what ``Metrics`` holds between scrapes and at the peak of one."""
    state = State(nodes)
    state.fleet.orphans()  # the fleet's own state built at first use: not Metrics'
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    metrics = state.metrics()
    scrape(metrics)
    first = tracemalloc.get_traced_memory()[0] - start
    for _ in range(3):
        state.change(changed)
        scrape(metrics)
    held = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.reset_peak()
    state.change(changed)
    scrape(metrics)
    peak = tracemalloc.get_traced_memory()[1] - start
    tracemalloc.stop()
    print(f"{nodes} nodes x {CARDS} cards: Metrics holds {first / 2**20:.1f} MB after the "
          f"first scrape, {held / 2**20:.1f} MB after scrapes with {changed:.0%} changed; "
          f"peak during a scrape {peak / 2**20:.1f} MB (tracemalloc)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--scrapes", type=int, default=7)
    parser.add_argument("--changed", type=float, default=0.01)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--whole", action="store_true")
    parser.add_argument("--gzip", action="store_true")
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--level", type=int)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    global WHOLE, GZIP, LEVEL  # noqa: PLW0603
    WHOLE = arguments.whole
    GZIP = arguments.gzip
    LEVEL = arguments.level
    if arguments.serve:
        serve(arguments.serve, arguments.port, arguments.changed)
        return
    if arguments.http:
        for nodes in arguments.nodes:
            http(nodes, arguments.scrapes, arguments.changed)
        return
    if arguments.memory:
        for nodes in arguments.nodes:
            memory(nodes, arguments.changed)
        return
    # As the daemon runs: its young-generation threshold, what it holds at start frozen.
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    gc.freeze()
    for nodes in arguments.nodes:
        state = State(nodes)
        metrics = state.metrics()
        first, size = scrape(metrics)
        firsts = [first] + [scrape(state.metrics())[0] for _ in range(2)]
        same = median_of(arguments.scrapes, lambda: None, metrics)
        changed = median_of(arguments.scrapes, partial(state.change, arguments.changed), metrics)
        reported = median_of(arguments.scrapes, partial(state.reported, arguments.changed),
                             metrics)
        print(f"{nodes} nodes x {CARDS} cards, {size:,} bytes: first scrape "
              f"{statistics.median(firsts):.3f} s, nothing changed {same:.3f} s, "
              f"{arguments.changed:.0%} of nodes changed {changed:.3f} s, and every agent "
              f"reported {reported:.3f} s; RSS {rss():.0f} MB, "
              f"peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
        if arguments.profile:
            state.change(arguments.changed)
            profile = cProfile.Profile()
            profile.enable()
            scrape(metrics)
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
