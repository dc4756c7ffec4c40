"""Preemption: which lower-priority pods to evict from a node so that a pending pod fits.

Every answer is checked by ``decide`` on a one-node fleet from which the victims' cards are
released, so mutex, numa-bind, topology-aware, several containers, init containers and the
namespace's ResourceQuotas count exactly as they do when the pod is scheduled; nothing here
repeats a fit rule.

Victim sets are compared by ``victim_cost``: fewest pods whose eviction violates a
PodDisruptionBudget, then fewest pods, then the lowest priorities (the highest first, then
the sum), then the least recently started (the latest start first, then the next), then the
pod keys.

The search, on one node:

1. The pod fits as things are: the answer has no victims. Evicting every eligible pod does
   not make it fit: there is no answer.
2. Per card, the minimal sets of eligible pods whose eviction lets the card take a share of
   the pod (its least demanding GPU container asking for that one card), cheapest first:
   the shortest run of the card's pods taken cheapest first that suffices (by bisection),
   less the pods that may stay; then, for a card of up to ``EXHAUSTIVE_TENANTS`` eligible
   pods, every set in cost order, skipping the subsets of a set that does not suffice and
   the supersets of one that does. Cards are taken cheapest tenants first, each with an even
   part of the probes left (at least ``CARD_PROBES_MIN``).
3. Unions of those sets, one per card over any set of cards, cheapest first (adding a
   card's set never makes a union cheaper, so the first union that fits is the cheapest of
   them); a union is checked by ``decide`` with the whole pod once enough cards take a share
   for the pod's largest container.
4. When no union fits, every eligible pod is evicted but those whose staying keeps the fit,
   the dearest kept first.

Bounds: at most ``DECIDE_BUDGET`` (256) calls of ``decide`` for one node and pod, of which
at most ``PROBE_BUDGET`` (128) probe single cards, and at most ``UNION_POPS`` (2048) unions
looked at. When no bound is reached (``CARD_CHOICES`` sets a card included) and no card has
more than ``EXHAUSTIVE_TENANTS`` eligible pods, the answer is the cheapest for a pod of one
GPU container (a card taking a share is then a card the pod may use); a pod whose
containers share a card may be given a dearer set. The bounds only ever cost optimality:
the set returned always fits.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

from common.core.decide import decide
from common.core.fleet import Fleet
from common.core.ledger import Allocation
from common.core.pod import PodRequest

DECIDE_BUDGET = 256
PROBE_BUDGET = 128
CARD_PROBES_MIN = 8
EXHAUSTIVE_TENANTS = 10
CARD_CHOICES = 8
"""The cheapest minimal sets kept per card for the unions."""
UNION_POPS = 2048
MINIMIZE_RESERVE = 64
"""Calls of ``decide`` kept back from the unions for the last step."""


@dataclass(frozen=True, slots=True)
class Tenant:
    """A pod holding cards on a node, as the daemon knows it."""

    priority: int
    """``spec.priority`` (0 when unset)."""
    started: float
    """When it started, seconds since the epoch."""
    disruption_allowed: bool = True
    """False: evicting it would violate a PodDisruptionBudget."""


@dataclass(frozen=True, slots=True)
class Preemption:
    """The pods to evict from ``node`` so that the pod fits there, and where it would go.

    ``victims`` is empty when the pod fits on the node already."""

    node: str
    victims: tuple[str, ...]
    """Pod keys ``namespace/name`` in eviction order: lowest priority first, then the
    least recently started, then the key."""
    pdb_violations: int
    """How many victims may not be disrupted."""
    allocation: Allocation


Cost = tuple[int, int, int, int, tuple[float, ...], tuple[str, ...]]


def victim_cost(victims: Iterable[str], tenants: Mapping[str, Tenant]) -> Cost:
    """How dear a set of victims is; the smaller the better (see the module's text)."""
    keys = tuple(sorted(victims))
    chosen = [tenants[key] for key in keys]
    priorities = [t.priority for t in chosen]
    return (sum(not t.disruption_allowed for t in chosen), len(keys),
            max(priorities, default=0), sum(priorities),
            tuple(sorted((t.started for t in chosen), reverse=True)), keys)


def best_preemption(choices: Iterable[Preemption],
                    tenants: Mapping[str, Tenant]) -> Preemption | None:
    """The cheapest preemption among nodes by ``victim_cost``; ties to the node name."""
    return min(choices, key=lambda p: (victim_cost(p.victims, tenants), p.node), default=None)


def preemption_on_node(fleet: Fleet, node: str, request: PodRequest, priority: int,
                       tenants: Mapping[str, Tenant]) -> Preemption | None:
    """The cheapest set of pods of priority below ``priority`` on ``node`` whose eviction
    lets ``request`` fit there, or None when no such set exists (or the pod asks for no GPU,
    or the node is unknown). Pods absent from ``tenants`` are never victims."""
    inventory = fleet.node(node)
    if inventory is None or not request.wants_gpu:
        return None
    # The node's pods alone, but the quota charges of every pod of the preemptor's
    # namespace: evicting one of them makes room under its quotas; a pod of another
    # namespace does not, so a pod refused only for its quota preempts nobody outside its
    # namespace. Only that namespace is kept: each probe below copies the book.
    local = Fleet(fleet.quotas.of_namespace(request.subject.namespace))
    local.upsert_node(inventory)
    for key, allocation in fleet.allocations().items():
        if allocation.node == node and key != request.key:
            local.allocate(key, allocation)
    search = _Search(local, request, priority, tenants)
    return search.run()


def _cheapest_first(pods: Iterable[str], tenants: Mapping[str, Tenant]) -> list[str]:
    """Pods in the order they are best evicted: undisruptable last, lowest priority,
    least recently started, key."""
    return sorted(pods, key=lambda key: (not tenants[key].disruption_allowed,
                                         tenants[key].priority, tenants[key].started, key))


class _Search:
    """One node's search, counting its calls of ``decide``."""

    def __init__(self, local: Fleet, request: PodRequest, priority: int,
                 tenants: Mapping[str, Tenant]) -> None:
        self.local = local
        self.request = request
        self.tenants = tenants
        self.node = next(local.nodes())
        self.holders: dict[str, list[str]] = {d.uuid: [] for d in self.node.cards}
        for key, allocation in sorted(local.allocations().items()):
            known = tenants.get(key)
            if known is None or known.priority >= priority:
                continue
            for uuid in allocation.footprint():
                if uuid in self.holders:
                    self.holders[uuid].append(key)
        self.eligible = sorted({key for pods in self.holders.values() for key in pods})
        self.calls = 0
        self.probes = 0
        self.ready_cards = 0
        """Cards that take a share of the pod with no eviction."""

    def fit(self, victims: Iterable[str], pod: PodRequest | None = None) -> Allocation | None:
        self.calls += 1
        decision = decide(self.local.without_all(victims), pod or self.request)
        return decision.allocation

    def answer(self, victims: Iterable[str], allocation: Allocation) -> Preemption:
        tenants = self.tenants
        order = tuple(sorted(victims, key=lambda key: (tenants[key].priority,
                                                       tenants[key].started, key)))
        return Preemption(self.node.name, order,
                          sum(not tenants[key].disruption_allowed for key in order), allocation)

    def run(self) -> Preemption | None:
        now = self.fit(())
        if now is not None:
            return self.answer((), now)
        widest = self.fit(self.eligible) if self.eligible else None
        if widest is None:
            return None
        choices = self.card_choices()
        found = self.cheapest_union(choices)
        if found is None:
            found = self.minimized(widest)
        return self.answer(*found)

    # Per card ----------------------------------------------------------------

    def card_choices(self) -> list[list[frozenset[str]]]:
        """Per card that needs evictions to take a share, its cheapest minimal sets.

        A card that takes a share already needs none and adds nothing to the unions. Cards
        are taken cheapest tenants first, each with an even part of the probes left."""
        choices: list[list[frozenset[str]]] = []
        cards = sorted(self.holders.items(), key=lambda item: victim_cost(item[1], self.tenants))
        for position, (uuid, pods) in enumerate(cards):
            budget = self.probes + max(CARD_PROBES_MIN,
                                       (PROBE_BUDGET - self.probes) // (len(cards) - position))
            if budget > PROBE_BUDGET:
                break
            card = _Card(self, uuid, pods, budget)
            if card.pod is None:
                continue
            if card.takes(frozenset()):
                self.ready_cards += 1
                continue
            if pods and card.takes(frozenset(pods)):
                choices.append(card.minimal_sets())
        return choices

    # Across cards ------------------------------------------------------------

    def cheapest_union(self, choices: Sequence[list[frozenset[str]]]
                       ) -> tuple[frozenset[str], Allocation] | None:
        """The cheapest union of one set per card, over any cards, that fits the pod.

        Only unions that let as many cards take a share as one container asks for are
        checked; the others still grow into larger unions."""
        limit = DECIDE_BUDGET - MINIMIZE_RESERVE
        needed = max(c.cards for c in self.request.gpu_containers) - self.ready_cards
        tried: set[frozenset[str]] = set()
        heap: list[tuple[Cost, int, frozenset[str]]] = []
        for card, sets in enumerate(choices):
            for victims in sets:
                heapq.heappush(heap, (victim_cost(victims, self.tenants), card, victims))
        pops = 0
        while heap and pops < UNION_POPS and self.calls < limit:
            _, last, victims = heapq.heappop(heap)
            pops += 1
            able = sum(any(s <= victims for s in sets) for sets in choices)
            if able >= needed and victims not in tried:
                tried.add(victims)
                allocation = self.fit(victims)
                if allocation is not None:
                    return victims, allocation
            for card in range(last + 1, len(choices)):
                for more in choices[card]:
                    union = victims | more
                    heapq.heappush(heap, (victim_cost(union, self.tenants), card, union))
        return None

    def minimized(self, allocation: Allocation) -> tuple[frozenset[str], Allocation]:
        """Every eligible pod evicted (``allocation`` is where the pod then goes), less
        those whose staying keeps the fit."""
        victims = set(self.eligible)
        for key in reversed(_cheapest_first(self.eligible, self.tenants)):
            if self.calls >= DECIDE_BUDGET:
                break
            kept = self.fit(victims - {key})
            if kept is not None:
                victims.discard(key)
                allocation = kept
        return frozenset(victims), allocation


class _Card:
    """The sets of pods on one card whose eviction lets it take a share of the pod."""

    def __init__(self, search: _Search, uuid: str, pods: list[str], budget: int) -> None:
        self.search = search
        self.pods = pods
        self.budget = budget
        self.pod = self.share(search.request, uuid)
        self.short: list[frozenset[str]] = []
        """Sets that do not suffice, and so neither does any of their subsets."""
        self.enough: set[frozenset[str]] = set()

    @staticmethod
    def share(pod: PodRequest, uuid: str) -> PodRequest | None:
        """The pod's least demanding GPU container asking for one card, ``uuid`` only."""
        if pod.use_uuids is not None and uuid not in pod.use_uuids:
            return None
        smallest = min(pod.gpu_containers,
                       key=lambda c: (c.memory_mib or 0, c.memory_percent, c.cores))
        return replace(pod, containers=(replace(smallest, cards=1, is_init=False),),
                       use_uuids=frozenset({uuid}))

    @property
    def spent(self) -> bool:
        return self.search.probes >= self.budget

    def takes(self, victims: frozenset[str]) -> bool:
        """Whether the card takes the share once ``victims`` are gone."""
        assert self.pod is not None
        self.search.probes += 1
        if self.search.fit(victims, self.pod) is None:
            self.short.append(victims)
            return False
        self.enough.add(victims)
        return True

    def minimal_sets(self) -> list[frozenset[str]]:
        """Minimal sufficient sets, cheapest first: the trimmed shortest run, and the sets
        cheaper or dearer than it found by ``exhaustive`` for a card of few pods."""
        first = self.shortest_run()
        everyone = frozenset(self.pods)
        if first == everyone or len(self.pods) > EXHAUSTIVE_TENANTS:
            return [first]
        found = self.exhaustive()
        if not any(m < first for m in found) and first not in found:
            found.append(first)
        return sorted(found, key=lambda s: victim_cost(s, self.search.tenants))[:CARD_CHOICES]

    def shortest_run(self) -> frozenset[str]:
        """The shortest run of the card's pods, cheapest first, that suffices (by bisection),
        less the pods of the run, dearest first, whose staying keeps it so."""
        ordered = _cheapest_first(self.pods, self.search.tenants)
        low, high = 0, len(ordered)  # the first ``high`` suffice, the first ``low`` do not
        while high - low > 1 and not self.spent:
            middle = (low + high) // 2
            if self.takes(frozenset(ordered[:middle])):
                high = middle
            else:
                low = middle
        run = frozenset(ordered[:high])
        # The last pod of the run stays in it: the run without it is the first ``low``.
        for key in reversed(ordered[:high - 1] if low == high - 1 else ordered[:high]):
            if self.spent:
                break
            if self.takes(run - {key}):
                run -= {key}
        return run

    def exhaustive(self) -> list[frozenset[str]]:
        """The minimal sufficient sets, cheapest first, as far as the card's probes go.

        Taken cheapest first, a set that suffices has had all its subsets looked at before
        it: it is minimal unless it holds a set found before."""
        allowed = frozenset(p for p in self.pods if self.search.tenants[p].disruption_allowed)
        minimal: list[frozenset[str]] = []
        for subset in self.cheapest_subsets():
            if any(m <= subset for m in minimal) or any(subset <= s for s in self.short):
                continue
            if len(minimal) >= CARD_CHOICES or self.spent:
                break
            # The largest set with the same undisruptable pods, once: when it does not
            # suffice, none of the sets it holds is probed.
            widest = allowed | subset
            if widest != subset and widest not in self.enough and not self.takes(widest):
                continue
            if subset in self.enough or (not self.spent and self.takes(subset)):
                minimal.append(subset)
        return minimal

    def cheapest_subsets(self) -> Iterator[frozenset[str]]:
        """The card's proper, non-empty sets of pods, cheapest first, made as needed: by
        undisruptable pods, then size, then the rest of ``victim_cost``."""
        tenants = self.search.tenants
        allowed = [p for p in self.pods if tenants[p].disruption_allowed]
        guarded = [p for p in self.pods if not tenants[p].disruption_allowed]
        for violations in range(len(guarded) + 1):
            for size in range(max(violations, 1), len(self.pods)):
                if size - violations > len(allowed):
                    continue
                tier = [frozenset(a + g) for g in combinations(guarded, violations)
                        for a in combinations(allowed, size - violations)]
                yield from sorted(tier, key=lambda s: victim_cost(s, tenants))
