"""pyhami as the controller of a Kueue AdmissionCheck (``pyhami.io/placement``).

Kueue reserves a workload's quota in its ClusterQueue, then waits for every
AdmissionCheck the ClusterQueue names. For each Workload that holds quota and names a
check of pyhami's, the leading daemon places all of its pods at once on the live fleet
(each with its own policy chain, as a pod group's members are), and:

- **they fit**: their cards are reserved under placeholder keys, the check says
  ``Ready``, and asks Kueue to add ``pyhami.io/workload`` and ``pyhami.io/pod-set`` to the
  pods; each pod, when it comes to /filter, takes the cards held for one of its pod set
  (``Verbs._workload_decision``). What is not taken is released when the workload ends or
  is evicted, or ``--group-ttl`` after the check said Ready (as a group's cards are);
- **they do not**: nothing is held; the check stays ``Pending`` with pyhami's sentence,
  and after ``--kueue-retry-after`` says ``Retry``: Kueue then evicts the workload, gives
  its quota back and queues it again behind the workloads already waiting (its place in
  the queue is the time of its eviction), so the quota goes to a workload that can start.
  No ``requeueAfterSeconds`` is set: Kueue v0.17 waits that long before it evicts, the
  quota held meanwhile;
- **pyhami cannot place it whatever the cards** (a template that is no pod, more pods
  than a placement takes): ``Rejected`` with the reason.

A workload whose pods ask for no GPU is ``Ready`` at once, nothing held. Kueue's order
decides who goes first (priority, then age); pyhami only says whether a workload fits
now. Only the leader writes; a daemon that begins to lead holds again the cards of the
workloads said Ready whose pods have not all come (within their time).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from common.core.fiterror import plural
from common.core.workloads import (
    CONTROLLER_NAME,
    CheckState,
    Duty,
    Member,
    Workload,
    WorkloadRefused,
    check_duty,
    pod_set_updates,
    workload_members,
)
from scheduler.cluster import (
    AdmissionCheckChange,
    CheckUpdate,
    ClusterError,
    KueueApi,
    WorkloadChange,
)
from scheduler.metrics import Metrics
from scheduler.service.shared import Reports, ServicePart, Shared, in_slices

logger = logging.getLogger(__name__)

PASS_PERIOD = 1.0
"""The longest the checks wait between two passes when nothing wakes them: the time a
``Retry`` or a hold's end may come late by."""


