"""Device cordons: the nodes' ``hami.io/device-cordon`` annotations read into the live
state every ``CORDON_REFRESH_S``; where the cluster lists its Nodes, the nodes it no
longer lists forgotten."""

from __future__ import annotations

import asyncio
import logging

from scheduler.cluster import ClusterError
from scheduler.metrics import Metrics
from scheduler.service.handlers.inventories import Inventories
from scheduler.service.shared import Reports, ServicePart, Shared

logger = logging.getLogger(__name__)

CORDON_REFRESH_S = 15.0


class Cordons(ServicePart):
    """The cluster's cordons kept in the live state."""

    def __init__(self, shared: Shared, metrics: Metrics, reports: Reports, *,
                 inventories: Inventories) -> None:
        super().__init__(shared, metrics, reports)
        self._inventories = inventories

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
                self._inventories.forget(name, "its Node is no longer in the cluster")
        changed = self.state.nodes.set_cluster_cordons(cordons)
        if changed:
            logger.info("device cordons changed on %s", ", ".join(sorted(changed)))
            await self.reports.capacity_changed(*changed)

    async def follow_cordons(self, period: float = CORDON_REFRESH_S) -> None:
        while True:
            await asyncio.sleep(period)
            await self.refresh_cordons()
