"""The decision daemon's service: its parts around one shared state.

``verbs`` answers kube-scheduler (Filter, Prioritize, Bind and the explain preview) in
the service's words (a pod and node names in, ``Filtered``, ``NodeScore`` or a bind's
refusal out; the wire shapes are the HTTP face's),
``handlers`` answers the cluster's and the bus's events, ``preemption`` makes room for
GPU pods of higher priority, ``reporting`` tells others (telemetry, retries, metrics,
status), ``registration`` writes the Nodes' HAMi register annotation for HAMi-WebUI,
``admission`` answers Kueue's admission check where the daemon is asked to.
They share one ``Shared`` state and meet nowhere else (docs/architecture.md, "The
service"); everything that changes the ledger happens on one event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from scheduler.cluster import Cluster, KueueApi
from scheduler.leadership import Leadership
from scheduler.service.admission import AdmissionChecks
from scheduler.service.handlers import Handlers
from scheduler.service.preemption import NodeVictims, Preemptions
from scheduler.service.registration import NodeRegistration
from scheduler.service.reporting import Check, Publish, Reporting
from scheduler.service.shared import (
    ServiceSettings,
    Shared,
)
from scheduler.service.verbs import Filtered, NodeScore, Verbs

__all__ = ["Filtered", "NodeScore", "NodeVictims", "SchedulerService", "ServiceSettings"]


class SchedulerService:
    """The service's parts built around one shared state. Callers use the parts by
    name: ``verbs`` (kube-scheduler's extender verbs), ``handlers`` (the event handlers),
    ``preemptions``, ``reporting``, ``registration`` (the Nodes' register annotation),
    ``admission`` (Kueue's admission check, where asked)."""

    def __init__(self, settings: ServiceSettings, cluster: Cluster, publish: Publish,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, *,
                 leadership: Leadership | None = None,
                 readiness_checks: Sequence[Check] = (),
                 status_parts: Mapping[str, Callable[[], object]] | None = None,
                 kueue: KueueApi | None = None) -> None:
        """``leadership``: whether this daemon decides (default: alone, always);
        ``kueue``: Kueue's objects, where the daemon answers Kueue's admission check;
        ``readiness_checks``, ``status_parts``: what the daemon around the service adds to
        /readyz and /statusz (NATS, background tasks, TLS)."""
        self.shared = shared = Shared(settings, cluster, clock, wall_clock,
                                      leadership=leadership)
        self.reporting = reporting = Reporting(shared, publish,
                                               readiness_checks=readiness_checks,
                                               status_parts=status_parts or {})
        self.preemptions = preemptions = Preemptions(shared, reporting.metrics, reporting)
        self.verbs = Verbs(shared, reporting.metrics, reporting,
                           on_unschedulable=preemptions.unschedulable)
        self.handlers = Handlers(shared, reporting.metrics, reporting)
        self.registration = NodeRegistration(shared, reporting.metrics, reporting)
        self.admission: AdmissionChecks | None = None if kueue is None else AdmissionChecks(
            shared, reporting.metrics, reporting, kueue=kueue,
            retry_after=settings.kueue_retry_after)
        """Kueue's admission check (``admission.py``), where the daemon answers it."""
        self.state = shared.state
        self.metrics = reporting.metrics
        self.cluster = cluster

    @property
    def ready(self) -> bool:
        """The ledger is rebuilt: /filter answers."""
        return self.shared.ready

    @property
    def inventory_accepted(self) -> int:
        return self.shared.inventory_accepted
