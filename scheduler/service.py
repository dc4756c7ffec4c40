"""The decision daemon's service: the extender verbs around the live state.

The HTTP layer (``scheduler.http``) decodes requests and calls these methods;
everything that changes the ledger happens here, on one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine
from dataclasses import dataclass
from typing import Literal

from common.core import (
    Allocation,
    AnnotationError,
    Decision,
    Defaults,
    NodePolicy,
    PodManifest,
    PodRejected,
    PodRequest,
    decision_document,
    parse_pod,
    rejected,
)
from common.core.annotations import (
    ALLOCATED_ANNOTATION,
    BIND_PHASE_ANNOTATION,
    BIND_TIME_ANNOTATION,
    TIME_ANNOTATION,
    TO_ALLOCATE_ANNOTATION,
)
from common.core.fleet import NODE_WEIGHTS, occupied_slots, score_max
from common.core.pod import DEFAULT_NAMESPACE
from common.core.reasons import removed_most
from common.messaging import RateLimitedLog
from common.telemetry import CardUsage, DecisionEvent, UsageEvent
from common.wire import Inventory, WireError, decode_inventory
from scheduler.cluster import Cluster, ClusterError, PodChange
from scheduler.metrics import Metrics, Sources
from scheduler.protocol import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    HostPriority,
    node_name,
)
from scheduler.state import LiveState

logger = logging.getLogger(__name__)

Publish = Callable[[DecisionEvent | UsageEvent], Awaitable[None]]
MAX_PRIORITY = 10
NODE_SCORE_MAX = score_max(NODE_WEIGHTS)
"""/prioritize scales a node's score from 0..NODE_SCORE_MAX to 0..MAX_PRIORITY."""
CORDON_REFRESH_S = 15.0
NODE_WATCH_S = 1.0
DEFAULT_NODE_RETENTION_S = 600.0

Check = Callable[[], str | None]


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    defaults: Defaults
    node_timeout: float = 30.0
    reservation_ttl: float = 60.0
    node_retention: float | None = DEFAULT_NODE_RETENTION_S
    """Forget a node silent this long (standalone); None: never for silence."""
    nodes_listed: bool = False
    """The cluster lists its Nodes (Kubernetes): forget a node it no longer lists."""


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1e3


