"""NVLink graphs hostile to the linked-set search, as adjacency bitmasks (bit j of entry i:
cards i and j are linked), and the nodes that report them.

Shared by the search's tests, its fuzz target and ``harness/benchmarks/topology_worst.py``.
"""

from __future__ import annotations

import random

import pytest

from common.core import Card, Node, linksets, placement
from common.core.linksets import SEARCH_STEPS, SearchBudget

Masks = list[int]


def link(masks: Masks, a: int, b: int) -> None:
    masks[a] |= 1 << b
    masks[b] |= 1 << a


def random_graph(cards: int, p: float, rng: random.Random) -> Masks:
    """G(n, p): each pair linked with probability ``p``."""
    masks = [0] * cards
    for a in range(cards):
        for b in range(a + 1, cards):
            if rng.random() < p:
                link(masks, a, b)
    return masks


def complete_multipartite(cards: int, parts: int) -> Masks:
    """Card i in part ``i % parts``, linked to every card of the other parts: a
    ``parts``-clique everywhere, never one card more."""
    return [sum(1 << b for b in range(cards) if b % parts != a % parts) for a in range(cards)]


def mycielski(cards: int) -> Masks:
    """The first ``cards`` cards of the Mycielskian of K2 iterated until that large: no
    three pairwise linked, yet greedy colouring needs ever more classes."""
    masks = [0b10, 0b01]
    while len(masks) < cards:
        n = len(masks)
        grown = masks + [0] * (n + 1)
        for v in range(n):
            # The shadow of v (n + v) is linked to v's neighbours, and to the apex (2n).
            for u in range(n):
                if masks[v] >> u & 1:
                    link(grown, n + v, u)
            link(grown, n + v, 2 * n)
        masks = grown
    keep = (1 << cards) - 1
    return [mask & keep for mask in masks[:cards]]


def cliques_crossed(cards: int, clique: int, p: float, rng: random.Random) -> Masks:
    """Islands of ``clique`` fully linked cards, then each pair across islands linked with
    probability ``p``: nearly NVLink islands, but no longer a union of cliques."""
    masks = [0] * cards
    for a in range(cards):
        for b in range(a + 1, cards):
            if a // clique == b // clique or rng.random() < p:
                link(masks, a, b)
    return masks


def linked_pairs(masks: Masks, cards: list[int]) -> bool:
    """Whether every two of ``cards`` are linked."""
    return all(masks[a] >> b & 1 for i, a in enumerate(cards) for b in cards[i + 1:])


def node_of_links(name: str, masks: Masks, numa: list[int] | None = None) -> Node:
    """A node whose card i (uuid ``GPU-<name>-i``) reports the links of ``masks[i]``."""
    devices = []
    for i, mask in enumerate(masks):
        links = {f"GPU-{name}-{j}": 4 for j in range(len(masks)) if mask >> j & 1}
        devices.append(Card(uuid=f"GPU-{name}-{i}", index=i, type="NVIDIA-H100",
                            memory=81920, numa=0 if numa is None else numa[i], links=links))
    return Node(name=name, cards=devices)


def spent_budgets(monkeypatch: pytest.MonkeyPatch) -> list[SearchBudget]:
    """Every budget ``place_pod`` opens from now on, one a node placed in full."""
    opened: list[SearchBudget] = []

    class Kept(linksets.SearchBudget):
        def __init__(self, steps: int = SEARCH_STEPS) -> None:
            super().__init__(steps)
            opened.append(self)

    monkeypatch.setattr(placement, "SearchBudget", Kept)
    return opened
