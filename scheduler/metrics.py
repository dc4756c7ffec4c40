"""Prometheus metrics at ``/metrics``: HAMi's scheduler metrics under HAMi's names, labels
and scales, and the daemon's own (``pyhami_*``).

Every gauge is read from the live state at scrape time, so none is ever out of date.
docs/scheduler.md ("Metrics") lists them beside HAMi's definitions.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import lru_cache
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from common.core import Fleet, Usage
from common.core.model import Card
from common.core.pod import DEFAULT_NAMES
from common.core.vendors import ResourceNames
from common.messaging import Connection, Unsent
from common.version import package_version
from common.wire import Measured, MeasuredCard

MIB = 1024 * 1024
# From 100 us (a /filter on a small cluster) to a minute: under a burst a /bind waits on the
# API server, and its quantiles must not all read the top bucket.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# HAMi registers its scheduler collector wrapped with this constant label.
HAMI_ZONE = "vGPU"
CARD_LABELS = ["node", "device_uuid", "device_index", "device_type"]
HAMI_CARD_LABELS = [*CARD_LABELS, "zone"]
HAMI_CONTAINER_LABELS = ["namespace", "node", "pod", "container_index", "device_uuid", "zone"]
INVENTORY_RESULTS = ("accepted", "out_of_order", "sequence_jump", "rejected", "wrong_subject",
                     "card_conflict")
RELEASE_CAUSES = ("expired", "bind_failed", "group")
AUTH_RESULTS = ("accepted", "refused", "malformed")
ALLOCATION_RESULTS = ("success", "failed", "refused")
PREEMPTION_RESULTS = (("daemon", "evicted"), ("daemon", "failed"),
                      ("kube-scheduler", "answered"), ("kube-scheduler", "none"))
"""evicted: victims deleted; failed: a deletion refused; answered: victims named to
kube-scheduler; none: no node where lower-priority pods could make room."""
REGISTRATION_RESULTS = ("written", "removed", "failed")
UNSENT_REASONS: tuple[Unsent, ...] = get_args(Unsent)
OPENMETRICS_END = b"# EOF\n"


@dataclass(frozen=True, slots=True)
class Sources:
    """What the collectors read at each scrape."""

    fleet: Callable[[], Fleet]
    last_heard: Callable[[], dict[str, float]]
    """Node -> when its agent was last heard from, in seconds since the epoch."""
    stale: Callable[[], AbstractSet[str]]
    """The nodes whose inventory is older than the node timeout."""
    ready: Callable[[], bool]
    """/readyz would answer 200."""
    leading: Callable[[], bool]
    """This daemon decides (not a standby)."""
    slices_enforced: Callable[[], dict[str, bool]]
    """Nodes whose agent serves a device plugin -> whether HAMi-core enforces the slices."""
    measured: Callable[[], Mapping[str, Measured]] = dict
    """Node -> the usage its agent measured last."""
    over_slice: Callable[[], Mapping[str, int]] = dict
    """Node whose measured usage is checked against the slices -> containers over theirs."""


def _gauge(name: str, documentation: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=labels)


class HamiCollector(Collector):
    """HAMi's per-container gauges (its ``cmd/scheduler/metrics.go``), legacy names off; its
    per-card ones are ``CardGauges``."""

    def __init__(self, fleet: Callable[[], Fleet]) -> None:
        self._fleet = fleet

    def collect(self) -> Iterable[Metric]:
        yield from self._containers(self._fleet())

    @staticmethod
    def _containers(fleet: Fleet) -> Iterator[Metric]:
        """Every pod holding cards, reserved or bound; containers numbered as in the
        allocation annotation (init containers first), as HAMi numbers them."""
        memory = _gauge("hami_vgpu_memory_allocated_bytes",
                        "vGPU memory allocated from a container", HAMI_CONTAINER_LABELS)
        cores = _gauge("hami_vgpu_core_allocated_ratio", "vGPU core allocated from a container",
                       HAMI_CONTAINER_LABELS)
        for key, allocation in sorted(fleet.allocations().items()):
            namespace, _, pod = key.partition("/")
            for position, grants in enumerate(allocation.containers):
                for grant in grants:
                    series = [namespace, allocation.node, pod, str(position), grant.uuid,
                              HAMI_ZONE]
                    memory.add_metric(series, grant.memory * MIB)
                    cores.add_metric(series, grant.cores)
        yield from (memory, cores, HamiCollector._mig_instances(fleet))

    @staticmethod
    def _mig_instances(fleet: Fleet) -> Metric:
        """HAMi's ``hami_node_gpu_mig_instance_info``: one series per MIG instance its node
        made (the runtime identity recorded on the pod), none before."""
        info = _gauge("hami_node_gpu_mig_instance_info", "MIG instance information",
                      ["node", "device_uuid", "device_index", "mig_uuid", "profile",
                       "gpu_instance_id", "compute_instance_id", "placement_start",
                       "placement_size"])
        for _, allocation in sorted(fleet.allocations().items()):
            node = fleet.node(allocation.node)
            index = {d.uuid: d.index for d in node.cards} if node is not None else {}
            for grants in allocation.containers:
                for grant in grants:
                    made = grant.instance
                    if made is None or not made.mig_uuid:
                        continue
                    info.add_metric([allocation.node, grant.uuid,
                                     str(index.get(grant.uuid, "")), made.mig_uuid,
                                     made.profile, str(made.gpu_instance_id),
                                     str(made.compute_instance_id),
                                     str(made.placement.start), str(made.placement.size)], 1)
        return info


CARD_FAMILIES = (
    ("hami_gpu_memory_limit_bytes", "Device memory limit for a certain GPU"),
    ("hami_gpu_core_limit_ratio", "Device core limit for a certain GPU"),
    ("hami_gpu_memory_allocated_bytes", "Device memory allocated for a certain GPU"),
    ("hami_gpu_shared_count", "Number of containers sharing this GPU"),
    ("hami_gpu_core_allocated_ratio", "Device core allocated for a certain GPU"),
    ("hami_node_gpu_overview", "GPU overview on a certain node"),
    ("hami_node_gpu_memory_allocated_ratio", "GPU Memory Allocated Percentage on a certain GPU"),
    ("pyhami_gpu_healthy", "1 while the node's agent reports the card healthy"),
    ("pyhami_gpu_physical_memory_bytes",
     "The card's own memory, before deviceMemoryScaling (hami_gpu_memory_limit_bytes is "
     "the registered figure)"),
    ("pyhami_gpu_physical_core_ratio",
     "The card's own cores, 100, before deviceCoreScaling (hami_gpu_core_limit_ratio is "
     "the registered figure)"),
)


def _escaped(value: str) -> str:
    """A label value as both exposition formats write it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@lru_cache(maxsize=4096)
