"""The worst ``topology-aware`` decision on link graphs built to be hard (issue 45).

    python harness/benchmarks/topology_worst.py [--cards 8,16,32,64,128,256] [--repeat 3]
                                        [--old-search] [--cap 10]

For each node size, one node reports each of these link graphs (``tests/linkgraphs.py``):
G(n, p) for p in 0.2, 0.25, 0.3, 0.5, 0.7, 0.9, 0.95; the complete (k-1)-partite graph for
a pod of k cards (a (k-1)-set everywhere, no k-set); the Mycielskian (no three linked, greedy
colouring needs ever more classes); islands of k-1 cards with random links across (p 0.3,
0.6). A pod asks for 2..8 cards, ``topology-aware``, and ``decide`` places it on that node
alone (the node's eligible cards ranked in an order shuffled by the cards' usage).
Printed per size: the worst decision's time (best of ``--repeat``), its graph and pod,
and the search's steps.

``--old-search`` puts back the search before issue 45 (every set tried in rank order,
kept below as ``old_clique``); each size then runs in a subprocess stopped after
``--cap`` seconds, reported as "> cap s".
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.core import Fleet, decide, linksets, parse_pod, placement
from common.core.fleet import NodeTopology
from common.core.linksets import SearchBudget
from pyhami.sandbox import DEFAULTS
from tests.builders import hold, manifest
from tests.linkgraphs import (
    Masks,
    cliques_crossed,
    complete_multipartite,
    mycielski,
    node_of_links,
    random_graph,
)

SIZES = (8, 16, 32, 64, 128, 256)
ASKED = range(2, 9)


def old_clique(ranked: list[int], size: int, adjacency: tuple[int, ...]) -> list[int] | None:
    """The search before issue 45, as it was in ``common/core/placement.py``."""

    def extend(chosen: list[int], mask: int, start: int) -> list[int] | None:
        if len(chosen) == size:
            return chosen
        for k in range(start, len(ranked) - (size - len(chosen)) + 1):
            card = ranked[k]
            if adjacency[card] & mask == mask:
                found = extend([*chosen, card], mask | (1 << card), k + 1)
                if found is not None:
                    return found
        return None

    return extend([], 0, 0)


def use_old_search() -> None:
    def old(ranked: list[int], size: int, topology: NodeTopology,
            budget: SearchBudget) -> list[int] | None:
        return old_clique(ranked, size, topology.adjacency)

    placement.linked_set = old  # type: ignore[assignment]


def graphs(cards: int, asked: int, seed: int) -> Iterator[tuple[str, Masks]]:
    rng = random.Random(seed * 1000 + cards)
    for p in (0.2, 0.25, 0.3, 0.5, 0.7, 0.9, 0.95):
        yield f"G(n, {p})", random_graph(cards, p, rng)
    yield f"complete {asked - 1}-partite", complete_multipartite(cards, max(asked - 1, 1))
    yield "Mycielski", mycielski(cards)
    for p in (0.3, 0.6):
        yield f"islands of {asked - 1} + {p} across", cliques_crossed(
            cards, max(asked - 1, 1), p, rng)


class CountedBudget(SearchBudget):
    """A node's budget that leaves what it spent in ``SPENT`` (one entry a node placed)."""

    def __init__(self, steps: int = linksets.SEARCH_STEPS) -> None:
        super().__init__(steps)
        SPENT.append(self)


SPENT: list[CountedBudget] = []


def decision_time(masks: Masks, asked: int, repeat: int) -> tuple[float, int, str]:
    """Best time of ``repeat`` decisions, the search's steps, and the node's outcome."""
    fleet = Fleet()
    fleet.upsert_node(node_of_links("n", masks))
    # Some usage, so that the ranking is not the cards' index order.
    rng = random.Random(len(masks) * 31 + asked)
    for i in rng.sample(range(len(masks)), len(masks) // 3):
        hold(fleet, f"default/u{i}", "n", f"GPU-n-{i}")
    pod = parse_pod(manifest(gpus=asked, policy="topology-aware,binpack"), DEFAULTS)
    assert fleet.layout is not None  # built before the clock starts, as in a running daemon
    best = float("inf")
    outcome = ""
    SPENT.clear()
    for _ in range(repeat):
        start = time.perf_counter()
        decision = decide(fleet, pod)
        best = min(best, time.perf_counter() - start)
        outcome = "placed" if decision.scheduled else (decision.failed_nodes or {}).get("n", "")
    return best, max((budget.spent for budget in SPENT), default=0), outcome


def measure(cards: int, repeat: int) -> None:
    """One line a graph and pod, as each is decided: the parent caps each line's wait."""
    for asked in ASKED:
        if asked > cards:
            continue
        for name, masks in graphs(cards, asked, 1):
            seconds, steps, outcome = decision_time(masks, asked, repeat)
            print(f"{seconds!r}\t{name}, {asked} asked\t{steps}\t{outcome}", flush=True)


def worst(command: list[str], cap: float | None) -> tuple[float | None, str, str, str]:
    """The slowest line of a ``measure`` subprocess; None for the time when one graph took
    longer than ``cap`` seconds (the subprocess is then stopped)."""
    found: tuple[float | None, str, str, str] = (0.0, "", "", "")
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(child.stdout, selectors.EVENT_READ)
            while True:
                if not selector.select(cap):
                    child.kill()
                    return None, "", "", ""
                line = child.stdout.readline()
                if not line:
                    break
                seconds, what, steps, outcome = line.rstrip("\n").split("\t")
                if found[0] is not None and float(seconds) > found[0]:
                    found = (float(seconds), what, steps, outcome)
    if child.returncode:
        raise SystemExit(f"{command} failed with {child.returncode}")
    return found


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return f"{os.cpu_count()} CPUs, {model}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", default=",".join(map(str, SIZES)))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--old-search", action="store_true")
    parser.add_argument("--cap", type=float, default=10.0)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:
        # One size, in the subprocess the parent watches.
        if args.old_search:
            use_old_search()
        placement.SearchBudget = CountedBudget  # type: ignore[misc]
        measure(args.one, args.repeat)
        return
    search = "old search (every set)" if args.old_search else (
        f"bounded search, {linksets.SEARCH_STEPS} steps")
    print(f"{machine()}; {search}")
    print("| cards | worst decision | graph, pod | steps | outcome |")
    print("|---|---|---|---|---|")
    for cards in (int(c) for c in args.cards.split(",")):
        command = [sys.executable, __file__, "--one", str(cards), "--repeat", str(args.repeat)]
        if args.old_search:
            command.append("--old-search")
        seconds, what, steps, outcome = worst(command, args.cap if args.old_search else None)
        shown = f"> {args.cap:g} s" if seconds is None else f"{seconds * 1000:.1f} ms"
        steps = "-" if args.old_search else steps
        print(f"| {cards} | {shown} | {what} | {steps} | {outcome} |", flush=True)


if __name__ == "__main__":
    main()
