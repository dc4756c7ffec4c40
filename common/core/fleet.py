"""The live device state of every node, in a vectorised snapshot.

Cards of all nodes sit in flat numpy arrays, grouped by node (nodes sorted by
name, cards by device index), so one decision checks every card with a few
array operations. Usage from the ledger is applied to the arrays as it
changes; when a node's card set or static fields change (or it comes or goes), that node
alone is built again and spliced among the others' arrays at the next decision.
"""

from __future__ import annotations

import copy
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import NamedTuple, overload

import numpy as np
import numpy.typing as npt

from common.core.annotations import cordoned_uuids
from common.core.ledger import Allocation, Usage
from common.core.mig import MIG_MODE, MigPlacement, MigProfile
from common.core.model import Card, Node
from common.core.policy import Weights
from common.core.quota import QuotaBook
from common.core.reasons import CHECK_COUNT

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


def round_scores(values: FloatArray) -> FloatArray:
    """Scores are compared after rounding to 6 decimal places, everywhere."""
    return np.round(values, 6)


def ratio(used: IntArray | FloatArray, capacity: IntArray) -> FloatArray:
    """used/capacity, with 0 where the capacity is zero."""
    out = np.zeros(len(capacity), dtype=np.float64)
    np.divide(used, capacity, out=out, where=capacity > 0)
    return out


SCORE_SCALE = 10
"""What one fully used resource adds to a score, at weight 1."""
NODE_WEIGHTS = Weights()
"""A node's score weighs its slots, cores and memory alike."""


def utilization_score(slots: FloatArray, cores: FloatArray, memory: FloatArray,
                      weights: Weights) -> FloatArray:
    """The score of cards or nodes from their used ratios of slots, cores and memory:
    ``10 * (slot * slots + core * cores + memory * memory)`` under the weights, rounded."""
    return round_scores(SCORE_SCALE * (_weighted(weights.slot, slots)
                                       + _weighted(weights.core, cores)
                                       + _weighted(weights.memory, memory)))


def utilization_scores(rows: Iterable[tuple[int, int, int, int, int, int]],
                       weights: Weights) -> list[float]:
    """``utilization_score`` of a few cards or nodes from their used and total slots, cores
    and memory (a row each: used slots, slots, used cores, cores, used memory, memory), on
    plain Python integers: the same floats to the last bit (each ratio one
    correctly rounded division of integers below 2**53, the same sums in the same order,
    and ``numpy.round``'s multiply, round half to even and divide), without the cost of
    a dozen numpy calls on arrays of one to eight elements."""
    slot_w, core_w, memory_w = weights.slot, weights.core, weights.memory
    scores = []
    for u, n, uc, c, um, m in rows:
        slots = u / n if n > 0 else 0.0
        core = uc / c if c > 0 else 0.0
        mem = um / m if m > 0 else 0.0
        if slot_w != 1:
            slots = slot_w * slots
        if core_w != 1:
            core = core_w * core
        if memory_w != 1:
            mem = memory_w * mem
        scores.append(round(SCORE_SCALE * (slots + core + mem) * _ROUNDING) / _ROUNDING)
    return scores


_ROUNDING = 10.0 ** 6
"""``round_scores``' 6 decimal places, as ``numpy.round`` applies them."""


def _weighted(weight: int, ratios: FloatArray) -> FloatArray:
    # A weight of 1 (the default) changes nothing: skip an array product per resource.
    return ratios if weight == 1 else weight * ratios


def score_max(weights: Weights) -> float:
    """The score of a card or node with every resource fully used."""
    return float(SCORE_SCALE * (weights.slot + weights.core + weights.memory))


@overload
def occupied_slots(tenants: int, processes: int) -> int: ...
@overload
def occupied_slots(tenants: IntArray, processes: IntArray) -> IntArray: ...
def occupied_slots(tenants: int | IntArray, processes: int | IntArray) -> int | IntArray:
    """A card's time-slicing slots in use: the tenants the ledger books, or the tenants
    its agent sees (``Card.processes``) when they are more (pods and processes started
    outside pyhami take slots too)."""
    if isinstance(tenants, int) and isinstance(processes, int):
        return max(tenants, processes)
    return np.maximum(tenants, processes)


def _static_signature(device: Card) -> tuple[object, ...]:
    links = None if device.links is None else tuple(sorted(device.links.items()))
    return (device.uuid, device.index, device.type, device.memory, device.cores,
            device.count, device.numa, links, device.mode, device.mig_profiles)


def _same_static(old: list[Card], new: list[Card]) -> bool:
    """Whether two listings hold the same cards with the same static fields, in any order
    (an agent lists them in the same order every time: compared in order first)."""
    # The fields of _static_signature, compared one by one: building the tuples costs
    # 2 us a message more, on the ingestion path.
    if len(old) == len(new) and all(
        a.uuid == b.uuid and a.index == b.index and a.type == b.type and a.memory == b.memory
        and a.cores == b.cores and a.count == b.count and a.numa == b.numa and a.links == b.links
        and a.mode == b.mode and a.mig_profiles == b.mig_profiles
        for a, b in zip(old, new, strict=True)
    ):
        return True
    return sorted(map(_static_signature, old)) == sorted(map(_static_signature, new))


