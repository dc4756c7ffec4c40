"""The generated cluster and workload with distributed jobs that docs/simulate.md, "Jobs
placed all or nothing", runs ``pyhami simulate`` on: pyhami's own cluster and workload
files (JSON), the jobs declared as Kueue declares plain-pod groups.

    python -m tests.simulate_groups_example examples/simulate/groups

writes ``cluster.json`` and ``workload.json`` there; the same seed writes the same files.

The cluster: 8 nodes of 8 cards of 81920 MiB (64 cards). The workload: jobs arrive one
after the other, a minute apart on average (exponential gaps); about a fifth of the pods
are the workers of distributed jobs of 2 to 16 members, each worker asking for half of 2
or 4 cards (cores and memory), created a second apart by their controller and running
together for one to four hours; the rest are single pods sharing one card (10 to 100%) or
taking 2 whole cards, for ten minutes to two hours. The demand offered is about 1.25 times
the cards: jobs queue.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

NODES = 8
CARDS_PER_NODE = 8
CARD_MEMORY_MIB = 81920
NAMESPACE = "ml"
SEED = 30
PODS = 400
IN_GROUPS = 0.2
GROUP_SIZES = (2, 16)
MEAN_GAP_SECONDS = 60.0
MEMBER_GAP_SECONDS = 1.0
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
SHARES = (10, 25, 30, 50, 75, 100)  # a single sharing pod's percent of one card


def cluster() -> dict[str, Any]:
    return {"nodes": [
        {"name": f"gpu-node-{n}", "devices": [
            {"uuid": f"GPU-{n}-{i}", "index": i, "type": "NVIDIA A100-SXM4-80GB",
             "memory": CARD_MEMORY_MIB} for i in range(CARDS_PER_NODE)]}
        for n in range(NODES)]}


def pod(name: str, cards: int, percent: int, labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": cards, "nvidia.com/gpucores": percent,
              "nvidia.com/gpumem-percentage": percent}
    metadata: dict[str, Any] = {"name": name, "namespace": NAMESPACE}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": [{"name": "main", "image": "trainer",
                                     "resources": {"limits": limits}}]}}


def group_sizes(rng: random.Random) -> list[int]:
    """Group sizes from 2 to 16 until they hold a fifth of the pods."""
    target = round(PODS * IN_GROUPS)
    sizes: list[int] = []
    while sum(sizes) < target:
        # The last one takes what is left, at least the smallest size.
        sizes.append(max(GROUP_SIZES[0], min(rng.randint(*GROUP_SIZES), target - sum(sizes))))
    return sizes


def workload(seed: int = SEED) -> dict[str, Any]:
    rng = random.Random(seed)
    sizes = group_sizes(rng)
    singles = PODS - sum(sizes)
    # The jobs in a random order: None for a single pod, else a group's size.
    jobs: list[int | None] = [None] * singles + list(sizes)
    rng.shuffle(jobs)
    entries: list[dict[str, Any]] = []
    now = 0.0
    for number, size in enumerate(jobs):
        now += rng.expovariate(1 / MEAN_GAP_SECONDS)
        if size is None:
            whole = rng.random() < 0.15
            cards, percent = (2, 100) if whole else (1, rng.choice(SHARES))
            entries.append({"arrival": round(now, 1),
                            "duration": float(rng.randint(600, 7200)),
                            "pod": pod(f"single-{number:03d}", cards, percent)})
            continue
        name = f"train-{number:03d}"
        cards = rng.choice((2, 4))
        duration = float(rng.randint(3600, 4 * 3600))
        for worker in range(size):
            entries.append({
                "arrival": round(now + worker * MEMBER_GAP_SECONDS, 1),
                "duration": duration,
                "pod": pod(f"{name}-worker-{worker}", cards, 50,
                           {KUEUE_GROUP_LABEL: name}, {KUEUE_COUNT_ANNOTATION: str(size)})})
        now += size * MEMBER_GAP_SECONDS
    return {"pods": entries}


def write(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cluster.json").write_text(json.dumps(cluster(), indent=1) + "\n")
    (folder / "workload.json").write_text(json.dumps(workload(), indent=1) + "\n")


if __name__ == "__main__":
    write(Path(sys.argv[1] if len(sys.argv) > 1 else "examples/simulate/groups"))
