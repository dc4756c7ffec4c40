"""One scheduling decision: which node, which cards, and why every other node fails."""

from __future__ import annotations

from collections import Counter
from collections.abc import (
    Callable,
    Collection,
    ItemsView,
    Iterator,
    KeysView,
    Mapping,
    Sequence,
    ValuesView,
)
from dataclasses import dataclass
from functools import partial
from itertools import islice
from operator import is_not

import msgspec
import numpy as np

from common.core.annotations import CardGrant, allocation_annotations
from common.core.fiterror import fit_error_message
from common.core.fleet import BoolArray, Fleet, FloatArray, IntArray, Snapshot, round_scores
from common.core.ledger import Allocation
from common.core.mig import MigInstance
from common.core.placement import (
    CodeArray,
    NodeFailure,
    Placement,
    PodView,
    card_reason_counts,
    instance_grants,
    node_level_failure,
    place_pod,
)
from common.core.pod import ContainerRequest, PodRequest
from common.core.policy import NodePolicy
from common.core.quota import QuotaRefusal
from common.core.reasons import (
    CARD_REASON,
    CHECK_COUNT,
    INSUFFICIENT_CARDS,
    QUOTA_REASON,
    TOPOLOGY_NOT_FIT,
    CardCheck,
    FailedNode,
    NodeReasons,
    failed_node_texts,
)

_ELIGIBLE = int(CardCheck.ELIGIBLE)
"""Compared with a numpy array, a plain integer: an IntEnum member costs a lookup of numpy's
protocols through the enum's metaclass, four times the comparison."""


@dataclass(frozen=True, slots=True)
class PlacedCard:
    uuid: str
    index: int
    memory: int
    cores: int
    instance: MigInstance | None = None
    """On a MIG card: the GPU instance reserved for the container."""


class ExplainRow(msgspec.Struct, frozen=True):
    """One card of one node as the pod's first GPU container sees it."""

    node: str
    index: int
    uuid: str
    used: int
    score: float
    filtered_by: str | None
    rank: int | None
    chosen: bool


@dataclass(frozen=True, slots=True)
class Decision:
    pod: str
    scheduled: bool
    node: str | None = None
    cards: tuple[tuple[PlacedCard, ...], ...] = ()
    allocation: Allocation | None = None
    failures: Mapping[str, FailedNode] | None = None
    """Why each node refused fails the pod, as data (``failed_nodes`` writes it out)."""
    ignored_policies: tuple[str, ...] = ()
    adjusted: tuple[str, ...] = ()
    """The pod's figures read otherwise than written, as HAMi reads them
    (``PodRequest.adjusted``): warnings, not refusals."""
    reason: str | None = None
    message: str | None = None
    """For a pod placed nowhere: one sentence on what it asked for and what the nodes have
    (``common.core.fiterror``), or the reason a malformed pod is refused."""
    explain: tuple[ExplainRow, ...] | None = None
    asks_for_gpu: bool = True
    """False for a pod that asks for no GPU: pyhami passes every node and leaves the
    choice to kube-scheduler (the decision is ``scheduled`` with no node)."""
    quota: QuotaRefusal | None = None
    """The ResourceQuota that refused cards to the pod, when one did."""
    fitting: Mapping[str, float] | None = None
    """Every node considered that holds the pod -> its node score before the pod (rounded
    as compared), best first by the pod's node policy, the chosen node first of all: what
    HAMi's ``FilteringSucceed`` Event lists, and what /filter answers when it answers every
    node that fits. None where nothing was decided (a pod asking for no GPU, a refusal
    for the pod itself, a group's member)."""

    @property
    def failed_nodes(self) -> dict[str, str] | None:
        """Node -> its reasons as HAMi's FailedNodes writes them (``count/cards Reason``),
        the quota's sentence after ``ResourceQuotaNotFit``."""
        if self.failures is None:
            return None
        details = None if self.quota is None else {QUOTA_REASON: self.quota.text()}
        return failed_node_texts(self.failures, details)

    def annotations(self) -> dict[str, str]:
        """The allocation annotations that do not depend on the clock."""
        if self.allocation is None or self.node is None:
            return {}
        return allocation_annotations(self.node, self.allocation.containers)


