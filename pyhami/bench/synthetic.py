"""Random clusters for benchmarks: seeded, so every run sees the same cluster."""

from __future__ import annotations

import random

from common.core import Card, Node

# Typed as HAMi registers them (the NVML name, "NVIDIA-" before it where it lacks one).
_MODELS = (("NVIDIA-Tesla T4", 15360), ("NVIDIA A100-SXM4-80GB", 81920),
           ("NVIDIA H100 80GB HBM3", 81559))


def _links(uuids: list[str], islands: bool) -> list[dict[str, int]]:
    """Every pair linked (NVSwitch), or two fully linked halves (NVLink islands)."""
    half = len(uuids) // 2
    links = []
    for i in range(len(uuids)):
        peers = [j for j in range(len(uuids))
                 if j != i and (not islands or (i < half) == (j < half))]
        links.append({uuids[j]: 12 for j in peers})
    return links


def random_node(rng: random.Random, name: str, cards: int) -> Node:
    model, memory = rng.choice(_MODELS)
    uuids = [f"GPU-{name}-{i}" for i in range(cards)]
    links = _links(uuids, islands=rng.random() < 0.5)
    devices = [
        Card(uuid=uuids[i], index=i, type=model, memory=memory, numa=i * 2 // max(cards, 1),
             links=links[i], processes=rng.choice((0, 0, 0, 1)))
        for i in range(cards)
    ]
    return Node(name=name, cards=devices)


def random_nodes(rng: random.Random, count: int, cards: int) -> list[Node]:
    return [random_node(rng, f"node-{i:05d}", cards) for i in range(count)]
