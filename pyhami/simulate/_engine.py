"""Replaying a workload through the decision core, one policy chain at a time.

Events run in time order: arrivals, and departures (a pod placed at time ``t`` with a
duration ``d`` leaves at ``t + d``; one without a duration stays). At equal times the
departures come first, then the arrivals in trace order. Each arriving pod is decided by
``common.core.decide`` on a fleet built from the trace's nodes, exactly as the extender
decides it; a pod that fits nowhere waits, and waiting pods are tried again, in arrival
order, whenever departures free capacity.

The cluster file's ResourceQuotas apply throughout: a pod placed is charged to the
quotas of its namespace that select it, and refunded when it leaves, as in the daemon.

Retrying waiting pods cheaply, and why it finds what a full retry would: a node's usage,
and a quota's, only grow between departures, and every check of the core is monotone in
them (more usage never lets a pod fit where it did not), so a waiting pod that failed on
every node when last tried still fails on every node nobody left since. After a batch of
departures the waiting pods are therefore tried on the freed nodes only, except the pods
of a namespace under quota that a departure refunded: those may now fit on any node, and
are tried on all. Two shortcuts skip pods without calling ``decide``: pods whose requests
are identical (all but the name; the namespace and what quota scopes match on are part
of the request) fail or fit alike, so once one fails in a batch the later ones are
skipped; and a request whose first GPU container finds too few cards with enough free
cores, memory and slots on every freed node (a necessary condition of the core's card
checks) is not tried at all, unless it is to be tried on all nodes. The choice among the
freed nodes is the one a full retry makes: the nodes that fit are the same, and so are
their scores.

Groups (a distributed job's pods, declared with Kueue's label and count): with
``all_or_nothing`` (the default), a group's members wait until all of them have arrived,
then ``common.core.groups.place_group`` places them at once, every member or none; a group
that does not fit holds no card and waits. Waiting groups are tried again after every batch
of departures, before the waiting single pods, highest ``spec.priority`` first, then in the
order they became whole: a large job gets the freed cards before the stream of small pods
behind it (the small pods wait that much longer), while a group that does not fit stops
nobody. They are tried on every node, since a group may span freed and unchanged nodes.
Without ``all_or_nothing`` each member is placed on its own as it arrives, as
kube-scheduler alone places them, and holds its cards while the rest of its group waits. In
both, a member's duration runs from the moment its whole group is placed (a job's workers
start work together), and the cards held by the placed members of a group not yet whole are
counted as GPU-hours held idle: by construction none with all or nothing.

``inflate=X`` follows Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing
Workloads with Fragmentation Gradient Descent" (USENIX ATC '23): the workload's pods are
submitted again and again, in trace order and with unique names, until the GPU demand
that arrived reaches X times the cluster's GPU capacity. As in the paper, pods never
depart in that mode (durations are ignored), so a pod that fits nowhere when it arrives
is refused at the end.
"""

from __future__ import annotations

import heapq
import operator
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import msgspec
import numpy as np

from common.core import (
    Allocation,
    ClusterFile,
    Decision,
    Defaults,
    Fleet,
    NodePolicy,
    PodManifest,
    PodRejected,
    PodRequest,
    decide,
    fleet_from_cluster,
    parse_default_chain,
    parse_pod,
)
from common.core.deviceconfig import DeviceConfig
from common.core.fleet import BoolArray, FloatArray, IntArray, Snapshot
from common.core.groups import member_order, place_group
from common.core.placement import PodView
from common.core.pod import GPU_POLICY_ANNOTATION, ContainerRequest
from common.core.policy import Chain
from common.core.reasons import QUOTA_REASON, removed_most
from common.files import InputFileError
from pyhami.simulate._results import GroupTally, NamespaceTally, PolicyRun, Sample
from pyhami.simulate._trace import SimPod, Trace

