"""Placing one container on one node: per-card checks, ranking, and the N-card choice."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from common.core.fleet import (
    BoolArray,
    CachedChecks,
    FloatArray,
    IntArray,
    NodeTopology,
    Snapshot,
    occupied_slots,
    ratio,
    utilization_score,
    utilization_scores,
)
from common.core.linksets import (
    DECISION_SEARCH_STEPS,
    SEARCH_STEPS,
    SearchBudget,
    linked_set,
)
from common.core.mig import (
    HAMI_CORE_MODE,
    MIG_MODE,
    MigInstance,
    MigPlacement,
    instances_that_fit,
    memory_asked,
    select_instance,
)
from common.core.pod import ContainerRequest, PodRequest
from common.core.policy import SortKey
from common.core.quota import OwnCharge, QuotaLeft
from common.core.reasons import (
    CARD_REASON,
    CHECK_COUNT,
    INSUFFICIENT_CARDS,
    NODE_INSUFFICIENT_DEVICE,
    NUMA_NOT_FIT,
    TOPOLOGY_NOT_FIT,
    TOPOLOGY_SEARCH_LIMIT,
    TOPOLOGY_UNKNOWN,
    CardCheck,
)

CodeArray = npt.NDArray[np.int8]
# The check codes as plain integers: compared with or written into numpy arrays, an
# IntEnum member costs a lookup of numpy's protocols through the enum's metaclass.
_ELIGIBLE = int(CardCheck.ELIGIBLE)
_NOT_HEALTHY = int(CardCheck.NOT_HEALTHY)
_CORDONED = int(CardCheck.CORDONED)
_TYPE_MISMATCH = int(CardCheck.TYPE_MISMATCH)
_UUID_MISMATCH = int(CardCheck.UUID_MISMATCH)
_SLOTS_EXHAUSTED = int(CardCheck.SLOTS_EXHAUSTED)
_MUTEX_BUSY = int(CardCheck.MUTEX_BUSY)
_INSUFFICIENT_MEMORY = int(CardCheck.INSUFFICIENT_MEMORY)
_INSUFFICIENT_CORE = int(CardCheck.INSUFFICIENT_CORE)
_WHOLE_CARD_BUSY = int(CardCheck.WHOLE_CARD_BUSY)
_COMPUTE_EXHAUSTED = int(CardCheck.COMPUTE_EXHAUSTED)
_QUOTA_NOT_FIT = int(CardCheck.QUOTA_NOT_FIT)
_MIG_INFEASIBLE = int(CardCheck.MIG_INFEASIBLE)
_UNKNOWN_NUMA_LAST = 1 << 62
CACHED_REQUEST_SHAPES = 32
"""Request shapes (what the card checks depend on) whose checks a snapshot keeps."""
_REFRESH_SHARE = 8
"""Past 1/8 of the cards changed, checking them all again is cheaper than one by one."""
_FEW_CARDS = 16
"""Up to this many cards changed, kept checks are brought up to date card by card on plain
Python numbers (``PodView._card_code``), below the cost of the dozen and a half numpy
calls of ``_capacity_codes`` on a few cards; past it, by those calls."""


@dataclass(frozen=True, slots=True)
class Extra:
    """Usage the pod's own earlier containers put on a node's cards."""

    tenants: IntArray
    memory: IntArray
    cores: IntArray


def _past_quota(codes: CodeArray) -> BoolArray:
    """The cards whose first failing check, if any, comes after the quota's: those the
    quota's refusal becomes the reason of."""
    past: BoolArray = (codes == _ELIGIBLE) | (codes > _QUOTA_NOT_FIT)
    return past


