"""Preemption: a GPU pod of higher priority gets its cards by evicting the fewest
pods of lower priority (docs/preemption.md).

The choice is the decision core's (``common.core.preemption``); this part feeds it the
pods holding cards, with their priorities, start times and disruption budgets, and acts
on it by one of two ways:

- **kube-scheduler's preempt verb** (``answer``). kube-scheduler calls it with the nodes
  its own dry run chose and the victims it found there (its in-tree filters only: for a
  node pyhami alone rejects it finds none). On a node where it offers victims, pyhami
  answers them if, once they are gone, the pod fits its cards too, else leaves the node
  out: it never adds to victims kube-scheduler found. On a node where it offers none,
  pyhami names the victims itself, among the node's lower-priority pods.
- **the daemon itself** (``refused``). kube-scheduler v1.36 never calls the verb for a
  node only the extender rejected (its dry run fails there first: ``expected at least
  one victim pod``). So when /filter finds no node for a pod that may preempt and
  kube-scheduler has not asked about it within ``PREEMPT_GRACE_S``, the leading daemon
  picks the best node and set, deletes the victims (uid preconditions), and records
  Events; their cards are freed when their deletions are seen, and the pod is tried
  again at once (the capacity-freed stamp).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.core import (
    PodManifest,
    PodRejected,
    PodRequest,
    Preemption,
    Tenant,
    best_preemption,
    parse_pod,
    preemption_on_node,
)
from common.core.groups import group_of
from scheduler.cluster import ClusterError, ClusterPod, DisruptionBudget
from scheduler.metrics import Metrics
from scheduler.service.shared import Reports, ServicePart, Shared

logger = logging.getLogger(__name__)

PREEMPT_GRACE_S = 1.0
"""kube-scheduler calls the preempt verb right after the /filter that found no node; a
pod it has not asked about by then is preempted for by the daemon."""
CANDIDATES_MAX = 16
"""The daemon picks the best of the first nodes where victims make room, as kube-scheduler
looks at a bounded number of candidate nodes."""
UNDER_WAY_S = 120.0
"""How long the victims of one preemption are awaited before the pod may preempt again."""
NEVER = "Never"


@dataclass(frozen=True, slots=True)
class NodeVictims:
    """The pods to evict on one node so that a preemptor fits: their uids, and how many
    disruption budgets evicting them violates."""

    uids: list[str]
    pdb_violations: int = 0


@dataclass(frozen=True, slots=True)
class UnderWay:
    victims: frozenset[str]
    """Their uids: a pod re-created under a victim's name is another pod."""
    node: str
    since: float


