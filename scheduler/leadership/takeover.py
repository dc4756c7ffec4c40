"""What a daemon does as it begins to lead, and as it stops.

Standalone: it reads every pod afresh, fences the pods no node holds (a bind its
predecessor sent can no longer land) and rebuilds its ledger before it decides; once,
``CATCH_UP_AFTER_S`` later, it reads the pods its predecessor's last writes bound after
that. Kubernetes: a fresh list of the pods, for any the pod watch has not brought yet.
Standing by, the standalone daemon drops its reservations. What it acts on is given at
construction, as the small ports below, so the leadership imports no service.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

import nats.errors

from common.messaging import describe_error
from common.supervision import Supervisor
from scheduler.cluster import ClusterError
from scheduler.leadership.lease import TakeOverFailed
from scheduler.leadership.port import Leadership
from scheduler.retry import BUS_START_PATIENCE_S, BUS_START_RETRY_S

logger = logging.getLogger(__name__)

CATCH_UP_AFTER_S = 6.0
"""When a standalone daemon that has just taken the lease reads the pods again for writes
its predecessor sent while it still decided but that landed after this daemon read them
(a NATS client's publish timeout, 5 s, plus a margin): each is booked then."""


class LedgerRebuild(Protocol):
    async def rebuild(self) -> None:
        """Replace the ledger with what the pods' allocation annotations say."""
        ...


class PodReconcile(Protocol):
    async def reconcile(self) -> None:
        """Bring the ledger in line with a fresh list of the pods."""
        ...


class ReservationsDropped(Protocol):
    async def stand_by(self) -> None:
        """Release the reservations this daemon made: it will never bind them."""
        ...


class PodStore(Protocol):
    """The standalone pod store, as a daemon taking the lease reads it."""

    async def reload(self) -> None:
        """Read every pod and quota afresh."""
        ...

    async def fence(self) -> int:
        """Fence the pods no node holds; how many had been bound meanwhile."""
        ...

    async def catch_up(self) -> int:
        """Take the pods written after this daemon read them; how many."""
        ...


class Takeover:
    """The hooks a leadership calls (``elected``, ``demoted``), given the service's
    ledger, pod watch and reservations, and the standalone pod store (None: Kubernetes)."""

    def __init__(self, leadership: Leadership, supervisor: Supervisor, *,
                 ledger: LedgerRebuild, pods: PodReconcile,
                 reservations: ReservationsDropped, store: PodStore | None,
                 retry_pending: Callable[[], None] | None = None) -> None:
        """``retry_pending``: the standalone pending loop's, asked to try every pending
        pod again once this daemon decides."""
        self._leadership = leadership
        self._supervisor = supervisor
        self._ledger = ledger
        self._pods = pods
        self._reservations = reservations
        self._store = store
        self._retry_pending = retry_pending
        self._catching_up: asyncio.Task[None] | None = None

    async def elected(self) -> None:
        """This daemon leads from now on. Standalone: it reads every pod afresh and
        rebuilds its ledger before it decides. Kubernetes: a fresh list of the pods, for
        any the pod watch has not brought yet."""
        store = self._store
        if store is None:
            await self._pods.reconcile()
            return
        try:
            await store.reload()
            # Before deciding: a bind the predecessor sent can no longer land on a pod
            # this daemon may place elsewhere (docs/reliability.md, the fault test).
            late = await store.fence()
        except (nats.errors.Error, TimeoutError, OSError, ClusterError) as error:
            raise TakeOverFailed(f"the pod store could not be read and fenced "
                                 f"({describe_error(error)})") from None
        if late:
            logger.warning("%d pod(s) bound by the previous lease holder after this daemon "
                           "read the pod store: read now", late)
        await self._ledger.rebuild()
        self.stop()
        self._catching_up = asyncio.create_task(self._catch_up(store))
        if self._retry_pending is not None:
            self._retry_pending()

    async def demoted(self) -> None:
        """Standing by: the standalone daemon drops its reservations."""
        self.stop()
        await self._reservations.stand_by()

    def stop(self) -> None:
        """No catching up from now on (stopping, or no longer leading)."""
        if self._catching_up is not None:
            self._catching_up.cancel()
            self._catching_up = None

    async def _catch_up(self, store: PodStore) -> None:
        """Once, ``CATCH_UP_AFTER_S`` after taking the lease: the pods the predecessor's
        last writes bound after this daemon's reload are read and booked (their Allocate
        is asked again meanwhile by the device plugin, agent UNLISTED_PATIENCE_S)."""
        await asyncio.sleep(CATCH_UP_AFTER_S)
        deadline = time.monotonic() + BUS_START_PATIENCE_S
        while self._leadership.leading():
            with self._supervisor.contained("catching up with the pod store"):
                try:
                    taken = await store.catch_up()
                except (nats.errors.Error, TimeoutError, OSError) as error:
                    if time.monotonic() + BUS_START_RETRY_S >= deadline:
                        logger.error("the pod store was not read again within %gs of taking "
                                     "the lease (%s): a bind the previous holder made last "
                                     "may be missing from the ledger", BUS_START_PATIENCE_S,
                                     describe_error(error))
                        return
                    logger.warning("catching up with the pod store: %s; trying again in %gs",
                                   describe_error(error), BUS_START_RETRY_S)
                    await asyncio.sleep(BUS_START_RETRY_S)
                    continue
                if taken:
                    logger.warning("%d pod(s) written by the previous lease holder after this "
                                   "daemon read the pod store: read now", taken)
            return