def _number(value: float) -> str:
    written: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return written


_Writer = Callable[[str, Card, Usage], str]
# Per family of CARD_FAMILIES, in order: a card's line, given the labels every family's
# lines share (``device_type``, ``device_uuid`` and ``node``). Label names go in sorted order,
# as prometheus_client writes them.
_WRITERS: tuple[_Writer, ...] = (
    lambda shared, card, usage: (
        f'hami_gpu_memory_limit_bytes{{device_index="{card.index}",{shared},'
        f'zone="{HAMI_ZONE}"}} {_number(card.memory * MIB)}\n'),
    lambda shared, card, usage: (
        f'hami_gpu_core_limit_ratio{{device_index="{card.index}",{shared},'
        f'zone="{HAMI_ZONE}"}} {_number(card.cores)}\n'),
    lambda shared, card, usage: (
        f'hami_gpu_memory_allocated_bytes{{device_cores="{card.cores}",'
        f'device_index="{card.index}",{shared},zone="{HAMI_ZONE}"}} '
        f'{_number(usage.memory * MIB)}\n'),
    lambda shared, card, usage: (
        f'hami_gpu_shared_count{{device_index="{card.index}",{shared},'
        f'zone="{HAMI_ZONE}"}} {_number(usage.tenants)}\n'),
    lambda shared, card, usage: (
        f'hami_gpu_core_allocated_ratio{{device_index="{card.index}",{shared},'
        f'zone="{HAMI_ZONE}"}} {_number(usage.cores)}\n'),
    lambda shared, card, usage: (
        f'hami_node_gpu_overview{{device_cores="{card.cores}",device_index="{card.index}",'
        f'device_memory_limit="{card.memory}",{shared},zone="{HAMI_ZONE}"}} '
        f'{_number(usage.memory * MIB)}\n'),
    lambda shared, card, usage: (
        f'hami_node_gpu_memory_allocated_ratio{{device_index="{card.index}",{shared},'
        f'zone="{HAMI_ZONE}"}} {_number(usage.memory / card.memory)}\n'
        if card.memory > 0 else ""),
    lambda shared, card, usage: (
        f'pyhami_gpu_healthy{{device_index="{card.index}",{shared}}} '
        f'{_number(int(card.health))}\n'),
    lambda shared, card, usage: (
        f'pyhami_gpu_physical_memory_bytes{{device_index="{card.index}",{shared}}} '
        f'{_number(card.own_memory * MIB)}\n'),
    lambda shared, card, usage: (
        f'pyhami_gpu_physical_core_ratio{{device_index="{card.index}",{shared}}} '
        f'{_number(card.own_cores)}\n'),
)