@dataclass(slots=True)
class NodeTopology:
    """NVLink adjacency of one node's cards as bitmasks over their positions."""

    known: bool
    adjacency: tuple[int, ...]
    # Per card, its component when every linked component is fully connected
    # (NVSwitch, NVLink islands); None for other shapes.
    cliques: tuple[int, ...] | None


def _cliques(masks: list[int]) -> tuple[int, ...] | None:
    """Component of each card, if the link graph is a disjoint union of cliques."""
    component: list[int] = [-1] * len(masks)
    for card, mask in enumerate(masks):
        if component[card] >= 0:
            continue
        members = mask | (1 << card)
        for peer in range(len(masks)):
            if members >> peer & 1:
                if masks[peer] | (1 << peer) != members:
                    return None
                component[peer] = card
    return tuple(component)


def _topology(devices: list[Card]) -> NodeTopology:
    if all(d.links is None for d in devices):
        return NodeTopology(False, tuple(0 for _ in devices), None)
    position = {d.uuid: i for i, d in enumerate(devices)}
    masks = [0] * len(devices)
    for i, device in enumerate(devices):
        for peer, lanes in (device.links or {}).items():
            j = position.get(peer)
            if j is not None and j != i and lanes > 0:
                masks[i] |= 1 << j
                masks[j] |= 1 << i
    return NodeTopology(True, tuple(masks), _cliques(masks))


class CardGroups:
    """A global id per card for the set it may be chosen with (-1: none), and each id's node."""

    def __init__(self, keys: list[tuple[int, ...] | None], node_of: list[int]) -> None:
        ids: dict[tuple[int, ...], int] = {}
        group_node: list[int] = []
        card_group: list[int] = []
        for key, node in zip(keys, node_of, strict=True):
            if key is None:
                card_group.append(-1)
                continue
            if key not in ids:
                ids[key] = len(group_node)
                group_node.append(node)
            card_group.append(ids[key])
        self.card_group: IntArray = np.array(card_group, dtype=np.int64)
        self.group_node: IntArray = np.array(group_node, dtype=np.int64)

    @classmethod
    def spliced(cls, runs: list[tuple[CardGroups, int, int, int, int]]) -> CardGroups:
        """The groups of runs of other snapshots' nodes put one after the other: per run, its
        groups, its nodes ``lo:hi`` there, and the cards ``start:stop`` of those nodes.
        The ids ``__init__`` would give: it numbers the groups node by node (a key holds its
        node), so a run of nodes holds a run of ids, renumbered by one offset."""
        card_group: list[IntArray] = []
        group_node: list[IntArray] = []
        first_id = first_node = 0
        for groups, lo, hi, start, stop in runs:
            low, high = (int(i) for i in np.searchsorted(groups.group_node, (lo, hi)))
            cards = groups.card_group[start:stop]
            card_group.append(np.where(cards >= 0, cards + (first_id - low), -1))
            group_node.append(groups.group_node[low:high] + (first_node - lo))
            first_id += high - low
            first_node += hi - lo
        joined = cls.__new__(cls)
        joined.card_group = np.concatenate(card_group)
        joined.group_node = np.concatenate(group_node)
        return joined


_SPLICE_MAX_SHARE = 4
"""Past 1 node in 4 changed, the snapshot is built whole: each changed node is built on its
own anyway (as dear as in a whole build) and cuts the old snapshot into two more runs to
splice, so past that share splicing saves too little to be worth its path."""

CHANGE_LOG_MAX = 1 << 16
"""Changed cards a snapshot remembers; past that, cached checks are computed afresh."""


@dataclass(slots=True)
class CachedChecks:
    """One request shape's check code per card and their counts per node, as of ``seen``
    entries of the snapshot's change log."""

    codes: npt.NDArray[np.int8]
    by_node: IntArray
    seen: int


_DYNAMIC_ARRAYS = ("tenants", "usedmem", "usedcores", "used", "node_used", "node_usedmem",
                   "node_usedcores", "healthy", "cordoned", "processes", "inconsistent")
"""The arrays of a ``Snapshot`` that change after it is built (usage, health, cordons)."""


class _Span(NamedTuple):
    """A run of one snapshot's nodes ``lo:hi``, whose cards are ``start:stop`` there."""

    snapshot: Snapshot
    lo: int
    hi: int
    start: int
    stop: int


