"""Time ``pyhami simulate``'s engine on a synthetic trace the size of the openb default
trace (8,152 pods, 1,213 GPU nodes, 6,212 GPUs), one run per policy chain.

The cluster mixes five GPU models, 1 to 8 cards a node; 70% of the pods share one card
(100 to 900 milli-GPU, mapped to gpucores and gpumem-percentage alike), 30% take 1 to 8
whole cards; 10% ask for one GPU model. Arrivals are spread over a week; 70% of the pods
run for an exponentially distributed time (mean four days), the rest stay.

    scripts/bench-simulate [--inflate 1.2]     (python -m harness.bench_simulate)
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from common.core import Card, Node, NodePolicy, PodManifest
from common.core.pod import (
    GPU_POLICY_ANNOTATION,
    Container,
    ObjectMeta,
    PodSpec,
    ResourceRequirements,
)
from common.core.vendors import NVIDIA
from pyhami.simulate._engine import simulate
from pyhami.simulate._results import PolicyRun, percentile
from pyhami.simulate._trace import SimPod, Trace

MODELS = (("A100-SXM4-80GB", 81920), ("V100-SXM2-32GB", 32768), ("T4", 15360),
          ("A10", 23028), ("P100-PCIE-16GB", 16384))
NODES, CARDS, PODS = 1213, 6212, 8152
WEEK = 7 * 24 * 3600.0
POLICIES = ("spread", "binpack", "mutex,binpack,numa")


def card_counts(rng: np.random.Generator) -> list[int]:
    counts = rng.choice([1, 2, 4, 8], size=NODES, p=[0.15, 0.15, 0.25, 0.45])
    while (excess := int(counts.sum()) - CARDS) != 0:
        node = int(rng.integers(NODES))
        step = 1 if excess < 0 else -1
        if 1 <= counts[node] + step <= 8:
            counts[node] += step
    return [int(c) for c in counts]


def cluster(rng: np.random.Generator) -> list[Node]:
    nodes = []
    for position, count in enumerate(card_counts(rng)):
        model, memory = MODELS[int(rng.integers(len(MODELS)))]
        devices = [Card(uuid=f"GPU-{position}-{index}", index=index, type=model,
                        memory=memory, numa=index * 2 // max(count, 2))
                   for index in range(count)]
        nodes.append(Node(name=f"node-{position:04d}", cards=devices))
    return nodes


def pod(position: int, rng: np.random.Generator) -> PodManifest:
    if rng.random() < 0.7:
        milli = int(rng.integers(1, 10)) * 100
        limits: dict[str, str | int | float] = {
            "nvidia.com/gpu": 1, "nvidia.com/gpucores": milli // 10,
            "nvidia.com/gpumem-percentage": milli // 10}
    else:
        cards = int(rng.choice([1, 2, 4, 8], p=[0.6, 0.15, 0.15, 0.1]))
        limits = {"nvidia.com/gpu": cards, "nvidia.com/gpucores": 100}
    annotations: dict[str, str] = {}
    if rng.random() < 0.1:
        annotations[NVIDIA.pod_annotations.use_type] = MODELS[int(rng.integers(len(MODELS)))][0]
    if rng.random() < 0.05:
        annotations[GPU_POLICY_ANNOTATION] = "spread"
    return PodManifest(
        metadata=ObjectMeta(name=f"pod-{position:05d}", annotations=annotations),
        spec=PodSpec(containers=[Container(name="main",
                                           resources=ResourceRequirements(limits=limits))]))


def workload(rng: np.random.Generator) -> list[SimPod]:
    arrivals = np.sort(rng.uniform(0, WEEK, size=PODS))
    pods = []
    for position, arrival in enumerate(arrivals.tolist()):
        duration = float(rng.exponential(4 * 24 * 3600)) if rng.random() < 0.7 else None
        pods.append(SimPod(pod(position, rng), arrival, duration))
    return pods


def report(run: PolicyRun, seconds: float) -> str:
    last = run.samples[-1]
    p95 = percentile(run.waits, 0.95) or 0.0
    return (f"{run.policy:<20} {seconds:6.2f} s  placed {run.placed:5d}  refused "
            f"{run.refused:5d}  peak allocation {run.peak_allocation:.3f}  at end: arrived "
            f"{last.arrived:.2f} allocation {last.allocation:.3f} fragmentation "
            f"{last.fragmentation:.3f}  wait p95 {p95 / 3600:.1f} h")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--inflate", type=float, default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    trace = Trace(nodes=cluster(rng), pods=workload(rng))
    print(f"{len(trace.nodes)} nodes, {sum(len(n.cards) for n in trace.nodes)} GPUs, "
          f"{len(trace.pods)} pods, inflate {args.inflate}")
    for policy in POLICIES:
        started = time.perf_counter()
        run = simulate(trace, policy=policy, node_policy=NodePolicy.BINPACK,
                       inflate=args.inflate)
        print(report(run, time.perf_counter() - started), flush=True)


if __name__ == "__main__":
    main()