NO_NODE = "NoNode"
"""The reason counted for a pod refused with no node judged (a cluster with no node)."""
GROUP_NOT_FIT = "GroupDoesNotFit"
"""The reason counted for the members of a whole group that never fitted at once."""
GROUP_INCOMPLETE = "GroupIncomplete"
"""The reason counted for the members of a group whose members never all arrived (or one
of them was malformed)."""
SECONDS_PER_HOUR = 3600.0
_SHARE_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class _Submission:
    """One pod as it arrives: its request (or why it is malformed) and its demand."""

    request: PodRequest | PodRejected
    namespace: str
    kind: int
    """Index of the pod's request among the distinct requests (-1: malformed)."""
    arrival: float
    duration: float | None
    demand: float
    group: str | None = None
    """The key of the pod's group (namespace/name), None for a pod on its own."""
    group_count: int = 0
    priority: int = 0
    """``spec.priority``, 0 when unset: the order waiting groups are tried in."""

    def repeated(self, request: PodRequest | PodRejected, arrival: float,
                 group: str | None) -> _Submission:
        """The pod submitted again (``inflate``): another request and group key, another
        arrival, no departure. ``dataclasses.replace`` works out the fields each time,
        which cost more than the rest of the workload's setup (7,000 pods a chain)."""
        return _Submission(request, self.namespace, self.kind, arrival, None, self.demand,
                           group, self.group_count, self.priority)


class _Group:
    """One group of the workload as the run goes: who arrived, who holds cards."""

    def __init__(self, key: str, count: int, priority: int) -> None:
        self.key = key
        self.count = count
        self.priority = priority
        self.arrived: list[int] = []
        """Positions of the members that arrived, malformed ones included."""
        self.placed: list[int] = []
        """Positions of the members placed (holding cards, or asking for none)."""
        self.started = False
        """All members placed: their durations run."""
        self.whole_at = -1
        """Position of the member whose arrival made the group whole, -1 before."""


def simulate(trace: Trace, *, policy: str, node_policy: NodePolicy,
             inflate: float | None = None,
             progress: Callable[[int, int], None] | None = None,
             device: DeviceConfig | None = None,
             all_or_nothing: bool = True,
             parses: Parses | None = None) -> PolicyRun:
    """Replay ``trace`` with ``policy`` (a chain, the cluster default; a pod's own
    annotation overrides it) and ``node_policy``; a group's members placed together, all
    or none, or (without ``all_or_nothing``) one at a time as they arrive.

    ``parses`` reads the pods' requests, and may be shared by the runs of one trace
    (default: a fresh one); ``Parses(reuse=False)`` reads every pod afresh, the reference
    the tests compare with.

    Raises ``SettingsError`` for a chain that names an unknown policy,
    ``ClusterFileError`` for inconsistent nodes, and ``InputFileError`` when ``inflate``
    cannot be reached (no GPU card, or no pod asking for a GPU).
    """
    defaults = Defaults(parse_default_chain(policy), node_policy,
                        DeviceConfig() if device is None else device)
    fleet = fleet_from_cluster(ClusterFile(nodes=list(trace.nodes)))
    for quota in trace.quotas:
        fleet.quotas.set_quota(quota)
    snapshot = fleet.snapshot
    requests = _Requests(snapshot, Parses() if parses is None else parses)
    in_order = sorted(trace.pods, key=lambda pod: pod.arrival)  # stable: ties keep order
    submissions = [_in_group(requests.submission(pod.manifest, defaults, pod.arrival,
                                                 pod.duration), pod)
                   for pod in in_order]
    if inflate is not None:
        submissions = _inflated(submissions, inflate, len(snapshot.devices))
    replay = _Replay(fleet, requests, len(snapshot.devices), all_or_nothing)
    replay.run(submissions, progress)
    groups = replay.groups.values()
    return PolicyRun(
        policy=policy,
        node_policy=node_policy.value,
        pods=len(submissions),
        placed=len(replay.waits),
        refused=sum(replay.refused.values()),
        refused_by_reason=dict(replay.refused),
        peak_allocation=replay.peak_allocation,
        samples=replay.samples,
        waits=replay.waits,
        by_namespace=replay.by_namespace(),
        groups=GroupTally(
            placement="all-or-nothing" if all_or_nothing else "one-at-a-time",
            jobs=len(replay.groups),
            started=sum(group.started for group in groups),
            waiting=sum(not group.started for group in groups),
            holding=sum(bool(group.placed) and not group.started for group in groups),
            idle_gpu_hours=replay.idle_gpu_seconds / SECONDS_PER_HOUR),
        mig_instances=dict(replay.mig_instances),
    )


def _in_group(submission: _Submission, pod: SimPod) -> _Submission:
    """``submission`` with the group ``pod`` declares, and its priority."""
    if pod.group is None:
        return submission
    return replace(submission, group=pod.group.key, group_count=pod.group.count or 0,
                   priority=pod.manifest.spec.priority or 0)


