"""The reactions, kube-scheduler's event handlers: what the daemon does when the cluster
or the bus speaks. The ledger rebuilt at start-up, agents' inventories, the device
plugins' allocation requests and outcomes, pods that change or end, a fresh list of the
pods after a lost watch, node cordons, nodes that fall silent, reservations that no bind
confirmed in time."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from common.core import Allocation, AnnotationError, PodRejected, PodRequest, parse_pod
from common.core.annotations import (
    BIND_PHASE_ANNOTATION,
    BIND_TIME_ANNOTATION,
    TO_ALLOCATE_ANNOTATION,
    with_reservations,
)
from common.core.groups import GroupRef, group_of
from common.core.mig import (
    MIG_ALLOCATIONS_ANNOTATION,
    MigReservation,
    MigReservationError,
    decode_reservations,
    encode_reservations,
    with_runtime,
)
from common.core.pod import control_disabled
from common.core.quota import Quota, QuotaRejected, ResourceQuotaManifest, parse_quota
from common.messaging import RateLimitedLog
from common.wire import (
    ALLOCATED_SUBJECT_PREFIX,
    ALLOCATIONS_SUBJECT_PREFIX,
    AllocationOutcome,
    HoldingContainer,
    HoldingPod,
    Inventory,
    PendingAllocations,
    PendingContainer,
    PendingPod,
    WireError,
    decode_inventory,
    decode_outcome,
    subject_node_checked,
)
from scheduler.cluster import (
    AllocationPhase,
    ClusterError,
    ClusterPod,
    PodChange,
    QuotaChange,
    StoreUnavailable,
)
from scheduler.metrics import Metrics
from scheduler.service.shared import Reports, ServicePart, Shared

logger = logging.getLogger(__name__)

CORDON_REFRESH_S = 15.0
NODE_WATCH_S = 1.0
ALLOCATING = "allocating"
# The bind-phases a device plugin sets once it answered the kubelet's Allocate.
ANSWERED_PHASES = frozenset({"success", "failed"})
# A device plugin reports a pod's outcome once, to every daemon. When the pod store cannot
# take it (StoreUnavailable: nothing applied; the buckets' stream electing a leader after
# a NATS server's loss), it is written again in the background, for this long. A standby
# keeps each outcome as long, and writes it should it take the lease meanwhile and find
# the pod still "allocating": the lease may move before the holder could write it. Else
# the pod would stay "allocating" with its container started. At most OWED_OUTCOMES_MAX
# wait so at once.
OUTCOME_RETRY_S = 20.0
OUTCOME_RETRY_PAUSE_S = 0.5
OWED_OUTCOMES_MAX = 1000


class Reactions(ServicePart):
    """The daemon's answers to the cluster's and the agents' events."""

    def __init__(self, shared: Shared, metrics: Metrics, reports: Reports) -> None:
        super().__init__(shared, metrics, reports)
        self._followed_cluster = False
        self._refusals = RateLimitedLog(shared.clock, logger)
        # The outcomes the store could not take yet, each written again by its own task.
        self._owed: set[asyncio.Task[None]] = set()
        # ResourceQuota -> why it was refused, so each refusal is logged and told once,
        # not at every status update the quota controller writes.
        self._refused_quotas: dict[str, str] = {}
        # Looked up once: every inventory message counts one of these.
        self._accepted = metrics.inventory.labels("accepted")
        self._out_of_order = metrics.inventory.labels("out_of_order")

    async def rebuild(self) -> None:
        """Rebuild the ledger from the pods' allocation annotations, then answer /filter.

        Whatever the ledger held is replaced: a standalone daemon elected again reads the
        pods its predecessor bound."""
        pods = await self.cluster.list_pods()
        quotas = await self.cluster.list_quotas()
        restored = []
        for pod in pods:
            if not pod.finished:
                self._note_member(pod)  # a group counts its members again, bound or not
            try:
                allocation = pod.allocation(self.settings.defaults.device.resources)
            except AnnotationError as error:
                logger.error("pod %s: %s; its cards are not counted", pod.key, error)
                continue
            if allocation is not None:
                restored.append((pod.key, allocation))
                self._note_allocate_answered(pod)
                self.shared.pods.bound(pod)
        self.shared.pods.keep_bound(key for key, _ in restored)
        self.state.bookings.replace_ledger(restored)
        book = self.state.fleet.quotas
        applied = []
        for manifest in quotas:
            quota = await self._read_quota(manifest) or book.quota(manifest.namespace,
                                                                   manifest.metadata.name)
            if quota is not None:
                applied.append(quota)
        book.replace_quotas(applied)
        await self.refresh_cordons()
        self.reports.mark_changed(*(a.node for _, a in restored))
        logger.info("ledger rebuilt from %d pods holding cards, under %d GPU quotas",
                    len(restored), sum(1 for _ in self.state.fleet.quotas.quotas()))
        self.shared.ready = True

    async def receive_inventory(self, subject: str, data: bytes) -> None:
        """Ingest one agent message; a card that left while pods hold it is reported on them."""
        result = self.ingest(subject, data)
        if result is None:
            return
        inventory, vanished = result
        if inventory.reason == "resync" and self.shared.leadership.leading():
            # Usage goes out on change only: a watcher that asked the agents to report
            # (``pyhami watch``, on connecting) would see the node's cards without their
            # tenants until the next pod came or went. The answers to a resync are
            # answered with the node's usage as it stands (the leader's, which decides).
            self.reports.usage_asked(inventory.node)
        await self._watch_slices(inventory)
        if not vanished:
            return
        holders = [(key, allocation) for key, allocation in self.state.fleet.allocations().items()
                   if allocation.node == inventory.node]
        for key, allocation in holders:
            lost = sorted({g.uuid for grants in allocation.containers for g in grants} & vanished)
            if lost:
                namespace, _, name = key.partition("/")
                await self.cluster.record_event(
                    namespace, name, "Warning", "CardVanished",
                    f"node {inventory.node} no longer reports {', '.join(lost)}, which this pod "
                    "holds; the cards stay booked until the pod ends")

    async def _watch_slices(self, inventory: Inventory) -> None:
        """On a node where nothing enforces the slices (the agent's device plugin runs
        without HAMi-core), a container measured using more memory than its slice gets a
        Warning Event ``SliceExceeded``, once per container and card per window."""
        slices = self.state.slices
        if inventory.measured is None or inventory.slices_enforced is not False:
            slices.clear(inventory.node)
            return
        check = slices.check(inventory.node, inventory.measured, self.shared.pods.bound_by_uid,
                             self.state.fleet.allocation, self._clock())
        if check.unmatched:
            self.metrics.measured_unmatched.inc(check.unmatched)
        for over in check.announce:
            self.metrics.slice_exceeded.inc()
            logger.warning("pod %s/%s on node %s: %s", over.namespace, over.pod,
                           inventory.node, over.sentence())
            await self.cluster.record_event(over.namespace, over.pod, "Warning",
                                            "SliceExceeded", over.sentence())

    def ingest(self, subject: str, data: bytes) -> tuple[Inventory, set[str]] | None:
        """Apply one agent message: the inventory and the cards that left holding allocations.

        A message refused (malformed, out of bounds, on another node's subject, claiming
        another live node's card, numbered too far ahead) is counted by result and logged at
        a bounded rate.
        """
        try:
            inventory = decode_inventory(data, subject)
        except WireError as error:
            self._refuse_inventory(error.result, str(error))
            return None
        result = self.state.nodes.ingest(inventory, self._clock())
        if result.conflict is not None:
            self._refuse_inventory("card_conflict", f"inventory refused: {result.conflict}")
            return None
        if result.too_far_ahead is not None:
            self._refuse_inventory("sequence_jump", f"inventory refused: {result.too_far_ahead}")
            return None
        if not result.accepted:
            self._out_of_order.inc()
            return None
        self._accepted.inc()
        self.shared.inventory_accepted += 1
        if not result.changed:
            return inventory, set()
        if result.back_after is not None:
            logger.info("node %s is heard from again after %.0fs of silence", inventory.node,
                        result.back_after)
        self.reports.mark_changed(inventory.node)
        for uuid, usage in result.vanished.items():
            logger.error("node %s: card %s left the inventory while allocations hold it "
                         "(%d tenants, %d MiB); they stay booked until their pods end",
                         inventory.node, uuid, usage.tenants, usage.memory)
        self.reports.retry_waiting()
        return inventory, set(result.vanished)

    # The device plugins' allocations -------------------------------------------------

    async def pending_allocations(self, subject: str) -> PendingAllocations | None:
        """The answer to a device plugin's request on ``subject``: the pods bound to its
        node whose bind-phase is ``allocating``, oldest bind-time first, each read from the
        cluster now. A pod whose bind is still under way counts: the kubelet may see the
        Binding, and ask, before the API server's answer reaches the daemon. None (no
        answer: the requester times out) for a subject that names no valid node, counted
        and logged at a bounded rate, or while the cluster cannot be read (a partial list
        could make the plugin refuse a pod it should serve)."""
        try:
            node = subject_node_checked(subject, ALLOCATIONS_SUBJECT_PREFIX)
        except WireError as error:
            self._refuse_allocation(f"allocations request refused: {error}")
            return None
        # Reserved ones included (a bind in flight); the pod as read now says if it is bound.
        keys = sorted(key for key, allocation in self.state.fleet.allocations().items()
                      if allocation.node == node
                      and not self.shared.pods.is_allocate_answered(key))
        try:
            pods = await asyncio.gather(*(self.cluster.get_pod(*key.split("/", 1))
                                          for key in keys))
        except ClusterError as error:
            self._refusals.warning("allocations_unread", "allocations of node %s not "
                                   "answered: %s", node, error)
            return None
        pending = [entry for pod in pods if pod is not None
                   if (entry := _pending(pod, node)) is not None]
        pending.sort(key=lambda entry: (entry.bind_time, entry.namespace, entry.name))
        in_flight = [pod for pod in pods if pod is not None and pod.node == node]
        return PendingAllocations(node=node, pods=pending,
                                  holding=self._holding(node, in_flight))

    def _holding(self, node: str, read_now: list[ClusterPod]) -> list[HoldingPod]:
        """Every pod bound to ``node`` that the ledger holds cards for, and those of
        ``read_now`` bound there (a bind in flight is not yet among the bound), each with
        its containers and their cards. Complete: only the leader answers, and it rebuilt
        the ledger from the cluster before it led."""
        held = {key: allocation for key, allocation in self.state.fleet.allocations().items()
                if allocation.node == node}
        pods = {pod.uid: pod for key, pod in self.shared.pods.bound_pods().items()
                if key in held}
        pods.update((pod.uid, pod) for pod in read_now if pod.key in held)
        return [_holding_pod(pod, held[pod.key])
                for pod in sorted(pods.values(), key=lambda pod: pod.key)]

    async def allocation_outcome(self, subject: str, data: bytes) -> None:
        """Set the pod's bind-phase as its node's device plugin reports (``failed`` with a
        Warning Event saying why). Refused, counted and logged at a bounded rate: a
        malformed outcome, and one for a pod that is not bound to the subject's node (an
        agent reports only for its own node) or no longer has that uid."""
        try:
            node = subject_node_checked(subject, ALLOCATED_SUBJECT_PREFIX)
            outcome = decode_outcome(data)
        except WireError as error:
            self._refuse_allocation(f"allocation outcome refused: {error}")
            return
        namespace, name = outcome.namespace, outcome.name
        key = f"{namespace}/{name}"
        held = self.state.fleet.allocation(key)
        # Booked there, bound or with its bind under way; the pod read below says if bound.
        if held is None or held.node != node:
            self._refuse_allocation(f"allocation outcome refused: pod {key} is not bound "
                                    f"to node {node}")
            return
        phase: AllocationPhase = "success" if outcome.ok else "failed"
        try:
            pod = await self.cluster.get_pod(namespace, name)
            if pod is None or pod.uid != outcome.uid or pod.node != node:
                self._refuse_allocation(f"allocation outcome refused: pod {key} of uid "
                                        f"{outcome.uid} is not on node {node}")
                return
            if pod.annotations.get(BIND_PHASE_ANNOTATION) in ANSWERED_PHASES:
                # Sent again by a plugin that had not yet seen it written: taken once.
                self.shared.pods.allocate_answered(key)
                return
            await self._write_phase(key, pod, outcome, phase)
        except StoreUnavailable as error:
            self._write_later(node, outcome, phase, error)
            return
        except ClusterError as error:
            self._refusals.warning("outcome_unwritten", "allocation outcome of pod %s not "
                                   "written: %s", key, error)
            return
        await self._outcome_written(node, outcome, phase)

    async def _write_phase(self, key: str, pod: ClusterPod, outcome: AllocationOutcome,
                           phase: AllocationPhase) -> None:
        """Write the pod's bind-phase; with it, in the same write, its MIG reservations
        completed with the instances its node made, which the ledger then holds too
        (``hami_node_gpu_mig_instance_info`` reads them there)."""
        completed = self._runtime_identity(pod, outcome)
        written = (None if completed is None
                   else {MIG_ALLOCATIONS_ANNOTATION: encode_reservations(completed)})
        await self.cluster.set_bind_phase(pod.namespace, pod.name, outcome.uid, phase,
                                          written)
        held = self.state.fleet.allocation(key)
        if completed is None or held is None:
            return
        try:
            containers = with_reservations(held.containers, completed)
        except MigReservationError:
            return  # reservations not the ledger's own: the ledger keeps what it has
        self.state.bookings.confirm(key, dataclasses.replace(held, containers=containers))

    def _runtime_identity(self, pod: ClusterPod, outcome: AllocationOutcome
                          ) -> tuple[MigReservation, ...] | None:
        """The pod's MIG reservations completed with the instances its node made; None
        where the outcome carries none. Instances that match no reservation of the pod are
        refused (counted, logged) and nothing is written of them: the phase still is."""
        if not outcome.mig_instances:
            return None
        try:
            return with_runtime(
                decode_reservations(pod.annotations.get(MIG_ALLOCATIONS_ANNOTATION, "")),
                [(r.container_index, r.device_index, r.mig_uuid, r.gpu_instance_id,
                  r.compute_instance_id) for r in outcome.mig_instances])
        except MigReservationError as error:
            self._refuse_allocation(f"MIG instances of pod {pod.key} not recorded: {error}")
            return None

    def keep_outcome(self, subject: str, data: bytes) -> None:
        """A standby's part: keep the outcome, written should this daemon decide within
        ``OUTCOME_RETRY_S`` and the pod still wait for it (``_write_again``)."""
        try:
            node = subject_node_checked(subject, ALLOCATED_SUBJECT_PREFIX)
            outcome = decode_outcome(data)
        except WireError:
            return  # the deciding daemon refuses it, counted and logged
        self._write_later(node, outcome, "success" if outcome.ok else "failed", None)

    def _write_later(self, node: str, outcome: AllocationOutcome, phase: AllocationPhase,
                     error: StoreUnavailable | None) -> None:
        if len(self._owed) >= OWED_OUTCOMES_MAX:
            self._refusals.warning("outcome_unwritten", "allocation outcome of pod %s/%s not "
                                   "kept (%d others wait already): %s", outcome.namespace,
                                   outcome.name, len(self._owed), error or "standing by")
            return
        task = asyncio.create_task(self._write_again(node, outcome, phase))
        self._owed.add(task)
        task.add_done_callback(self._owed.discard)

    async def _write_again(self, node: str, outcome: AllocationOutcome,
                           phase: AllocationPhase) -> None:
        """Write the bind-phase once this daemon decides and the store answers, for at most
        ``OUTCOME_RETRY_S``, unless the pod no longer waits for it (answered by the daemon
        that decided before, gone, or another pod under its name)."""
        key = f"{outcome.namespace}/{outcome.name}"
        deadline = time.monotonic() + OUTCOME_RETRY_S
        last: str | None = None
        while time.monotonic() + OUTCOME_RETRY_PAUSE_S < deadline:
            await asyncio.sleep(OUTCOME_RETRY_PAUSE_S)
            if self.shared.leadership.refusal() is not None:
                continue
            last = last or "the pod store did not answer"
            try:
                pod = await self.cluster.get_pod(outcome.namespace, outcome.name)
                if pod is None or pod.uid != outcome.uid or pod.node != node or \
                        pod.annotations.get(BIND_PHASE_ANNOTATION) in ANSWERED_PHASES:
                    return
                await self._write_phase(key, pod, outcome, phase)
            except StoreUnavailable as error:
                last = str(error)
                continue
            except ClusterError as error:
                self._refusals.warning("outcome_unwritten", "allocation outcome of pod %s "
                                       "not written: %s", key, error)
                return
            await self._outcome_written(node, outcome, phase)
            return
        if last is None:
            # Kept by a standby that never decided meanwhile: the daemon that did wrote it,
            # or the device plugin sends it again while the pod waits.
            logger.debug("allocation outcome of pod %s kept %gs and let go: this daemon did "
                         "not decide meanwhile", key, OUTCOME_RETRY_S)
            return
        self._refusals.warning("outcome_unwritten", "allocation outcome of pod %s not "
                               "written within %gs: %s", key, OUTCOME_RETRY_S, last)

    async def _outcome_written(self, node: str, outcome: AllocationOutcome,
                               phase: AllocationPhase) -> None:
        namespace, name = outcome.namespace, outcome.name
        key = f"{namespace}/{name}"
        self.shared.pods.allocate_answered(key)
        self.metrics.allocations.labels(phase).inc()
        if outcome.ok:
            logger.info("pod %s: node %s's device plugin handed it its cards", key, node)
            return
        why = outcome.reason or "no reason given"
        logger.warning("pod %s: node %s's device plugin could not allocate: %s", key, node, why)
        await self.cluster.record_event(namespace, name, "Warning", "AllocationFailed",
                                        f"node {node} could not hand the pod its cards: {why}")

    def _refuse_allocation(self, why: str) -> None:
        self.metrics.allocations.labels("refused").inc()
        self._refusals.warning("allocation_refused", "%s", why)

    def _note_allocate_answered(self, pod: ClusterPod) -> None:
        if pod.annotations.get(BIND_PHASE_ANNOTATION) in ANSWERED_PHASES:
            self.shared.pods.allocate_answered(pod.key)

    async def stand_by(self) -> None:
        """This daemon stopped deciding: the reservations it made will never be bound."""
        dropped = self.state.bookings.drop_reservations()
        if dropped:
            logger.info("standing by: %d reservations released", len(dropped))
            await self.reports.capacity_changed(*(a.node for a in dropped.values()),
                                                retry_waiting=False)

    def connection_resumed(self) -> None:
        """The daemon is on the bus again after an outage: whatever the agents sent
        meanwhile was missed, so their next messages may skip any number of sequences."""
        self.state.nodes.forgive_gaps(self._clock())

    def _refuse_inventory(self, result: str, why: str) -> None:
        self.metrics.inventory.labels(result).inc()
        self._refusals.warning(result, "%s", why)

    async def follow_cluster(self) -> None:
        """Release the cards of pods deleted, Failed or Succeeded, for as long as it runs.

        Started again after a crash, it first compares the ledger with a fresh list of
        the pods, for the changes that went by while it was down."""
        if self._followed_cluster:
            await self.reconcile()
        self._followed_cluster = True
        async for change in self.cluster.changes():
            await self.on_pod_change(change)

    async def reconcile(self) -> None:
        """Bring the ledger in line with a fresh list of the pods: release the pods gone
        or finished, book those bound that it lacks."""
        pods = await self.cluster.list_pods()
        listed = {pod.key for pod in pods}
        for key in sorted(self.state.bookings.bound - listed):
            await self._pod_ended(key)
        for pod in pods:
            await self.on_pod_change(PodChange(pod, deleted=False))

    async def on_pod_change(self, change: PodChange) -> None:
        pod = change.pod
        if change.deleted or pod.finished:
            await self._pod_ended(pod.key)
            return
        self._note_allocate_answered(pod)
        self._note_member(pod)
        names = self.settings.defaults.device.resources
        if pod.node is not None and pod.manifest.asks_for_gpu(names):
            self.shared.pods.bound(pod)  # its priority and start, for preemption
        if (pod.key in self.state.bookings.bound
                or self.state.bookings.reservation(pod.key) is not None):
            return
        try:
            allocation = pod.allocation(self.settings.defaults.device.resources)
        except AnnotationError as error:
            logger.error("pod %s: %s; its cards are not counted", pod.key, error)
            return
        if allocation is not None:  # bound elsewhere, e.g. while this daemon was down
            self.state.bookings.restore([(pod.key, allocation)])
            # Cards booked, none freed: no waiting pod fits now that did not before.
            await self.reports.capacity_changed(allocation.node, retry_waiting=False)

    async def _pod_ended(self, key: str) -> None:
        self.shared.pods.ended(key)
        groups = self.state.groups
        group = groups.group_of(key)
        was_waiting = group is not None and any(m.key == key for m in groups.waiting(group.key))
        groups.forget(key)
        released = self.state.bookings.release(key)
        if released is not None:
            logger.info("pod %s ended: its cards on %s are free", key, released.node)
            await self.reports.capacity_changed(released.node)
        if group is not None and was_waiting and groups.held(group.key):
            # The group is no longer whole: the cards held for the rest of it go too.
            await self._let_group_go(group, f"its member {key} ended before it was bound")

    def _note_member(self, pod: ClusterPod) -> None:
        """A pod that declares a group counts as one of its members from the moment it
        exists, GPU or not (its /filter refuses a bad declaration, with an Event)."""
        manifest = pod.manifest
        try:
            group = group_of(manifest)
        except PodRejected:
            return
        if group is None:
            return
        try:
            request: PodRequest | None = parse_pod(manifest, self.settings.defaults)
        except PodRejected:
            request = None
        self.state.groups.note(group, pod.key, manifest, request, bound=pod.node is not None)

    async def _let_group_go(self, group: GroupRef, why: str) -> None:
        """Release the cards held for the group's members still waiting for their bind."""
        groups = self.state.groups
        groups.let_go(group.key)
        freed = [(member.key, allocation) for member in groups.waiting(group.key)
                 if (allocation := self.state.bookings.release_reservation(member.key))
                 is not None]
        if not freed:
            return
        logger.warning("group %s: the cards held for %d waiting members are released: %s",
                       group.key, len(freed), why)
        self.metrics.released.labels("group").inc(len(freed))
        await self.reports.capacity_changed(*(allocation.node for _, allocation in freed))

    # ResourceQuotas ------------------------------------------------------------------------

    async def follow_quotas(self) -> None:
        """Apply the namespaces' ResourceQuotas as they change, for as long as it runs."""
        async for change in self.cluster.quota_changes():
            await self.on_quota_change(change)

    async def on_quota_change(self, change: QuotaChange) -> None:
        """Apply, replace or drop one quota; pods waiting may fit under the new limits."""
        manifest = change.quota
        namespace, name = manifest.namespace, manifest.metadata.name
        book = self.state.fleet.quotas
        if change.deleted:
            self._refused_quotas.pop(manifest.key, None)
            if book.remove_quota(namespace, name) is not None:
                logger.info("ResourceQuota %s deleted: its GPU limits no longer apply",
                            manifest.key)
                self.reports.retry_waiting()
            return
        quota = await self._read_quota(manifest)
        if quota is None or book.quota(namespace, name) == quota:
            return  # refused, or only its status changed
        if not quota.limits_gpu:  # Kubernetes' own resources only
            if book.remove_quota(namespace, name) is not None:
                logger.info("ResourceQuota %s no longer limits GPUs", manifest.key)
                self.reports.retry_waiting()
            return
        book.set_quota(quota)
        logger.info("ResourceQuota %s applies: %s", manifest.key, _limits(quota))
        self.reports.retry_waiting()

    async def _read_quota(self, manifest: ResourceQuotaManifest) -> Quota | None:
        """The quota, or None when it cannot be applied: then logged, counted and told in
        a Warning Event on it, once for each reason. A quota refused after a valid version
        keeps that version's limits (a typo must not lift a namespace's cap)."""
        try:
            quota = parse_quota(manifest, self.settings.defaults.device)
        except QuotaRejected as error:
            why = str(error)
            if self._refused_quotas.get(manifest.key) != why:
                self._refused_quotas[manifest.key] = why
                kept = self.state.fleet.quotas.quota(manifest.namespace,
                                                     manifest.metadata.name)
                outcome = ("its last valid limits stay applied" if kept is not None
                           else "it is not applied")
                logger.error("%s; %s", why, outcome)
                self.metrics.quotas_refused.inc()
                await self.cluster.record_quota_event(
                    manifest.namespace, manifest.metadata.name, "Warning", "QuotaRefused",
                    f"pyhami cannot apply this quota: {why}; {outcome}")
            return None
        self._refused_quotas.pop(manifest.key, None)
        return quota

    async def refresh_cordons(self) -> None:
        """Read the nodes' ``hami.io/device-cordon`` annotations into the live state; where
        the cluster lists its Nodes, forget the nodes it no longer lists."""
        listed_since = self._clock()
        try:
            cordons = await self.cluster.device_cordons()
        except ClusterError as error:
            logger.warning("node cordons not refreshed, keeping the last ones: %s", error)
            return
        if self.settings.nodes_listed:
            for name in self.state.nodes.unlisted(cordons.keys(), listed_since):
                self._forget(name, "its Node is no longer in the cluster")
        changed = self.state.nodes.set_cluster_cordons(cordons)
        if changed:
            logger.info("device cordons changed on %s", ", ".join(sorted(changed)))
            await self.reports.capacity_changed(*changed)

    async def follow_cordons(self, period: float = CORDON_REFRESH_S) -> None:
        while True:
            await asyncio.sleep(period)
            await self.refresh_cordons()

    async def watch_nodes(self, period: float = NODE_WATCH_S) -> None:
        while True:
            await asyncio.sleep(period)
            self.check_nodes()

    def check_nodes(self) -> None:
        """Log each node once as it goes stale; forget those silent beyond the retention."""
        now = self._clock()
        for name, why in self.state.nodes.newly_stale(now).items():
            logger.warning("node %s is stale: %s", name, why.text())
        for name, quiet in self.state.nodes.silent_beyond_retention(now).items():
            self._forget(name, f"silent for {quiet:.0f}s (retention "
                               f"{self.settings.node_retention:g}s)")

    def _forget(self, name: str, why: str) -> None:
        self.state.nodes.forget(name)
        held = sum(1 for a in self.state.fleet.allocations().values() if a.node == name)
        logger.warning("node %s forgotten: %s%s", name, why,
                       f"; {held} pods still hold its cards" if held else "")

    async def expire_reservations(self, period: float = 1.0) -> None:
        while True:
            await asyncio.sleep(period)
            now = self._clock()
            for overdue in list(self.state.groups.overdue(now)):
                await self._let_group_go(overdue, f"not every member was bound within "
                                                  f"{self.settings.group_ttl:g}s")
            late = self.state.bookings.expire(now)
            for key in late:
                logger.warning("reservation of pod %s expired: no bind came in time", key)
                self.metrics.released.labels("expired").inc()
                if (group := self.state.groups.group_of(key)) is not None:
                    await self._let_group_go(group, f"the reservation of its member {key} "
                                                    "expired")
            if late:
                await self.reports.capacity_changed(*(a.node for a in late.values()))



