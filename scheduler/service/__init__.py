"""The decision daemon's service: one facade over its three rooms.

``verbs`` answers kube-scheduler, ``reactions`` follows the cluster and the bus,
``preemption`` makes room for GPU pods of higher priority, ``reporting`` tells others
(telemetry, retries, metrics, status); they share one
``Shared`` state and meet nowhere else (docs/architecture.md, "The daemon's rooms").
The HTTP layer (``scheduler.web.extender``), the wiring (``scheduler.daemon``) and the tests use
the facade; everything that changes the ledger happens on one event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from scheduler.cluster import Cluster
from scheduler.service.preemption import Preemptions
from scheduler.service.reactions import Reactions
from scheduler.service.reporting import Publish, Reporting
from scheduler.service.shared import (
    ServiceSettings,
    Shared,
)
from scheduler.service.verbs import Verbs

__all__ = ["SchedulerService", "ServiceSettings"]


class SchedulerService:
    """The rooms built around one shared state, and their methods under one name."""

    def __init__(self, settings: ServiceSettings, cluster: Cluster, publish: Publish,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.shared = shared = Shared(settings, cluster, clock, wall_clock)
        self.reporting = reporting = Reporting(shared, publish)
        self.verbs = verbs = Verbs(shared, reporting.metrics, reporting)
        self.reactions = reactions = Reactions(shared, reporting.metrics, reporting)
        self.preemptions = preemptions = Preemptions(shared, reporting.metrics, reporting)
        shared.on_refused = preemptions.refused
        self.settings = settings
        self.cluster = cluster
        self.state = shared.state
        self.metrics = reporting.metrics
        # The extender verbs: scheduler.web.extender, the standalone pending loop.
        self.filter = verbs.filter
        self.prioritize = verbs.prioritize
        self.bind = verbs.bind
        self.explain = verbs.explain
        self.preempt = preemptions.answer
        # Reactions: the daemon's background tasks started by scheduler.daemon.
        self.rebuild = reactions.rebuild
        self.receive_inventory = reactions.receive_inventory
        self.ingest = reactions.ingest
        self.pending_allocations = reactions.pending_allocations
        self.allocation_outcome = reactions.allocation_outcome
        self.connection_resumed = reactions.connection_resumed
        self.stand_by = reactions.stand_by
        self.follow_cluster = reactions.follow_cluster
        self.reconcile = reactions.reconcile
        self.on_pod_change = reactions.on_pod_change
        self.refresh_cordons = reactions.refresh_cordons
        self.follow_cordons = reactions.follow_cordons
        self.watch_nodes = reactions.watch_nodes
        self.check_nodes = reactions.check_nodes
        self.expire_reservations = reactions.expire_reservations
        # Reporting: health, views, and the retry signal of the pending loop.
        self.readiness_checks = reporting.readiness_checks
        self.status_parts = reporting.status_parts
        self.not_ready_because = reporting.not_ready_because
        self.status = reporting.status
        self.ledger = reporting.ledger
        self.retry_signal = reporting.retry_signal
        self.settle = shared.settle

    def refusal(self) -> str | None:
        """Why the verbs and the pod API answer 503 now (a standalone standby); None when
        they serve."""
        return self.shared.leadership.refusal()

    @property
    def ready(self) -> bool:
        """The ledger is rebuilt: /filter answers."""
        return self.shared.ready

    @property
    def inventory_accepted(self) -> int:
        return self.shared.inventory_accepted