class AdmissionChecks(ServicePart):
    """The Kueue admission check's controller: the Workloads and AdmissionChecks seen, and
    the passes that place, hold and release."""

    def __init__(self, shared: Shared, metrics: Metrics, reports: Reports, *,
                 kueue: KueueApi, retry_after: float) -> None:
        super().__init__(shared, metrics, reports)
        self._kueue = kueue
        self._retry_after = retry_after
        self._wall_clock = shared.wall_clock
        self._workloads: dict[str, Workload] = {}
        self._checks: set[str] = set()
        """The AdmissionChecks whose controller is pyhami."""
        self._active: set[str] = set()
        """Those marked Active by this daemon."""
        self._pending_since: dict[str, float] = {}
        self._tried: dict[str, tuple[str, int]] = {}
        """Workload → (resourceVersion, the fleet's changes) of its last try that did not
        fit: tried again only once either moved."""
        self._said: dict[str, tuple[str, CheckState, str]] = {}
        """Workload → (resourceVersion, state, message) last written for it."""
        self._wake = asyncio.Event()

    # What the watches tell --------------------------------------------------------------

    def workload_changed(self, change: WorkloadChange) -> None:
        workload = change.workload
        if change.deleted:
            self._workloads.pop(workload.key, None)
        else:
            self._workloads[workload.key] = workload
        self._wake.set()

    def check_changed(self, change: AdmissionCheckChange) -> None:
        name = change.check.metadata.name
        if change.deleted or change.check.spec.controller_name != CONTROLLER_NAME:
            self._checks.discard(name)
            self._active.discard(name)
        else:
            self._checks.add(name)
        self._wake.set()

    async def follow_workloads(self) -> None:
        async for change in self._kueue.workload_changes():
            self.workload_changed(change)

    async def follow_checks(self) -> None:
        async for change in self._kueue.admission_check_changes():
            self.check_changed(change)

    # The passes ----------------------------------------------------------------------

    async def run(self) -> None:
        """A pass whenever a Workload or AdmissionCheck changes, cards are freed, or
        ``PASS_PERIOD`` passes; the leader's only."""
        freed = self.reports.retry_signal()
        while True:
            waits = [asyncio.ensure_future(self._wake.wait()),
                     asyncio.ensure_future(freed.wait())]
            try:
                await asyncio.wait(waits, timeout=PASS_PERIOD,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
            self._wake.clear()
            freed.clear()
            if self.shared.ready and self.shared.leadership.leading():
                await self.run_pass()

    async def run_pass(self) -> None:
        """Each workload that names a check of pyhami's, in Kueue's order: placed, held or
        let go as its status asks."""
        await self._activate_checks()
        await self._release(self.state.workloads.expire(self._clock()))
        checks = frozenset(self._checks)
        for key in [k for k in self.state.workloads.workloads() if k not in self._workloads]:
            await self._let_go(key)  # deleted
        for workload in sorted(self._workloads.values(), key=lambda w: w.order):
            held_uid = self.state.workloads.uid(workload.key)
            if held_uid is not None and held_uid != workload.metadata.uid:
                # Deleted and made again under the same name between two passes: what was
                # held was the old one's.
                await self._let_go(workload.key)
            duty, check = check_duty(workload, checks)
            if duty is Duty.NONE or check is None:
                await self._let_go(workload.key)
            elif duty is Duty.HOLD:
                if not self.state.workloads.held(workload.key):
                    await self._take_over(workload, check)
            else:
                await self._place(workload, check)

    async def _activate_checks(self) -> None:
        for name in sorted(self._checks - self._active):
            try:
                await self._kueue.activate_check(
                    name, "pyhami places each workload's pods on the GPUs before it starts")
            except ClusterError as error:
                logger.warning("%s", error)
                continue
            self._active.add(name)
            logger.info("AdmissionCheck %s: pyhami answers it", name)

    async def _place(self, workload: Workload, check: str) -> None:
        key = workload.key
        if self.state.workloads.held(key):
            # Placed, and Kueue has not seen Ready yet (or the write failed): say it again.
            waiting = self.state.workloads.waiting(key)
            await self._say(workload, check, CheckState.READY, self._ready_message(
                len(waiting)), self._pod_sets(workload))
            return
        try:
            members = workload_members(workload, self.settings.defaults)
        except WorkloadRefused as error:
            await self._say(workload, check, CheckState.REJECTED,
                            f"pyhami cannot place this workload: {error}")
            return
        if not members:
            self.state.workloads.hold(key, workload.metadata.uid, [], self._clock())
            await self._say(workload, check, CheckState.READY,
                            "no pod asks for a GPU: pyhami holds no card for it")
            return
        tried = (workload.metadata.resource_version, self.state.cache.fleet_changes)
        if self._tried.get(key) == tried and not self._retry_due(key):
            return
        message = await self._hold(workload, members, self.settings.group_ttl)
        if message is None:
            self._pending_since.pop(key, None)
            self._tried.pop(key, None)
            await self._say(workload, check, CheckState.READY,
                            self._ready_message(len(members)), self._pod_sets(workload))
            return
        self._tried[key] = tried
        since = self._pending_since.setdefault(key, self._clock())
        if self._clock() - since >= self._retry_after:
            self._pending_since.pop(key, None)
            await self._say(workload, check, CheckState.RETRY,
                            f"{message}; after {self._retry_after:g}s pyhami gives its quota "
                            "back to the queue")
        else:
            await self._say(workload, check, CheckState.PENDING, message)

    def _retry_due(self, key: str) -> bool:
        since = self._pending_since.get(key)
        return since is not None and self._clock() - since >= self._retry_after

    async def _hold(self, workload: Workload, members: Sequence[Member],
                    ttl: float) -> str | None:
        """Place ``members`` together and hold their cards for ``ttl``: None when they
        are held, else why not (pyhami's sentence)."""
        cache, now = self.state.cache, self._clock()
        name = workload.metadata.name
        requests = [m.request for m in members]
        async with self.shared.booking:
            steps, generation = cache.group_steps(name, requests, None, now)
            placement = await in_slices(steps)
            if not self.shared.leadership.leading():
                return "this daemon no longer leads"
            if placement.placed and cache.reserve_group(placement, generation, self._clock(),
                                                        ttl):
                self.state.workloads.hold(workload.key, workload.metadata.uid, members,
                                          self._clock() + ttl)
                nodes = sorted({d.node for d in placement.decisions if d.node is not None})
                self.reports.mark_changed(*nodes)
                logger.info("workload %s: its %s held on %s", workload.key,
                            plural(len(members), "GPU pod"), ", ".join(nodes))
                return None
        if placement.placed:
            return "the cards changed while its pods were placed; it is tried again"
        return (f"{placement.fitting} of {plural(len(members), 'GPU pod')} fit now; "
                f"{placement.refused or 'they fit no node'}")

    async def _take_over(self, workload: Workload, check: str) -> None:
        """A workload said Ready before this daemon led (or before it restarted): its
        pods not bound yet get their cards held again, for what is left of their time."""
        key, ttl = workload.key, self.settings.group_ttl
        state = workload.check((check,))
        age = seconds_since(state.last_transition_time if state else None,
                            self._wall_clock())
        left = ttl - age if age is not None else 0.0
        try:
            members = workload_members(workload, self.settings.defaults)
        except WorkloadRefused:
            members = []
        bound = self.state.workloads.bound_in(key)
        remaining = [m for m in members if m.index >= bound.get(m.pod_set, 0)]
        if left <= 0 or not remaining or await self._hold(workload, remaining, left) is not None:
            # Nothing to hold, or no longer held together: its pods are placed alone.
            self.state.workloads.hold(key, workload.metadata.uid, [], self._clock())

    async def _let_go(self, key: str) -> None:
        self._pending_since.pop(key, None)
        self._tried.pop(key, None)
        self._said.pop(key, None)
        await self._release(self.state.workloads.let_go(key))

    async def _release(self, placeholders: Sequence[str]) -> None:
        nodes: list[str] = []
        for placeholder in placeholders:
            released = self.state.cache.release_reservation(placeholder)
            if released is not None:
                nodes.append(released.node)
                self.metrics.released.labels("group").inc()
        if nodes:
            await self.reports.capacity_changed(*nodes)

    # Writing the check's state ---------------------------------------------------------

    async def _say(self, workload: Workload, check: str, state: CheckState, message: str,
                   pod_sets: Sequence[str] = ()) -> None:
        """Write the check's ``state`` on ``workload`` unless it says so already."""
        key, version = workload.key, workload.metadata.resource_version
        current = workload.check((check,))
        if current is not None and current.state == state and current.message == message:
            return
        if self._said.get(key) == (version, state, message):
            return  # written already; the watch has not brought it back yet
        update = CheckUpdate(state, message, tuple(pod_set_updates(workload, pod_sets)))
        try:
            await self._kueue.set_check(workload, check, update)
        except ClusterError as error:
            self.metrics.admission_check_failures.inc()
            logger.warning("%s", error)
            return
        self._said[key] = (version, state, message)
        self.metrics.admission_checks.labels(state.value).inc()
        logger.info("workload %s: check %s %s: %s", key, check, state.value, message)

    @staticmethod
    def _ready_message(pods: int) -> str:
        return f"pyhami holds the cards of its {plural(pods, 'GPU pod')} until they start"

    @staticmethod
    def _pod_sets(workload: Workload) -> list[str]:
        return [pod_set.name for pod_set in workload.spec.pod_sets]


def seconds_since(stamp: str | None, now: float) -> float | None:
    """Seconds from ``stamp`` (an RFC 3339 time, as the API writes one) to ``now``
    (seconds since the epoch); None for a stamp that is missing or unreadable."""
    if not stamp:
        return None
    try:
        then = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    return now - then.timestamp()
