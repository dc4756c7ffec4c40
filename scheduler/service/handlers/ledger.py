"""The ledger rebuilt: which pod holds which cards, read from the pods' allocation
annotations at start-up (and by a standalone daemon elected again), with the groups'
members, the quotas and the cordons; then /filter answers."""

from __future__ import annotations

import asyncio
import logging

from common.core import AnnotationError
from scheduler.cluster import ClusterError
from scheduler.metrics import Metrics
from scheduler.service.handlers.allocations import Allocations
from scheduler.service.handlers.cordons import Cordons
from scheduler.service.handlers.groups import GroupMembers
from scheduler.service.handlers.quotas import Quotas
from scheduler.service.shared import Reports, ServicePart, Shared

logger = logging.getLogger(__name__)

REBUILD_RETRY_S = 2.0


class Ledger(ServicePart):
    """The ledger rebuilt from the cluster."""

    def __init__(self, shared: Shared, metrics: Metrics, reports: Reports, *,
                 allocations: Allocations, groups: GroupMembers, quotas: Quotas,
                 cordons: Cordons) -> None:
        super().__init__(shared, metrics, reports)
        self._allocations = allocations
        self._groups = groups
        self._quotas = quotas
        self._cordons = cordons

    async def rebuild(self) -> None:
        """Rebuild the ledger from the pods' allocation annotations, then answer /filter.

        Whatever the ledger held is replaced: a standalone daemon elected again reads the
        pods its predecessor bound."""
        pods = await self.cluster.list_pods()
        quotas = await self.cluster.list_quotas()
        restored = []
        for pod in pods:
            if not pod.finished:
                self._groups.note(pod)  # a group counts its members again, bound or not
            try:
                allocation = pod.allocation(self.settings.defaults.device.resources)
            except AnnotationError as error:
                logger.error("pod %s: %s; its cards are not counted", pod.key, error)
                continue
            if allocation is not None:
                restored.append((pod.key, allocation))
                self._allocations.note_answered(pod)
                self.shared.pods.bound(pod)
                self.state.workloads.note_bound(pod.namespace, pod.key, pod.annotations)
        self.shared.pods.keep_bound(key for key, _ in restored)
        self.state.cache.replace_ledger(restored)
        book = self.state.fleet.quotas
        applied = []
        for manifest in quotas:
            quota = (await self._quotas.read_quota(manifest)
                     or book.quota(manifest.namespace, manifest.metadata.name))
            if quota is not None:
                applied.append(quota)
        book.replace_quotas(applied)
        await self._cordons.refresh_cordons()
        self.reports.mark_changed(*(a.node for _, a in restored))
        logger.info("ledger rebuilt from %d pods holding cards, under %d GPU quotas",
                    len(restored), sum(1 for _ in self.state.fleet.quotas.quotas()))
        self.shared.ready = True

    async def rebuild_until_listed(self) -> None:
        """Rebuild the ledger, trying again while the cluster cannot list its pods."""
        while True:
            try:
                await self.rebuild()
            except ClusterError as error:
                logger.warning("rebuilding the ledger failed, trying again in %gs: %s",
                               REBUILD_RETRY_S, error)
                await asyncio.sleep(REBUILD_RETRY_S)
                continue
            return