def rejected(key: str, reason: str) -> Decision:
    """The decision for a malformed pod: unschedulable, with the reason naming the input."""
    return Decision(pod=key, scheduled=False, failures={}, reason=reason, message=reason)


def _counted_failure(request: ContainerRequest, view: PodView, node: int,
                     by_code: list[int]) -> Counter[str]:
    """Why a one-container pod fails a node, when counts per check tell it all.

    That is every case but numa-bind with eligible cards: there the reason names
    the best-ranked card's NUMA group.
    """
    snapshot = view.snapshot
    failure = node_level_failure(request, int(snapshot.node_cards[node]), snapshot.topology[node],
                                 view.pod.chain.topology_aware,
                                 view.takes_mig and bool(snapshot.node_has_mig[node]))
    if failure is not None:
        return failure
    eligible = by_code[CardCheck.ELIGIBLE]
    aware = view.pod.chain.topology_aware and request.cards > 1
    why = TOPOLOGY_NOT_FIT if aware and eligible >= request.cards else INSUFFICIENT_CARDS
    return card_reason_counts(by_code) + Counter({why: eligible})


def _holds_a_set(view: PodView, request: ContainerRequest, codes: CodeArray,
                 by_node: IntArray) -> BoolArray:
    """Nodes whose eligible cards hold a valid set for ``request``, from counts alone.

    Exact for nodes whose linked components are fully connected; nodes with other
    link shapes are evaluated one by one instead.
    """
    snapshot, pod = view.snapshot, view.pod
    enough = by_node[:, CardCheck.ELIGIBLE] >= request.cards
    aware = pod.chain.topology_aware and request.cards > 1
    bound = pod.numa_bind and request.cards > 1
    if not (aware or bound):
        return enough
    if aware and bound:
        groups = snapshot.numa_link_groups
    else:
        groups = snapshot.link_groups if aware else snapshot.numa_groups
    members = groups.card_group[(codes == _ELIGIBLE) & (groups.card_group >= 0)]
    per_group = np.bincount(members, minlength=len(groups.group_node))
    has_set = np.zeros(len(snapshot.node_names), dtype=np.bool_)
    has_set[groups.group_node[per_group >= request.cards]] = True
    return enough & has_set


FEW_FAILING = 256
"""Failing nodes up to which their distinct reasons are found in a dict of their rows
rather than by np.unique (about 25 us for a few dozen nodes, most of their writing)."""
_PICK_ROWS_BELOW = 8
"""The failing nodes' check counts are copied row by row while they are at most one in
this many of the fleet's nodes, the whole array otherwise (measured: picking rows costs
about ten times a row of a block copy)."""


class NodeFailures(Mapping[str, FailedNode]):
    """Node -> why it fails the pod, worked out and written only when first read: a pod
    scheduled among thousands of nodes mostly needs none of it."""

    __slots__ = ("_build", "_built", "_count")

    def __init__(self, build: Callable[[], dict[str, FailedNode]], count: int) -> None:
        self._build = build
        self._count = count
        self._built: dict[str, FailedNode] | None = None

    def _all(self) -> dict[str, FailedNode]:
        if self._built is None:
            self._built = self._build()
        return self._built

    def __getitem__(self, name: str) -> FailedNode:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return self._count

    # The built dict's own views and lookups: Mapping's mixins go through __getitem__ for
    # every node, and /filter writes every failing node's reasons (twice, the answer and
    # the decision event): 25 nodes' items cost 40 us that way at 5,000 nodes.
    def __contains__(self, name: object) -> bool:
        return name in self._all()

    def keys(self) -> KeysView[str]:
        return self._all().keys()

    def items(self) -> ItemsView[str, FailedNode]:
        return self._all().items()

    def values(self) -> ValuesView[FailedNode]:
        return self._all().values()