class Snapshot:
    """Flat per-card arrays for a fixed set of nodes and cards.

    Usage changes are applied in place and logged (``changed``), so what is derived from
    the cards (check codes, node scores) is brought up to date for the changed cards only.

    ``devices`` is read for the cards' static fields only (uuid, index, type): a node not
    built again since keeps the cards of the report that built it, whose health and
    processes may be older than the arrays', which are the ones kept up to date.
    """

    def __init__(self, nodes: Iterable[Node]) -> None:
        ordered = sorted(nodes, key=lambda n: n.name)
        node_of, cordoned = self._lay_out_nodes(ordered)
        self._read_cards(node_of, cordoned)
        self._index_cards(node_of)
        self._start_usage()
        self._start_derived()
        self._group_cards(node_of)

    def _lay_out_nodes(self, ordered: list[Node]) -> tuple[list[int], list[bool]]:
        """The nodes in name order and their cards in index order, one run per node; per
        card, its node's position and whether it is cordoned."""
        self.node_names: list[str] = [n.name for n in ordered]
        self.node_position: dict[str, int] = {n: i for i, n in enumerate(self.node_names)}
        self.name_set: frozenset[str] = frozenset(self.node_names)
        self.devices: list[Card] = []
        starts: list[int] = []
        self.topology: list[NodeTopology] = []
        node_of: list[int] = []
        cordoned: list[bool] = []
        for position, node in enumerate(ordered):
            devices = sorted(node.cards, key=lambda d: d.index)
            starts.append(len(self.devices))
            cordon = cordoned_uuids(node.annotations)
            self.devices.extend(devices)
            node_of.extend(position for _ in devices)
            cordoned.extend(d.uuid in cordon for d in devices)
            self.topology.append(_topology(devices))
        self.start: IntArray = np.array([*starts, len(self.devices)], dtype=np.int64)
        self.node_cards: IntArray = np.diff(self.start)
        return node_of, cordoned

    def _read_cards(self, node_of: list[int], cordoned: list[bool]) -> None:
        """The cards' figures as flat arrays, and the MIG profiles of the MIG cards."""
        self.node_of: IntArray = np.array(node_of, dtype=np.int64)
        devs = self.devices
        self.index: IntArray = np.array([d.index for d in devs], dtype=np.int64)
        self.memory: IntArray = np.array([d.memory for d in devs], dtype=np.int64)
        self.cores: IntArray = np.array([d.cores for d in devs], dtype=np.int64)
        self.count: IntArray = np.array([d.count for d in devs], dtype=np.int64)
        self.numa: IntArray = np.array([d.numa for d in devs], dtype=np.int64)
        self.healthy: BoolArray = np.array([d.health for d in devs], dtype=np.bool_)
        self.inconsistent: BoolArray = np.zeros(len(devs), dtype=np.bool_)
        """Cards the ledger's MIG reservations contradict (``Fleet.inconsistencies``):
        judged as unhealthy, as HAMi marks them."""
        self.cordoned: BoolArray = np.array(cordoned, dtype=np.bool_)
        self.processes: IntArray = np.array([d.processes for d in devs], dtype=np.int64)
        self.mig: BoolArray = np.array([d.mode == MIG_MODE for d in devs], dtype=np.bool_)
        """The cards in MIG mode: each container gets an instance of one of its profiles."""
        self.mig_profiles: dict[int, tuple[MigProfile, ...]] = {
            i: d.mig_profiles for i, d in enumerate(devs) if d.mode == MIG_MODE}
        self.instances: dict[int, tuple[MigPlacement, ...]] = {}
        """Per MIG card, the placements its pods' instances occupy (cards without any are
        left out)."""

    def _index_cards(self, node_of: list[int]) -> None:
        """The lookups by card: its type's id, its position by node and uuid, by uuid."""
        devs = self.devices
        self.types: list[str] = sorted({d.type for d in devs})
        type_ids = {t: i for i, t in enumerate(self.types)}
        self.type_id: IntArray = np.array([type_ids[d.type] for d in devs], dtype=np.int64)
        self.card_position: dict[tuple[str, str], int] = {}
        self.uuid_positions: dict[str, list[int]] = {}
        for i, device in enumerate(devs):
            self.card_position[(self.node_names[node_of[i]], device.uuid)] = i
            self.uuid_positions.setdefault(device.uuid, []).append(i)

    def _start_usage(self) -> None:
        """No usage yet: the ledger's is applied card by card (``set_usage``)."""
        size = len(self.devices)
        self.tenants: IntArray = np.zeros(size, dtype=np.int64)
        self.usedmem: IntArray = np.zeros(size, dtype=np.int64)
        self.usedcores: IntArray = np.zeros(size, dtype=np.int64)
        self.used: IntArray = occupied_slots(self.tenants, self.processes)
        node_total = len(self.node_names)

        def per_node(values: IntArray) -> IntArray:
            return np.bincount(self.node_of, weights=values, minlength=node_total).astype(np.int64)

        self.node_count: IntArray = per_node(self.count)
        self.node_cores: IntArray = per_node(self.cores)
        self.node_memory: IntArray = per_node(self.memory)
        self.node_used: IntArray = per_node(self.used)
        self.node_usedmem: IntArray = np.zeros(node_total, dtype=np.int64)
        self.node_usedcores: IntArray = np.zeros(node_total, dtype=np.int64)

    def _start_derived(self) -> None:
        """What is derived from the cards and kept up to date with them: nothing yet."""
        self.check_base: IntArray = self.node_of * CHECK_COUNT
        self._node_score: FloatArray | None = None
        self._stale_scores: set[int] = set()
        self.changed: list[int] = []
        self.check_cache: dict[tuple[object, ...], CachedChecks] = {}

    def _group_cards(self, node_of: list[int]) -> None:
        """Which cards may form one set under numa-bind, topology-aware, or both, and the
        nodes' topology and MIG at a glance."""
        cliques: list[int | None] = []
        for topology in self.topology:
            cliques.extend(topology.cliques or [None] * len(topology.adjacency))
        numa_ids = [d.numa for d in self.devices]
        self.numa_groups = CardGroups(
            [(n, numa) if numa >= 0 else None for n, numa in zip(node_of, numa_ids, strict=True)],
            node_of)
        self.link_groups = CardGroups(
            [(n, c) if c is not None else None for n, c in zip(node_of, cliques, strict=True)],
            node_of)
        self.numa_link_groups = CardGroups(
            [(n, numa, c) if c is not None and numa >= 0 else None
             for n, numa, c in zip(node_of, numa_ids, cliques, strict=True)],
            node_of)
        self.topology_known: BoolArray = np.array([t.known for t in self.topology],
                                                  dtype=np.bool_)
        self.irregular_links: BoolArray = np.array(
            [t.known and t.cliques is None for t in self.topology], dtype=np.bool_)
        self.node_has_mig: BoolArray = (
            np.bincount(self.node_of[self.mig], minlength=len(self.node_names)) > 0)
        self.has_mig = bool(self.mig.any())

    def copy(self) -> Snapshot:
        """A snapshot of the same cards whose usage and health change apart from this one's:
        the arrays that change are copied, the rest (names, capacities, topology) shared
        and never written. Building a snapshot of 5,000 nodes of 8 cards takes about 250 ms;
        this, a few."""
        other = copy.copy(self)
        for name in _DYNAMIC_ARRAYS:
            setattr(other, name, getattr(self, name).copy())
        other._node_score = None if self._node_score is None else self._node_score.copy()
        other._stale_scores = set(self._stale_scores)
        other.instances = dict(self.instances)
        other.changed = []
        other.check_cache = {}
        return other

    @classmethod
    def spliced(cls, runs: list[tuple[Snapshot, int, int]]) -> Snapshot:
        """The snapshot of runs of nodes taken from other snapshots, in the order given (the
        caller keeps the names sorted): ``(snapshot, lo, hi)`` takes its nodes ``lo:hi`` with
        their cards, usage, health and cordons as they are there. The same snapshot, array for
        array, as ``Snapshot`` of those nodes with that usage applied; at 5,000 nodes a few
        milliseconds instead of the ~250 ms of a build, with no Python loop over the cards
        of the runs but for the dicts keyed by card. Every source must hold one entry of
        ``card_position`` per card (no uuid twice in a node)."""
        if not runs:
            raise ValueError("a spliced snapshot needs at least one run of nodes")
        new = cls.__new__(cls)
        spans = [_Span(snapshot, lo, hi, int(snapshot.start[lo]), int(snapshot.start[hi]))
                 for snapshot, lo, hi in runs]
        new._splice_nodes(spans)
        new._splice_arrays(spans)
        sources = {id(span.snapshot): span.snapshot for span in spans}
        new._splice_mig(spans, sources)
        new._splice_types(spans)
        new._splice_positions(spans, sources)
        new._start_derived()
        for name in ("numa_groups", "link_groups", "numa_link_groups"):
            setattr(new, name, CardGroups.spliced(
                [(getattr(snapshot, name), lo, hi, start, stop)
                 for snapshot, lo, hi, start, stop in spans]))
        new.has_mig = bool(new.mig.any())
        return new

    def _splice_nodes(self, spans: list[_Span]) -> None:
        """The runs' nodes and cards one after the other, numbered afresh."""
        self.node_names = list(chain.from_iterable(
            snapshot.node_names[lo:hi] for snapshot, lo, hi, _, _ in spans))
        self.node_position = {n: i for i, n in enumerate(self.node_names)}
        self.name_set = frozenset(self.node_names)
        self.devices = list(chain.from_iterable(
            snapshot.devices[start:stop] for snapshot, _, _, start, stop in spans))
        self.topology = list(chain.from_iterable(
            snapshot.topology[lo:hi] for snapshot, lo, hi, _, _ in spans))
        self.node_cards = np.concatenate([snapshot.node_cards[lo:hi]
                                          for snapshot, lo, hi, _, _ in spans])
        self.start = np.zeros(len(self.node_cards) + 1, dtype=np.int64)
        np.cumsum(self.node_cards, out=self.start[1:])
        self.node_of = np.repeat(np.arange(len(self.node_cards), dtype=np.int64),
                                 self.node_cards)

    def _splice_arrays(self, spans: list[_Span]) -> None:
        """The per-card and per-node arrays, each the runs' slices concatenated."""
        for name in ("index", "memory", "cores", "count", "numa", "healthy", "inconsistent",
                     "cordoned", "processes", "mig", "tenants", "usedmem", "usedcores", "used"):
            setattr(self, name, np.concatenate([getattr(snapshot, name)[start:stop]
                                                for snapshot, _, _, start, stop in spans]))
        for name in ("node_count", "node_cores", "node_memory", "node_used", "node_usedmem",
                     "node_usedcores", "topology_known", "irregular_links", "node_has_mig"):
            setattr(self, name, np.concatenate([getattr(snapshot, name)[lo:hi]
                                                for snapshot, lo, hi, _, _ in spans]))

    def _splice_mig(self, spans: list[_Span], sources: dict[int, Snapshot]) -> None:
        """The dicts keyed by card position (MIG profiles, instances): each source's
        positions mapped to the new ones (-1: not taken), then one pass over each source's
        entries."""
        moved = {key: [-1] * len(snapshot.devices) for key, snapshot in sources.items()}
        first = 0
        for snapshot, _, _, start, stop in spans:
            moved[id(snapshot)][start:stop] = range(first, first + stop - start)
            first += stop - start
        mig_profiles: dict[int, tuple[MigProfile, ...]] = {}
        self.instances = {}
        for key, snapshot in sources.items():
            where = moved[key]
            for card, profiles in snapshot.mig_profiles.items():
                if where[card] >= 0:
                    mig_profiles[where[card]] = profiles
            for card, placements in snapshot.instances.items():
                if where[card] >= 0:
                    self.instances[where[card]] = placements
        self.mig_profiles = dict(sorted(mig_profiles.items()))  # in card order, as built

    def _splice_types(self, spans: list[_Span]) -> None:
        """Types: those still present, sorted; each source's ids mapped onto them."""
        present: set[str] = set()
        for snapshot, _, _, start, stop in spans:
            used = np.bincount(snapshot.type_id[start:stop], minlength=len(snapshot.types))
            present.update(snapshot.types[t] for t in np.flatnonzero(used).tolist())
        self.types = sorted(present)
        type_ids = {t: i for i, t in enumerate(self.types)}
        self.type_id = np.concatenate([
            np.array([type_ids.get(t, -1) for t in snapshot.types], dtype=np.int64)[
                snapshot.type_id[start:stop]]
            for snapshot, _, _, start, stop in spans])

    def _splice_positions(self, spans: list[_Span], sources: dict[int, Snapshot]) -> None:
        """The cards' positions by node and uuid, and by uuid."""
        # card_position's keys are in card order, one per card: sliced, then numbered.
        keys_of = {key: list(snapshot.card_position) for key, snapshot in sources.items()}
        keys = list(chain.from_iterable(
            keys_of[id(snapshot)][start:stop] for snapshot, _, _, start, stop in spans))
        self.card_position = dict(zip(keys, range(len(keys)), strict=True))
        uuids = [uuid for _, uuid in keys]
        # Each uuid once: position i's entry is [i]. Those lists are never written (copies
        # of a snapshot share them already), so the largest source's serve again, in
        # position order when its uuids are each once too: 40,000 lists not made again.
        largest = max(sources.values(), key=lambda snapshot: len(snapshot.devices))
        singles = (list(largest.uuid_positions.values())
                   if len(largest.uuid_positions) == len(largest.devices) else [])
        singles.extend([i] for i in range(len(singles), len(uuids)))
        self.uuid_positions = dict(zip(uuids, singles, strict=False))
        if len(self.uuid_positions) < len(uuids):  # a uuid on two nodes: all its positions
            self.uuid_positions = {}
            for i, uuid in enumerate(uuids):
                self.uuid_positions.setdefault(uuid, []).append(i)

    def node_slice(self, node: int) -> slice:
        return slice(int(self.start[node]), int(self.start[node + 1]))

    def _set_used(self, card: int, used: int) -> None:
        node = self.node_of[card]
        self.node_used[node] += used - self.used[card]
        self.used[card] = used

    def _touched(self, card: int) -> None:
        if len(self.changed) >= CHANGE_LOG_MAX:
            self.changed.clear()
            self.check_cache.clear()
        self.changed.append(card)
        if self._node_score is not None:
            self._stale_scores.add(int(self.node_of[card]))

    def set_usage(self, card: int, usage: Usage) -> None:
        node = self.node_of[card]
        self.node_usedmem[node] += usage.memory - self.usedmem[card]
        self.node_usedcores[node] += usage.cores - self.usedcores[card]
        self.tenants[card] = usage.tenants
        self.usedmem[card] = usage.memory
        self.usedcores[card] = usage.cores
        self._set_used(card, occupied_slots(usage.tenants, int(self.processes[card])))
        self._touched(card)

    def set_inconsistent(self, card: int, inconsistent: bool) -> None:
        if bool(self.inconsistent[card]) != inconsistent:
            self.inconsistent[card] = inconsistent
            self._touched(card)

    def set_instances(self, card: int, placements: tuple[MigPlacement, ...]) -> None:
        """The placements the MIG instances of pods occupy on one card, now."""
        if placements:
            self.instances[card] = placements
        else:
            self.instances.pop(card, None)
        self._touched(card)

    def set_dynamic(self, card: int, device: Card, cordoned: bool) -> None:
        if (bool(self.healthy[card]) == device.health and bool(self.cordoned[card]) == cordoned
                and int(self.processes[card]) == device.processes):
            return  # an agent's periodic report that changes nothing invalidates nothing
        self.healthy[card] = device.health
        self.cordoned[card] = cordoned
        self.processes[card] = device.processes
        self._set_used(card, occupied_slots(int(self.tenants[card]), device.processes))
        self._touched(card)

    def node_scores(self) -> FloatArray:
        """Every node's score before the pod, from its cards' sums (0 to
        ``score_max(NODE_WEIGHTS)``)."""
        if self._node_score is None:
            self._node_score = self._score_nodes(slice(None))
        elif self._stale_scores:
            if len(self._stale_scores) == 1:
                # One node booked since: its score on plain numbers, the same float.
                (node,) = self._stale_scores
                self._node_score[node] = utilization_scores(
                    [(int(self.node_used[node]), int(self.node_count[node]),
                      int(self.node_usedcores[node]), int(self.node_cores[node]),
                      int(self.node_usedmem[node]), int(self.node_memory[node]))],
                    NODE_WEIGHTS)[0]
            else:
                stale = np.fromiter(self._stale_scores, dtype=np.int64,
                                    count=len(self._stale_scores))
                self._node_score[stale] = self._score_nodes(stale)
        self._stale_scores.clear()
        return self._node_score

    def _score_nodes(self, nodes: slice | IntArray) -> FloatArray:
        return utilization_score(ratio(self.node_used[nodes], self.node_count[nodes]),
                                 ratio(self.node_usedcores[nodes], self.node_cores[nodes]),
                                 ratio(self.node_usedmem[nodes], self.node_memory[nodes]),
                                 NODE_WEIGHTS)