def _inflated(submissions: list[_Submission], target: float,
              cards: int) -> list[_Submission]:
    """The workload repeated, in order, until its demand reaches ``target`` x ``cards``;
    no pod departs. Repeats keep their spacing, one after the other in time."""
    total = sum(s.demand for s in submissions)
    if cards == 0:
        raise InputFileError("inflate: the cluster has no GPU card")
    if total <= 0:
        raise InputFileError("inflate: no pod of the workload asks for a GPU")
    first = min(s.arrival for s in submissions)
    span = max(s.arrival for s in submissions) - first + 1.0
    inflated: list[_Submission] = []
    arrived = 0.0
    repeat = 0
    while arrived < target * cards:
        for submission in submissions:
            request = submission.request
            if repeat and isinstance(request, PodRequest):
                request = _keyed(request, f"{request.key}#{repeat}")
            group = submission.group
            if repeat and group is not None:
                group = f"{group}#{repeat}"
            inflated.append(submission.repeated(request, repeat * span + submission.arrival,
                                                group))
            arrived += submission.demand
            if arrived >= target * cards:
                break
        repeat += 1
    return inflated


_REQUEST_FIELDS = [field.name for field in fields(PodRequest)]
assert _REQUEST_FIELDS[0] == "key", "_keyed passes the key first"
_request_rest = operator.attrgetter(*_REQUEST_FIELDS[1:])


def _keyed(request: PodRequest, key: str) -> PodRequest:
    """``replace(request, key=key)``, the fields named once rather than worked out on
    every call (``replace`` was a third of the cost of setting a chain's 7,000 pods up)."""
    return PodRequest(key, *_request_rest(request))


class Parses:
    """The pods' requests as ``parse_pod`` reads them, each distinct manifest read once.

    A workload repeats a few shapes of pod thousands of times (openb: 8,152 pods), and
    ``simulate`` replays it once per policy chain: ``parse_pod`` on every pod of every
    run took a fifth of the time (1.2 s of 5.5 s on openb, three chains). The request
    depends on the manifest only, but for its key (``namespace/name``) and, on a pod
    without the ``hami.io/gpu-scheduler-policy`` annotation, on the chain the run takes
    as the cluster default (``Defaults.gpu_policy``, the only default that differs
    between the runs of one command). So each manifest with its name left out is read
    once, under the first defaults seen, and its request is reused with the pod's key
    and, without the annotation, the run's chain (``dataclasses.replace``); an annotated
    manifest is read once per default chain. ``reuse=False`` reads every pod afresh.
    """

    def __init__(self, *, reuse: bool = True) -> None:
        self.reuse = reuse
        # Manifest (JSON, name blanked) -> its request under the first defaults, key "".
        self._first: dict[bytes, PodRequest] = {}
        # (manifest, default chain) -> request, key "": annotated manifests.
        self._annotated: dict[tuple[bytes, Chain], PodRequest] = {}
        self._defaults: tuple[NodePolicy, DeviceConfig] | None = None
        self._last: Defaults | None = None

    @staticmethod
    def content(manifest: PodManifest) -> bytes:
        """What identifies the manifest but for its name: its JSON, the name blanked."""
        return msgspec.json.encode(msgspec.structs.replace(
            manifest, metadata=msgspec.structs.replace(manifest.metadata, name="")))

    def signature(self, manifest: PodManifest, defaults: Defaults,
                  content: bytes | None = None) -> PodRequest:
        """The manifest's request with the key left empty; ``content``: its ``content``,
        when known. Raises ``PodRejected`` as ``parse_pod`` does (not kept: rare)."""
        if not self.reuse:
            return replace(parse_pod(manifest, defaults), key="")
        if content is None:
            content = self.content(manifest)
        if defaults is not self._last:
            if self._defaults is None:
                self._defaults = (defaults.node_policy, defaults.device)
            elif self._defaults != (defaults.node_policy, defaults.device):
                raise ValueError("Parses: one node policy and device configuration each")
            self._last = defaults
        annotated = GPU_POLICY_ANNOTATION in (manifest.metadata.annotations or {})
        found = (self._annotated.get((content, defaults.gpu_policy)) if annotated
                 else self._first.get(content))
        if found is None:
            found = replace(parse_pod(manifest, defaults), key="")
            if annotated:
                self._annotated[(content, defaults.gpu_policy)] = found
            else:
                self._first[content] = found
        elif not annotated and found.chain != defaults.gpu_policy:
            found = replace(found, chain=defaults.gpu_policy)
        return found