class FittingNodes(Mapping[str, float]):
    """Node -> score of the nodes that hold the pod, best first, written only when first
    read (most decisions need none of it): the positions and scores copied when made, as
    the snapshot's scores change with the next booking."""

    __slots__ = ("_built", "_names", "_positions", "_scores", "_spread")

    def __init__(self, names: Sequence[str], positions: IntArray, scores: FloatArray,
                 policy: NodePolicy) -> None:
        self._names = names
        self._positions = positions
        self._scores = scores[positions]
        self._spread = policy is NodePolicy.SPREAD
        self._built: dict[str, float] | None = None

    def _all(self) -> dict[str, float]:
        if self._built is None:
            rounded = round_scores(self._scores)
            # Best first: binpack's highest score, spread's lowest, ties to the position
            # (nodes are held sorted by name), as ``_best_node`` chooses.
            order = np.lexsort((self._positions, rounded if self._spread else -rounded))
            names = self._names
            self._built = {names[int(self._positions[i])]: float(rounded[i])
                           for i in order.tolist()}
        return self._built

    def __getitem__(self, name: str) -> float:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._positions)

    def __contains__(self, name: object) -> bool:
        return name in self._all()

    def best(self, count: int) -> list[tuple[str, float]]:
        """The first ``count`` nodes of the order with their scores, without ordering
        them all: a placed pod's ``FilteringSucceed`` Event names a few among what may be
        thousands (5,000 nodes ordered: 1.6 ms; their head: 0.04 ms; measured by
        harness/benchmarks/event_messages.py, figures in docs/performance.md)."""
        if count <= 0:
            return []
        if self._built is not None or count >= len(self._positions):
            return list(islice(self._all().items(), count))
        rounded = round_scores(self._scores)
        key = rounded if self._spread else -rounded
        # The ``count`` smallest keys, ties to the position: every key below the count-th
        # smallest, then as many of those equal to it as are left, in position order
        # (the positions rise: they come from a mask's nonzero).
        threshold = np.partition(key, count - 1)[count - 1]
        below = np.flatnonzero(key < threshold)
        tied = np.flatnonzero(key == threshold)[:count - len(below)]
        head = np.concatenate((below, tied))
        order = head[np.lexsort((self._positions[head], key[head]))]
        names = self._names
        return [(names[int(self._positions[i])], float(rounded[i])) for i in order.tolist()]


def _counted_failures(view: PodView, request: ContainerRequest, by_node: IntArray,
                      nodes: BoolArray, more: dict[str, FailedNode]) -> NodeFailures:
    """The reasons of the nodes failed from check counts alone, then of ``more``."""
    snapshot = view.snapshot
    failing = nodes.nonzero()[0]  # flatnonzero of a 1-D mask, without its wrappers
    # A copy of the counts, which are kept in the snapshot and change with the next booking.
    # When many nodes fail, the whole array (one block copied) rather than their rows
    # (picked one by one: ten times the cost, at 1,200 nodes); when few do, their rows only:
    # at 15,000 nodes the whole array is 1.4 MB, a quarter of a millisecond to copy at every
    # decision, whatever the 750 names kube-scheduler sent. The cards per node and the
    # topology are the snapshot's for good. The rows are stacked with them only when the
    # reasons are asked for (a caller that places the pod, as ``pyhami simulate`` does 7,000
    # times a chain on openb, seldom asks).
    picked = len(failing) * _PICK_ROWS_BELOW <= len(by_node)
    counts = by_node[failing] if picked else by_node.copy()

    def reasons(node: int, row: list[int]) -> FailedNode:
        return NodeReasons.of(_counted_failure(request, view, node, row[:CHECK_COUNT]),
                              row[CHECK_COUNT])

    def build() -> dict[str, FailedNode]:
        failed: dict[str, FailedNode] = {}
        names = snapshot.node_names
        columns = (counts if picked else counts[failing], snapshot.node_cards[failing],
                   snapshot.topology_known[failing])
        # Many nodes fail the same way: build each distinct set of reasons once, from
        # the first node with that row (a row holds all that the reasons depend on).
        if 0 < len(failing) <= FEW_FAILING:
            # Grouped by the rows as tuples: np.unique's sort costs more below this.
            seen: dict[tuple[int, ...], FailedNode] = {}
            for node, row in zip(failing.tolist(), np.column_stack(columns).tolist(),
                                 strict=True):
                key = tuple(row)
                found = seen.get(key)
                if found is None:
                    found = seen[key] = reasons(node, row)
                failed[names[node]] = found
        elif len(failing):
            rows = np.column_stack(columns)
            keys = rows.view(np.dtype((np.void, rows.itemsize * rows.shape[1]))).ravel()
            _, first, group = np.unique(keys, return_index=True, return_inverse=True)
            distinct = [reasons(int(failing[i]), rows[i].tolist()) for i in first.tolist()]
            failed = {names[node]: distinct[g]
                      for node, g in zip(failing.tolist(), group.tolist(), strict=True)}
        failed.update(more)
        return failed

    return NodeFailures(build, len(failing) + len(more))