class Preemptions(ServicePart):
    """Both ways of preempting, over the shared live state."""

    def __init__(self, shared: Shared, metrics: Metrics, reports: Reports) -> None:
        super().__init__(shared, metrics, reports)
        self._asked: dict[str, float] = {}
        """Pods kube-scheduler sent to the preempt verb, and when."""
        self._under_way: dict[str, UnderWay] = {}
        """Preemptors whose victims are being deleted."""
        self._weighing: set[str] = set()
        """Preemptors whose preemption waits for its grace or is being chosen: one at a
        time per pod, or two /filter refusals within the grace would evict twice."""

    # kube-scheduler's preempt verb ------------------------------------------------------

    async def answer(self, pod: PodManifest, offered: Mapping[str, NodeVictims],
                     ) -> dict[str, NodeVictims]:
        """Each of the candidate nodes ``offered`` (with the victims kube-scheduler found
        there) where the pod's cards can be freed, with its victims."""
        self._note_asked(pod.key)
        request = self._preemptor(pod)
        answered: dict[str, NodeVictims] = {}
        if request is not None:
            priority = pod.spec.priority or 0
            tenants = self._tenants(await self._budgets())
            keys = {holder.uid: key for key, holder in self.shared.pods.bound_pods().items()}
            for node, victims in offered.items():
                if victims.uids:  # kube-scheduler's victims: enough for the cards too?
                    gone = [keys[uid] for uid in victims.uids if uid in keys]
                    if self._fits_without(node, request, gone):
                        answered[node] = victims
                    continue
                choice = preemption_on_node(self.state.fleet, node, request, priority,
                                            tenants)
                if choice is not None and choice.victims:
                    answered[node] = NodeVictims(
                        [self.shared.pods.bound_pods()[key].uid for key in choice.victims],
                        choice.pdb_violations)
                await asyncio.sleep(0)  # tens of ms a node: the verbs go on meanwhile
        self.metrics.preemptions.labels("kube-scheduler",
                                        "answered" if answered else "none").inc()
        return answered

    def _fits_without(self, node: str, request: PodRequest, gone: Sequence[str]) -> bool:
        fleet = self.state.fleet.without_all(gone)
        return preemption_on_node(fleet, node, request, 0, {}) is not None

    def _note_asked(self, key: str) -> None:
        now = self._clock()
        if len(self._asked) > ASKED_KEPT:
            self._asked = {k: t for k, t in self._asked.items() if now - t < PREEMPT_GRACE_S}
        self._asked[key] = now

    # The daemon's own preemption ----------------------------------------------------------

    def unschedulable(self, pod: PodManifest, request: PodRequest,
                      nodes: Sequence[str]) -> None:
        """/filter found no node for ``pod``: unless kube-scheduler asks the preempt verb
        about it, preempt for it once the grace is over."""
        # /filter parsed the pod already; this runs on its path, so only cheap checks here.
        if (not self.shared.leadership.leading() or pod.spec.preemption_policy == NEVER
                or request.key in self._weighing or self._awaiting_victims(request.key)):
            return
        self._weighing.add(request.key)
        self.shared.in_background(self._preempt_unless_asked(pod, request, list(nodes),
                                                             self._clock()))

    async def _preempt_unless_asked(self, pod: PodManifest, request: PodRequest,
                                    nodes: list[str], refused_at: float) -> None:
        try:
            await self._weigh(pod, request, nodes, refused_at)
        finally:
            self._weighing.discard(request.key)

    async def _weigh(self, pod: PodManifest, request: PodRequest, nodes: list[str],
                     refused_at: float) -> None:
        await asyncio.sleep(PREEMPT_GRACE_S)
        key = request.key
        if (self._asked.get(key, float("-inf")) >= refused_at
                or not self.shared.leadership.leading() or key in self.state.cache.bound
                or self.state.cache.reservation(key) is not None
                or self._awaiting_victims(key)):
            return
        priority = pod.spec.priority or 0
        # Only nodes where a pod of lower priority holds cards can be made room on; where
        # there is none (every pod of an all-default-priority cluster), no budgets are read.
        fleet = self.state.fleet
        holding = {allocation.node for key, holder in self.shared.pods.bound_pods().items()
                   if holder.priority < priority
                   and (allocation := fleet.allocation(key)) is not None}
        nodes = [name for name in nodes if name in holding]
        if not nodes:
            return
        tenants = self._tenants(await self._budgets())
        choices: list[Preemption] = []
        for node in nodes:
            choice = preemption_on_node(self.state.fleet, node, request, priority, tenants)
            if choice is not None and choice.victims:
                choices.append(choice)
                if len(choices) == CANDIDATES_MAX:
                    break
            await asyncio.sleep(0)  # tens of ms a node: the verbs go on meanwhile
        best = best_preemption(choices, tenants)
        if best is None:
            logger.debug("pod %s: no lower-priority pods whose cards would make room", key)
            return
        await self._evict(pod, key, priority, best)

    async def _evict(self, pod: PodManifest, key: str, priority: int,
                     chosen: Preemption) -> None:
        holders = self.shared.pods.bound_pods()
        self._under_way[key] = UnderWay(
            frozenset(holders[victim].uid for victim in chosen.victims if victim in holders),
            chosen.node, self._clock())
        names = ", ".join(chosen.victims)
        logger.info("pod %s (priority %d): preempting %s on node %s", key, priority, names,
                    chosen.node)
        await self.cluster.record_event(
            pod.namespace, pod.metadata.name, "Normal", "Preempting",
            f"evicting {len(chosen.victims)} pods of lower priority on node {chosen.node} "
            f"to free their cards: {names}")
        for victim in chosen.victims:
            holder = self.shared.pods.bound_pods().get(victim)
            if holder is None:
                continue  # ended meanwhile: its cards are free already
            try:
                await self.cluster.evict(holder.namespace, holder.name, holder.uid)
            except ClusterError as error:
                logger.warning("pod %s: preempting %s failed: %s", key, victim, error)
                self.metrics.preemptions.labels("daemon", "failed").inc()
                continue
            self.metrics.preempted.inc()
            await self.cluster.record_event(
                holder.namespace, holder.name, "Warning", "Preempted",
                f"preempted by pod {key} of priority {priority} (this pod's: "
                f"{holder.priority}), to free its cards on node {chosen.node}")
        self.metrics.preemptions.labels("daemon", "evicted").inc()

    def _awaiting_victims(self, key: str) -> bool:
        self._forget_finished()
        return key in self._under_way

    def _forget_finished(self) -> None:
        """Drop the preemptions whose victims are all gone, or that waited too long."""
        if not self._under_way:
            return
        now = self._clock()
        present = {holder.uid for holder in self.shared.pods.bound_pods().values()}
        self._under_way = {key: under_way for key, under_way in self._under_way.items()
                           if now - under_way.since <= UNDER_WAY_S
                           and under_way.victims & present}

    # What both ways weigh ------------------------------------------------------------------

    def _preemptor(self, pod: PodManifest) -> PodRequest | None:
        """The pod's request, if it asks for GPUs and may preempt: not a member of a pod
        group (evicting for one member would free room its group may still not fit in)."""
        if pod.spec.preemption_policy == NEVER:
            return None
        try:
            request = parse_pod(pod, self.settings.defaults)
            if group_of(pod) is not None:
                return None
        except PodRejected:
            return None
        return request if request.wants_gpu else None

    async def _budgets(self) -> list[DisruptionBudget]:
        try:
            return await self.cluster.disruption_budgets()
        except ClusterError as error:
            # Unknown budgets: count every victim as a violation, so a choice without
            # victims covered by none cannot be told apart, rather than claim none.
            logger.warning("PodDisruptionBudgets not read: %s", error)
            return [_EVERY_POD]

    def _tenants(self, budgets: Sequence[DisruptionBudget]) -> dict[str, Tenant]:
        """The pods that may be preempted: bound, holding cards, not already on their way
        out for another preemptor."""
        self._forget_finished()
        leaving = {victim for under_way in self._under_way.values()
                   for victim in under_way.victims}
        return {key: Tenant(priority=holder.priority, started=holder.started,
                            disruption_allowed=not _protected(holder, budgets))
                for key, holder in self.shared.pods.bound_pods().items()
                if key in self.state.cache.bound and holder.uid not in leaving}


ASKED_KEPT = 1024
_EVERY_POD = DisruptionBudget(namespace="", selected=True, match_labels={},
                              match_expressions=(), disruptions_allowed=0)


def _protected(pod: ClusterPod, budgets: Sequence[DisruptionBudget]) -> bool:
    """Evicting the pod would take a budget covering it below what it allows."""
    labels = pod.manifest.metadata.labels or {}
    return any(budget.disruptions_allowed <= 0
               and (budget is _EVERY_POD or budget.covers(pod.namespace, labels))
               for budget in budgets)

