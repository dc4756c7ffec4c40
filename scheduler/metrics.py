"""Prometheus metrics at ``/metrics``: HAMi's device gauges and the daemon's own health."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.core import Fleet
from common.messaging import Connection

MIB = 1024 * 1024
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5)
CARD_LABELS = ["node", "deviceuuid", "deviceidx", "devicetype"]


class _DeviceCollector(Collector):
    """Reads the live fleet at scrape time, so the gauges are never out of date."""

    def __init__(self, fleet: Callable[[], Fleet], silence: Callable[[], dict[str, float]],
                 orphans: Callable[[], int]) -> None:
        self._fleet = fleet
        self._silence = silence
        self._orphans = orphans

    def collect(self) -> Iterable[Metric]:
        allocated = GaugeMetricFamily("hami_gpu_memory_allocated_bytes",
                                      "GPU memory allocated to pods", labels=CARD_LABELS)
        limit = GaugeMetricFamily("hami_gpu_memory_limit_bytes", "GPU memory of the card",
                                  labels=CARD_LABELS)
        shared = GaugeMetricFamily("hami_gpu_shared_count",
                                   "Tenants sharing the card (allocations or observed processes)",
                                   labels=CARD_LABELS)
        cores = GaugeMetricFamily("hami_gpu_core_allocated_ratio",
                                  "Share of the card's compute allocated (0..1)",
                                  labels=CARD_LABELS)
        core_limit = GaugeMetricFamily("hami_gpu_core_limit",
                                       "Compute units of the card (100 = whole)",
                                       labels=CARD_LABELS)
        healthy = GaugeMetricFamily("hami_gpu_healthy", "1 when the card is healthy",
                                    labels=CARD_LABELS)
        fleet = self._fleet()
        for node in fleet.nodes():
            for device in node.devices:
                labels = [node.name, device.uuid, str(device.index), device.type]
                usage = fleet.usage(node.name, device.uuid)
                allocated.add_metric(labels, usage.memory * MIB)
                limit.add_metric(labels, device.memory * MIB)
                shared.add_metric(labels, max(usage.tenants, device.processes))
                cores.add_metric(labels, usage.cores / device.cores if device.cores else 0.0)
                core_limit.add_metric(labels, device.cores)
                healthy.add_metric(labels, 1.0 if device.health else 0.0)
        silence = GaugeMetricFamily("pyhami_node_seconds_since_heard",
                                    "Seconds since the node's agent last reported",
                                    labels=["node"])
        for name, seconds in sorted(self._silence().items()):
            silence.add_metric([name], seconds)
        orphans = GaugeMetricFamily(
            "pyhami_allocations_on_vanished_cards",
            "Cards still holding allocations that their node no longer reports")
        orphans.add_metric([], self._orphans())
        yield from (allocated, limit, shared, cores, core_limit, healthy, silence, orphans)


class ConnectionCollector(Collector):
    """The NATS connection's health, read at scrape time."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def collect(self) -> Iterable[Metric]:
        connected = GaugeMetricFamily("pyhami_nats_connected", "1 while connected to NATS")
        connected.add_metric([], 1.0 if self._connection.connected else 0.0)
        replaced = CounterMetricFamily(
            "pyhami_nats_clients_replaced",
            "NATS clients connected again after the server made nats-py close one for good")
        replaced.add_metric([], self._connection.replaced)
        unsent = CounterMetricFamily("pyhami_nats_messages_unsent",
                                     "Messages not sent on NATS, by reason", labels=["reason"])
        for reason in ("disconnected", "too_large", "failed"):
            unsent.add_metric([reason], self._connection.unsent[reason])
        yield from (connected, replaced, unsent)


class Metrics:
    def __init__(self, fleet: Callable[[], Fleet], silence: Callable[[], dict[str, float]],
                 orphans: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_DeviceCollector(fleet, silence, orphans))
        self.filter_seconds = Histogram("pyhami_filter_seconds", "Time to answer /filter",
                                        buckets=LATENCY_BUCKETS, registry=self.registry)
        self.bind_seconds = Histogram("pyhami_bind_seconds", "Time to answer /bind",
                                      buckets=LATENCY_BUCKETS, registry=self.registry)
        self.decisions = Counter("pyhami_decisions", "Decisions by verb, outcome and reason",
                                 ["verb", "outcome", "reason"], registry=self.registry)
        self.inventory = Counter("pyhami_inventory_messages",
                                 "Inventory messages received, by result", ["result"],
                                 registry=self.registry)
        self.released = Counter("pyhami_reservations_released",
                                "Reservations released without a bind, by cause", ["cause"],
                                registry=self.registry)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