def _best_node(scores: FloatArray, fits: BoolArray, policy: NodePolicy) -> int | None:
    """Highest (binpack) or lowest (spread) node score; ties to the name sorting first."""
    if not fits.any():
        return None
    # The nodes that do not fit scored past every score (all finite): the first highest
    # (lowest) is then the first node, by name, of the best score among those that fit.
    if policy is NodePolicy.BINPACK:
        return int(np.where(fits, scores, -np.inf).argmax())
    return int(np.where(fits, scores, np.inf).argmin())


def decide(
    fleet: Fleet,
    pod: PodRequest,
    *,
    nodes: Collection[str] | None = None,
    explain: bool = False,
    explain_chosen: bool = False,
    exhaustive: bool = False,
    describe: bool = False,
) -> Decision:
    """Choose a node and cards for ``pod`` among ``nodes`` (default: every node).

    Nodes are judged from per-card check counts where those suffice; the rest,
    or every node with ``exhaustive`` (the slower reference path), one by one.
    ``explain`` adds the selection path of every node, ``explain_chosen`` that of
    the chosen node only. ``describe`` words why a pod placed nowhere fits no node
    (``Decision.message``).
    """
    if not pod.wants_gpu:
        return Decision(pod=pod.key, scheduled=True, failures={},
                        ignored_policies=pod.ignored_policies, adjusted=pod.adjusted,
                        asks_for_gpu=False)
    snapshot = fleet.snapshot
    # The quotas asked once: what the pod may still be charged, which its card checks
    # consume as one limit.
    view = PodView(snapshot, pod, fleet.quotas.left(pod.subject))
    considered = _considered(snapshot, nodes)
    codes, by_node = view.first_checks()
    fits, counted, placed_in_full = _judged_by_counts(view, codes, by_node, considered,
                                                      exhaustive)
    placements, failed = _placed_in_full(view, codes, placed_in_full, fits)
    failures = _counted_failures(view, pod.gpu_containers[0], by_node, counted, failed)
    node_scores = snapshot.node_scores()
    chosen_node = _best_node(node_scores, fits, pod.node_policy)
    fitting = FittingNodes(snapshot.node_names, fits.nonzero()[0], node_scores, pod.node_policy)
    placement = _chosen_placement(view, chosen_node, placements, codes)
    rows = None
    if explain:
        rows = _explain(view, codes, considered, chosen_node, placement)
    elif explain_chosen and chosen_node is not None:
        only_chosen = np.zeros(len(snapshot.node_names), dtype=np.bool_)
        only_chosen[chosen_node] = True
        rows = _explain(view, codes, only_chosen, chosen_node, placement)
    quota = _quota_refusal(fleet, view, codes, by_node=by_node, considered=considered,
                           failed=failed)
    if chosen_node is None:
        message = fit_error_message(fleet, pod, failures) if describe else None
        return Decision(pod=pod.key, scheduled=False, failures=failures,
                        ignored_policies=pod.ignored_policies, adjusted=pod.adjusted,
                        message=message, explain=rows, quota=quota, fitting=fitting)
    return _scheduled(view, chosen_node, placement, failures, rows=rows, quota=quota,
                      fitting=fitting)