class KeyedLocks:
    """One lock per key, held only while someone uses it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class SchedulerService:
    def __init__(self, settings: ServiceSettings, cluster: Cluster, publish: Publish,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.state = LiveState(node_timeout=settings.node_timeout,
                               reservation_ttl=settings.reservation_ttl,
                               node_retention=settings.node_retention)
        self.cluster = cluster
        self._publish = publish
        self._clock = clock
        self._wall_clock = wall_clock
        self.metrics = Metrics(Sources(
            fleet=lambda: self.state.fleet, last_heard=self._last_heard,
            stale=lambda: self.state.stale_nodes(self._clock()).keys(),
            ready=lambda: not self.not_ready_because()))
        self.ready = False
        """The ledger is rebuilt: /filter answers (``not_ready_because`` says the rest)."""
        self.readiness_checks: list[Check] = []
        """Each says why the daemon is not ready, or None (NATS, background tasks)."""
        self.status_parts: dict[str, Callable[[], object]] = {}
        self.inventory_accepted = 0
        self._followed_cluster = False
        self._manifests: dict[str, PodManifest] = {}
        self._changed_nodes: set[str] = set()
        self._retry_signals: list[asyncio.Event] = []
        self._reporting: set[asyncio.Task[None]] = set()
        # Pods /filter refused, to retry when cards are freed: kube-scheduler may have
        # retried them a moment before pyhami saw the release, and then waits minutes.
        self._refused: dict[str, tuple[str, str]] = {}
        self._binding = KeyedLocks()
        self._refusals = RateLimitedLog(clock, logger)

    # Start-up ----------------------------------------------------------------

    async def rebuild(self) -> None:
        """Rebuild the ledger from the pods' allocation annotations, then answer /filter."""
        pods = await self.cluster.list_pods()
        restored = []
        for pod in pods:
            try:
                allocation = pod.allocation()
            except AnnotationError as error:
                logger.error("pod %s: %s; its cards are not counted", pod.key, error)
                continue
            if allocation is not None:
                restored.append((pod.key, allocation))
        self.state.restore(restored)
        await self.refresh_cordons()
        self._changed_nodes.update(a.node for _, a in restored)
        logger.info("ledger rebuilt from %d pods holding cards", len(restored))
        self.ready = True

    def not_ready_because(self) -> list[str]:
        """Why /readyz answers 503; empty when ready."""
        reasons = [] if self.ready else ["rebuilding the ledger"]
        reasons.extend(reason for check in self.readiness_checks if (reason := check()))
        return reasons

    def status(self) -> dict[str, object]:
        """A cheap summary for operators and benchmarks (``/statusz``)."""
        not_ready = self.not_ready_because()
        return {
            "ready": not not_ready,
            "not_ready_because": not_ready,
            **{name: part() for name, part in self.status_parts.items()},
            "nodes": sum(1 for _ in self.state.fleet.nodes()),
            "node_names": sorted(n.name for n in self.state.fleet.nodes()),
            "stale_nodes": sorted(self.state.stale_nodes(self._clock())),
            "inventory_accepted": self.inventory_accepted,
            "pods_bound": len(self.state.bound),
            "reservations": len(self.state.reservations),
        }

    def _last_heard(self) -> dict[str, float]:
        """When each node was last heard from, in seconds since the epoch (for metrics)."""
        now, wall = self._clock(), self._wall_clock()
        return {name: wall - quiet for name, quiet in self.state.silence(now).items()}

    # Inventory ---------------------------------------------------------------

    async def receive_inventory(self, subject: str, data: bytes) -> None:
        """Ingest one agent message; a card that left while pods hold it is reported on them."""
        result = self.ingest(subject, data)
        if result is None:
            return
        inventory, vanished = result
        if not vanished:
            return
        holders = [(key, allocation) for key, allocation in self.state.fleet.allocations().items()
                   if allocation.node == inventory.node]
        for key, allocation in holders:
            lost = sorted({g.uuid for grants in allocation.containers for g in grants} & vanished)
            if lost:
                namespace, _, name = key.partition("/")
                await self.cluster.record_event(
                    namespace, name, "Warning", "CardVanished",
                    f"node {inventory.node} no longer reports {', '.join(lost)}, which this pod "
                    "holds; the cards stay booked until the pod ends")

    def ingest(self, subject: str, data: bytes) -> tuple[Inventory, set[str]] | None:
        """Apply one agent message: the inventory and the cards that left holding allocations.

        A message refused (malformed, out of bounds, on another node's subject, claiming
        another live node's card) is counted by result and logged at a bounded rate.
        """
        try:
            inventory = decode_inventory(data, subject)
        except WireError as error:
            self._refuse_inventory(error.result, str(error))
            return None
        result = self.state.ingest(inventory, self._clock())
        if result.conflict is not None:
            self._refuse_inventory("card_conflict", f"inventory refused: {result.conflict}")
            return None
        if not result.accepted:
            self.metrics.inventory.labels("out_of_order").inc()
            return None
        self.metrics.inventory.labels("accepted").inc()
        self.inventory_accepted += 1
        if not result.news:
            return inventory, set()
        if result.back_after is not None:
            logger.info("node %s is heard from again after %.0fs of silence", inventory.node,
                        result.back_after)
        self._changed_nodes.add(inventory.node)
        for uuid, usage in result.vanished.items():
            logger.error("node %s: card %s left the inventory while allocations hold it "
                         "(%d tenants, %d MiB); they stay booked until their pods end",
                         inventory.node, uuid, usage.tenants, usage.memory)
        self._retry_waiting()
        return inventory, set(result.vanished)

    def _refuse_inventory(self, result: str, why: str) -> None:
        self.metrics.inventory.labels(result).inc()
        self._refusals.warning(result, "%s", why)

    # Extender verbs ------------------------------------------------------------

    async def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        started = time.perf_counter()
        names = args.node_names
        if names is None:
            names = [node_name(item) for item in (args.nodes.items or [])] if args.nodes else []
        if not self.ready:
            return ExtenderFilterResult(error="pyhami is rebuilding its ledger; try again")
        try:
            request = parse_pod(args.pod, self.settings.defaults)
        except PodRejected as error:
            decision = rejected(args.pod.key, str(error))
            self._count("filter", decision)
            self._in_background(self._after_filter(args.pod, decision, _ms_since(started)))
            unresolvable = {name: f"PodRejected: {error}" for name in names}
            return ExtenderFilterResult(failed_and_unresolvable_nodes=unresolvable)
        if not request.wants_gpu:
            return self._pass_through(args, names)
        self._manifests[request.key] = args.pod
        decision = self.state.filter(request, names, self._clock(), explain_chosen=True)
        if decision.node is not None:
            self._changed_nodes.add(decision.node)
            self._refused.pop(request.key, None)
        else:
            self._refused[request.key] = (args.pod.namespace, args.pod.metadata.name)
        self._count("filter", decision)
        self.metrics.filter_duration.observe(time.perf_counter() - started)
        self._in_background(self._after_filter(args.pod, decision, _ms_since(started), request))
        failed = decision.failed_nodes or {}
        if decision.node is None:
            return ExtenderFilterResult(node_names=[] if args.node_names is not None else None,
                                        nodes=None if args.node_names is not None else
                                        {"items": []},
                                        failed_nodes=failed)
        if args.node_names is not None:
            return ExtenderFilterResult(node_names=[decision.node], failed_nodes=failed)
        chosen = [item for item in (args.nodes.items or []) if node_name(item) == decision.node] \
            if args.nodes else []
        return ExtenderFilterResult(nodes={"items": chosen}, failed_nodes=failed)

    def _pass_through(self, args: ExtenderArgs, names: list[str]) -> ExtenderFilterResult:
        if args.node_names is not None:
            return ExtenderFilterResult(node_names=list(names))
        return ExtenderFilterResult(nodes={"items": list(args.nodes.items or [])}
                                    if args.nodes else None)

    async def _after_filter(self, pod: PodManifest, decision: Decision, duration_ms: float,
                            request: PodRequest | None = None) -> None:
        namespace = pod.namespace
        name = pod.metadata.name
        if decision.ignored_policies:
            message = (f"unknown scheduler policies ignored: {', '.join(decision.ignored_policies)}"
                       f"; evaluating {request.chain if request else 'the default'}")
            logger.warning("pod %s: %s", decision.pod, message)
            await self.cluster.record_event(namespace, name, "Warning", "PolicyIgnored", message)
        if decision.node is None and decision.message is not None:
            await self.cluster.record_event(namespace, name, "Warning", "FilteringFailed",
                                            decision.message)
        for row in decision.explain or ():
            logger.debug("pod %s node %s card %d (%s): computer score is %.6f%s", decision.pod,
                         row.node, row.index, row.uuid, row.score,
                         f", filtered by {row.filtered_by}" if row.filtered_by else "")
        await self._publish(DecisionEvent.of(decision, "filter", self._wall_clock(), duration_ms))
        await self._publish_usage()

    def explain(self, pod: PodManifest,
                node_names: Collection[str] | None = None) -> dict[str, object]:
        """What /filter would decide for ``pod`` now among ``node_names`` (default: every
        node), with every card's selection path.

        Books nothing: for ``pyhami explain`` and the demo.
        """
        try:
            request = parse_pod(pod, self.settings.defaults)
        except PodRejected as error:
            return decision_document(rejected(pod.key, str(error)))
        # A pod that holds cards already is judged as if it held none.
        decision = self.state.preview(request, node_names, self._clock(), explain=True,
                                      describe=True, holding_nothing=True)
        return decision_document(decision)

    async def prioritize(self, args: ExtenderArgs) -> list[HostPriority]:
        """0..10 per node by the node policy: binpack favours the busiest node."""
        names = args.node_names
        if names is None:
            names = [node_name(item) for item in (args.nodes.items or [])] if args.nodes else []
        policy = self.settings.defaults.node_policy
        with contextlib.suppress(PodRejected):  # /filter already refused it with its reason
            policy = parse_pod(args.pod, self.settings.defaults).node_policy
        layout = self.state.fleet.layout
        scores = layout.node_scores()
        result = []
        for name in names:
            position = layout.node_position.get(name)
            if position is None:
                result.append(HostPriority(name, 0))
                continue
            fraction = min(float(scores[position]) / NODE_SCORE_MAX, 1.0)
            score = fraction if policy is NodePolicy.BINPACK else 1.0 - fraction
            result.append(HostPriority(name, round(score * MAX_PRIORITY)))
        return result

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        """Bind the pod to ``args.node`` with its cards; one bind of a pod runs at a time.

        A repeated bind to the node the pod is bound to answers success and changes
        nothing; a bind to another node is refused. A failed bind releases only the
        reservation it used, never a pod's bound cards.
        """
        started = time.perf_counter()
        key = f"{args.pod_namespace or DEFAULT_NAMESPACE}/{args.pod_name}"
        try:
            async with self._binding.hold(key):
                return await self._bind_exclusively(key, args)
        finally:
            self.metrics.bind_duration.observe(time.perf_counter() - started)

    async def _bind_exclusively(self, key: str, args: ExtenderBindingArgs,
                                ) -> ExtenderBindingResult:
        if key in self.state.bound:
            held = self.state.fleet.allocation(key)
            if held is not None and held.node == args.node:
                return ExtenderBindingResult()  # a repeat of the bind that placed it
            where = held.node if held is not None else "another node"
            return await self._refuse_bind(args, f"pod {key} is already bound to {where}")
        allocation: Allocation | None = None
        try:
            allocation = await self._allocation_on(key, args)
            await self.cluster.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node,
                                    self._bind_annotations(key, args.node, allocation))
        except ClusterError as error:
            if allocation is not None and self.state.reservation(key) is allocation:
                self.state.release_reservation(key)
                self.metrics.released.labels("bind_failed").inc()
                self._changed_nodes.add(args.node)
                await self._publish_usage()
                self._retry_waiting()
            return await self._refuse_bind(args, str(error))
        if allocation is not None:
            self.state.confirm(key, allocation)
        self._manifests.pop(key, None)
        self.metrics.decisions.labels("bind", "bound", "").inc()
        return ExtenderBindingResult()

    async def _refuse_bind(self, args: ExtenderBindingArgs, why: str) -> ExtenderBindingResult:
        self.metrics.decisions.labels("bind", "failed", "BindingFailed").inc()
        await self.cluster.record_event(args.pod_namespace, args.pod_name, "Warning",
                                        "BindingFailed", why)
        return ExtenderBindingResult(error=why)

    def _bind_annotations(self, key: str, node: str,
                          allocation: Allocation | None) -> dict[str, str | None]:
        """The allocation annotations (docs/decision-core.md). A pod that holds no cards
        loses any allocation annotation its author wrote: the pod's annotations are the
        ledger's durable record."""
        if allocation is None:
            return {ALLOCATED_ANNOTATION: None, TO_ALLOCATE_ANNOTATION: None}
        now = str(int(self._wall_clock()))
        annotations: dict[str, str | None] = dict(Decision(
            pod=key, scheduled=True, node=node, allocation=allocation).annotations())
        annotations.update({TIME_ANNOTATION: now, BIND_PHASE_ANNOTATION: "allocating",
                            BIND_TIME_ANNOTATION: now})
        return annotations

    async def _allocation_on(self, key: str, args: ExtenderBindingArgs) -> Allocation | None:
        """The pod's cards on the node kube-scheduler chose, deciding again if need be;
        None for a pod that asks for no GPU. Raises ``ClusterError`` when it cannot go there.
        """
        held = self.state.reservation(key)
        if held is not None and held.node == args.node:
            return held
        manifest = self._manifests.get(key)
        if manifest is None:
            pod = await self.cluster.get_pod(args.pod_namespace, args.pod_name)
            if pod is None:
                raise ClusterError(f"pod {key} no longer exists")
            manifest = pod.manifest
        try:
            request = parse_pod(manifest, self.settings.defaults)
        except PodRejected as error:
            raise ClusterError(str(error)) from None
        if not request.wants_gpu:
            return None
        decision = self.state.filter(request, [args.node], self._clock())
        if decision.allocation is None:
            failure = (decision.failures or {}).get(args.node)
            why = failure.text() if failure is not None else "no cards fit"
            raise ClusterError(f"node {args.node} cannot hold pod {key}: {why}")
        self._changed_nodes.add(args.node)
        return decision.allocation

    # Cluster changes -------------------------------------------------------------

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
        for key in sorted(self.state.bound - listed):
            await self._pod_ended(key)
        for pod in pods:
            await self.on_pod_change(PodChange(pod, deleted=False))

    async def on_pod_change(self, change: PodChange) -> None:
        pod = change.pod
        if change.deleted or pod.finished:
            await self._pod_ended(pod.key)
            return
        if pod.key in self.state.bound or self.state.reservation(pod.key) is not None:
            return
        try:
            allocation = pod.allocation()
        except AnnotationError as error:
            logger.error("pod %s: %s; its cards are not counted", pod.key, error)
            return
        if allocation is not None:  # bound elsewhere, e.g. while this daemon was down
            self.state.restore([(pod.key, allocation)])
            self._changed_nodes.add(allocation.node)
            await self._publish_usage()

    async def _pod_ended(self, key: str) -> None:
        self._manifests.pop(key, None)
        self._refused.pop(key, None)
        released = self.state.release(key)
        if released is not None:
            logger.info("pod %s ended: its cards on %s are free", key, released.node)
            self._changed_nodes.add(released.node)
            await self._publish_usage()
            self._retry_waiting()

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
            for name in self.state.unlisted(cordons.keys(), listed_since):
                self._forget(name, "its Node is no longer in the cluster")
        changed = self.state.set_cluster_cordons(cordons)
        if changed:
            logger.info("device cordons changed on %s", ", ".join(sorted(changed)))
            self._changed_nodes.update(changed)
            await self._publish_usage()
            self._retry_waiting()

    async def follow_cordons(self, period: float = CORDON_REFRESH_S) -> None:
        while True:
            await asyncio.sleep(period)
            await self.refresh_cordons()

    async def watch_nodes(self, period: float = NODE_WATCH_S) -> None:
        while True:
            await asyncio.sleep(period)
            self.check_nodes()

    def check_nodes(self) -> None:
        """Log each node once as it goes stale; forget those silent beyond the retention."""
        now = self._clock()
        for name, why in self.state.newly_stale(now).items():
            logger.warning("node %s is stale: %s", name, why.text())
        for name, quiet in self.state.silent_beyond_retention(now).items():
            self._forget(name, f"silent for {quiet:.0f}s (retention "
                               f"{self.settings.node_retention:g}s)")

    def _forget(self, name: str, why: str) -> None:
        self.state.forget(name)
        self._changed_nodes.discard(name)
        held = sum(1 for a in self.state.fleet.allocations().values() if a.node == name)
        logger.warning("node %s forgotten: %s%s", name, why,
                       f"; {held} pods still hold its cards" if held else "")

    async def expire_reservations(self, period: float = 1.0) -> None:
        while True:
            await asyncio.sleep(period)
            late = self.state.expire(self._clock())
            for key, allocation in late.items():
                logger.warning("reservation of pod %s expired: no bind came in time", key)
                self.metrics.released.labels("expired").inc()
                self._changed_nodes.add(allocation.node)
            if late:
                await self._publish_usage()
                self._retry_waiting()

    # Helpers -------------------------------------------------------------------

    def _count(self, verb: Literal["filter", "bind"], decision: Decision) -> None:
        if decision.reason is not None:
            self.metrics.decisions.labels(verb, "rejected", "PodRejected").inc()
        elif decision.node is not None:
            self.metrics.decisions.labels(verb, "scheduled", "").inc()
        else:
            top = removed_most((decision.failures or {}).values()) or "NoNode"
            self.metrics.decisions.labels(verb, "unschedulable", top).inc()

    async def _publish_usage(self) -> None:
        changed, self._changed_nodes = self._changed_nodes, set()
        fleet = self.state.fleet
        for name in sorted(changed):
            node = fleet.node(name)
            if node is None:
                continue
            cards = []
            for device in sorted(node.devices, key=lambda d: d.index):
                usage = fleet.usage(name, device.uuid)
                cards.append(CardUsage(
                    uuid=device.uuid, index=device.index, type=device.type,
                    tenants=usage.tenants, used=occupied_slots(usage.tenants, device.processes),
                    usedmem=usage.memory, memory=device.memory, usedcores=usage.cores,
                    cores=device.cores, count=device.count, health=device.health))
            await self._publish(UsageEvent(node=name, timestamp=self._wall_clock(), cards=cards))

    def _in_background(self, report: Coroutine[None, None, None]) -> None:
        """Events and telemetry go out after the answer, never delaying kube-scheduler."""
        task = asyncio.get_running_loop().create_task(report)
        self._reporting.add(task)
        task.add_done_callback(self._reported)

    async def settle(self, timeout: float = 5.0) -> None:
        """Let the reports already under way go out (before shutting down)."""
        if self._reporting:
            await asyncio.wait(self._reporting, timeout=timeout)

    def _reported(self, task: asyncio.Task[None]) -> None:
        self._reporting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("reporting a decision failed", exc_info=task.exception())

    def _retry_waiting(self) -> None:
        """Cards were freed or a node changed: pods waiting for capacity may fit now."""
        for event in self._retry_signals:
            event.set()
        if self._refused:
            waiting, self._refused = list(self._refused.values()), {}
            stamp = str(self._wall_clock())
            self._in_background(self._ask_cluster_to_retry(waiting, stamp))

    async def _ask_cluster_to_retry(self, waiting: list[tuple[str, str]], stamp: str) -> None:
        for namespace, name in waiting:
            await self.cluster.retry_pod(namespace, name, stamp)

    def retry_signal(self) -> asyncio.Event:
        """An event set whenever cards are freed or inventory changes (for retry loops)."""
        event = asyncio.Event()
        self._retry_signals.append(event)
        return event

    # Read-only view of the ledger ------------------------------------------------

    def ledger(self) -> dict[str, object]:
        """The ledger as it stands (``GET /ledgerz``), for operators and invariant checks.

        ``pods``: every allocation (bound or reserved) with its cards per container;
        ``reservations``: unconfirmed ones with their age; ``cards``: each reported
        card's booked usage beside its capacity; ``orphans``: usage on cards no node
        reports any more.
        """
        now = self._clock()
        state = self.state
        fleet = state.fleet
        pods = {
            key: {"node": allocation.node, "bound": key in state.bound,
                  "init_containers": allocation.init_containers,
                  "containers": [[{"uuid": g.uuid, "memory": g.memory, "cores": g.cores}
                                  for g in grants] for grants in allocation.containers]}
            for key, allocation in fleet.allocations().items()}
        reservations = {
            key: {"node": held.allocation.node,
                  "age_s": now - (held.expires - state.reservation_ttl),
                  "expires_in_s": held.expires - now}
            for key, held in state.reservations.items()}
        cards = []
        for node in fleet.nodes():
            for device in node.devices:
                usage = fleet.usage(node.name, device.uuid)
                cards.append({"node": node.name, "uuid": device.uuid, "index": device.index,
                              "tenants": usage.tenants, "usedmem": usage.memory,
                              "usedcores": usage.cores, "memory": device.memory,
                              "cores": device.cores, "count": device.count,
                              "processes": device.processes})
        orphans = [{"node": node, "uuid": uuid, "tenants": usage.tenants,
                    "usedmem": usage.memory, "usedcores": usage.cores}
                   for (node, uuid), usage in fleet.orphans().items()]
        return {"reservation_ttl_s": state.reservation_ttl, "bound": sorted(state.bound),
                "pods": pods, "reservations": reservations, "cards": cards,
                "orphans": orphans}