class PodView:
    """What one decision needs about a pod, computed once against a snapshot."""

    def __init__(self, snapshot: Snapshot, pod: PodRequest, quota: QuotaLeft | None = None) -> None:
        """``quota``: what the pod may still be charged under its namespace's quotas (None:
        no quota applies to it)."""
        self.snapshot = snapshot
        self.pod = pod
        self.quota = quota
        self.quota_refused_first = False
        """Whether the quota refused any card in ``first_checks`` (then its codes and
        counts hold ``QUOTA_NOT_FIT``; never otherwise)."""
        self.type_ok: BoolArray | None = None
        self.uuid_ok: BoolArray | None = None
        if pod.use_types is not None or pod.nouse_types:
            per_type = np.array([_type_passes(t, pod) for t in snapshot.types], dtype=np.bool_)
            self.type_ok = per_type[snapshot.type_id] if len(per_type) else per_type
        if pod.modes is not None:
            # nvidia.com/vgpu-mode: HAMi counts a card of a mode not named as a type
            # mismatch.
            mode_ok = (snapshot.mig if MIG_MODE in pod.modes else np.zeros_like(snapshot.mig))
            if HAMI_CORE_MODE in pod.modes:
                mode_ok = mode_ok | ~snapshot.mig
            self.type_ok = mode_ok if self.type_ok is None else self.type_ok & mode_ok
        self.takes_mig = snapshot.has_mig and pod.takes_mode(MIG_MODE)
        """Whether MIG cards may serve the pod: then a container may take several
        instances of one card, and MIG cards are checked for a free placement."""
        if pod.use_uuids is not None or pod.nouse_uuids:
            ok = np.full(len(snapshot.devices), pod.use_uuids is None, dtype=np.bool_)
            for uuid in pod.use_uuids or ():
                ok[snapshot.uuid_positions.get(uuid, [])] = True
            for uuid in pod.nouse_uuids:
                ok[snapshot.uuid_positions.get(uuid, [])] = False
            self.uuid_ok = ok
        self._scores: FloatArray | None = None
        self._run_scores: dict[tuple[int, int], list[float]] = {}
        self.search_steps_left = DECISION_SEARCH_STEPS
        """What the decision's linked-set searches may still take, over all its nodes."""

    def scores(self) -> FloatArray:
        """Every card's utilization score under the pod's weights (existing usage only)."""
        if self._scores is None:
            self._scores = self.score_cards(slice(None))
        return self._scores

    def score_cards(self, where: slice) -> FloatArray:
        """The scores of a run of cards under the pod's weights, computed now."""
        lay = self.snapshot
        return utilization_score(ratio(lay.used[where], lay.count[where]),
                                 ratio(lay.usedcores[where], lay.cores[where]),
                                 ratio(lay.usedmem[where], lay.memory[where]),
                                 self.pod.weights)

    def card_scores(self, where: slice) -> list[float]:
        """The scores of a run of cards: from the fleet-wide pass when there was one,
        else computed for just these cards (cheaper for one node), once per run."""
        if self._scores is not None:
            return self._scores[where].tolist()  # type: ignore[no-any-return]
        key = (where.start, where.stop)
        scores = self._run_scores.get(key)
        if scores is None:
            lay = self.snapshot
            scores = self._run_scores[key] = utilization_scores(
                zip(lay.used[where].tolist(), lay.count[where].tolist(),
                    lay.usedcores[where].tolist(), lay.cores[where].tolist(),
                    lay.usedmem[where].tolist(), lay.memory[where].tolist(), strict=True),
                self.pod.weights)
        return scores

    def card_codes(
        self, request: ContainerRequest, where: slice | IntArray, extra: Extra | None = None,
        own: OwnCharge | None = None, held: HeldInstances | None = None,
    ) -> CodeArray:
        """Per card, the first failing check of ``CardCheck`` (0 when the card is eligible).

        ``extra``: what the pod's earlier app containers put on the cards; ``own``: what its
        earlier containers are charged on them; ``held``: the MIG instances its earlier
        containers took (all node-local, ``where`` a node's run)."""
        codes = self._capacity_codes(request, where, extra, held)
        if self.quota is not None:
            fails = self.quota.card_fails(request, self.snapshot.memory[where], own)
            codes[fails & _past_quota(codes)] = _QUOTA_NOT_FIT
        return codes

    def _capacity_codes(self, request: ContainerRequest, where: slice | IntArray,
                        extra: Extra | None, held: HeldInstances | None = None) -> CodeArray:
        lay = self.snapshot
        memory, cores = lay.memory[where], lay.cores[where]
        used, usedmem, usedcores = lay.used[where], lay.usedmem[where], lay.usedcores[where]
        if extra is not None:
            used = occupied_slots(lay.tenants[where] + extra.tenants, lay.processes[where])
            usedmem = usedmem + extra.memory
            usedcores = usedcores + extra.cores
        codes: CodeArray = np.zeros(len(memory), dtype=np.int8)
        # Assigned last check first, so the first failing check is what remains.
        if request.cores == 0:
            codes[usedcores >= cores] = _COMPUTE_EXHAUSTED
        if request.cores >= 100:
            # Only a card of exactly 100 cores is taken whole (HAMi's ``Fit``): one
            # registered with more under core scaling stays shared.
            codes[(used > 0) & (cores == 100)] = _WHOLE_CARD_BUSY
        codes[cores - usedcores < request.cores] = _INSUFFICIENT_CORE
        if request.memory_mib is not None:
            codes[memory - usedmem < request.memory_mib] = _INSUFFICIENT_MEMORY
        else:
            slices = memory * request.memory_percent // 100
            codes[memory - usedmem < slices] = _INSUFFICIENT_MEMORY
        if self.pod.chain.mutex:
            codes[used > 0] = _MUTEX_BUSY
        codes[used >= lay.count[where]] = _SLOTS_EXHAUSTED
        if self.uuid_ok is not None:
            codes[~self.uuid_ok[where]] = _UUID_MISMATCH
        if self.type_ok is not None:
            codes[~self.type_ok[where]] = _TYPE_MISMATCH
        codes[lay.cordoned[where]] = _CORDONED
        codes[~lay.healthy[where] | lay.inconsistent[where]] = _NOT_HEALTHY
        if self.takes_mig:
            self._mig_codes(request, where, codes, held)
        return codes

    def _mig_codes(self, request: ContainerRequest, where: slice | IntArray, codes: CodeArray,
                   held: HeldInstances | None) -> None:
        """HAMi's last card check, on the MIG cards every other check passed: a profile
        that covers the memory asked for, with a placement free of the card's instances."""
        lay = self.snapshot
        open_mig = np.flatnonzero(lay.mig[where] & (codes == _ELIGIBLE))
        if not len(open_mig):
            return
        cards = np.arange(len(lay.devices))[where][open_mig]
        for local, card in zip(open_mig.tolist(), cards.tolist(), strict=True):
            occupied = self.occupied(card, held.get(local, ()) if held else ())
            if select_instance(lay.mig_profiles[card], occupied,
                               self.mig_memory(card, request)) is None:
                codes[local] = _MIG_INFEASIBLE

    def occupied(self, card: int, mine: Iterable[MigPlacement] = ()) -> list[MigPlacement]:
        """The placements taken on a MIG card: the ledger's instances, and ``mine``."""
        return [*self.snapshot.instances.get(card, ()), *mine]

    def mig_instances(self, card: int, request: ContainerRequest,
                      mine: Iterable[MigPlacement], most: int) -> list[MigInstance]:
        """The instances one container may take of a MIG card, one after the other."""
        return instances_that_fit(self.snapshot.mig_profiles[card], self.occupied(card, mine),
                                  self.mig_memory(card, request), most)

    def mig_memory(self, card: int, request: ContainerRequest) -> int:
        lay = self.snapshot
        return memory_asked(request.memory_mib, request.memory_percent, int(lay.memory[card]),
                            lay.mig_profiles[card])

    def first_checks(self) -> tuple[CodeArray, IntArray]:
        """Every card's check code for the pod's first GPU container, and per node the
        count of each code (``(nodes, CHECK_COUNT)``). Read-only: the capacity checks are
        kept in the snapshot per request shape and brought up to date from the cards changed
        since; the pod's quota is applied over them."""
        lay, pod = self.snapshot, self.pod
        request = pod.gpu_containers[0]
        key = (request.cores, request.memory_mib, request.memory_percent, pod.chain.mutex,
               pod.use_types, pod.nouse_types, pod.use_uuids, pod.nouse_uuids, pod.modes)
        cache = lay.check_cache
        cached = cache.pop(key, None)  # popped and put back: the dict keeps LRU order
        behind = len(lay.changed) - cached.seen if cached is not None else 0
        if cached is None or behind > len(lay.devices) // _REFRESH_SHARE:
            codes = self._capacity_codes(request, slice(None), None)
            nodes = len(lay.node_names)
            by_node = np.bincount(lay.check_base + codes, minlength=nodes * CHECK_COUNT)
            cached = CachedChecks(codes, by_node.reshape(nodes, CHECK_COUNT), len(lay.changed))
        elif behind:
            # The cards changed, sorted and each once (``numpy.unique`` costs more on the
            # few a booking changes).
            changed = sorted(set(lay.changed[cached.seen:]))
            if len(changed) <= _FEW_CARDS and not self.takes_mig:
                self._recheck_few(request, cached, changed)
            else:
                cards = np.array(changed, dtype=np.int64)
                fresh = self._capacity_codes(request, cards, None)
                counts = cached.by_node.reshape(-1)
                np.subtract.at(counts, lay.check_base[cards] + cached.codes[cards], 1)
                np.add.at(counts, lay.check_base[cards] + fresh, 1)
                cached.codes[cards] = fresh
            cached.seen = len(lay.changed)
        if len(cache) >= CACHED_REQUEST_SHAPES:
            del cache[next(iter(cache))]
        cache[key] = cached
        if self.quota is None:
            return cached.codes, cached.by_node
        return self._with_quota(request, cached.codes, cached.by_node)

    def _recheck_few(self, request: ContainerRequest, cached: CachedChecks,
                     cards: list[int]) -> None:
        """Kept checks brought up to date for a few ``cards`` changed since, one by one: a
        booking changes one to eight cards, and most decisions follow one or two (openb:
        half of them one card, five in six up to eight)."""
        codes, counts, base = cached.codes, cached.by_node.reshape(-1), self.snapshot.check_base
        for card in cards:
            fresh = self._card_code(request, card)
            old = codes.item(card)
            if fresh != old:
                node = base.item(card)
                counts[node + old] -= 1
                counts[node + fresh] += 1
                codes[card] = fresh

    def _card_code(self, request: ContainerRequest, card: int) -> int:
        """``_capacity_codes`` of one card for a pod's first container (nothing of its
        own on the card yet), not for a pod that may take MIG cards: the same checks in
        the order they run, the first that fails answering, on the card's figures as
        Python integers (``tests/core/test_kept_checks.py`` compares the two)."""
        lay = self.snapshot
        if not lay.healthy.item(card) or lay.inconsistent.item(card):
            return _NOT_HEALTHY
        if lay.cordoned.item(card):
            return _CORDONED
        if self.type_ok is not None and not self.type_ok.item(card):
            return _TYPE_MISMATCH
        if self.uuid_ok is not None and not self.uuid_ok.item(card):
            return _UUID_MISMATCH
        used = lay.used.item(card)
        if used >= lay.count.item(card):
            return _SLOTS_EXHAUSTED
        if used > 0 and self.pod.chain.mutex:
            return _MUTEX_BUSY
        memory = lay.memory.item(card)
        wanted = (request.memory_mib if request.memory_mib is not None
                  else memory * request.memory_percent // 100)
        if memory - lay.usedmem.item(card) < wanted:
            return _INSUFFICIENT_MEMORY
        cores, usedcores = lay.cores.item(card), lay.usedcores.item(card)
        if cores - usedcores < request.cores:
            return _INSUFFICIENT_CORE
        if request.cores >= 100 and used > 0 and cores == 100:
            return _WHOLE_CARD_BUSY
        if request.cores == 0 and usedcores >= cores:
            return _COMPUTE_EXHAUSTED
        return _ELIGIBLE

    def _with_quota(self, request: ContainerRequest, codes: CodeArray,
                    by_node: IntArray) -> tuple[CodeArray, IntArray]:
        """The cached checks with the quota applied, copied where it refuses cards."""
        assert self.quota is not None
        if request.memory_mib is not None:
            # The same charge on every card: the quota refuses all of them or none. Judged
            # on plain integers, as ``card_fails`` judges each card (the pod's first
            # container: nothing charged before it); this is the usual pod's whole cost
            # of its quota.
            if not len(codes) or not self.quota.refuses_every_card(request):
                return codes, by_node
            later = _past_quota(codes)
            if not later.any():
                return codes, by_node  # every card fails an earlier check
            self.quota_refused_first = True
            refused = codes.copy()
            refused[later] = _QUOTA_NOT_FIT
            counts = by_node.copy()
            moved = [0, *range(_QUOTA_NOT_FIT + 1, CHECK_COUNT)]
            counts[:, _QUOTA_NOT_FIT] += counts[:, moved].sum(axis=1)
            counts[:, moved] = 0
            return refused, counts
        fails = self.quota.card_fails(request, self.snapshot.memory)
        if not fails.any():
            return codes, by_node
        fails &= _past_quota(codes)
        if not fails.any():
            return codes, by_node
        self.quota_refused_first = True
        refused = codes.copy()
        refused[fails] = _QUOTA_NOT_FIT
        lay = self.snapshot
        nodes = len(lay.node_names)
        counts = np.bincount(lay.check_base + refused, minlength=nodes * CHECK_COUNT)
        return refused, counts.reshape(nodes, CHECK_COUNT)

    def rank(self, node: int, eligible: list[int]) -> list[int]:
        """Eligible card positions (local to the node) in chain order."""
        if len(eligible) < 2:
            return list(eligible)  # nothing to order: no score needed
        where = self.snapshot.node_slice(node)
        scores = self.card_scores(where)
        numa = self.snapshot.numa[where].tolist()
        index = self.snapshot.index[where].tolist()
        keys = self.pod.chain.ranking

        def sort_key(card: int) -> tuple[float, ...]:
            parts: list[float] = []
            for key in keys:
                if key is SortKey.BINPACK:
                    parts.append(-scores[card])
                elif key is SortKey.SPREAD:
                    parts.append(scores[card])
                else:
                    parts.append(numa[card] if numa[card] >= 0 else _UNKNOWN_NUMA_LAST)
            parts.append(index[card])
            return tuple(parts)

        return sorted(eligible, key=sort_key)


def _type_passes(card_type: str, pod: PodRequest) -> bool:
    lowered = card_type.lower()
    if pod.use_types is not None and not any(t in lowered for t in pod.use_types):
        return False
    return not any(t in lowered for t in pod.nouse_types)


def card_reason_counts(code_counts: list[int]) -> Counter[str]:
    """Reason name -> cards it removed, from a count per check code."""
    counts: Counter[str] = Counter()
    for code in range(1, CHECK_COUNT):
        if code_counts[code]:
            counts[CARD_REASON[CardCheck(code)]] += code_counts[code]
    return counts


def node_level_failure(
    request: ContainerRequest, cards: int, topology: NodeTopology, topology_aware: bool,
    mig: bool = False,
) -> Counter[str] | None:
    """Reasons that fail the whole node before any card is looked at. ``mig``: the node
    has MIG cards the pod may take, several instances a card, so asking more cards than
    the node has fails no node here (HAMi's ``isMIGRequest``)."""
    if request.cards > cards and not mig:
        return Counter({NODE_INSUFFICIENT_DEVICE: cards})
    if topology_aware and request.cards > 1 and not topology.known:
        return Counter({TOPOLOGY_UNKNOWN: cards})
    return None


def choose_cards(
    ranked: list[int],
    size: int,
    numa: list[int],
    topology: NodeTopology | None,
    numa_bind: bool,
    *,
    budget: SearchBudget | None = None,
) -> list[int] | Counter[str]:
    """Pick ``size`` cards from the ranked eligible ones, or say why the set fails.

    ``topology`` is given when the pod is topology-aware and asks for several cards;
    ``budget``: the steps its linked-set searches may take (a fresh ``SearchBudget`` when
    None). A search that runs out fails the node with ``TOPOLOGY_SEARCH_LIMIT``: no set
    was found, none was proven absent.
    """
    steps = SearchBudget() if budget is None else budget

    def pick(candidates: list[int]) -> list[int] | None:
        if len(candidates) < size:
            return None
        if topology is None:
            return candidates[:size]
        return linked_set(candidates, size, topology, steps)

    if not (numa_bind and size > 1):
        chosen = pick(ranked)
        if chosen is not None:
            return chosen
        if len(ranked) < size:
            return Counter({INSUFFICIENT_CARDS: len(ranked)})
        if steps.exhausted:
            return Counter({TOPOLOGY_SEARCH_LIMIT: len(ranked)})
        return Counter({TOPOLOGY_NOT_FIT: len(ranked)})

    groups: dict[int, list[int]] = {}
    for card in ranked:
        if numa[card] >= 0:
            groups.setdefault(numa[card], []).append(card)
    tried: set[int] = set()
    for card in ranked:
        if numa[card] in groups and numa[card] not in tried:
            tried.add(numa[card])
            chosen = pick(groups[numa[card]])
            if chosen is not None:
                return chosen
            if steps.exhausted:
                # The later groups would each be refused unsearched.
                return Counter({TOPOLOGY_SEARCH_LIMIT: len(ranked)})
    if topology is not None and any(len(g) >= size for g in groups.values()):
        return Counter({TOPOLOGY_NOT_FIT: len(ranked)})
    best = next((groups[numa[c]] for c in ranked if numa[c] >= 0), [])
    return Counter({INSUFFICIENT_CARDS: len(best), NUMA_NOT_FIT: len(ranked) - len(best)})


Placement = list[list[int]]
"""The node-local card positions chosen for each GPU container, in order; a MIG card
is listed once for each instance a container takes of it."""
HeldInstances = dict[int, list[MigPlacement]]
"""Node-local MIG card -> the placements of the instances the pod's earlier containers
took there."""
Charge = tuple[int, int, MigInstance | None]
"""A card's charge for one container: MiB, cores, and its MIG instance (None: not MIG)."""


def _expand_mig(view: PodView, node: int, ranked: list[int], request: ContainerRequest,
                held: HeldInstances) -> list[int]:
    """The ranked cards with each MIG card repeated once for every instance the container
    could take of it, one after the other: HAMi visits a MIG card again after taking an
    instance of it, before the next card."""
    snapshot = view.snapshot
    start = int(snapshot.start[node])
    expanded: list[int] = []
    for card in ranked:
        if snapshot.mig[start + card]:
            fit = view.mig_instances(start + card, request, held.get(card, ()), request.cards)
            expanded.extend([card] * len(fit))
        else:
            expanded.append(card)
    return expanded


@dataclass(frozen=True, slots=True)
class NodeFailure:
    """Why one node cannot take the pod, and where that was found."""

    reasons: Counter[str]
    container: int
    """The failing container's position among the pod's GPU containers."""
    codes: CodeArray | None
    """Its card checks on the node; None when the node failed before any card was checked."""
    taken: Extra | None
    """What the pod's earlier containers put on the node's cards, as the checks counted it."""


def place_pod(view: PodView, node: int, first_codes: CodeArray) -> Placement | NodeFailure:
    """Place every GPU container on one node in order, or return why the node fails."""
    # One budget for all the pod's linked-set searches on the node: its cost is bounded
    # however many containers and NUMA groups are searched, and so is the decision's over
    # all its nodes.
    budget = SearchBudget(min(SEARCH_STEPS, view.search_steps_left))
    try:
        return _place_containers(view, node, first_codes, budget)
    finally:
        view.search_steps_left -= budget.spent


def _place_containers(view: PodView, node: int, first_codes: CodeArray,
                      budget: SearchBudget) -> Placement | NodeFailure:
    snapshot, pod = view.snapshot, view.pod
    where = snapshot.node_slice(node)
    start, cards = where.start, where.stop - where.start
    topology = snapshot.topology[node]
    numa = snapshot.numa[where].tolist()
    containers = pod.gpu_containers
    topology_aware = pod.chain.topology_aware
    # What earlier app containers put on the cards, and what earlier containers are
    # charged, read by later containers only: none kept for the usual pod of one GPU
    # container, nor worked out after the last container.
    last = len(containers) - 1
    taken = Extra(*(np.zeros(cards, dtype=np.int64) for _ in range(3))) if last else None
    own = OwnCharge.none(cards) if view.quota is not None and last else None
    mig_node = view.takes_mig and bool(snapshot.node_has_mig[node])
    held: HeldInstances = {}
    placement: Placement = []
    for position, request in enumerate(containers):
        failure = node_level_failure(request, cards, topology, topology_aware, mig_node)
        if failure is not None:
            return NodeFailure(failure, position, None, None)
        extra = None if position == 0 or request.is_init else taken
        codes = (first_codes if position == 0
                 else view.card_codes(request, where, extra, own, held if mig_node else None))
        eligible = (codes == _ELIGIBLE).nonzero()[0].tolist()
        ranked = view.rank(node, eligible)
        aware = topology_aware and request.cards > 1
        if mig_node and not aware:
            ranked = _expand_mig(view, node, ranked, request, held)
        chosen = choose_cards(ranked, request.cards, numa, topology if aware else None,
                              pod.numa_bind, budget=budget)
        if isinstance(chosen, Counter):
            by_code = np.bincount(codes, minlength=CHECK_COUNT).tolist()
            return NodeFailure(card_reason_counts(by_code) + chosen, position, codes, extra)
        placement.append(chosen)
        if position == last:
            break
        grants = _charges(view, start, chosen, request, held if mig_node else None)
        if own is not None:
            for card, (card_memory, _, _) in zip(chosen, grants, strict=True):
                own.add(request, card, card_memory)
        if not request.is_init and taken is not None:
            for card, (card_memory, card_cores, _) in zip(chosen, grants, strict=True):
                taken.tenants[card] += 1
                taken.memory[card] += card_memory
                taken.cores[card] += card_cores
    return placement


def _grant(view: PodView, card: int, request: ContainerRequest,
           mine: list[MigPlacement]) -> tuple[int, int, MigInstance]:
    """The instance a container takes of a MIG card, after the pod's earlier ones (added
    to ``mine``), as memory, cores and the instance: the profile's figures are what the
    card is charged (HAMi's ``AddResourceUsage``)."""
    found = view.mig_instances(card, request, mine, 1)
    assert found, "a MIG card chosen for a container has an instance for it"
    instance = found[0]
    mine.append(instance.placement)
    profile = next(p for p in view.snapshot.mig_profiles[card] if p.name == instance.profile)
    return profile.memory, profile.cores, instance


def _charges(view: PodView, start: int, chosen: list[int], request: ContainerRequest,
             held: HeldInstances | None) -> list[Charge]:
    """What each chosen card is charged for the container: its memory slice and cores, or
    on a MIG card (``held``: the node has MIG cards the pod may take) the instance taken
    after the pod's earlier ones, with its profile's figures."""
    snapshot = view.snapshot
    return [_grant(view, start + card, request, held.setdefault(card, []))
            if held is not None and snapshot.mig[start + card]
            else (request.memory_slice(int(snapshot.memory[start + card])), request.cores, None)
            for card in chosen]


def instance_grants(view: PodView, node: int, placement: Placement) -> list[list[Charge]]:
    """Per GPU container and chosen card: the memory and cores it is charged and its MIG
    instance (None on a card not in MIG mode), worked out in the order ``place_pod``
    took them."""
    snapshot = view.snapshot
    start = int(snapshot.start[node])
    held: HeldInstances | None = (
        {} if view.takes_mig and snapshot.node_has_mig[node] else None)
    return [_charges(view, start, chosen, request, held)
            for request, chosen in zip(view.pod.gpu_containers, placement, strict=True)]