class _Requests:
    """Distinct requests (all but the pod's name), their demand and card needs."""

    def __init__(self, snapshot: Snapshot, parses: Parses) -> None:
        self.snapshot = snapshot
        self.parses = parses
        self.kinds: dict[PodRequest, int] = {}
        # Manifest content (Parses.content) -> request (key ""), kind and demand; not
        # with reuse off.
        self.by_content: dict[bytes, tuple[PodRequest, int, float]] = {}
        self.examples: list[PodRequest] = []
        self.counts: list[int] = []
        self.mean_memory = float(snapshot.memory.mean()) if len(snapshot.devices) else 1.0

    def submission(self, manifest: PodManifest, defaults: Defaults, arrival: float,
                   duration: float | None) -> _Submission:
        namespace = manifest.namespace
        # A manifest seen before in this run (but for its name) is the same request, of
        # the same kind and demand: one lookup, and the pod's key set.
        content = Parses.content(manifest) if self.parses.reuse else None
        known = self.by_content.get(content) if content is not None else None
        if known is None:
            try:
                signature = self.parses.signature(manifest, defaults, content)
            except PodRejected as error:
                return _Submission(error, namespace, -1, arrival, duration, 0.0)
            kind = self.kinds.get(signature)
            if kind is None:
                kind = self.kinds[signature] = len(self.examples)
                self.examples.append(_keyed(signature, manifest.key))
                self.counts.append(0)
            demand = sum(c.cards * self.share(c) for c in signature.containers
                         if not c.is_init)
            known = (signature, kind, demand)
            if content is not None:
                self.by_content[content] = known
        signature, kind, demand = known
        self.counts[kind] += 1
        request = _keyed(signature, manifest.key)
        return _Submission(request, namespace, kind, arrival, duration, demand)

    def share(self, container: ContainerRequest) -> float:
        """The share of one card a container takes: its cores or its memory, the larger."""
        memory = (container.memory_percent / 100 if container.memory_mib is None
                  else container.memory_mib / self.mean_memory)
        return min(max(container.cores / 100, memory), 1.0)