def _considered(snapshot: Snapshot, nodes: Collection[str] | None) -> BoolArray:
    """The nodes the pod is judged on, as a mask of the snapshot's: ``nodes`` (None: all)."""
    considered = np.ones(len(snapshot.node_names), dtype=np.bool_)
    if nodes is not None:
        wanted = nodes if isinstance(nodes, (set, frozenset)) else set(nodes)
        if not wanted.issuperset(snapshot.name_set):
            considered[:] = False
            # The lookups and the dropping of unknown names in C, one pass over the names:
            # a Python loop over the ~420 names kube-scheduler sends at 1,000 nodes cost
            # more than the rest of the choice, and at 15,000 nodes an intersection first
            # (a second pass) cost a tenth of the decision.
            found = filter(partial(is_not, None), map(snapshot.node_position.get, wanted))
            considered[np.fromiter(found, dtype=np.intp)] = True
    return considered


def _judged_by_counts(view: PodView, codes: CodeArray, by_node: IntArray,
                      considered: BoolArray,
                      exhaustive: bool) -> tuple[BoolArray, BoolArray, BoolArray]:
    """The considered nodes split by how they are judged: those the check counts say fit,
    those they say fail (``counted``), and the rest, placed one by one
    (``placed_in_full``): every node for a pod of several GPU containers or with
    ``exhaustive``; for one container, the nodes whose counts do not tell (irregular
    NVLink shapes, NUMA groups under numa-bind, MIG cards)."""
    snapshot, pod = view.snapshot, view.pod
    first = pod.gpu_containers[0]
    node_count = len(snapshot.node_names)
    counted = np.zeros(node_count, dtype=np.bool_)
    fits = np.zeros(node_count, dtype=np.bool_)
    placed_in_full = considered.copy()
    if len(pod.gpu_containers) == 1 and not exhaustive:
        holds = _holds_a_set(view, first, codes, by_node)
        if pod.chain.topology_aware and first.cards > 1:
            placed_in_full &= snapshot.irregular_links
            fits = considered & ~placed_in_full & holds
            counted = considered & ~placed_in_full & ~fits
        else:
            # No node placed in full: the same masks with three array operations fewer.
            placed_in_full[:] = False
            fits = considered & holds
            counted = considered & ~fits
        if pod.numa_bind and first.cards > 1:
            placed_in_full |= counted & (by_node[:, CardCheck.ELIGIBLE] > 0)
            counted &= ~placed_in_full
        if view.takes_mig:
            # Several instances of one MIG card may serve one container: counts of
            # eligible cards do not tell whether a node holds the set.
            on_mig = considered & snapshot.node_has_mig
            placed_in_full |= on_mig
            fits &= ~on_mig
            counted &= ~on_mig
    return fits, counted, placed_in_full


def _placed_in_full(view: PodView, codes: CodeArray, placed_in_full: BoolArray,
                    fits: BoolArray) -> tuple[dict[int, Placement], dict[str, FailedNode]]:
    """The pod placed on each of those nodes in turn: the placements found (their nodes
    marked in ``fits``) and the reasons of the nodes that failed."""
    snapshot = view.snapshot
    placements: dict[int, Placement] = {}
    failed: dict[str, FailedNode] = {}
    if placed_in_full.any():
        view.scores()
    for node in placed_in_full.nonzero()[0].tolist():
        result = place_pod(view, node, codes[snapshot.node_slice(node)])
        if isinstance(result, NodeFailure):
            failed[snapshot.node_names[node]] = NodeReasons.of(result.reasons,
                                                             int(snapshot.node_cards[node]))
        else:
            placements[node] = result
            fits[node] = True
    return placements, failed


def _chosen_placement(view: PodView, chosen_node: int | None,
                      placements: dict[int, Placement], codes: CodeArray) -> Placement:
    """The pod's cards on the chosen node: placed already, or placed now (a node the
    counts said fits); none when no node was chosen."""
    if chosen_node is None:
        return []
    found = placements.get(chosen_node)
    if found is None:
        result = place_pod(view, chosen_node, codes[view.snapshot.node_slice(chosen_node)])
        assert not isinstance(result, NodeFailure), "a node that fits places the pod"
        found = result
    return found


