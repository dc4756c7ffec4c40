"""The verbs: what kube-scheduler (or the standalone pending loop) asks. /filter
books cards on one node, /prioritize ranks nodes, /bind makes the booking durable on the
pod; ``explain`` previews /filter and books nothing.

They speak the service's words: a pod and the names of the nodes offered in, a decision
out (``Filtered``, ``NodeScore``, a bind's refusal). kube-scheduler's extender/v1 shapes
are the HTTP face's (``scheduler.web``), which decodes them and writes the answers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from common.core import (
    Allocation,
    Decision,
    NodePolicy,
    PodManifest,
    PodRejected,
    PodRequest,
    decision_document,
    parse_pod,
    rejected,
)
from common.core.annotations import (
    ALLOCATED_ANNOTATION,
    BIND_PHASE_ANNOTATION,
    BIND_TIME_ANNOTATION,
    TIME_ANNOTATION,
    TO_ALLOCATE_ANNOTATION,
    VGPU_NODE_LABEL,
    allocation_annotations,
)
from common.core.events import (
    BINDING_FAILED,
    BINDING_SUCCEED,
    FILTERING_FAILED,
    FILTERING_SUCCEED,
    binding_succeed,
    filtering_failures,
    filtering_succeed,
    no_node_summary,
)
from common.core.fiterror import plural
from common.core.fleet import NODE_WEIGHTS, score_max
from common.core.groups import GroupPlacement, GroupRef, check_count, group_of
from common.core.mig import MIG_ALLOCATIONS_ANNOTATION
from common.core.pod import DEFAULT_NAMESPACE
from common.core.quota import admission_denial
from common.core.reasons import NodeRefusal, removed_most
from common.core.workloads import claimed_workload
from common.locks import KeyedLocks
from scheduler.cluster import ClusterError
from scheduler.metrics import Metrics
from scheduler.service.shared import (
    FilterNodes,
    Reports,
    ServicePart,
    Shared,
    Unschedulable,
    in_slices,
)
from scheduler.state import NODE_STALE, Starving, Tried, Waiting

logger = logging.getLogger(__name__)

MAX_PRIORITY = 10
ADJUSTED_EVENT = "RequestAdjusted"
"""The Warning Event naming the figures of a pod read otherwise than written
(``PodRequest.adjusted``: a share above 100 read as 100, ...)."""
GROUP_TRIES = 3
"""Placements of a group per /filter when the fleet keeps changing under each (pods bound
outside the daemon, a node's cards changed): then its members are tried again later."""
NODE_SCORE_MAX = score_max(NODE_WEIGHTS)
"""/prioritize scales a node's score from 0..NODE_SCORE_MAX to 0..MAX_PRIORITY."""
GROUP_AHEAD = "GroupAhead"
"""A node withheld from a pod for the group gone ahead of it, which would use it."""
NODE_REFUSALS_TOLD = frozenset({NODE_STALE, GROUP_AHEAD})
"""The refusals of a node before the core judged its cards that get HAMi's per-reason
``FilteringFailed`` Event, as the core's reasons do: they say something of that node.
Not ``NodeUnknown`` (a node without GPU inventory: in a mixed cluster most nodes; HAMi
writes no Event for its ``node unregistered`` either), nor the refusals every node gets
for the pod's own sake (``PodAlreadyBound``, the group's reasons): those are in the
summary's sentence."""


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1e3


@dataclass(frozen=True, slots=True)
class Filtered:
    """What /filter decided for one pod among the nodes offered (the HTTP face writes it
    as kube-scheduler's ExtenderFilterResult)."""

    passing: Sequence[str] | None
    """The nodes the pod may go to, in the order answered; None when no node is answered:
    the verb did not decide (``error``) or refused the pod itself (``unresolvable``)."""
    failed: dict[str, str] = field(default_factory=dict)
    """Each node refused, with its reason."""
    unresolvable: dict[str, str] = field(default_factory=dict)
    """Each node refused for the pod's own sake (a malformed pod): no node will do."""
    error: str = ""
    """Why the verb did not decide: the ledger is being rebuilt, or this daemon stands by."""
    every_node: bool = False
    """The pod asks for no GPU: every node offered passes, answered as it was sent."""
    decision: Decision | None = None
    """The core's decision, where one was taken."""


class NodeScore(NamedTuple):
    """One node's score by /prioritize, 0..``MAX_PRIORITY``."""

    node: str
    score: int


class Verbs(ServicePart):
    """The extender verbs over the shared live state."""

    def __init__(self, shared: Shared, metrics: Metrics, reports: Reports, *,
                 on_unschedulable: Unschedulable) -> None:
        """``on_unschedulable`` is told of every GPU pod /filter found no node for, with
        the nodes it was offered (preemption acts on it)."""
        super().__init__(shared, metrics, reports)
        self._on_unschedulable = on_unschedulable
        self._wall_clock = shared.wall_clock
        self._binding = KeyedLocks()

    def refusal(self) -> str | None:
        """Why this daemon may not decide now (a standalone standby: the lease's holder);
        None when it may. The one place the verbs' callers and the verbs themselves ask
        the leadership: the HTTP face before it reads a body (503), /filter on entering
        and again with its decision taken."""
        return self.shared.leadership.refusal()

    async def filter(self, pod: PodManifest, names: Sequence[str]) -> Filtered:
        """Where ``pod`` may go among the nodes ``names`` (kept as given: a tuple sent
        again is known by its identity), its cards reserved on the node chosen."""
        started = time.perf_counter()
        # Asked here, with nothing awaited before the booking, for the pending loop and
        # the HTTP face alike: a daemon paused since the HTTP face asked (by the kernel,
        # say) may have lost the lease meanwhile.
        if (standby := self.refusal()) is not None:
            return Filtered(None, error=standby)
        if not self.shared.ready:
            return Filtered(None, error="pyhami is rebuilding its ledger; try again")
        try:
            request = parse_pod(pod, self.settings.defaults)
            group = group_of(pod)
            workload = claimed_workload(pod.metadata.annotations or {})
        except PodRejected as error:
            decision = rejected(pod.key, str(error))
            self._count("filter", decision)
            self.shared.in_background(self._after_filter(
                pod, decision, _ms_since(started), self._wall_clock(), offered=len(names)))
            unresolvable = {name: f"PodRejected: {error}" for name in names}
            return Filtered(None, unresolvable=unresolvable, decision=decision)
        if not request.wants_gpu:
            return Filtered(names, every_node=True)
        self.shared.pods.filtered(request.key, pod)
        if group is None:
            # Waits only while a group is placed in slices (which books on the same cards).
            async with self.shared.booking:
                held = (None if workload is None
                        else self._workload_decision(request, *workload, names))
                ahead = self._ahead_of(pod, None) if held is None else None
                offered, withheld = self._offered(names, ahead)
                decision = held or self.state.cache.filter(request, offered, self._clock(),
                                                           explain_chosen=True)
            if ahead is not None and withheld:
                decision = self._behind(request, decision, withheld, ahead)
        else:
            decision = await self._filter_member(pod, request, group, names)
        decided_at = self._wall_clock()
        # And once more with the decision taken: a daemon paused while deciding has it
        # timed after the pause, and counts it only if the lease still holds by then.
        if (standby := self.refusal()) is not None:
            self.state.cache.release_reservation(request.key)
            return Filtered(None, error=standby)
        if decision.node is not None:
            self.reports.mark_changed(decision.node)
            self.shared.pods.scheduled(request.key)
        else:
            self.shared.pods.unschedulable(request.key, pod.namespace, pod.metadata.name)
            if group is None:
                # Never for one member of a group: evicting for it alone would free room
                # its group may still not fit in (groups are not preempted for; docs).
                self._on_unschedulable(pod, request, names)
        self._count("filter", decision)
        self.metrics.filter_duration.observe(time.perf_counter() - started)
        # Written once, for the answer and the decision event both.
        failed = decision.failed_nodes or {}
        self.shared.in_background(self._after_filter(
            pod, decision, _ms_since(started), decided_at, request, offered=len(names),
            failed_nodes=failed))
        answered = [] if decision.node is None else self._answered(decision, group)
        return Filtered(answered, failed=failed, decision=decision)

    def _answered(self, decision: Decision, group: GroupRef | None) -> list[str]:
        """The nodes /filter answers for a placed pod: the one chosen, or with
        ``--filter-nodes all`` every node that holds it (the chosen one first, its cards
        reserved there; /bind places the cards on whichever node kube-scheduler takes).
        A group's member is answered the node its cards are held on: the group was
        placed as a whole."""
        assert decision.node is not None
        if self.settings.filter_nodes is FilterNodes.ONE or group is not None \
                or not decision.fitting:
            return [decision.node]
        return list(decision.fitting)

    # Kueue workloads: the cards the admission check held for the pods ------------------

    def _workload_decision(self, request: PodRequest, workload: str, pod_set: str,
                           names: Sequence[str]) -> Decision | None:
        """A pod of a Kueue workload the admission check placed goes where the cards held
        for one of its pod set are (``HeldWorkloads.claim``): their node. None when none
        is held for it (their time passed, the workload was placed before this daemon
        led, the pod asks otherwise than its pod set did) or kube-scheduler did not offer
        their node (a node selector pyhami did not read): it is then placed alone."""
        cache = self.state.cache
        if request.key in cache.bound:
            return None  # the cache answers a bound pod its node
        namespace = request.key.partition("/")[0]
        placeholder = self.state.workloads.claim(f"{namespace}/{workload}", pod_set, request)
        if placeholder is None:
            return None
        held = cache.reservation(request.key) or cache.hand_over(placeholder, request.key,
                                                                 self._clock())
        if held is None:
            return None
        if names and held.node not in names:
            logger.info("pod %s: the cards held for it on %s are on a node kube-scheduler "
                        "did not offer; placed alone", request.key, held.node)
            cache.release_reservation(request.key)
            return None
        return Decision(pod=request.key, scheduled=True, node=held.node, allocation=held,
                        failures={})

    # Groups: every member placed at once, or none (kube-scheduler's Permit) ---------------

    async def _filter_member(self, pod: PodManifest, request: PodRequest, group: GroupRef,
                             names: Sequence[str]) -> Decision:
        """The decision for a member of ``group``: its node when the group was placed
        together; when the group counts all its members, every waiting member placed at
        once, or none; refused while members are missing. The group's placement runs in
        slices of the loop's time (``in_slices``), under the booking lock."""
        groups = self.state.groups
        groups.note(group, request.key, pod, request, bound=False)
        count, unknown = await self._group_count(group)
        if count is None:
            return self._member_refused(request, names, "GroupWaiting", unknown, unknown)
        held = self.state.cache.reservation(request.key)
        if held is not None and groups.held(group.key):
            return self._held_decision(request, held, names, group)
        if groups.bound_members(group.key) >= count:
            # The group started already: a member that comes late is placed alone.
            async with self.shared.booking:
                return self.state.cache.filter(request, names, self._clock(),
                                                  explain_chosen=True)
        seen = groups.seen(group.key)
        if seen < count:
            elsewhere = groups.elsewhere(group.key)
            hint = (f" ({elsewhere} pods of a group {group.name} are in other namespaces: a "
                    "group's members share one namespace)" if elsewhere else "")
            return self._member_refused(
                request, names, "GroupWaiting", f"group {group.name} has {seen} of {count} "
                f"members", f"group {group.name}: waiting for its members: {seen} of {count} "
                f"exist in namespace {group.namespace}{hint}; none is given cards before all "
                "are")
        waiting = groups.waiting(group.key)
        async with self.shared.booking:
            ahead = self._ahead_of(pod, group.key)
            offered, withheld = self._offered(names, ahead)
            placement = await self._place_group(group, request.key, waiting, offered,
                                                sent=len(names))
        if isinstance(placement, Tried):
            refused = self._member_refused(request, offered, placement.reason,
                                           placement.detail, placement.message)
            if ahead is not None and withheld:
                return self._behind(request, refused, withheld, ahead)
            return refused
        groups.unblocked(group.key)
        groups.hold(group.key, self._clock() + self.settings.group_ttl)
        logger.info("group %s: its %d waiting members placed together: %s", group.key,
                    len(placement.decisions),
                    ", ".join(f"{d.pod} on {d.node}" for d in placement.decisions))
        for decision in placement.decisions:
            if decision.node is not None:
                self.reports.mark_changed(decision.node)
        # The other members were refused while the group was not whole: they are asked for
        # again, and their /filter answers the node their cards are held on.
        self.reports.retry_waiting()
        mine = next(d for d in placement.decisions if d.pod == request.key)
        return self._held_decision(request, mine.allocation, names, group,
                                   fitting=mine.fitting) \
            if mine.allocation is not None else mine

    async def _place_group(self, group: GroupRef, asking: str, waiting: list[Waiting],
                           offered: Sequence[str], *, sent: int) -> GroupPlacement | Tried:
        """Every waiting member of ``group`` placed and reserved together among
        ``offered``, in slices of the loop's time (the caller holds the booking lock); or
        the refusal, which stands while nothing changes (``Groups.last_try``): not fitting
        now, or not even on idle cards. ``sent``: the nodes kube-scheduler sent."""
        groups, cache = self.state.groups, self.state.cache
        offered_key = frozenset(offered)
        tried = groups.last_try(group.key, self._clock(), cache.fleet_changes, offered_key)
        if tried is not None:
            return tried
        members = [member.request for member in waiting]
        for _ in range(GROUP_TRIES):
            changes = cache.fleet_changes
            steps, generation = cache.group_steps(group.name, members, offered,
                                                     self._clock())
            placement = await in_slices(steps)
            if (standby := self.shared.leadership.refusal()) is not None:
                # The lease was lost while the loop ran others: a standby reserves nothing
                # (its reservations were dropped with the lease; filter answers its error).
                return Tried(self._clock(), -1, None, "GroupWaiting", standby, standby)
            if not placement.placed:
                return await self._group_refused(group, asking, waiting, offered, placement,
                                                 changes=changes, sent=sent)
            if cache.reserve_group(placement, generation, self._clock(),
                                      self.settings.group_ttl):
                return placement
        # Pods bound meanwhile (seen on the pod watch) or a node's cards changed while each
        # try ran: the members are tried again on their next /filter.
        return Tried(self._clock(), -1, None, "GroupWaiting",
                     f"group {group.name}: cards changed while it was placed",
                     f"group {group.name}: the cards changed while its members were placed "
                     f"({GROUP_TRIES} tries); it is tried again")

    async def _group_refused(self, group: GroupRef, asking: str, waiting: list[Waiting],
                             offered: Sequence[str], placement: GroupPlacement, *,
                             changes: int, sent: int) -> Tried:
        """A group that did not fit: it goes ahead of others in time only if it would fit
        on idle cards; its refusal is kept (``Groups.tried``) and told to every member
        (``asking``, whose /filter this is, by its own answer; the others in HAMi's summary
        over the ``sent`` nodes of this /filter)."""
        groups, cache = self.state.groups, self.state.cache
        now = self._clock()
        members = [member.request for member in waiting]
        idle = await in_slices(cache.idle_group_steps(group.name, members, offered, now))
        if idle.placed:
            priority = max((m.manifest.spec.priority or 0) for m in waiting) if waiting else 0
            groups.blocked(group.key, now, priority, placement.nodes)
            why = placement.message or f"group {group.name} does not fit"
            tried = Tried(now, changes, frozenset(offered), "GroupDoesNotFit",
                          f"group {group.name}: {placement.fitting} of {len(members)} members "
                          "fit", why)
        else:
            groups.never_fits(group.key)
            self.metrics.groups_never_fit.inc()
            why = (f"group {group.name} can never start on these nodes: even with every card "
                   f"free, {idle.fitting} of {len(members)} members fit (its namespace's "
                   f"quota counted); it waits without holding back other pods; "
                   f"{idle.message or ''}").rstrip("; ")
            tried = Tried(now, changes, frozenset(offered), "GroupNeverFits",
                          f"group {group.name}: {idle.fitting} of {len(members)} members fit "
                          "on idle cards", why)
        groups.tried(group.key, tried)
        logger.info("group %s: %s", group.key, why)
        others = [member.key for member in waiting if member.key != asking]
        for key in others:
            namespace, _, name = key.partition("/")
            self.shared.pods.unschedulable(key, namespace, name)
        # One after the other, in one task: a thousand members' Events at once would queue
        # a thousand requests ahead of everything else the loop serves.
        self.shared.in_background(self._tell_members(others, no_node_summary(sent, why)))
        return tried

    async def _tell_members(self, keys: list[str], message: str) -> None:
        for key in keys:
            namespace, _, name = key.partition("/")
            await self.cluster.record_event(namespace, name, "Warning", FILTERING_FAILED,
                                            message)

    def _ahead_of(self, pod: PodManifest, own_group: str | None) -> Starving | None:
        """The group that goes ahead of ``pod`` now (``Groups.starving``: of the pod's
        priority or higher, not its own); None."""
        starving = self.state.groups.starving(self._clock(), self.settings.group_patience,
                                              self.settings.group_turn)
        if starving is None or starving.ref.key == own_group or \
                (pod.spec.priority or 0) > starving.priority:
            return None
        return starving

    @staticmethod
    def _offered(names: Sequence[str], ahead: Starving | None) -> tuple[Sequence[str],
                                                                        list[str]]:
        """The nodes a pod may be placed on with ``ahead`` going first, and those withheld
        (the nodes the group ahead would use)."""
        if ahead is None or not ahead.claimed:
            return names, []
        claimed = ahead.claimed
        return [n for n in names if n not in claimed], [n for n in names if n in claimed]

    def _behind(self, request: PodRequest, decision: Decision, withheld: Sequence[str],
                ahead: Starving) -> Decision:
        """``decision`` with the nodes withheld for the group ahead refused as such; a pod
        placed nowhere is told it waits behind the group (its Event), and counted."""
        refusal = NodeRefusal(GROUP_AHEAD, f"kept for group {ahead.ref.key}")
        failures = {**(decision.failures or {}), **dict.fromkeys(withheld, refusal)}
        if decision.scheduled:
            return dataclasses.replace(decision, failures=failures)
        self.metrics.held_back.inc()
        left = max(0.0, ahead.until - self._clock())
        message = (f"waiting behind group {ahead.ref.key}, whole and not fitting: for at most "
                   f"{left:.0f}s more, pods of priority {ahead.priority} or lower are not "
                   f"placed on {plural(len(ahead.claimed), 'node')} it would use"
                   + (f"; elsewhere: {decision.message}" if decision.message
                      and len(withheld) < len(failures) else ""))
        return dataclasses.replace(decision, failures=failures, message=message)

    async def _group_count(self, group: GroupRef) -> tuple[int | None, str]:
        """The group's member count, checked; None with the sentence saying why not."""
        disagreement = self.state.groups.disagreement(group.key)
        if disagreement is not None:
            return None, (f"group {group.name}: its members disagree on its member count "
                          f"({disagreement}): none is given cards until they agree")
        count = group.count if group.count is not None else self.state.groups.count(group.key)
        if count is None:
            try:
                stored = await self.cluster.group_size(group)
            except ClusterError as error:
                return None, f"group {group.name}: its PodGroup cannot be read: {error}"
            if stored is None:
                return None, (f"group {group.name}: no PodGroup {group.key} "
                              f"({group.source.value}) to give its member count; the members "
                              "wait for it")
            try:
                count = check_count(f"PodGroup {group.key}", stored)
            except PodRejected as error:
                return None, f"group {group.name}: {error}"
            self.state.groups.set_count(group.key, count)
        return count, ""

    def _held_decision(self, request: PodRequest, held: Allocation, names: Sequence[str],
                       group: GroupRef, *, fitting: Mapping[str, float] | None = None,
                       ) -> Decision:
        """The member goes where the cards held for it are: that node, or none when
        kube-scheduler did not offer it (the group is then released when its time passes).
        ``fitting``: the nodes that held the member in its group's placement, when this
        /filter placed the group (its ``FilteringSucceed`` names them)."""
        if not names or held.node in names:
            return Decision(pod=request.key, scheduled=True, node=held.node, allocation=held,
                            failures={}, fitting=fitting)
        return self._member_refused(
            request, names, "GroupHeldElsewhere", f"its cards are held on {held.node}",
            f"group {group.name}: this member's cards are held on node {held.node}, which "
            "kube-scheduler did not offer (a node selector or taint of this member only?)")

    def _member_refused(self, request: PodRequest, names: Sequence[str], reason: str,
                        detail: str, message: str) -> Decision:
        refusal = NodeRefusal(reason, detail)
        return Decision(pod=request.key, scheduled=False,
                        failures=dict.fromkeys(names, refusal), message=message)

    async def _after_filter(self, pod: PodManifest, decision: Decision, duration_ms: float,
                            decided_at: float, request: PodRequest | None = None, *,
                            offered: int, failed_nodes: dict[str, str] | None = None) -> None:
        """The decision's Events, one after the other in this one task (a refusal's may be
        several: each is an API write), then its report. ``offered``: the nodes
        kube-scheduler sent, HAMi's total in its messages."""
        namespace = pod.namespace
        name = pod.metadata.name
        if decision.ignored_policies:
            message = (f"unknown scheduler policies ignored: {', '.join(decision.ignored_policies)}"
                       f"; evaluating {request.chain if request else 'the default'}")
            logger.warning("pod %s: %s", decision.pod, message)
            await self.cluster.record_event(namespace, name, "Warning", "PolicyIgnored", message)
        # From the request, not the decision: a group member's decision is the group's.
        adjusted = request.adjusted if request is not None else ()
        if adjusted:
            # HAMi reads these figures so without a word (a log line at most): say it where
            # the pod's owner looks.
            message = "request read as HAMi reads it: " + "; ".join(adjusted)
            logger.warning("pod %s: %s", decision.pod, message)
            await self.cluster.record_event(namespace, name, "Warning", ADJUSTED_EVENT, message)
        if decision.node is not None:
            if self.settings.success_events:
                await self.cluster.record_event(
                    namespace, name, "Normal", FILTERING_SUCCEED,
                    filtering_succeed(decision.node, offered, decision.fitting))
        elif decision.message is not None:
            # HAMi's: one Event per reason naming its nodes, then the summary, which carries
            # pyhami's sentence on what was asked and what the nodes have.
            for message in filtering_failures(decision.failures or {}, NODE_REFUSALS_TOLD):
                await self.cluster.record_event(namespace, name, "Warning", FILTERING_FAILED,
                                                message)
            await self.cluster.record_event(namespace, name, "Warning", FILTERING_FAILED,
                                            no_node_summary(offered, decision.message))
        for row in decision.explain or ():
            logger.debug("pod %s node %s card %d (%s): computer score is %.6f%s", decision.pod,
                         row.node, row.index, row.uuid, row.score,
                         f", filtered by {row.filtered_by}" if row.filtered_by else "")
        await self.reports.decided(decision, "filter", duration_ms, decided_at,
                                   failed_nodes=failed_nodes)

    def explain(self, pod: PodManifest,
                node_names: Collection[str] | None = None) -> dict[str, object]:
        """What /filter would decide for ``pod`` now among ``node_names`` (default: every
        node), with every card's selection path.

        Books nothing: for ``pyhami explain`` and the demo.
        """
        try:
            request = parse_pod(pod, self.settings.defaults)
        except PodRejected as error:
            return decision_document(rejected(pod.key, str(error)))
        # A pod that holds cards already is judged as if it held none.
        decision = self.state.cache.preview(request, node_names, self._clock(),
                                               explain=True, describe=True,
                                               holding_nothing=True)
        return decision_document(decision)

    def admission_denial(self, pod: PodManifest) -> str | None:
        """Why the webhook denies a new pod: its fixed GPU requests alone exceed what its
        namespace's quotas leave (the quota's sentence). None when they fit, when the pod
        is malformed (/filter refuses it with its reason) and while the ledger is being
        rebuilt (the usage is not known yet: /filter judges the pod)."""
        if not self.shared.ready:
            return None
        try:
            request = parse_pod(pod, self.settings.defaults)
        except PodRejected:
            return None
        refusal = admission_denial(self.state.fleet.quotas, request)
        return None if refusal is None else refusal.text()

    async def prioritize(self, pod: PodManifest, names: Sequence[str]) -> list[NodeScore]:
        """0..10 for each of ``names``, in their order, by the pod's node policy: binpack
        favours the busiest node."""
        policy = self.settings.defaults.node_policy
        with contextlib.suppress(PodRejected):  # /filter already refused it with its reason
            policy = parse_pod(pod, self.settings.defaults).node_policy
        snapshot = self.state.fleet.snapshot
        scores = snapshot.node_scores()
        result = []
        for name in names:
            position = snapshot.node_position.get(name)
            if position is None:
                result.append(NodeScore(name, 0))
                continue
            fraction = min(float(scores[position]) / NODE_SCORE_MAX, 1.0)
            score = fraction if policy is NodePolicy.BINPACK else 1.0 - fraction
            result.append(NodeScore(name, round(score * MAX_PRIORITY)))
        return result

    async def bind(self, *, namespace: str, name: str, uid: str, node: str) -> str | None:
        """Bind the pod ``namespace``/``name`` (of ``uid``, where known) to ``node`` with
        its cards; None when bound, else why not. One bind of a pod runs at a time.

        A repeated bind to the node the pod is bound to answers success and changes
        nothing; a bind to another node is refused. A failed bind releases only the
        reservation it used, never a pod's bound cards.
        """
        started = time.perf_counter()
        key = f"{namespace or DEFAULT_NAMESPACE}/{name}"
        try:
            async with self._binding.hold(key):
                return await self._bind_exclusively(key, namespace, name, uid, node)
        finally:
            self.metrics.bind_duration.observe(time.perf_counter() - started)

    async def _bind_exclusively(self, key: str, namespace: str, name: str, uid: str,
                                node: str) -> str | None:
        if key in self.state.cache.bound:
            held = self.state.fleet.allocation(key)
            if held is not None and held.node == node:
                return None  # a repeat of the bind that placed it
            where = held.node if held is not None else "another node"
            return self._refuse_bind(namespace, name, f"pod {key} is already bound to {where}")
        allocation: Allocation | None = None
        end_mark = self.shared.pods.end_mark(key)
        try:
            allocation = await self._allocation_on(key, namespace, name, node)
            await self.cluster.bind(namespace, name, uid, node,
                                    self._bind_annotations(allocation),
                                    # HAMi's label: its node monitor selects pods by it.
                                    labels=(None if allocation is None
                                            else {VGPU_NODE_LABEL: node}))
        except ClusterError as error:
            if allocation is not None and self.state.cache.reservation(key) is allocation:
                self.state.cache.release_reservation(key)
                self.metrics.released.labels("bind_failed").inc()
                await self.reports.capacity_changed(node)
            return self._refuse_bind(namespace, name, str(error))
        if self.shared.pods.end_mark(key) != end_mark:
            # The pod was deleted (or finished) while its bind was under way: the watch
            # released its cards already, and confirming now would book them for ever.
            if allocation is not None and self.state.cache.reservation(key) is allocation:
                self.state.cache.release_reservation(key)
            return None
        if allocation is not None:
            self.state.cache.confirm(key, allocation)
        self.state.groups.bound(key)
        self.shared.pods.forget_manifest(key)
        self.metrics.decisions.labels("bind", "bound", "").inc()
        if self.settings.success_events:
            key_namespace, _, key_name = key.partition("/")
            # After the answer, as a refusal's: kube-scheduler waits for no Event.
            self.shared.in_background(self.cluster.record_event(
                namespace, name, "Normal", BINDING_SUCCEED,
                binding_succeed(node, key_namespace, key_name)))
        return None

    def _refuse_bind(self, namespace: str, name: str, why: str) -> str:
        self.metrics.decisions.labels("bind", "failed", BINDING_FAILED).inc()
        # After the answer: kube-scheduler waits for neither the Event nor its API write.
        self.shared.in_background(self.cluster.record_event(
            namespace, name, "Warning", BINDING_FAILED, why))
        return why

    def _bind_annotations(self, allocation: Allocation | None) -> dict[str, str | None]:
        """The allocation annotations (docs/decision-core.md). A pod that holds no cards
        loses any allocation annotation its author wrote: the pod's annotations are the
        ledger's durable record."""
        if allocation is None:
            return {ALLOCATED_ANNOTATION: None, TO_ALLOCATE_ANNOTATION: None,
                    MIG_ALLOCATIONS_ANNOTATION: None}
        now = str(int(self._wall_clock()))
        # A reservation annotation the pod's author wrote goes unless the pod holds MIG
        # instances: the agent would create what it names.
        annotations: dict[str, str | None] = {MIG_ALLOCATIONS_ANNOTATION: None}
        annotations.update(allocation_annotations(allocation.node, allocation.containers))
        annotations.update({TIME_ANNOTATION: now, BIND_PHASE_ANNOTATION: "allocating",
                            BIND_TIME_ANNOTATION: now})
        return annotations

    async def _allocation_on(self, key: str, namespace: str, name: str,
                             node: str) -> Allocation | None:
        """The pod's cards on the node kube-scheduler chose, deciding again if need be;
        None for a pod that asks for no GPU. Raises ``ClusterError`` when it cannot go there.
        """
        held = self.state.cache.reservation(key)
        if held is not None and held.node == node:
            return held
        group = self.state.groups.group_of(key)
        if group is not None and self.state.groups.bound_members(group.key) < (
                self.state.groups.count(group.key) or 0):
            # Decided alone, a member would hold cards its group may never join.
            raise ClusterError(f"pod {key} is a member of group {group.name}, whose cards "
                               "are no longer held together: it is placed with its group")
        manifest = self.shared.pods.manifest(key)
        if manifest is None:
            pod = await self.cluster.get_pod(namespace, name)
            if pod is None:
                raise ClusterError(f"pod {key} no longer exists")
            manifest = pod.manifest
        try:
            request = parse_pod(manifest, self.settings.defaults)
        except PodRejected as error:
            raise ClusterError(str(error)) from None
        if not request.wants_gpu:
            return None
        async with self.shared.booking:
            decision = self.state.cache.filter(request, [node], self._clock())
        if decision.allocation is None:
            failure = (decision.failures or {}).get(node)
            why = failure.text() if failure is not None else "no cards fit"
            raise ClusterError(f"node {node} cannot hold pod {key}: {why}")
        self.reports.mark_changed(node)
        return decision.allocation

    def _count(self, verb: Literal["filter", "bind"], decision: Decision) -> None:
        if decision.reason is not None:
            self.metrics.decisions.labels(verb, "rejected", "PodRejected").inc()
        elif decision.node is not None:
            self.metrics.decisions.labels(verb, "scheduled", "").inc()
        else:
            top = removed_most((decision.failures or {}).values()) or "NoNode"
            self.metrics.decisions.labels(verb, "unschedulable", top).inc()
