"""The generated cluster and workload docs/simulate.md runs ``pyhami simulate`` on, in the
public openb trace format (cluster-trace-gpu-v2023): a node list and a pod list.

    python -m tests.simulate_example examples/simulate

writes ``nodes.csv`` and ``pods.csv`` there; the same seed writes the same files.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
              "creation_time,deletion_time,scheduled_time")
# (model, cards per node, nodes): 32 + 32 + 16 = 80 cards of three models, as openb's.
NODE_GROUPS = (("V100M32", 8, 4), ("T4", 4, 8), ("P100", 2, 8))
CARDS = sum(cards * count for _, cards, count in NODE_GROUPS)
# Pods arrive until their GPU demand reaches this share of the cards: past full, where
# the policies part.
DEMAND = 1.25
SEED = 17
# Most pods run to the end (no deletion time); the others leave after a few minutes.
STAYING = 0.7
SHARE_MILLI = (100, 250, 300, 460, 500, 750)  # a sharing pod's share of one card


def node_rows() -> list[str]:
    rows, number = [], 0
    for model, cards, count in NODE_GROUPS:
        for _ in range(count):
            rows.append(f"sim-node-{number:02d},{cards * 12000},{cards * 49152},{cards},{model}")
            number += 1
    return rows


def pod_rows(seed: int = SEED) -> list[str]:
    """Sharing pods (60%), one-card pods (32%) and 2- or 4-card pods, one in four tied to
    a GPU model, arriving a minute apart on average."""
    chance = random.Random(seed)
    rows: list[str] = []
    arrival, demand = 0, 0.0
    while demand < DEMAND * CARDS:
        number = len(rows)
        kind = chance.random()
        if kind < 0.6:
            cards, milli = 1, chance.choice(SHARE_MILLI)
        elif kind < 0.92:
            cards, milli = 1, 1000
        else:
            cards, milli = chance.choice((2, 2, 4)), 1000
        spec = chance.choice(("V100M32", "T4|P100")) if chance.random() < 0.25 else ""
        departure = "" if chance.random() < STAYING else arrival + chance.randint(120, 900)
        demand += cards * milli / 1000
        cpu = 4000 * cards
        rows.append(f"sim-pod-{number:03d},{cpu},{cpu * 4},{cards},{milli},{spec},LS,Running,"
                    f"{arrival},{departure},{arrival}")
        arrival += round(chance.expovariate(1 / 60))
    return rows


def write_example(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    nodes, pods = folder / "nodes.csv", folder / "pods.csv"
    nodes.write_text("\n".join([NODE_HEADER, *node_rows()]) + "\n")
    pods.write_text("\n".join([POD_HEADER, *pod_rows()]) + "\n")
    return nodes, pods


if __name__ == "__main__":
    for path in write_example(Path(sys.argv[1])):
        print(path)
