"""The linked-set search of ``topology-aware``: which ``size`` of a node's eligible cards,
all pairwise linked by NVLink, come first in the pod's chain order.

The answer is the set whose positions in the ranked list, sorted, are lexicographically
smallest. Finding whether any such set exists is the clique problem, exponential in the
worst case; an agent may report any link graph of up to 256 cards, so the search must not
trust the graph to be kind. It answers in three ways, cheapest first:

- a graph that is a disjoint union of cliques (NVSwitch, NVLink islands: what real nodes
  report) is answered from its components, without search;
- otherwise a depth-first search in rank order, which only prunes branches that hold no
  set: a branch's candidates are the cards linked to every card chosen, a card with fewer
  than ``size - 1`` linked candidates is never in a set (the k-core), and a branch whose
  candidates colour greedily into fewer classes than cards still needed holds no set (a
  clique takes one card of each colour), which settles e.g. a complete 7-partite graph
  asked for 8 cards at the root;
- every card the search looks at is a step taken from a ``SearchBudget``; when it runs
  out the node fails with ``TopologyNotFit (search limit reached)`` rather than keeping
  the event loop busy.

Pure: bit operations on Python integers (a card is a bit), no clock.
"""

from __future__ import annotations

import numpy as np

from common.core.fleet import NodeTopology

DECISION_SEARCH_STEPS = 100_000
"""Steps all the nodes of one decision may take in all (two nodes' worth of
``SEARCH_STEPS``): several agents reporting adversarial links cost a decision at most about
50 ms together, not 25 ms each. Nodes whose links are unions of cliques take none of it;
a node judged once the decision's steps are spent fails with the search-limit reason."""

SEARCH_STEPS = 50_000
"""Steps one pod's searches on one node may take in all. A step is a card looked at (one
coloured, one peeled off the k-core) or a branch entered: a handful of operations on
integers of at most 256 bits, 0.3 to 0.5 us in CPython on a 2-vCPU Xeon, so a node costs at
most about 25 ms however its links are drawn (``harness/benchmarks/topology_worst.py``). Far above
what real topologies need (unions of cliques need none; random and hill-climbed graphs of
up to 32 cards answered within 5,000), and low enough that the event loop keeps answering
/healthz while a node of adversarial links is judged. G(256, 0.3) asked for 8 cards is
about where it falls short (68,000 steps to prove there is no set)."""


class SearchBudget:
    """What one pod's linked-set searches on one node may still spend, shared by its NUMA
    groups and containers so that the node's cost is bounded as a whole."""

    __slots__ = ("exhausted", "left", "spent")

    def __init__(self, steps: int = SEARCH_STEPS) -> None:
        self.left = steps
        self.spent = 0
        self.exhausted = False
        """Whether a search stopped for want of steps: its "no set" is then unproven."""

    def take(self, steps: int) -> bool:
        """Spend ``steps``, or mark the budget exhausted (spending nothing) when fewer are
        left: ``spent`` never passes the budget."""
        if steps > self.left:
            self.exhausted = True
            return False
        self.left -= steps
        self.spent += steps
        return True


def linked_set(ranked: list[int], size: int, topology: NodeTopology,
               budget: SearchBudget) -> list[int] | None:
    """The pairwise-linked ``size``-set of ``ranked`` (distinct card positions, best first)
    whose sorted ranks are lexicographically smallest, in rank order; None when there is
    none or when ``budget`` ran out first (``budget.exhausted`` tells which)."""
    if size < 1 or len(ranked) < size or budget.exhausted:
        return None if size >= 1 else []
    if topology.cliques is not None:
        return _in_one_component(ranked, size, topology.cliques)
    return _search(ranked, size, topology.adjacency, budget)


def _in_one_component(ranked: list[int], size: int,
                      component: tuple[int, ...]) -> list[int] | None:
    """Within one fully linked component any ``size`` cards form a set, and the best of a
    component is its first ``size`` in rank order. Components hold distinct positions, so
    the lexicographically smallest of those is the component's whose first card ranks
    first: the first, in order of appearance, that holds ``size`` cards."""
    members: dict[int, list[int]] = {}
    for card in ranked:
        members.setdefault(component[card], []).append(card)
    for cards in members.values():
        if len(cards) >= size:
            return cards[:size]
    return None


