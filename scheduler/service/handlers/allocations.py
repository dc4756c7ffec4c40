"""The device plugins' allocation handshake: a plugin asks which pods bound to its node
wait for their cards (``pending_allocations``), the kubelet's Allocate answered, it
reports the outcome (``allocation_outcome``), written as the pod's bind-phase (with its
MIG instances). A standby keeps the outcomes it hears, written should it take the lease
while the pod still waits; an outcome the pod store cannot take yet is written again in
the background."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from common.core import Allocation
from common.core.annotations import (
    BIND_PHASE_ANNOTATION,
    BIND_TIME_ANNOTATION,
    TO_ALLOCATE_ANNOTATION,
    with_reservations,
)
from common.core.mig import (
    MIG_ALLOCATIONS_ANNOTATION,
    MigReservation,
    MigReservationError,
    decode_reservations,
    encode_reservations,
    with_runtime,
)
from common.core.pod import control_disabled
from common.messaging import RateLimitedLog
from common.wire import (
    ALLOCATED_SUBJECT_PREFIX,
    ALLOCATIONS_SUBJECT_PREFIX,
    AllocationOutcome,
    HoldingContainer,
    HoldingPod,
    PendingAllocations,
    PendingContainer,
    PendingPod,
    WireError,
    decode_outcome,
    subject_node_checked,
)
from scheduler.cluster import AllocationPhase, ClusterError, ClusterPod, StoreUnavailable
from scheduler.metrics import Metrics
from scheduler.service.shared import Reports, ServicePart, Shared

logger = logging.getLogger(__name__)

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


class Allocations(ServicePart):
    """The daemon's side of the device plugins' allocation handshake."""

    def __init__(self, shared: Shared, metrics: Metrics, reports: Reports) -> None:
        super().__init__(shared, metrics, reports)
        self._refusals = RateLimitedLog(shared.clock, logger)
        # The outcomes the store could not take yet, each written again by its own task.
        self._owed: set[asyncio.Task[None]] = set()

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
        self.state.cache.confirm(key, dataclasses.replace(held, containers=containers))

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

    def note_answered(self, pod: ClusterPod) -> None:
        """The pod's device plugin answered already, as its bind-phase says."""
        if pod.annotations.get(BIND_PHASE_ANNOTATION) in ANSWERED_PHASES:
            self.shared.pods.allocate_answered(pod.key)


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
