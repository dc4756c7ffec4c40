"""``pyhami bench decide``: how fast the decision core is for a cluster of a given size."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import deque

from common.arguments import Subcommands, policy_chain, positive_int
from common.core import (
    Defaults,
    Fleet,
    NodePolicy,
    PodManifest,
    decide,
    parse_default_chain,
    parse_pod,
)
from common.core.pod import Container, ObjectMeta, PodSpec, ResourceRequirements
from pyhami.bench.synthetic import random_nodes


def register(benches: Subcommands) -> None:
    decide_parser = benches.add_parser("decide", help="time the decision core on a random cluster")
    decide_parser.add_argument("--nodes", type=positive_int, required=True,
                               help="nodes of the random cluster (required)")
    decide_parser.add_argument("--cards", type=positive_int, default=8,
                               help="cards of each node; half of all cards' worth of pods "
                                    "stay placed while the others come and go (default 8)")
    decide_parser.add_argument("--chain", type=policy_chain, default="spread",
                               help="the card policy chain the timed pods name, e.g. "
                                    "mutex,binpack (default spread)")
    decide_parser.add_argument("--gpus", type=positive_int, default=1,
                               help="cards each timed pod asks for (default 1)")
    decide_parser.add_argument("--pods", type=positive_int, default=2000,
                               help="pods decided and timed (default 2000)")
    decide_parser.add_argument("--seed", type=int, default=1,
                               help="seed of the random cluster and pods: the same seed, the "
                                    "same run (default 1)")
    decide_parser.set_defaults(handler=_run_decide)


def _run_decide(args: argparse.Namespace) -> int:
    return run(nodes=args.nodes, cards=args.cards, chain=args.chain, gpus=args.gpus,
               pods=args.pods, seed=args.seed)


def _pod(rng: random.Random, number: int, chain: str, gpus: int) -> PodManifest:
    limits: dict[str, str | int | float] = {
        "nvidia.com/gpu": gpus,
        "nvidia.com/gpumem": rng.choice((1000, 2000, 4000, 8000)),
        "nvidia.com/gpucores": rng.choice((0, 10, 30)),
    }
    return PodManifest(
        metadata=ObjectMeta(name=f"bench-{number}", namespace="bench",
                            annotations={"hami.io/gpu-scheduler-policy": chain}),
        spec=PodSpec(containers=[Container(name="main",
                                           resources=ResourceRequirements(limits=limits))]),
    )


def bench_decide(*, nodes: int, cards: int, chain: str, gpus: int, pods: int, seed: int,
                 resident: int) -> dict[str, object]:
    """Time parse + decide per pod; each placed pod is applied, the oldest released.

    ``resident`` pods stay allocated at a time, so usage keeps changing while the
    cluster neither fills up nor empties.
    """
    rng = random.Random(seed)
    fleet = Fleet()
    for node in random_nodes(rng, nodes, cards):
        fleet.upsert_node(node)
    defaults = Defaults(parse_default_chain("spread"), NodePolicy.BINPACK)
    live: deque[str] = deque()
    for number in range(resident):  # warm the cluster with resident pods
        warm = _pod(rng, number, rng.choice(("binpack", "spread")), 1)
        decision = decide(fleet, parse_pod(warm, defaults))
        if decision.allocation is not None:
            fleet.allocate(decision.pod, decision.allocation)
            live.append(decision.pod)
    manifests = [_pod(rng, resident + n, chain, gpus) for n in range(pods)]
    timings: list[float] = []
    scheduled = 0
    for manifest in manifests:
        started = time.perf_counter()
        decision = decide(fleet, parse_pod(manifest, defaults))
        timings.append(time.perf_counter() - started)
        if decision.allocation is not None:
            scheduled += 1
            fleet.allocate(decision.pod, decision.allocation)
            live.append(decision.pod)
            if len(live) > resident:
                fleet.release(live.popleft())
    timings.sort()
    return {
        "nodes": nodes,
        "cards": cards,
        "chain": chain,
        "gpus": gpus,
        "pods": pods,
        "scheduled": scheduled,
        "median_ms": round(statistics.median(timings) * 1e3, 4),
        "p99_ms": round(timings[min(len(timings) - 1, int(len(timings) * 0.99))] * 1e3, 4),
        "decisions_per_s": round(len(timings) / sum(timings), 1),
    }


def run(*, nodes: int, cards: int, chain: str, gpus: int, pods: int, seed: int) -> int:
    resident = nodes * cards // 2
    print(json.dumps(bench_decide(nodes=nodes, cards=cards, chain=chain, gpus=gpus, pods=pods,
                                  seed=seed, resident=resident)))
    return 0