def _search(ranked: list[int], size: int, adjacency: tuple[int, ...],
            budget: SearchBudget) -> list[int] | None:
    if size == 1:
        return ranked[:1]
    linked = _rank_space(ranked, adjacency)
    alive = _k_core(linked, size, budget)
    if not alive:
        return None
    found = _grow(alive, size, linked, budget)
    if not found:
        return None
    chosen: list[int] = []
    while found:
        low = found & -found
        chosen.append(ranked[low.bit_length() - 1])
        found ^= low
    return chosen


def _rank_space(ranked: list[int], adjacency: tuple[int, ...]) -> list[int]:
    """Each ranked card's linked peers among the ranked cards, as bits of their ranks: bit
    ``i`` is ``ranked[i]``, so the lowest bit of a set is its best-ranked card and a
    branch's later cards are the bits above its own. Through a bit matrix in numpy, as the
    remapping of a dense 256-card graph bit by bit in Python costs 10 ms, this 0.15 ms."""
    width = (len(adjacency) + 7) // 8
    rows = b"".join([adjacency[card].to_bytes(width, "little") for card in ranked])
    matrix = np.unpackbits(np.frombuffer(rows, dtype=np.uint8).reshape(len(ranked), width),
                           axis=1, bitorder="little")
    packed = np.packbits(np.ascontiguousarray(matrix[:, ranked]), axis=1, bitorder="little")
    row = packed.shape[1]
    data = packed.tobytes()
    return [int.from_bytes(data[i * row:(i + 1) * row], "little") for i in range(len(ranked))]


def _k_core(linked: list[int], size: int, budget: SearchBudget) -> int:
    """The cards with at least ``size - 1`` linked peers among such cards (peeled one by
    one, each removal lowering its peers' counts), or 0 when fewer than ``size`` are left or
    the budget ran out. Peeling never removes a card of a set: each has ``size - 1`` peers
    in the set."""
    least = size - 1
    alive = (1 << len(linked)) - 1
    degree = [peers.bit_count() for peers in linked]
    doomed = [card for card, count in enumerate(degree) if count < least]
    left = len(linked)
    while doomed:
        card = doomed.pop()
        bit = 1 << card
        if not alive & bit:
            continue
        alive ^= bit
        left -= 1
        if left < size:
            return 0
        peers = linked[card] & alive
        if not budget.take(1 + peers.bit_count()):
            return 0
        while peers:
            low = peers & -peers
            peer = low.bit_length() - 1
            degree[peer] -= 1
            if degree[peer] == least - 1:
                doomed.append(peer)
            peers ^= low
    return alive


def _colour_tops(candidates: int, linked: list[int]) -> list[int]:
    """Greedy colouring of the candidates, highest rank first: each class takes, from the
    top, every card linked to none it holds. Returns each class's highest rank; they
    decrease. The cards ranked at or above ``r`` use exactly the classes whose top is at
    least ``r`` (the classes are first-fit in that order), so the count of such tops bounds
    any set drawn from them."""
    tops: list[int] = []
    left = candidates
    while left:
        top = left.bit_length() - 1
        tops.append(top)
        free = left
        while free:
            card = free.bit_length() - 1
            bit = 1 << card
            left ^= bit
            free &= ~(linked[card] | bit)
    return tops


def _grow(candidates: int, need: int, linked: list[int], budget: SearchBudget) -> int:
    """The lexicographically first ``need``-set of pairwise linked ``candidates`` (all
    linked to the cards chosen so far), as bits; 0 when there is none or the budget ran
    out. Branches are entered best rank first, so the first set found is the answer."""
    count = candidates.bit_count()
    # A branch with too few candidates costs a step; one that goes on, a step per candidate
    # (the colouring, then at most one turn of the loop below each).
    if not budget.take(1 if count < need else 1 + count) or count < need:
        return 0
    if need == 1:
        return candidates & -candidates
    tops = _colour_tops(candidates, linked)
    if len(tops) == count:
        # One card a class: each was linked to one of every class before its own, so the
        # candidates are pairwise linked and the best ``need`` of them are the answer.
        return _lowest(candidates, need)
    rest = candidates
    while rest:
        low = rest & -rest
        card = low.bit_length() - 1
        # Classes whose every card ranks before this one are out of the branch's reach.
        while tops and tops[-1] < card:
            tops.pop()
        if len(tops) < need:
            return 0
        rest ^= low
        found = _grow(rest & linked[card], need - 1, linked, budget)
        if found:
            return found | low
        if budget.exhausted:
            return 0
    return 0


def _lowest(cards: int, count: int) -> int:
    """The ``count`` lowest bits of ``cards``."""
    taken = 0
    for _ in range(count):
        low = cards & -cards
        taken |= low
        cards ^= low
    return taken
