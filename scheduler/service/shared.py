"""What the service's parts share: the settings, the live state, the cluster port, the
pods in flight, the reports under way, and the port through which a part says the
cards' capacity changed."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Generator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, Protocol, TypeVar

from common.arguments import positive_seconds
from common.core import Decision, Defaults, PodManifest, PodRequest
from common.settings import setting
from scheduler.cluster import SCHEDULER_NAME, Cluster
from scheduler.leadership import AlwaysLeader, Leadership
from scheduler.metrics import Metrics
from scheduler.state import LiveState
from scheduler.state.pods import PodsInFlight

logger = logging.getLogger(__name__)


class FilterNodes(StrEnum):
    """What /filter answers for a GPU pod it places."""

    ONE = "one"
    """The one node pyhami chose (HAMi's answer): the node policy decides."""
    ALL = "all"
    """Every node that holds the pod: kube-scheduler chooses among them, adding pyhami's
    /prioritize to its own scores (preferred affinity, topology spread, image locality)."""


def _filter_nodes(text: str) -> FilterNodes:
    try:
        return FilterNodes(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not one of {', '.join(repr(m.value) for m in FilterNodes)}"
        ) from None


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    defaults: Defaults
    node_timeout: float = setting(
        30.0, parse=positive_seconds,
        help="a node silent this long takes no new pods (default {default})")
    reservation_ttl: float = setting(
        60.0, parse=positive_seconds,
        help="release cards no bind confirmed after this long (default {default})")
    group_ttl: float = setting(
        60.0, parse=positive_seconds,
        help="release the cards held for a pod group placed together once this long has "
             "passed and not every member is bound; none of the group keeps any "
             "(default {default})")
    group_patience: float = setting(
        60.0, parse=positive_seconds,
        help="a pod group whole and not fitting for this long, that would fit on idle "
             "cards, goes ahead of every pod of its priority or lower: those are not placed "
             "on the nodes it would use (default {default})")
    group_turn: float = setting(
        300.0, parse=positive_seconds,
        help="a pod group gone ahead holds others back at most this long at a time; then it "
             "waits twice its last wait, at most an hour, before its next turn "
             "(default {default})")
    filter_nodes: FilterNodes = setting(
        FilterNodes.ONE, parse=_filter_nodes, metavar="{one,all}",
        help="what /filter answers for a GPU pod: 'one', the node pyhami chooses (HAMi's "
             "answer), or 'all', every node that holds the pod, for kube-scheduler to choose "
             "among with its own scores and /prioritize's (default {default})")
    node_retention: float | None = setting(
        600.0, parse=positive_seconds,
        help="standalone: forget a node silent this long; longer than --node-timeout; "
             "Kubernetes: remove its hami.io/node-nvidia-register then (default {default})")
    """Forget a node silent this long (standalone); None: never for silence."""
    nodes_listed: bool = False
    """The cluster lists its Nodes (Kubernetes): forget a node it no longer lists."""
    node_registration: bool = False
    """Write each Node's ``hami.io/node-nvidia-register`` for HAMi-WebUI (Kubernetes; the
    command turns it on unless ``--no-node-registration``)."""
    registration_retention: float = 600.0
    """Remove a node's register annotation once its agent is silent this long (the
    command passes ``--node-retention``)."""
    kueue_retry_after: float = setting(
        60.0, parse=positive_seconds,
        help="Kubernetes with Kueue: a workload whose pods do not fit for this long has "
             "pyhami's admission check say Retry: Kueue evicts it, its quota goes to the "
             "workloads waiting, and it is queued again behind them (default {default})")
    kueue_admission_check: bool = False
    """Answer Kueue's AdmissionChecks whose controllerName is ``pyhami.io/placement``
    (Kubernetes; the command turns it on with ``--kueue-admission-check``)."""
    success_events: bool = True
    """Write the Normal Events HAMi's scheduler writes on success, ``FilteringSucceed``
    when /filter places a GPU pod and ``BindingSucceed`` when /bind binds one: two Event
    writes a placed pod (the command turns them off with ``--no-success-events``)."""


SLICE_SECONDS = 0.02
"""How long work that takes many steps (a group's placement: a decision per member) runs
before the loop answers others (health probes, inventories, other verbs) in between."""

Result = TypeVar("Result")


async def in_slices(steps: Generator[None, None, Result],
                    clock: Callable[[], float] = time.perf_counter) -> Result:
    """Run ``steps`` to its end, letting the loop run every ``SLICE_SECONDS``: no request
    holds the daemon's loop for as long as its whole work takes."""
    deadline = clock() + SLICE_SECONDS
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: Result = done.value
            return result
        if clock() >= deadline:
            await asyncio.sleep(0)
            deadline = clock() + SLICE_SECONDS


Unschedulable = Callable[[PodManifest, PodRequest, Sequence[str]], None]
"""Told of a GPU pod /filter found no node for, with the nodes it was offered."""


class Reports(Protocol):
    """What the verbs and the handlers tell reporting."""

    def mark_changed(self, *nodes: str) -> None:
        """These nodes' usage changed; it goes out with the next usage report."""

    def usage_asked(self, node: str) -> None:
        """Someone asked for this node's usage (an agent answered a resync): it goes out
        with the next usage report, changed or not."""

    async def capacity_changed(self, *nodes: str, retry_waiting: bool = True) -> None:
        """The ending every path that books, frees or cordons cards shares: mark the
        nodes changed, publish their usage, and retry the pods waiting for capacity."""

    def retry_waiting(self) -> None:
        """Pods waiting for capacity may fit now: ask for them to be tried again."""

    def retry_signal(self) -> asyncio.Event:
        """An event set whenever cards are freed or inventory changes (for retry loops)."""
        ...

    async def decided(self, decision: Decision, verb: Literal["filter", "bind"],
                      duration_ms: float, decided_at: float, *,
                      failed_nodes: Mapping[str, str] | None = None) -> None:
        """Publish a decision (made at ``decided_at``, seconds since the epoch) and the
        usage it changed; ``failed_nodes``: its ``failed_nodes`` when written already."""


class Shared:
    """The one state the parts share; everything in it changes on the daemon's loop."""

    def __init__(self, settings: ServiceSettings, cluster: Cluster,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, *,
                 leadership: Leadership | None = None) -> None:
        self.settings = settings
        self.state = LiveState(node_timeout=settings.node_timeout,
                               reservation_ttl=settings.reservation_ttl,
                               node_retention=settings.node_retention)
        self.cluster = cluster
        self.clock = clock
        self.wall_clock = wall_clock
        self.ready = False
        """The ledger is rebuilt: /filter answers (``not_ready_because`` says the rest)."""
        self.leadership: Leadership = leadership or AlwaysLeader(SCHEDULER_NAME)
        """Whether this daemon decides: the daemon's choice, or alone (in-process tests)."""
        self.inventory_accepted = 0
        self.pods = PodsInFlight()
        """What the daemon remembers of pods beyond their cards."""
        self.booking = asyncio.Lock()
        """Taken by every verb that books cards: a group placed in slices holds it from its
        trial to its booking, so nothing is booked in between (the trial would no longer
        hold), while the loop goes on answering everything else."""
        self._reporting: set[asyncio.Task[None]] = set()
        self._before_settle: list[Callable[[], None]] = []

    def in_background(self, report: Coroutine[None, None, None]) -> None:
        """Events and telemetry go out after the answer, never delaying kube-scheduler."""
        task = asyncio.get_running_loop().create_task(report)
        self._reporting.add(task)
        task.add_done_callback(self._reported)

    def before_settle(self, send: Callable[[], None]) -> None:
        """``send`` starts what a part holds back to report in a batch, when settling."""
        self._before_settle.append(send)

    async def settle(self, timeout: float = 5.0) -> None:
        """Let the reports held back and those already under way go out (before shutting
        down)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            # Again after each wait: a report under way may hold back more (a decision's
            # report adds the decision to the telemetry batch).
            for send in self._before_settle:
                send()
            left = deadline - loop.time()
            if not self._reporting or left <= 0:
                return
            await asyncio.wait(set(self._reporting), timeout=left)

    def _reported(self, task: asyncio.Task[None]) -> None:
        self._reporting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("reporting a decision failed", exc_info=task.exception())


class ServicePart:
    """What every part of the service works with: the shared state, the metrics and the
    reports."""

    def __init__(self, shared: Shared, metrics: Metrics, reports: Reports) -> None:
        self.shared = shared
        self.settings = shared.settings
        self.state = shared.state
        self.cluster = shared.cluster
        self._clock = shared.clock
        self.metrics = metrics
        self.reports = reports
