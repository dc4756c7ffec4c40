"""Reservations no bind confirmed: released once ``--reservation-ttl`` passes (a group's
when not every member is bound within ``--group-ttl``), and all of them when this daemon
stands by, for it will never bind them."""

from __future__ import annotations

import asyncio
import logging

from scheduler.metrics import Metrics
from scheduler.service.handlers.groups import GroupMembers
from scheduler.service.shared import Reports, ServicePart, Shared

logger = logging.getLogger(__name__)


class Reservations(ServicePart):
    """The reservations released when no bind will come."""

    def __init__(self, shared: Shared, metrics: Metrics, reports: Reports, *,
                 groups: GroupMembers) -> None:
        super().__init__(shared, metrics, reports)
        self._groups = groups

    async def expire_reservations(self, period: float = 1.0) -> None:
        while True:
            await asyncio.sleep(period)
            now = self._clock()
            for overdue in list(self.state.groups.overdue(now)):
                await self._groups.let_go(overdue, f"not every member was bound within "
                                                   f"{self.settings.group_ttl:g}s")
            late = self.state.cache.expire(now)
            for key in late:
                logger.warning("reservation of pod %s expired: no bind came in time", key)
                self.metrics.released.labels("expired").inc()
                if (group := self.state.groups.group_of(key)) is not None:
                    await self._groups.let_go(group, f"the reservation of its member {key} "
                                                     "expired")
            if late:
                await self.reports.capacity_changed(*(a.node for a in late.values()))

    async def stand_by(self) -> None:
        """This daemon stopped deciding: the reservations it made will never be bound."""
        dropped = self.state.cache.drop_reservations()
        # The Kueue workloads' placeholders went with them: the next leader places again.
        self.state.workloads.let_go_all()
        if dropped:
            logger.info("standing by: %d reservations released", len(dropped))
            await self.reports.capacity_changed(*(a.node for a in dropped.values()),
                                                retry_waiting=False)