_MeasuredWriter = Callable[[str, Card, MeasuredCard], str]
MEASURED_CARD_FAMILIES: tuple[tuple[str, str, _MeasuredWriter], ...] = (
    ("pyhami_card_memory_used_bytes",
     "Memory in use on the card as its node's agent measured it (NVML), whoever uses it",
     lambda shared, card, figure: (
         f'pyhami_card_memory_used_bytes{{device_index="{card.index}",{shared}}} '
         f'{_number(figure.memory_used * MIB)}\n' if figure.memory_used is not None else "")),
    ("pyhami_card_utilization_ratio",
     "The card's utilization as its node's agent measured it (NVML), 0 to 1",
     lambda shared, card, figure: (
         f'pyhami_card_utilization_ratio{{device_index="{card.index}",{shared}}} '
         f'{_number(figure.utilization / 100)}\n' if figure.utilization is not None else "")),
)


class CardGauges:
    """The per-card gauges (HAMi's, under HAMi's meaning: the registered figures, scaled by
    ``deviceMemoryScaling`` and ``deviceCoreScaling``; and pyhami's: ``pyhami_gpu_healthy``
    and the card's own figures) as exposition text, in
    pieces of a few thousand cards, so that a scrape need neither hold the event loop nor
    the whole text at once.

    Written here rather than through prometheus_client's collectors, which took 5 s of the
    event loop and 170 MB for the 320,000 samples of 5,000 nodes of 8 cards. The lines are
    the same in the classic text format and OpenMetrics."""

    def __init__(self, fleet: Callable[[], Fleet], cards_per_piece: int = 2000,
                 measured: Callable[[], Mapping[str, Measured]] = dict) -> None:
        self._fleet = fleet
        self._cards_per_piece = cards_per_piece
        self._nodes_per_gathering = max(1, cards_per_piece // 8)
        self._measured = measured

    def pieces(self) -> Iterator[str]:
        """The text, a family's header or its lines for a few thousand cards at a time; each
        card as it was when the cards were gathered (empty pieces between, so that gathering
        40,000 cards, about 90 ms, does not hold the loop at once)."""
        fleet = self._fleet()
        measured = self._measured()
        cards: list[tuple[str, Card, Usage]] = []
        used: list[tuple[str, Card, MeasuredCard]] = []
        for position, node in enumerate(list(fleet.nodes())):
            if position and position % self._nodes_per_gathering == 0:
                yield ""
            name = _escaped(node.name)
            shares = [(f'device_type="{_escaped(card.type)}",'
                       f'device_uuid="{_escaped(card.uuid)}",node="{name}"', card)
                      for card in node.cards]
            cards.extend((shared, card, fleet.usage(node.name, card.uuid))
                         for shared, card in shares)
            figures = measured.get(node.name)
            if figures is not None:
                by_uuid = {figure.uuid: figure for figure in figures.cards}
                used.extend((shared, card, by_uuid[card.uuid]) for shared, card in shares
                            if card.uuid in by_uuid)
        step = self._cards_per_piece
        for (family, documentation), write in zip(CARD_FAMILIES, _WRITERS, strict=True):
            yield f"# HELP {family} {documentation}\n# TYPE {family} gauge\n"
            for start in range(0, len(cards), step):
                yield "".join([write(shared, card, usage)
                               for shared, card, usage in cards[start:start + step]])
        # Measured figures: only the cards whose agent sent one.
        for family, documentation, write_used in MEASURED_CARD_FAMILIES:
            yield f"# HELP {family} {documentation}\n# TYPE {family} gauge\n"
            for start in range(0, len(used), step):
                yield "".join([write_used(shared, card, figure)
                               for shared, card, figure in used[start:start + step]])

    def text(self) -> str:
        return "".join(self.pieces())


class QuotaCollector(Collector):
    """HAMi's quota gauges (its ``collectQuotaMetrics``), and pyhami's per ResourceQuota.

    HAMi keeps one limit per namespace and resource, so its gauges are per namespace: the
    use of all the namespace's pods holding cards, and the tightest limit of its quotas.
    pyhami applies every quota of a namespace, each to the pods its scopes select:
    ``pyhami_resource_quota_*`` show each quota's own use and limit. Both name the
    resources by the daemon's configured names (HAMi's ``resourceMemoryName`` and
    ``resourceCoreName``), as HAMi's gauge names them by its quota keys."""

    def __init__(self, fleet: Callable[[], Fleet], names: ResourceNames = DEFAULT_NAMES) -> None:
        self._fleet = fleet
        self._names = names

    def collect(self) -> Iterable[Metric]:
        book = self._fleet().quotas
        used = _gauge("hami_resource_quota_used", "resourcequota usage for a certain device",
                      ["namespace", "quota_name", "limit", "zone"])
        limit = _gauge("hami_resource_quota_limit", "resourcequota limit for a certain device",
                       ["namespace", "quota_name", "zone"])
        names = self._names
        own_used = _gauge("pyhami_resource_quota_used",
                          "What the pods a ResourceQuota charges hold, in its units (MiB of "
                          f"{names.memory}, percent of a card of {names.cores})",
                          ["namespace", "resource_quota", "resource"])
        own_limit = _gauge("pyhami_resource_quota_limit",
                           "A ResourceQuota's limit, in the same units",
                           ["namespace", "resource_quota", "resource"])
        tightest: dict[tuple[str, str], int] = {}
        for row in book.standings():
            series = [row.namespace, row.quota, row.resource]
            own_used.add_metric(series, row.used)
            own_limit.add_metric(series, row.limit)
            where = (row.namespace, row.resource)
            tightest[where] = min(tightest.get(where, row.limit), row.limit)
        spent = book.namespace_used()
        namespaces = sorted({*spent, *(namespace for namespace, _ in tightest)})
        for namespace in namespaces:
            charge = spent.get(namespace, Usage())
            for resource, value in ((names.memory, charge.memory),
                                    (names.cores, charge.cores)):
                cap = tightest.get((namespace, resource))
                if cap is None and value == 0:
                    continue
                used.add_metric([namespace, resource, str(cap or 0), HAMI_ZONE], value)
                if cap is not None:
                    limit.add_metric([namespace, resource, HAMI_ZONE], cap)
        yield from (used, limit, own_used, own_limit)


class DaemonCollector(Collector):
    """The daemon's own gauges: build, readiness, node freshness, cards, orphans."""

    def __init__(self, sources: Sources) -> None:
        self._sources = sources
        self._build = [package_version(), platform.python_version()]

    def collect(self) -> Iterable[Metric]:
        build = _gauge("pyhami_build_info",
                       "pyhami's version and Python's, as labels; the value is always 1",
                       ["version", "python_version"])
        build.add_metric(self._build, 1.0)
        ready = GaugeMetricFamily("pyhami_ready", "1 while /readyz would answer 200")
        ready.add_metric([], 1.0 if self._sources.ready() else 0.0)
        leader = GaugeMetricFamily(
            "pyhami_leader", "1 while this daemon decides, 0 while it stands by")
        leader.add_metric([], 1.0 if self._sources.leading() else 0.0)
        heard = _gauge("pyhami_node_last_heard_timestamp_seconds",
                       "When the node's agent last reported, in seconds since the epoch",
                       ["node"])
        stale = _gauge("pyhami_node_stale",
                       "1 while the node's inventory is older than --node-timeout", ["node"])
        stale_nodes = self._sources.stale()
        for name, when in sorted(self._sources.last_heard().items()):
            heard.add_metric([name], when)
            stale.add_metric([name], 1.0 if name in stale_nodes else 0.0)
        enforced = _gauge("pyhami_node_memory_slices_enforced",
                          "1 where HAMi-core enforces the memory and core slices in the "
                          "containers, 0 where the device plugin hands out cards without it",
                          ["node"])
        for name, yes in sorted(self._sources.slices_enforced().items()):
            enforced.add_metric([name], 1.0 if yes else 0.0)
        over = _gauge("pyhami_containers_over_slice",
                      "Containers measured using more memory than their slice, on a node "
                      "where nothing enforces the slices (no HAMi-core)", ["node"])
        for name, count in sorted(self._sources.over_slice().items()):
            over.add_metric([name], count)
        orphans = GaugeMetricFamily(
            "pyhami_allocations_on_vanished_cards",
            "Cards still holding allocations that their node no longer reports")
        orphans.add_metric([], len(self._sources.fleet().orphans()))
        yield from (build, ready, leader, heard, stale, enforced, over, orphans)


class ConnectionCollector(Collector):
    """The NATS connection's health, read at scrape time."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def collect(self) -> Iterable[Metric]:
        connected = GaugeMetricFamily("pyhami_nats_connected", "1 while connected to NATS")
        connected.add_metric([], 1.0 if self._connection.connected else 0.0)
        replaced = CounterMetricFamily(
            "pyhami_nats_clients_replaced_total",
            "NATS clients connected again after the server made nats-py close one for good")
        replaced.add_metric([], self._connection.replaced)
        unsent = CounterMetricFamily("pyhami_nats_messages_unsent_total",
                                     "Messages not sent on NATS, by reason", labels=["reason"])
        for reason in UNSENT_REASONS:
            unsent.add_metric([reason], self._connection.unsent[reason])
        yield from (connected, replaced, unsent)


class UnreadableCollector(Collector):
    """Objects the Kubernetes API sent that do not decode, per kind: each version is
    logged once and counted here (Kubernetes mode only)."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "pyhami_cluster_objects_unreadable",
            "Versions of objects the Kubernetes API sent that do not decode, left out until "
            "they change, by kind", labels=["kind"])
        for kind, count in sorted(self._counts.items()):
            family.add_metric([kind], count)
        yield family


