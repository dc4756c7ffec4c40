"""The standalone scheduling queue: with no kube-scheduler, the daemon plays its part for
the pods of ``scheduler.cluster.standalone``: filter, then bind, for every pending pod,
again whenever cards are freed."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from common.core.admission import names_no_other_scheduler
from scheduler.cluster import SCHEDULER_NAME
from scheduler.cluster.standalone import StandaloneCluster, StoredPod
from scheduler.service import SchedulerService

logger = logging.getLogger(__name__)


class PendingLoop:
    """Plays kube-scheduler for standalone pods: filter, then bind, retrying on change."""

    def __init__(self, service: SchedulerService, cluster: StandaloneCluster,
                 retry_period: float = 5.0, scheduler_name: str = SCHEDULER_NAME) -> None:
        self._service = service
        self._cluster = cluster
        self._retry_period = retry_period
        self._scheduler_name = scheduler_name
        self._retry = service.reporting.retry_signal()

    def retry_now(self) -> None:
        self._retry.set()

    async def run(self) -> None:
        while True:
            self._retry.clear()
            await self.schedule_pending()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._retry.wait(), self._retry_period)

    async def schedule_pending(self) -> None:
        if not self._service.ready:
            return
        for pod in self._cluster.pending():
            # A pod naming another scheduler waits for that one's /filter and /bind, as
            # kube-scheduler leaves the pods of other schedulers alone.
            if not names_no_other_scheduler(pod.manifest.spec.scheduler_name,
                                            self._scheduler_name):
                continue
            try:
                if not await self._schedule(pod):
                    return
            except Exception:  # one pod that breaks a rule must not stall every other
                logger.exception("pending pod %s: scheduling it crashed; it is tried again "
                                 "in the next round", pod.manifest.key)

    async def _schedule(self, pod: StoredPod) -> bool:
        """Filter, then bind, ``pod``; False when /filter did not decide (this daemon
        stands by, as the verbs say, or the ledger is being rebuilt): the round ends."""
        nodes = sorted(n.name for n in self._service.state.fleet.nodes())
        filtered = await self._service.verbs.filter(pod.manifest, nodes)
        if filtered.error:
            return False
        if filtered.passing:
            manifest = pod.manifest
            await self._service.verbs.bind(namespace=manifest.namespace,
                                           name=manifest.metadata.name, uid=pod.uid,
                                           node=filtered.passing[0])
        return True
