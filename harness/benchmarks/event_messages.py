"""What the messages of HAMi's Events cost the daemon's loop (issue 46).

    python harness/benchmarks/event_messages.py [--nodes 1000,5000] [--repeat 7]

For ``--nodes`` nodes that all hold the pod, with scores of a third of them tied: the
``FilteringSucceed`` message as the daemon writes it (the ten best through
``FittingNodes.best``), and the same message from the whole order (every node ordered,
as iterating the mapping does). For as many nodes refusing a pod (two reasons, the
nodes in two groups, as nodes failing alike share one reasons object): the per-reason
``FilteringFailed`` messages. Best of ``--repeat``, each a mean over enough calls to
take about 0.2 s.
"""

from __future__ import annotations

import argparse
import platform
import sys
import timeit
from collections.abc import Callable
from itertools import islice
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.core import NodePolicy, NodeReasons
from common.core.decide import FittingNodes
from common.core.events import NODES_LISTED, filtering_failures, filtering_succeed
from common.core.reasons import FailedNode


def best_ms(call: Callable[[], object], repeat: int) -> float:
    timer = timeit.Timer(call)
    number, _ = timer.autorange()
    return min(timer.repeat(repeat, number)) / number * 1e3


def measure(count: int, repeat: int) -> tuple[float, float, float]:
    """The three figures in ms for ``count`` nodes."""
    names = [f"gpu-node-{i:05d}" for i in range(count)]
    scores = np.round(np.random.default_rng(0).random(count) * 10, 6)
    scores[::3] = 2.5
    positions = np.arange(count)

    def made() -> FittingNodes:
        return FittingNodes(names, positions, scores, NodePolicy.BINPACK)

    def whole() -> list[tuple[str, float]]:
        return list(islice(made().items(), NODES_LISTED))

    assert made().best(NODES_LISTED) == whole()
    chosen = made().best(1)[0][0]
    memory = NodeReasons.of({"CardInsufficientMemory": 8}, 8)
    mixed = NodeReasons.of({"CardInsufficientMemory": 4, "CardNotHealth": 4}, 8)
    failures: dict[str, FailedNode] = {
        name: memory if i % 2 else mixed for i, name in enumerate(names)}
    return (best_ms(lambda: filtering_succeed(chosen, count, made()), repeat),
            best_ms(whole, repeat),
            best_ms(lambda: filtering_failures(failures), repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,5000")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print("| nodes | FilteringSucceed, the ten best (ms) | the same, every node ordered (ms) "
          "| FilteringFailed by reason (ms) |")
    print("|---:|---:|---:|---:|")
    for count in (int(n) for n in args.nodes.split(",")):
        succeed, ordered, failed = measure(count, args.repeat)
        print(f"| {count:,} | {succeed:.3f} | {ordered:.3f} | {failed:.3f} |")


if __name__ == "__main__":
    main()
