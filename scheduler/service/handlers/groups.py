"""Pod groups as the pods come and go: each pod that declares a group noted as one of
its members, and a group let go whole (the cards held for its waiting members released)
when it can no longer be bound together."""

from __future__ import annotations

import logging

from common.core import PodRejected, PodRequest, parse_pod
from common.core.groups import GroupRef, group_of
from scheduler.cluster import ClusterPod
from scheduler.service.shared import ServicePart

logger = logging.getLogger(__name__)


class GroupMembers(ServicePart):
    """The groups' members noted from the pods, and groups let go."""

    def note(self, pod: ClusterPod) -> None:
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

    async def let_go(self, group: GroupRef, why: str) -> None:
        """Release the cards held for the group's members still waiting for their bind."""
        groups = self.state.groups
        groups.let_go(group.key)
        freed = [(member.key, allocation) for member in groups.waiting(group.key)
                 if (allocation := self.state.cache.release_reservation(member.key))
                 is not None]
        if not freed:
            return
        logger.warning("group %s: the cards held for %d waiting members are released: %s",
                       group.key, len(freed), why)
        self.metrics.released.labels("group").inc(len(freed))
        await self.reports.capacity_changed(*(allocation.node for _, allocation in freed))
