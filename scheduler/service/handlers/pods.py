"""The pod watch: the cards of pods deleted or finished released, pods bound elsewhere
booked, the groups' members noted, and a fresh list of the pods compared with the ledger
after a lost watch or an election."""

from __future__ import annotations

import logging

from common.core import AnnotationError
from scheduler.cluster import PodChange
from scheduler.metrics import Metrics
from scheduler.service.handlers.allocations import Allocations
from scheduler.service.handlers.groups import GroupMembers
from scheduler.service.shared import Reports, ServicePart, Shared

logger = logging.getLogger(__name__)


class PodEvents(ServicePart):
    """What the daemon does as pods change or end."""

    def __init__(self, shared: Shared, metrics: Metrics, reports: Reports, *,
                 allocations: Allocations, groups: GroupMembers) -> None:
        super().__init__(shared, metrics, reports)
        self._allocations = allocations
        self._groups = groups
        self._followed_cluster = False

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
        for key in sorted(self.state.cache.bound - listed):
            await self._pod_ended(key)
        for pod in pods:
            await self.on_pod_change(PodChange(pod, deleted=False))

    async def on_pod_change(self, change: PodChange) -> None:
        pod = change.pod
        if change.deleted or pod.finished:
            await self._pod_ended(pod.key)
            return
        self._allocations.note_answered(pod)
        self._groups.note(pod)
        names = self.settings.defaults.device.resources
        if pod.node is not None and pod.manifest.asks_for_gpu(names):
            self.shared.pods.bound(pod)  # its priority and start, for preemption
            self.state.workloads.note_bound(pod.namespace, pod.key, pod.annotations)
        if (pod.key in self.state.cache.bound
                or self.state.cache.reservation(pod.key) is not None):
            return
        try:
            allocation = pod.allocation(self.settings.defaults.device.resources)
        except AnnotationError as error:
            logger.error("pod %s: %s; its cards are not counted", pod.key, error)
            return
        if allocation is not None:  # bound elsewhere, e.g. while this daemon was down
            self.state.cache.restore([(pod.key, allocation)])
            # Cards booked, none freed: no waiting pod fits now that did not before.
            await self.reports.capacity_changed(allocation.node, retry_waiting=False)

    async def _pod_ended(self, key: str) -> None:
        self.shared.pods.ended(key)
        self.state.workloads.pod_gone(key)
        groups = self.state.groups
        group = groups.group_of(key)
        was_waiting = group is not None and any(m.key == key for m in groups.waiting(group.key))
        groups.forget(key)
        released = self.state.cache.release(key)
        if released is not None:
            logger.info("pod %s ended: its cards on %s are free", key, released.node)
            await self.reports.capacity_changed(released.node)
        if group is not None and was_waiting and groups.held(group.key):
            # The group is no longer whole: the cards held for the rest of it go too.
            await self._groups.let_go(group, f"its member {key} ended before it was bound")