@dataclass(frozen=True, slots=True)
class _OneFamily:
    """One metric family as a registry the exposition encoders take."""

    family: Metric

    def collect(self) -> Iterable[Metric]:
        return (self.family,)


class Metrics:
    """Every metric of ``/metrics``; ``names`` are the daemon's configured resource names
    (its device configuration), which the quota gauges name."""

    def __init__(self, sources: Sources, names: ResourceNames = DEFAULT_NAMES) -> None:
        self.registry = CollectorRegistry()
        self.cards = CardGauges(sources.fleet, measured=sources.measured)
        self.registry.register(HamiCollector(sources.fleet))
        self.registry.register(DaemonCollector(sources))
        self.registry.register(QuotaCollector(sources.fleet, names))
        self.filter_duration = Histogram("pyhami_filter_duration_seconds",
                                         "Time to answer /filter", buckets=LATENCY_BUCKETS,
                                         registry=self.registry)
        self.bind_duration = Histogram("pyhami_bind_duration_seconds", "Time to answer /bind",
                                       buckets=LATENCY_BUCKETS, registry=self.registry)
        self.decisions = Counter("pyhami_decisions_total",
                                 "Decisions by verb, outcome and reason",
                                 ["verb", "outcome", "reason"], registry=self.registry)
        self.inventory = Counter("pyhami_inventory_messages_total",
                                 "Inventory messages received, by result", ["result"],
                                 registry=self.registry)
        self.nats_auth = Counter("pyhami_nats_auth_total",
                                 "NATS auth callout requests answered, by result", ["result"],
                                 registry=self.registry)
        self.released = Counter("pyhami_reservations_released_total",
                                "Reservations released without a bind, by cause", ["cause"],
                                registry=self.registry)
        self.allocations = Counter("pyhami_device_allocations_total",
                                   "Allocation outcomes the agents' device plugins reported, "
                                   "by result", ["result"], registry=self.registry)
        self.preemptions = Counter(
            "pyhami_preemptions_total",
            "Preemptions for GPU pods: by who evicts (daemon: pyhami itself; "
            "kube-scheduler: through the preempt verb) and result", ["by", "result"],
            registry=self.registry)
        self.quotas_refused = Counter(
            "pyhami_resource_quotas_refused_total",
            "ResourceQuota objects (or versions of one) pyhami could not apply, each "
            "counted once", registry=self.registry)
        self.registrations = Counter(
            "pyhami_node_registrations_total",
            "Writes of the Nodes' hami.io/node-nvidia-register annotation, by result "
            "(written, removed, failed)", ["result"], registry=self.registry)
        self.preempted = Counter("pyhami_preemption_victims_total",
                                 "Pods pyhami itself evicted to make room for a GPU pod of "
                                 "higher priority", registry=self.registry)
        self.slice_exceeded = Counter(
            "pyhami_slice_exceeded_total",
            "Containers found using more memory than their slice where nothing enforces it, "
            "each container and card counted once per SliceExceeded Event",
            registry=self.registry)
        self.measured_unmatched = Counter(
            "pyhami_measured_usage_unmatched_total",
            "Measured container usage the daemon could not compare with a slice: a pod it "
            "does not know bound to the node, or a container or card booked nothing",
            registry=self.registry)
        self.held_back = Counter(
            "pyhami_group_held_back_total",
            "GPU pods placed nowhere while a pod group went ahead of them, the nodes it would "
            "use kept from them (each /filter counted)", registry=self.registry)
        self.groups_never_fit = Counter(
            "pyhami_groups_never_fit_total",
            "Tries that found a whole pod group would not fit even on idle cards (it then "
            "holds back no other pod)", registry=self.registry)
        self.admission_checks = Counter(
            "pyhami_admission_checks_total",
            "States pyhami's Kueue admission check wrote on Workloads (Ready: its pods' cards "
            "held; Pending: they do not fit now; Retry: its quota goes back to the queue; "
            "Rejected: pyhami cannot place it)", ["state"], registry=self.registry)
        self.admission_check_failures = Counter(
            "pyhami_admission_check_write_failures_total",
            "Writes of the admission check's state that the API server did not take (tried "
            "again on the next pass)", registry=self.registry)
        # Every known label value from the start, so rate() and alerts see a zero first.
        for state in ("Ready", "Pending", "Retry", "Rejected"):
            self.admission_checks.labels(state)
        for result in INVENTORY_RESULTS:
            self.inventory.labels(result)
        for cause in RELEASE_CAUSES:
            self.released.labels(cause)
        for answer in AUTH_RESULTS:
            self.nats_auth.labels(answer)
        for outcome in ALLOCATION_RESULTS:
            self.allocations.labels(outcome)
        for by, result in PREEMPTION_RESULTS:
            self.preemptions.labels(by, result)
        for result in REGISTRATION_RESULTS:
            self.registrations.labels(result)

    def exposition(self) -> bytes:
        """The classic text format (tests and tools that read it directly)."""
        return b"".join(self.pieces("")[1])

    def pieces(self, accept: str) -> tuple[str, Iterator[bytes]]:
        """Every metric in the format ``accept`` (an Accept header) asks for, OpenMetrics
        when it names it, the classic text format otherwise: its content type, and the text
        in pieces to send one after the other."""
        encoder, content_type = choose_encoder(accept)

        def pieces() -> Iterator[bytes]:
            for piece in self.cards.pieces():
                yield piece.encode()
            # The rest family by family: a family of a line a node (5,000 nodes) is written
            # in tens of milliseconds, the whole registry in one call took 0.2 s.
            end = b""
            for family in self.registry.collect():
                text = encoder(_OneFamily(family))
                if text.endswith(OPENMETRICS_END):
                    text, end = text[:-len(OPENMETRICS_END)], OPENMETRICS_END
                yield text
            yield end  # OpenMetrics' end mark, after every family

        return content_type, pieces()
