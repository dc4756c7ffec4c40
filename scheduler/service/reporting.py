"""Reporting: what the daemon tells others. Usage and decisions on the
telemetry bus, the retries of waiting pods, the metrics' sources, and the status and
ledger views for operators."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Literal

import msgspec

from common.core import Decision
from common.core.fleet import occupied_slots
from common.telemetry import CardUsage, DecisionEvent, UsageEvent
from scheduler.metrics import Metrics, Sources
from scheduler.service.shared import Shared

logger = logging.getLogger(__name__)

Publish = Callable[[DecisionEvent | UsageEvent], Awaitable[None]]
Check = Callable[[], str | None]

TELEMETRY_BATCH_S = 0.02
"""Decisions and usage go out together at most this long after the first of them: under
a burst one usage message covers every pod placed on a node meanwhile, and one write to
NATS carries them all, where each pod cost a usage message and a write of its own."""
RECENT_DECISIONS = 100
"""The decisions kept to replay to a watcher that connects (``pyhami watch --decisions``
shows 10 by default)."""


class Reporting:
    """The ``Reports`` the other parts use, and the views of the daemon's health."""

    def __init__(self, shared: Shared, publish: Publish, *,
                 readiness_checks: Sequence[Check] = (),
                 status_parts: Mapping[str, Callable[[], object]] | None = None) -> None:
        self.shared = shared
        self.state = shared.state
        self._publish = publish
        self._clock = shared.clock
        self._wall_clock = shared.wall_clock
        self.metrics = Metrics(Sources(
            fleet=lambda: self.state.fleet, last_heard=self._last_heard,
            stale=lambda: self.state.nodes.stale_nodes(self._clock()).keys(),
            ready=lambda: not self.not_ready_because(),
            leading=shared.leadership.leading,
            slices_enforced=lambda: dict(self.state.nodes.slices_enforced),
            measured=lambda: self.state.nodes.measured,
            over_slice=lambda: self.state.slices.counts(self.state.nodes.known)),
            shared.settings.defaults.device.resources)
        self.readiness_checks: list[Check] = list(readiness_checks)
        """Each says why the daemon is not ready, or None (NATS, background tasks)."""
        self.status_parts: dict[str, Callable[[], object]] = dict(status_parts or {})
        self._changed_nodes: set[str] = set()
        self._retry_signals: list[asyncio.Event] = []
        self._outbox: list[DecisionEvent] = []
        self._recent: deque[DecisionEvent] = deque(maxlen=RECENT_DECISIONS)
        self._sending: asyncio.TimerHandle | None = None
        shared.before_settle(self._send_now)

    # What the other parts tell ----------------------------------------------------

    def mark_changed(self, *nodes: str) -> None:
        self._changed_nodes.update(nodes)

    def replay_decisions(self) -> None:
        """Publish the RECENT_DECISIONS last decisions sent again, oldest first, marked
        ``replayed``: a watcher that just connected sees what was decided before it."""
        recent = [msgspec.structs.replace(event, replayed=True) for event in self._recent]
        if recent:
            self.shared.in_background(self._replay(recent))

    async def _replay(self, recent: list[DecisionEvent]) -> None:
        for event in recent:
            await self._publish(event)

    def usage_asked(self, node: str) -> None:
        """Publish ``node``'s usage soon, changed or not."""
        self._changed_nodes.add(node)
        self._send_soon()

    async def capacity_changed(self, *nodes: str, retry_waiting: bool = True) -> None:
        self._changed_nodes.update(nodes)
        self._send_soon()
        if retry_waiting:
            self.retry_waiting()

    async def decided(self, decision: Decision, verb: Literal["filter", "bind"],
                      duration_ms: float, decided_at: float, *,
                      failed_nodes: Mapping[str, str] | None = None) -> None:
        leadership = self.shared.leadership
        self._outbox.append(DecisionEvent.of(decision, verb, decided_at, duration_ms,
                                             decider=leadership.identity,
                                             term=leadership.term, failed_nodes=failed_nodes))
        self._send_soon()

    def retry_waiting(self) -> None:
        for event in self._retry_signals:
            event.set()
        pods = self.shared.pods
        # kube-scheduler calls only the leader's extender: the leader stamps the retries.
        if pods.any_unschedulable() and self.shared.leadership.leading():
            waiting = pods.take_unschedulable()
            stamp = str(self._wall_clock())
            self.shared.in_background(self._ask_cluster_to_retry(waiting, stamp))

    async def _ask_cluster_to_retry(self, waiting: list[tuple[str, str]], stamp: str) -> None:
        for namespace, name in waiting:
            await self.shared.cluster.retry_pod(namespace, name, stamp)

    def retry_signal(self) -> asyncio.Event:
        """An event set whenever cards are freed or inventory changes (for retry loops)."""
        event = asyncio.Event()
        self._retry_signals.append(event)
        return event

    # Telemetry --------------------------------------------------------------------

    def _send_soon(self) -> None:
        if self._sending is None:
            self._sending = asyncio.get_running_loop().call_later(TELEMETRY_BATCH_S,
                                                                  self._send_now)

    def _send_now(self) -> None:
        """The decisions waiting, in the order taken, then the usage of every node changed
        since the last send (one message a node)."""
        if self._sending is not None:
            self._sending.cancel()
            self._sending = None
        decisions, self._outbox = self._outbox, []
        if decisions or self._changed_nodes:
            self.shared.in_background(self._send(decisions))

    async def _send(self, decisions: list[DecisionEvent]) -> None:
        for decision in decisions:
            await self._publish(decision)
            self._recent.append(decision)
        await self._publish_usage()

    async def _publish_usage(self) -> None:
        changed, self._changed_nodes = self._changed_nodes, set()
        fleet = self.state.fleet
        for name in sorted(changed):
            node = fleet.node(name)
            if node is None:
                continue
            cards = []
            for card in sorted(node.cards, key=lambda c: c.index):
                usage = fleet.usage(name, card.uuid)
                cards.append(CardUsage(
                    uuid=card.uuid, index=card.index, type=card.type,
                    tenants=usage.tenants, used=occupied_slots(usage.tenants, card.processes),
                    usedmem=usage.memory, memory=card.memory, usedcores=usage.cores,
                    cores=card.cores, count=card.count, health=card.health,
                    physical_memory=card.physical_memory, physical_cores=card.physical_cores))
            await self._publish(UsageEvent(node=name, timestamp=self._wall_clock(), cards=cards))

    # Views for operators --------------------------------------------------------------

    def not_ready_because(self) -> list[str]:
        """Why /readyz answers 503; empty when ready. A standby that may not serve (the
        standalone one) says so first."""
        standby = self.shared.leadership.refusal()
        if standby is not None:
            return [standby]
        reasons = [] if self.shared.ready else ["rebuilding the ledger"]
        reasons.extend(reason for check in self.readiness_checks if (reason := check()))
        return reasons

    def status(self) -> dict[str, object]:
        """A cheap summary for operators and benchmarks (``/statusz``)."""
        not_ready = self.not_ready_because()
        return {
            "ready": not not_ready,
            "not_ready_because": not_ready,
            "leadership": self.shared.leadership.describe(),
            **{name: part() for name, part in self.status_parts.items()},
            "nodes": sum(1 for _ in self.state.fleet.nodes()),
            "node_names": sorted(n.name for n in self.state.fleet.nodes()),
            "stale_nodes": sorted(self.state.nodes.stale_nodes(self._clock())),
            "inventory_accepted": self.shared.inventory_accepted,
            "pods_bound": len(self.state.cache.bound),
            "reservations": self.state.cache.reservation_count,
            "usage": self._booked_and_used(),
            "over_slice": [{"pod": f"{over.namespace}/{over.pod}", "container": over.container,
                            "uuid": over.uuid, "used_mib": over.used, "slice_mib": over.slice}
                           for over in self.state.slices.over(self.state.nodes.known)],
        }

    def _booked_and_used(self) -> list[dict[str, object]]:
        """Per node whose agent sends measured usage, each card's booked memory beside the
        memory and utilization measured on it (``/statusz``'s ``usage``)."""
        fleet = self.state.fleet
        nodes = []
        for name, measured in sorted(self.state.nodes.measured.items()):
            node = fleet.node(name)
            if node is None:
                continue
            figures = {figure.uuid: figure for figure in measured.cards}
            cards = []
            for card in sorted(node.cards, key=lambda card: card.index):
                figure = figures.get(card.uuid)
                cards.append({"uuid": card.uuid, "index": card.index, "memory_mib": card.memory,
                              "booked_mib": fleet.usage(name, card.uuid).memory,
                              "used_mib": None if figure is None else figure.memory_used,
                              "utilization": None if figure is None else figure.utilization})
            nodes.append({"node": name, "measured_at": measured.at,
                          "containers": len(measured.containers),
                          "dropped": measured.dropped, "cards": cards})
        return nodes

    def _last_heard(self) -> dict[str, float]:
        """When each node was last heard from, in seconds since the epoch (for metrics)."""
        now, wall = self._clock(), self._wall_clock()
        return {name: wall - quiet for name, quiet in self.state.nodes.silence(now).items()}

    def ledger(self) -> dict[str, object]:
        """The ledger as it stands (``GET /ledgerz``), for operators and invariant checks.

        ``pods``: every allocation (bound or reserved) with its cards per container;
        ``reservations``: unconfirmed ones with their age; ``cards``: each reported
        card's booked usage beside its registered capacity and its own (``physical_*``,
        before HAMi's scaling); ``orphans``: usage on cards no node reports any more;
        ``mig_contradicted``: cards the MIG reservations contradict, judged unhealthy.
        """
        now = self._clock()
        fleet, cache = self.state.fleet, self.state.cache
        pods = {
            key: {"node": allocation.node, "bound": key in cache.bound,
                  "init_containers": allocation.init_containers,
                  "containers": [[{"uuid": g.uuid, "memory": g.memory, "cores": g.cores}
                                  for g in grants] for grants in allocation.containers]}
            for key, allocation in fleet.allocations().items()}
        reservations = {
            key: {"node": allocation.node,
                  "age_s": now - (expires - cache.reservation_ttl),
                  "expires_in_s": expires - now}
            for key, allocation, expires in cache.reservations()}
        cards = []
        for node in fleet.nodes():
            for device in node.cards:
                usage = fleet.usage(node.name, device.uuid)
                cards.append({"node": node.name, "uuid": device.uuid, "index": device.index,
                              "tenants": usage.tenants, "usedmem": usage.memory,
                              "usedcores": usage.cores, "memory": device.memory,
                              "cores": device.cores, "count": device.count,
                              "physical_memory": device.own_memory,
                              "physical_cores": device.own_cores,
                              "processes": device.processes})
        orphans = [{"node": node, "uuid": uuid, "tenants": usage.tenants,
                    "usedmem": usage.memory, "usedcores": usage.cores}
                   for (node, uuid), usage in fleet.orphans().items()]
        # Cards the MIG reservations contradict: judged unhealthy while they do.
        contradicted = [{"node": node, "uuid": uuid, "why": why}
                        for (node, uuid), why in sorted(fleet.inconsistencies().items())]
        return {"reservation_ttl_s": cache.reservation_ttl, "bound": sorted(cache.bound),
                "pods": pods, "reservations": reservations, "cards": cards,
                "orphans": orphans, "mig_contradicted": contradicted}