class Fleet:
    """Nodes, their cards, and the ledger of allocations, kept consistent; and the
    namespaces' ResourceQuotas, charged as the ledger changes."""

    def __init__(self, quotas: QuotaBook | None = None) -> None:
        """``quotas``: the quotas and charges to start from (a copy of another fleet's,
        for a fleet of a few of its nodes that must still see the namespaces' quotas)."""
        self._nodes: dict[str, Node] = {}
        self._allocations: dict[str, Allocation] = {}
        self._usage: dict[tuple[str, str], Usage] = {}
        self._instances: dict[tuple[str, str], tuple[MigPlacement, ...]] = {}
        # Per card, the grants booked on it without a MIG instance and with one.
        self._grant_kinds: dict[tuple[str, str], tuple[int, int]] = {}
        self._layout: Snapshot | None = None
        # Nodes whose cards ``_layout`` no longer describes (their static fields changed,
        # they came or went): built again, alone, at the next ``snapshot``. Until then the
        # snapshot is kept up to date for every other node.
        self._stale: set[str] = set()
        self._quotas = quotas if quotas is not None else QuotaBook()
        self._generation = 0
        self._changes = 0

    @property
    def generation(self) -> int:
        """Counts the changes after which a placement tried on a copy made before may no
        longer fit this fleet: an allocation booked, a node's cards changed or gone. A trial
        placement is booked here only if this is what it was when the copy was made."""
        return self._generation

    @property
    def changes(self) -> int:
        """Counts every change of nodes or ledger (a booking, a release, an inventory):
        equal twice, the same placement would be found again."""
        return self._changes

    @property
    def quotas(self) -> QuotaBook:
        """The quotas and what the ledger's pods are charged under them."""
        return self._quotas

    @property
    def snapshot(self) -> Snapshot:
        if self._layout is None:
            self._layout = self._with_ledger(Snapshot(self._nodes.values()), self._usage,
                                             self._instances, self._grant_kinds)
        elif self._stale:
            self._layout = self._rebuilt(self._layout)
            self._stale.clear()
        return self._layout

    def _with_ledger(self, snapshot: Snapshot, usage: Iterable[tuple[str, str]],
                     instances: Iterable[tuple[str, str]],
                     grants: Iterable[tuple[str, str]]) -> Snapshot:
        """``snapshot`` with the ledger's usage, instances and contradictions applied to the
        cards of the keys given (a key may name a card the snapshot lacks)."""
        for key in usage:
            card = snapshot.card_position.get(key)
            if card is not None and key in self._usage:
                snapshot.set_usage(card, self._usage[key])
        for key in instances:
            card = snapshot.card_position.get(key)
            if card is not None and snapshot.mig[card] and key in self._instances:
                snapshot.set_instances(card, self._instances[key])
        for key in grants:
            card = snapshot.card_position.get(key)
            if card is not None and key in self._grant_kinds:
                snapshot.set_inconsistent(card, self._contradiction(key, snapshot) is not None)
        # No checks are kept yet: the log of the cards changed would serve none (and a
        # snapshot spliced from this one starts with an empty log as well).
        snapshot.changed.clear()
        return snapshot

    def _rebuilt(self, old: Snapshot) -> Snapshot:
        """The snapshot once the nodes in ``_stale`` are built again: those still here in a
        snapshot of their own, with their part of the ledger; every other node's cards taken
        as they are in ``old`` (kept up to date for them), spliced in name order. When many
        nodes changed, or a node lists a uuid twice, the whole snapshot is built again."""
        stale = self._stale
        fresh_nodes = [self._nodes[name] for name in stale if name in self._nodes]
        nodes = len(self._nodes)
        if (nodes == 0 or len(stale) * _SPLICE_MAX_SHARE > nodes
                or len(old.card_position) != len(old.devices)):
            return self._with_ledger(Snapshot(self._nodes.values()), self._usage,
                                     self._instances, self._grant_kinds)
        keys = [(n.name, d.uuid) for n in fresh_nodes for d in n.cards]
        fresh = self._with_ledger(Snapshot(fresh_nodes), keys, keys, keys)
        if len(fresh.card_position) != len(fresh.devices):
            return self._with_ledger(Snapshot(self._nodes.values()), self._usage,
                                     self._instances, self._grant_kinds)
        # The old snapshot's nodes in runs between those gone or changed (``removed``), each
        # changed or new node (a run of ``fresh``) where its name falls among them.
        removed = sorted(old.node_position[name] for name in stale if name in old.node_position)
        inserts = [bisect_left(old.node_names, name) for name in fresh.node_names]
        runs: list[tuple[Snapshot, int, int]] = []

        def take(snapshot: Snapshot, lo: int, hi: int) -> None:
            if lo == hi:
                return
            if runs and runs[-1][0] is snapshot and runs[-1][2] == lo:
                lo = runs.pop()[1]  # a node removed between two new ones: one run
            runs.append((snapshot, lo, hi))

        cursor = r = f = 0
        total = len(old.node_names)
        while cursor < total or f < len(inserts):
            stop = min(removed[r] if r < len(removed) else total,
                       inserts[f] if f < len(inserts) else total)
            take(old, cursor, stop)
            cursor = stop
            if f < len(inserts) and inserts[f] == cursor:
                first = f
                while f < len(inserts) and inserts[f] == cursor:
                    f += 1
                take(fresh, first, f)
            elif r < len(removed) and removed[r] == cursor:
                cursor += 1
                r += 1
        return Snapshot.spliced(runs)

    # Nodes -----------------------------------------------------------------

    def nodes(self) -> Iterator[Node]:
        return iter(self._nodes.values())

    def node(self, name: str) -> Node | None:
        return self._nodes.get(name)

    def upsert_node(self, node: Node) -> None:
        """Add or replace a node's inventory; in place when only dynamic fields change."""
        old = self._nodes.get(node.name)
        self._nodes[node.name] = node
        self._changes += 1
        static_changed = old is None or not _same_static(old.cards, node.cards)
        if static_changed:
            self._generation += 1
        if self._layout is None:
            return
        if static_changed or node.name in self._stale:
            self._stale.add(node.name)
            return
        cordon = cordoned_uuids(node.annotations)
        for device in node.cards:
            card = self._layout.card_position[(node.name, device.uuid)]
            self._layout.set_dynamic(card, device, device.uuid in cordon)

    def remove_node(self, name: str) -> None:
        if self._nodes.pop(name, None) is not None:
            if self._layout is not None:
                self._stale.add(name)
            self._changes += 1
            self._generation += 1

    # Ledger ----------------------------------------------------------------

    def allocations(self) -> dict[str, Allocation]:
        return dict(self._allocations)

    def allocation(self, key: str) -> Allocation | None:
        return self._allocations.get(key)

    def allocate(self, key: str, allocation: Allocation) -> None:
        """Record a pod's cards; replaces what the pod held before."""
        self.release(key)
        self._allocations[key] = allocation
        self._changes += 1
        self._generation += 1
        footprint = allocation.footprint()
        for uuid, usage in footprint.items():
            self._add_usage(allocation.node, uuid, usage)
        for uuid, placement in allocation.instances():
            self._move_instance(allocation.node, uuid, placement, add=True)
        self._count_grants(allocation, 1)
        self._quotas.charge(key, allocation, footprint)

    def without(self, key: str) -> Fleet:
        """The fleet as if pod ``key`` held nothing, leaving this one as it is: a copy of
        the nodes and the ledger less the pod (this fleet itself when the pod holds nothing).
        The copy builds its own snapshot when first asked."""
        return self.without_all((key,))

    def without_all(self, keys: Iterable[str]) -> Fleet:
        """The fleet as if none of the pods ``keys`` held anything, as ``without`` does for
        one pod (this fleet itself when none of them holds anything)."""
        held = [key for key in keys if key in self._allocations]
        if not held:
            return self
        other = self.copy()
        for key in held:
            other.release(key)
        return other

    def copy(self) -> Fleet:
        """A fleet of the same nodes, ledger and quota charges, booked apart from this one
        (a trial placement of several pods); its snapshot a copy of this one's arrays."""
        other = Fleet(self._quotas.copy())
        other._nodes = dict(self._nodes)
        other._allocations = dict(self._allocations)
        other._usage = dict(self._usage)
        other._instances = dict(self._instances)
        other._grant_kinds = dict(self._grant_kinds)
        other._layout = self._layout.copy() if self._layout is not None else None
        other._stale = set(self._stale)
        return other

    def release(self, key: str) -> Allocation | None:
        allocation = self._allocations.pop(key, None)
        if allocation is not None:
            self._changes += 1
            for uuid, usage in allocation.footprint().items():
                self._add_usage(allocation.node, uuid, Usage() - usage)
            for uuid, placement in allocation.instances():
                self._move_instance(allocation.node, uuid, placement, add=False)
            self._count_grants(allocation, -1)
            self._quotas.refund(key)
        return allocation

    def usage(self, node: str, uuid: str) -> Usage:
        return self._usage.get((node, uuid), Usage())

    def orphans(self) -> dict[tuple[str, str], Usage]:
        """Usage booked on cards that no node currently reports."""
        snapshot = self.snapshot
        return {key: u for key, u in self._usage.items() if key not in snapshot.card_position}

    def _add_usage(self, node: str, uuid: str, delta: Usage) -> None:
        key = (node, uuid)
        usage = self._usage.get(key, Usage()) + delta
        if usage == Usage():
            self._usage.pop(key, None)
        else:
            self._usage[key] = usage
        if self._layout is not None:
            card = self._layout.card_position.get(key)
            if card is not None:
                self._layout.set_usage(card, usage)

    def instances(self, node: str, uuid: str) -> tuple[MigPlacement, ...]:
        """The placements the ledger's MIG instances occupy on one card."""
        return self._instances.get((node, uuid), ())

    def _move_instance(self, node: str, uuid: str, placement: MigPlacement, *,
                       add: bool) -> None:
        key = (node, uuid)
        held = list(self._instances.get(key, ()))
        if add:
            held.append(placement)
        elif placement in held:
            held.remove(placement)
        if held:
            self._instances[key] = tuple(held)
        else:
            self._instances.pop(key, None)
        if self._layout is not None:
            card = self._layout.card_position.get(key)
            if card is not None and self._layout.mig[card]:
                self._layout.set_instances(card, tuple(held))

    def inconsistencies(self) -> dict[tuple[str, str], str]:
        """Cards the ledger's MIG reservations contradict, with why: they are judged
        unhealthy until the pods that contradict them are gone (HAMi's checks): a shared
        card holding a MIG instance, a MIG card held without one."""
        snapshot = self.snapshot
        found = {}
        for key in self._grant_kinds:
            why = self._contradiction(key, snapshot)
            if why is not None:
                found[key] = why
        return found

    def _contradiction(self, key: tuple[str, str], snapshot: Snapshot) -> str | None:
        card = snapshot.card_position.get(key)
        if card is None:
            return None  # a card no node reports: an orphan (``orphans``)
        plain, with_instance = self._grant_kinds.get(key, (0, 0))
        if snapshot.mig[card] and plain:
            return "a pod holds this MIG card without a MIG reservation"
        if not snapshot.mig[card] and with_instance:
            return "a MIG reservation names this card, which is not in MIG mode"
        return None

    def _count_grants(self, allocation: Allocation, sign: int) -> None:
        changed = set()
        for grants in allocation.containers:
            for grant in grants:
                key = (allocation.node, grant.uuid)
                plain, with_instance = self._grant_kinds.get(key, (0, 0))
                if grant.instance is None:
                    plain += sign
                else:
                    with_instance += sign
                if plain or with_instance:
                    self._grant_kinds[key] = (plain, with_instance)
                else:
                    self._grant_kinds.pop(key, None)
                changed.add(key)
        snapshot = self._layout
        if snapshot is None or (not snapshot.has_mig and not allocation.instances()):
            return  # no MIG card, no reservation: nothing to contradict
        for key in changed:
            card = snapshot.card_position.get(key)
            if card is not None:
                snapshot.set_inconsistent(card, self._contradiction(key, snapshot) is not None)