def _limits(quota: Quota) -> str:
    parts = []
    if quota.memory is not None:
        parts.append(f"{quota.memory} MiB of GPU memory")
    if quota.cores is not None:
        parts.append(f"{quota.cores}% of a card's cores")
    scoped = f", to pods matching {len(quota.rules)} scopes" if quota.rules else ""
    return " and ".join(parts) + scoped


def _holding_pod(pod: ClusterPod, allocation: Allocation) -> HoldingPod:
    """The pod and its containers' cards, as the node's agent names its usage."""
    spec = pod.manifest.spec
    init = spec.init_containers or ()
    containers = []
    for position, container in enumerate([*init, *spec.containers]):
        grants = (allocation.containers[position] if position < len(allocation.containers)
                  else ())
        containers.append(HoldingContainer(name=container.name, init=position < len(init),
                                           cards=tuple(grant.uuid for grant in grants)))
    return HoldingPod(namespace=pod.namespace, name=pod.name, uid=pod.uid,
                      containers=tuple(containers),
                      mig_allocations=pod.annotations.get(MIG_ALLOCATIONS_ANNOTATION, ""))


def _pending(pod: ClusterPod, node: str) -> PendingPod | None:
    """The pod as an allocations answer lists it, if it is on ``node`` and still waits for
    its cards; a missing or unreadable bind-time sorts it first."""
    annotations = pod.annotations
    devices = annotations.get(TO_ALLOCATE_ANNOTATION)
    if pod.node != node or annotations.get(BIND_PHASE_ANNOTATION) != ALLOCATING or not devices:
        return None
    bind_time = annotations.get(BIND_TIME_ANNOTATION, "")
    readable = bind_time.isascii() and bind_time.isdigit() and len(bind_time) <= 12
    spec = pod.manifest.spec
    containers = tuple(PendingContainer(name=container.name,
                                        control_disabled=control_disabled(container))
                       for container in [*(spec.init_containers or ()), *spec.containers])
    return PendingPod(namespace=pod.namespace, name=pod.name, uid=pod.uid, devices=devices,
                      bind_time=int(bind_time) if readable else 0, containers=containers,
                      mig_allocations=annotations.get(MIG_ALLOCATIONS_ANNOTATION, ""))