def _quota_refusal(fleet: Fleet, view: PodView, codes: CodeArray, *, by_node: IntArray,
                   considered: BoolArray, failed: dict[str, FailedNode]) -> QuotaRefusal | None:
    """The ResourceQuota that refused the pod cards on a node considered, when one did,
    as the quota room words it."""
    if view.quota is None:
        return None
    # The first checks hold QUOTA_NOT_FIT only where the quota refused cards (most pods
    # under a quota: nowhere, and then the counts need no look).
    if ((view.quota_refused_first and by_node[considered, CardCheck.QUOTA_NOT_FIT].any())
            or any(reason == QUOTA_REASON for failure in failed.values()
                   for reason, _ in failure.removed())):
        return fleet.quotas.card_refusal(view.pod, view.snapshot.memory, codes)
    return None


def _scheduled(view: PodView, node: int, placement: Placement, failed: Mapping[str, FailedNode],
               *, rows: tuple[ExplainRow, ...] | None, quota: QuotaRefusal | None,
               fitting: Mapping[str, float]) -> Decision:
    snapshot, pod = view.snapshot, view.pod
    start = int(snapshot.start[node])
    per_container = iter(zip(placement, instance_grants(view, node, placement), strict=True))
    grants: list[tuple[CardGrant, ...]] = []
    placed: list[tuple[PlacedCard, ...]] = []
    for request in pod.containers:
        if request.cards == 0:
            grants.append(())
            continue
        chosen, charged = next(per_container)
        cards = []
        for local, (memory, cores, instance) in zip(chosen, charged, strict=True):
            device = snapshot.devices[start + local]
            cards.append(PlacedCard(device.uuid, device.index, memory, cores, instance))
        placed.append(tuple(cards))
        grants.append(tuple(CardGrant(c.uuid, c.memory, c.cores, c.instance) for c in cards))
    init_count = sum(1 for c in pod.containers if c.is_init)
    name = snapshot.node_names[node]
    return Decision(
        pod=pod.key,
        scheduled=True,
        node=name,
        cards=tuple(placed),
        allocation=Allocation(name, tuple(grants), init_count, pod.subject),
        failures=failed,
        ignored_policies=pod.ignored_policies,
        adjusted=pod.adjusted,
        explain=rows,
        quota=quota,
        fitting=fitting,
    )


def _explain(view: PodView, codes: CodeArray, considered: BoolArray, chosen_node: int | None,
             placement: Placement) -> tuple[ExplainRow, ...]:
    snapshot = view.snapshot
    shown = np.flatnonzero(considered).tolist()
    if len(shown) > 1:
        view.scores()  # many nodes: score the whole fleet in one pass
    chosen_cards = {card for cards in placement for card in cards}
    first = view.pod.gpu_containers[0]
    rows: list[ExplainRow] = []
    for node in shown:
        where = snapshot.node_slice(node)
        scores = view.card_scores(where)
        used = snapshot.used[where].tolist()
        index = snapshot.index[where].tolist()
        local_codes = codes[where].tolist()
        # A node refused before its cards are looked at (fewer cards than asked) refuses
        # every card for that reason, as its failed_nodes entry says: a card's own check
        # (too little memory) would name a reason the node was not refused for.
        whole_node = node_level_failure(first, int(snapshot.node_cards[node]),
                                        snapshot.topology[node], view.pod.chain.topology_aware,
                                        view.takes_mig and bool(snapshot.node_has_mig[node]))
        if whole_node is not None:
            reason = next(iter(whole_node))
            rows += [ExplainRow(node=snapshot.node_names[node], index=index[local],
                                uuid=snapshot.devices[where.start + local].uuid,
                                used=used[local], score=scores[local], filtered_by=reason,
                                rank=None, chosen=False)
                     for local in range(len(local_codes))]
            continue
        eligible = [i for i, code in enumerate(local_codes) if code == CardCheck.ELIGIBLE]
        rank = {card: r + 1 for r, card in enumerate(view.rank(node, eligible))}
        for local, code in enumerate(local_codes):
            rows.append(ExplainRow(
                node=snapshot.node_names[node],
                index=index[local],
                uuid=snapshot.devices[where.start + local].uuid,
                used=used[local],
                score=scores[local],
                filtered_by=CARD_REASON[CardCheck(code)] if code else None,
                rank=rank.get(local),
                chosen=node == chosen_node and local in chosen_cards,
            ))
    return tuple(rows)