class _CardNeeds:
    """Per distinct request, what its first GPU container needs of each card: a
    necessary condition of the core's card checks, vectorised over requests."""

    def __init__(self, requests: _Requests) -> None:
        firsts = [r.gpu_containers[0] if r.wants_gpu else None for r in requests.examples]
        self.cards: IntArray = np.array([c.cards if c else 0 for c in firsts], dtype=np.int64)
        self.cores: IntArray = np.array([c.cores if c else 0 for c in firsts], dtype=np.int64)
        self.memory_mib: IntArray = np.array(
            [c.memory_mib if c and c.memory_mib is not None else -1 for c in firsts],
            dtype=np.int64)
        self.memory_percent: IntArray = np.array(
            [c.memory_percent if c else 0 for c in firsts], dtype=np.int64)
        self.mutex: BoolArray = np.array([r.chain.mutex for r in requests.examples],
                                         dtype=np.bool_)

    def may_fit(self, snapshot: Snapshot, kinds: IntArray, nodes: list[int]) -> BoolArray:
        """For each of ``kinds``: whether some node of ``nodes`` has enough cards that
        pass the cores, memory, slots, health and mutex checks."""
        cards = np.concatenate([np.arange(snapshot.start[n], snapshot.start[n + 1])
                                for n in nodes])
        offsets = np.cumsum([0, *(int(snapshot.node_cards[n]) for n in nodes[:-1])])
        used = snapshot.used[cards]
        usedcores = snapshot.usedcores[cards]
        cores = snapshot.cores[cards]
        memory = snapshot.memory[cards]
        free_memory = memory - snapshot.usedmem[cards]
        open_card = (snapshot.healthy[cards] & ~snapshot.cordoned[cards]
                     & (used < snapshot.count[cards]))
        want_cores = self.cores[kinds][:, None]
        want_mib = self.memory_mib[kinds][:, None]
        want_memory = np.where(want_mib >= 0, want_mib,
                               memory[None, :] * self.memory_percent[kinds][:, None] // 100)
        passes = (open_card[None, :]
                  & (cores - usedcores >= want_cores)
                  & (free_memory[None, :] >= want_memory)
                  & ((want_cores < 100) | (used == 0)[None, :])
                  & ((want_cores > 0) | (usedcores < cores)[None, :])
                  & (~self.mutex[kinds][:, None] | (used == 0)[None, :]))
        per_node = np.add.reduceat(passes.astype(np.int64), offsets, axis=1)
        return np.asarray((per_node >= self.cards[kinds][:, None]).any(axis=1), dtype=np.bool_)


class _Fragmentation:
    """Weng et al.'s fragmentation of each node for the workload's typical pods."""

    def __init__(self, snapshot: Snapshot, requests: _Requests) -> None:
        self.snapshot = snapshot
        shapes: Counter[tuple[int, float, int]] = Counter()
        type_masks: dict[int, BoolArray] = {}
        for request, count in zip(requests.examples, requests.counts, strict=True):
            if not request.wants_gpu:
                continue
            first = request.gpu_containers[0]
            mask = PodView(snapshot, request).type_ok
            mask_id = -1
            if mask is not None:
                mask_id = next((k for k, m in type_masks.items() if np.array_equal(m, mask)),
                               len(type_masks))
                type_masks.setdefault(mask_id, mask)
            shapes[(first.cards, requests.share(first), mask_id)] += count
        ordered = sorted(shapes.items())
        total = sum(shapes.values())
        self.weight: FloatArray = np.array([n / total for _, n in ordered], dtype=np.float64)
        self.cards: IntArray = np.array([s[0] for s, _ in ordered], dtype=np.int64)
        self.share: FloatArray = np.array([s[1] for s, _ in ordered], dtype=np.float64)
        everywhere = np.ones(len(snapshot.devices), dtype=np.bool_)
        self.type_ok: BoolArray = np.array(
            [type_masks.get(s[2], everywhere) for s, _ in ordered],
            dtype=np.bool_).reshape(len(ordered), len(snapshot.devices))
        self.threshold: FloatArray = self.share - _SHARE_TOLERANCE
        # What ``update`` takes per card and does not change in a replay (which books and
        # frees cards, and marks none unhealthy or cordoned): the capacities with a zero
        # read as 1 (such a card is closed, its share set to 0 whatever the quotient), and
        # the cards closed for good. ``update`` runs after every booking (a sixth of a
        # replay's time on openb): it divides as ``common.core.fleet.ratio`` does, so gives
        # the same figures to the last bit as before, with half the numpy calls.
        self.cores_or_one = np.where(snapshot.cores > 0, snapshot.cores, 1)
        self.memory_or_one = np.where(snapshot.memory > 0, snapshot.memory, 1)
        self.closed_for_good: BoolArray = ~snapshot.healthy | snapshot.cordoned \
            | (snapshot.cores == 0) | (snapshot.memory == 0)
        # A node's fragmentation depends on its cards' usage and on what does not change
        # in a replay (capacities, slots, the cards closed for good, the shapes' GPU types):
        # nodes alike in the latter share a class, and each (class, usage) is worked out
        # once. The usages repeat (openb: a chain books 6,600 times, on some 2,300 distinct
        # states), so most updates are one lookup, and give the float computed before.
        classes: dict[bytes, int] = {}
        self.node_class: list[int] = []
        for node in range(len(snapshot.node_names)):
            where = snapshot.node_slice(node)
            fixed = b"".join(array[where].tobytes() for array in (
                self.cores_or_one, self.memory_or_one, snapshot.count, self.closed_for_good,
                np.ascontiguousarray(self.type_ok[:, where])))
            self.node_class.append(classes.setdefault(fixed, len(classes)))
        self.known: dict[tuple[int, bytes, bytes, bytes], float] = {}
        self.node_fragment: FloatArray = np.zeros(len(snapshot.node_names), dtype=np.float64)
        for node in range(len(snapshot.node_names)):
            self.update(node)

    def update(self, node: int) -> None:
        if not len(self.weight):
            return
        lay = self.snapshot
        where = lay.node_slice(node)
        state = (self.node_class[node], lay.usedcores[where].tobytes(),
                 lay.usedmem[where].tobytes(), lay.used[where].tobytes())
        fragment = self.known.get(state)
        if fragment is None:
            fragment = self.known[state] = self._fragment(where)
        self.node_fragment[node] = fragment

    def _fragment(self, where: slice) -> float:
        """Weng et al.'s fragmentation of the cards ``where`` (one node's) as they are."""
        lay = self.snapshot
        # Each card's free share: the smaller of its free cores and free memory; none
        # when its slots are taken, it is unhealthy or cordoned.
        free = np.minimum(1.0 - lay.usedcores[where] / self.cores_or_one[where],
                          1.0 - lay.usedmem[where] / self.memory_or_one[where])
        free[(lay.used[where] >= lay.count[where]) | self.closed_for_good[where]] = 0.0
        np.clip(free, 0.0, 1.0, out=free)
        usable = self.type_ok[:, where] & (free[None, :] >= self.threshold[:, None])
        fits = usable.sum(axis=1) >= self.cards
        stranded = np.where(fits, (free[None, :] * ~usable).sum(axis=1), free.sum())
        return float(self.weight @ stranded)

    def value(self, capacity: int) -> float:
        return float(self.node_fragment.sum()) / capacity if capacity else 0.0


class _Replay:
    """The mutable state of one run."""

    def __init__(self, fleet: Fleet, requests: _Requests, capacity: int,
                 all_or_nothing: bool = True) -> None:
        self.fleet = fleet
        self.all_or_nothing = all_or_nothing
        self.groups: dict[str, _Group] = {}
        # Whole groups that did not fit, all or nothing: (-priority, whole_at, key).
        self.waiting_groups: list[tuple[int, int, str]] = []
        # GPU demand (cards, a share of one for a sharing pod) held by the placed members
        # of groups not yet whole, and its integral over time.
        self.partial_demand = 0.0
        self.idle_gpu_seconds = 0.0
        self.clock = 0.0
        self.snapshot = fleet.snapshot
        self.requests = requests
        self.capacity = capacity
        self.total_cores = int(self.snapshot.cores.sum())
        # The cores booked over the whole fleet, followed booking by booking from the
        # booked node's sum: the allocation is read after every pod, and summing the
        # fleet's 6,000 cards (openb) twice a pod cost a twentieth of a replay.
        self.used_cores = int(self.snapshot.usedcores.sum())
        self.needs = _CardNeeds(requests)
        self.fragmentation = _Fragmentation(self.snapshot, requests)
        self.departures: list[tuple[float, int]] = []
        self.submissions: list[_Submission] = []
        # Waiting pods (submission positions) per distinct request, in arrival order.
        self.waiting: dict[int, deque[int]] = {}
        self.samples: list[Sample] = []
        self.waits: list[float] = []
        self.refused: Counter[str] = Counter()
        # Namespaces with a quota: a departure there may let their waiting pods fit
        # anywhere.
        self.quota_namespaces = frozenset(quota.namespace for quota in fleet.quotas.quotas())
        self.pods_in: Counter[str] = Counter()
        self.placed_in: Counter[str] = Counter()
        self.refused_for_quota_in: Counter[str] = Counter()
        self.refused_otherwise_in: Counter[str] = Counter()
        self.peak_allocation = 0.0
        self.arrived = 0.0
        self.mig_instances: Counter[str] = Counter()

    def run(self, submissions: list[_Submission],
            progress: Callable[[int, int], None] | None) -> None:
        self.submissions = submissions
        total = len(submissions)
        every = max(total // 100, 1)
        for position, submission in enumerate(submissions):
            while self.departures and self.departures[0][0] <= submission.arrival:
                self._depart_next()
            self._advance(submission.arrival)
            self._arrive(position, submission)
            if progress is not None and (position + 1) % every == 0:
                progress(position + 1, total)
        while self.departures and (self.waiting or self.waiting_groups):
            self._depart_next()
        self._refuse_waiting()
        self._refuse_waiting_groups()
        if progress is not None:
            progress(total, total)

    def _allocation(self) -> float:
        return self.used_cores / self.total_cores if self.total_cores else 0.0

    def _book(self, position: int, allocation: Allocation) -> None:
        """Book the cards of the pod at ``position``, and follow what they change."""
        node = self.snapshot.node_position[allocation.node]
        before = self.snapshot.node_usedcores.item(node)
        self.fleet.allocate(str(position), allocation)
        self.used_cores += self.snapshot.node_usedcores.item(node) - before
        self.fragmentation.update(node)

    def _free(self, position: int) -> int | None:
        """Free the cards of the pod at ``position``, and follow what that changes; the
        node freed, None when the pod held no card."""
        allocation = self.fleet.allocation(str(position))
        if allocation is None:
            return None
        node = self.snapshot.node_position[allocation.node]
        before = self.snapshot.node_usedcores.item(node)
        self.fleet.release(str(position))
        self.used_cores += self.snapshot.node_usedcores.item(node) - before
        self.fragmentation.update(node)
        return node

    def _advance(self, now: float) -> None:
        """Time moves to ``now``: the cards partial groups hold count as idle meanwhile."""
        if now > self.clock:
            self.idle_gpu_seconds += self.partial_demand * (now - self.clock)
            self.clock = now

    def _arrive(self, position: int, submission: _Submission) -> None:
        self.arrived += submission.demand
        self.pods_in[submission.namespace] += 1
        request = submission.request
        group = self._group_of(position, submission)
        if isinstance(request, PodRejected):
            self.refused[type(request).__name__] += 1
            self.refused_otherwise_in[submission.namespace] += 1
        elif group is not None and self.all_or_nothing:
            if len(group.arrived) == group.count:
                group.whole_at = position
                if not self._try_group(group, submission.arrival):
                    heapq.heappush(self.waiting_groups,
                                   (-group.priority, group.whole_at, group.key))
        elif not request.wants_gpu:
            self.waits.append(0.0)
            self.placed_in[submission.namespace] += 1
            if group is not None:
                self._member_placed(position, submission.arrival)
        elif self.waiting.get(submission.kind):
            # An identical request already waits: it fits nowhere, nor does this one.
            self.waiting[submission.kind].append(position)
        elif not self._try(position, submission.arrival, None):
            self.waiting[submission.kind] = deque([position])
        self.samples.append(Sample(
            time=submission.arrival,
            arrived=self.arrived / self.capacity if self.capacity else 0.0,
            allocation=self._allocation(),
            fragmentation=self.fragmentation.value(self.capacity)))

    def _group_of(self, position: int, submission: _Submission) -> _Group | None:
        """The arriving pod's group, with the pod counted among its arrivals."""
        if submission.group is None:
            return None
        group = self.groups.get(submission.group)
        if group is None:
            group = self.groups[submission.group] = _Group(
                submission.group, submission.group_count, submission.priority)
        group.arrived.append(position)
        return group

    def _try_group(self, group: _Group, now: float) -> bool:
        """Place every member of the whole ``group`` at once, or none; whether it was
        placed. A malformed member keeps the group from ever starting."""
        requests: list[PodRequest] = []
        for position in group.arrived:
            request = self.submissions[position].request
            if isinstance(request, PodRejected):
                return False
            requests.append(request)
        if not self._group_fits(requests):
            return False
        placement = place_group(self.fleet, group.key, requests)
        if not placement.placed:
            return False
        by_key = {request.key: position
                  for request, position in zip(requests, group.arrived, strict=True)}
        for decision in placement.decisions:
            position = by_key[decision.pod]
            if decision.allocation is not None and decision.node is not None:
                self._count_instances(decision)
                self._book(position, decision.allocation)
            submission = self.submissions[position]
            self.waits.append(now - submission.arrival)
            self.placed_in[submission.namespace] += 1
            group.placed.append(position)
        self.peak_allocation = max(self.peak_allocation, self._allocation())
        self._start(group, now)
        return True

    def _group_fits(self, requests: list[PodRequest]) -> bool:
        """Whether ``place_group`` would place these members: the same decisions in the same
        order on a copy of the fleet, stopped at the first member that fits nowhere and
        without wording why (``place_group`` tries every member and words the refusal,
        which a group waiting through hundreds of departures would pay each time)."""
        ordered = member_order(requests)
        if not decide(self.fleet, ordered[0]).scheduled:
            return False  # the common case under load, without copying the fleet
        trial = self.fleet.copy()
        for member in ordered:
            decision = decide(trial, member)
            if not decision.scheduled:
                return False
            if decision.allocation is not None:
                trial.allocate(member.key, decision.allocation)
        return True

    def _member_placed(self, position: int, now: float) -> None:
        """One at a time: a member of a group placed; the group starts when it is the
        last, else its cards are held idle until then."""
        submission = self.submissions[position]
        group = self.groups[str(submission.group)]
        group.placed.append(position)
        if len(group.placed) == group.count:
            self._start(group, now)
        else:
            self.partial_demand += submission.demand

    def _start(self, group: _Group, now: float) -> None:
        """Every member of ``group`` placed: their durations run from ``now``."""
        group.started = True
        for position in group.placed:
            submission = self.submissions[position]
            if not self.all_or_nothing and position != group.placed[-1]:
                self.partial_demand -= submission.demand
            if submission.duration is not None:
                heapq.heappush(self.departures, (now + submission.duration, position))
        if self.partial_demand < _SHARE_TOLERANCE:
            self.partial_demand = 0.0  # no float residue left from the sums

    def _try(self, position: int, now: float, nodes: frozenset[str] | None) -> bool:
        """Decide one pod and place it if it fits; whether it was placed."""
        submission = self.submissions[position]
        request = submission.request
        assert isinstance(request, PodRequest)
        decision = decide(self.fleet, request, nodes=nodes)
        if decision.allocation is None or decision.node is None:
            return False
        self._count_instances(decision)
        self._book(position, decision.allocation)
        self.peak_allocation = max(self.peak_allocation, self._allocation())
        self.waits.append(now - submission.arrival)
        self.placed_in[submission.namespace] += 1
        if submission.group is not None:
            self._member_placed(position, now)
        elif submission.duration is not None:
            heapq.heappush(self.departures, (now + submission.duration, position))
        return True

    def _count_instances(self, decision: Decision) -> None:
        for cards in decision.cards:
            for card in cards:
                if card.instance is not None:
                    self.mig_instances[card.instance.profile] += 1

    def _depart_next(self) -> None:
        """Every departure at the earliest departure time, then the waiting pods retried
        on the nodes they freed."""
        now = self.departures[0][0]
        self._advance(now)
        freed: set[int] = set()
        refunded: set[str] = set()
        while self.departures and self.departures[0][0] == now:
            _, position = heapq.heappop(self.departures)
            node = self._free(position)
            if node is not None:
                freed.add(node)
                namespace = self.submissions[position].namespace
                if namespace in self.quota_namespaces:
                    refunded.add(namespace)
        if freed and self.waiting_groups:
            self._retry_groups(now)
        if freed and self.waiting:
            self._retry(sorted(freed), now, refunded)

    def _retry_groups(self, now: float) -> None:
        """Try the waiting whole groups again, highest priority first, then in the order
        they became whole; one that does not fit stops none behind it."""
        still: list[tuple[int, int, str]] = []
        for entry in sorted(self.waiting_groups):
            if not self._try_group(self.groups[entry[2]], now):
                still.append(entry)
        self.waiting_groups = still  # sorted, so still a heap

    def _retry(self, freed: list[int], now: float, refunded: set[str]) -> None:
        """Try the waiting pods again after departures freed ``freed`` nodes and refunded
        the quotas of the ``refunded`` namespaces."""
        kinds = list(self.waiting)
        may_fit = self.needs.may_fit(self.snapshot, np.array(kinds, dtype=np.int64), freed)
        names = frozenset(self.snapshot.node_names[n] for n in freed)
        # Heads of the candidate requests, merged by arrival order; with whether they
        # are tried on every node.
        heads: list[tuple[int, int, bool]] = []
        for kind, fits in zip(kinds, may_fit.tolist(), strict=True):
            anywhere = self.requests.examples[kind].subject.namespace in refunded
            if fits or anywhere:
                heads.append((self.waiting[kind][0], kind, anywhere))
        heapq.heapify(heads)
        while heads:
            position, kind, anywhere = heapq.heappop(heads)
            if not self._try(position, now, None if anywhere else names):
                continue  # identical requests behind it fail the same way
            queue = self.waiting[kind]
            queue.popleft()
            if queue:
                heapq.heappush(heads, (queue[0], kind, anywhere))
            else:
                del self.waiting[kind]

    def _refuse_waiting(self) -> None:
        for kind, queue in self.waiting.items():
            request = self.requests.examples[kind]
            decision = decide(self.fleet, request)
            reason = removed_most((decision.failures or {}).values()) or NO_NODE
            self.refused[reason] += len(queue)
            refused_in = (self.refused_for_quota_in if reason == QUOTA_REASON
                          else self.refused_otherwise_in)
            refused_in[request.subject.namespace] += len(queue)
        self.waiting.clear()

    def _refuse_waiting_groups(self) -> None:
        """All or nothing: the members of groups never placed, for want of room or of
        members."""
        if not self.all_or_nothing:
            return
        for group in self.groups.values():
            if group.started:
                continue
            reason = GROUP_NOT_FIT if group.whole_at >= 0 else GROUP_INCOMPLETE
            for position in group.arrived:
                submission = self.submissions[position]
                if isinstance(submission.request, PodRejected):
                    continue  # already counted, by its own error
                self.refused[reason] += 1
                self.refused_otherwise_in[submission.namespace] += 1
        self.waiting_groups.clear()

    def by_namespace(self) -> dict[str, NamespaceTally]:
        return {namespace: NamespaceTally(
                    pods=self.pods_in[namespace], placed=self.placed_in[namespace],
                    refused_for_quota=self.refused_for_quota_in[namespace],
                    refused_otherwise=self.refused_otherwise_in[namespace])
                for namespace in sorted(self.pods_in)}
