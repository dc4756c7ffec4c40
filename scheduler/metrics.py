"""Prometheus metrics at ``/metrics``: HAMi's scheduler metrics under HAMi's names, labels
and scales, and the daemon's own (``pyhami_*``).

Every gauge is read from the live state at scrape time, so none is ever out of date.
docs/scheduler.md ("Metrics") lists them beside HAMi's definitions.
"""

from __future__ import annotations

import ctypes
import platform
import zlib
from array import array
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.exposition import ALLOWUTF8, UNDERSCORES
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from common.core import Allocation, Fleet, Usage
from common.core.model import Card, Node
from common.core.pod import DEFAULT_NAMES
from common.core.vendors import ResourceNames
from common.gzipstream import RAW_DEFLATE, Deflated, DeflatedRun, GzipMember, deflate_each
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


Encoder = Callable[[Collector], bytes]
"""An exposition format's encoder (``choose_encoder``'s): a collector's families as text."""


def _encoded(encoder: Encoder, family: Metric) -> bytes:
    """One family in the format of ``encoder``, without OpenMetrics' end mark."""
    text = encoder(_OneFamily(family))
    return text[:-len(OPENMETRICS_END)] if text.endswith(OPENMETRICS_END) else text


def _encoding(encoder: Encoder) -> tuple[object, ...] | None:
    """What names the format ``encoder`` writes (its function and arguments), when it
    writes this module's metric and label names as they are (legacy names: escaping
    ``underscores`` or ``allow-utf-8``); None when it changes them."""
    if isinstance(encoder, partial):
        arguments = tuple(sorted(encoder.keywords.items()))
        escaping = encoder.keywords.get("escaping", UNDERSCORES)
        return (encoder.func, arguments) if escaping in (UNDERSCORES, ALLOWUTF8) else None
    return (encoder,)


_HEADERS: dict[tuple[tuple[object, ...], str], bytes] = {}


def _header(encoder: Encoder, encoding: tuple[object, ...], name: str,
            documentation: str) -> bytes:
    """A gauge family's HELP and TYPE lines as ``encoder`` writes them."""
    key = (encoding, name)
    header = _HEADERS.get(key)
    if header is None:
        header = _encoded(encoder, GaugeMetricFamily(name, documentation, labels=[]))
        if len(_HEADERS) < 1024:
            _HEADERS[key] = header
    return header


class Rendered(Collector):
    """A collector whose families ``/metrics`` takes as text (``rendered``), written from
    what it keeps of the last scrape; ``collect`` gives the same series as families (the
    registry's readers, the tests' reference)."""

    def rendered(self, encoder: Encoder,
                 encoding: tuple[object, ...]) -> Iterator[Segment]:
        """The families as ``encoder`` writes them (plain, or kept compressed);
        ``encoding``: its ``_encoding``."""
        raise NotImplementedError


class _Lines:
    """Per key, the line written for a value, written again when the value changes; the
    lines in key order, compressed, compressed again only when one changed."""

    def __init__(self, write: Callable[[str, float], str]) -> None:
        self._write = write
        self._kept: dict[str, tuple[float, str]] = {}
        self._text = deflate_each([b""], SCRAPE_LEVEL)[0]

    def text(self, values: Mapping[str, float]) -> Deflated:
        kept = self._kept
        # The keys in order: the last ones while they are the same (sorting 5,000 names at
        # every scrape cost more than the rest).
        order: Iterable[str] = kept.keys() if kept.keys() == values.keys() else sorted(values)
        now: dict[str, tuple[float, str]] = {}
        same = order is kept.keys()
        for key in order:
            value = values[key]
            line = kept.get(key)
            if line is None or line[0] != value:
                line = (value, self._write(key, value))
                same = False
            now[key] = line
        if not same:
            self._text = deflate_each(["".join([line for _, line in now.values()]).encode()],
                                      SCRAPE_LEVEL)[0]
            self._kept = now
        return self._text


def _node_line(family: str) -> Callable[[str, float], str]:
    def line(node: str, value: float) -> str:
        written: str = floatToGoString(value)  # type: ignore[no-untyped-call]
        return f'{family}{{node="{_escaped(node)}"}} {written}\n'

    return line


CONTAINER_FAMILIES = (
    ("hami_vgpu_memory_allocated_bytes", "vGPU memory allocated from a container"),
    ("hami_vgpu_core_allocated_ratio", "vGPU core allocated from a container"),
)


def _container_lines(key: str, allocation: Allocation) -> tuple[str, str]:
    """A pod's lines of ``CONTAINER_FAMILIES``, label names in sorted order."""
    namespace, _, pod = key.partition("/")
    memory: list[str] = []
    cores: list[str] = []
    tail = (f'namespace="{_escaped(namespace)}",node="{_escaped(allocation.node)}",'
            f'pod="{_escaped(pod)}",zone="{HAMI_ZONE}"}}')
    for position, grants in enumerate(allocation.containers):
        for grant in grants:
            labels = f'{{container_index="{position}",device_uuid="{_escaped(grant.uuid)}",{tail}'
            memory.append(f"hami_vgpu_memory_allocated_bytes{labels} "
                          f"{_number(grant.memory * MIB)}\n")
            cores.append(f"hami_vgpu_core_allocated_ratio{labels} {_number(grant.cores)}\n")
    return "".join(memory), "".join(cores)


class HamiCollector(Rendered):
    """HAMi's per-container gauges (its ``cmd/scheduler/metrics.go``), legacy names off; its
    per-card ones are ``CardGauges``."""

    def __init__(self, fleet: Callable[[], Fleet], pods_per_block: int = 32) -> None:
        self._fleet = fleet
        self._pods_per_block = pods_per_block
        # What the last scrape saw: the fleet, its count of changes, the pods in name order
        # and their lines; the two families' text compressed a block of pods at a time
        # (blocks cut at pods chosen by their keys, as CardGauges cuts its blocks: a pod
        # that comes, goes or changes makes its own block alone compressed again), and the
        # blocks of each family as one run (sent as it is while nothing changes).
        self._seen: tuple[Fleet | None, int] = (None, 0)
        self._order: list[str] = []
        self._pods: dict[str, _PodLines] = {}
        self._blocks: dict[tuple[_PodLines, ...], list[Deflated]] = {}
        self._texts = [DeflatedRun.of(()) for _ in CONTAINER_FAMILIES]
        self._mig: Metric | None = None

    def collect(self) -> Iterable[Metric]:
        yield from self._containers(self._fleet())

    def rendered(self, encoder: Encoder,
                 encoding: tuple[object, ...]) -> Iterator[Segment]:
        """The families as ``collect`` gives them; each pod's lines written again only when
        its allocation changed, nothing gathered when the fleet counts no change."""
        fleet = self._fleet()
        if (fleet, fleet.changes) != self._seen or self._mig is None:
            self._gather(fleet)
        texts, mig = self._texts, self._mig
        assert mig is not None  # gathered
        for (family, documentation), text in zip(CONTAINER_FAMILIES, texts, strict=True):
            yield _header(encoder, encoding, family, documentation)
            yield text
        yield _encoded(encoder, mig)

    def _gather(self, fleet: Fleet) -> None:
        kept = self._pods
        now = fleet.allocations()
        order = self._sorted(now)
        pods: dict[str, _PodLines] = {}
        blocks: dict[tuple[_PodLines, ...], list[Deflated]] = {}
        per_family: tuple[list[Deflated], ...] = tuple([] for _ in CONTAINER_FAMILIES)
        run: list[_PodLines] = []

        def close() -> None:
            members = tuple(run)
            texts = self._blocks.get(members)
            if texts is None:
                texts = deflate_each(["".join([pod.memory for pod in run]).encode(),
                                      "".join([pod.cores for pod in run]).encode()],
                                     SCRAPE_LEVEL)
            blocks[members] = texts
            for pieces, text in zip(per_family, texts, strict=True):
                pieces.append(text)
            run.clear()

        for key in order:
            allocation = now[key]
            pod = kept.get(key)
            if pod is None or pod.allocation is not allocation:
                pod = _PodLines.of(key, allocation, self._pods_per_block)
            pods[key] = pod
            run.append(pod)
            if pod.ends_block:
                close()
        if run:
            close()
        mig = self._mig_instances(fleet, [(key, pod.allocation) for key, pod in pods.items()
                                          if pod.makes_mig])
        texts = [previous if previous.pieces == tuple(pieces) else DeflatedRun.of(tuple(pieces))
                 for previous, pieces in zip(self._texts, per_family, strict=True)]
        # Kept only once all is written: a scrape left half way changes nothing.
        self._order, self._pods, self._blocks, self._texts = order, pods, blocks, texts
        self._mig = mig
        self._seen = (fleet, fleet.changes)

    def _sorted(self, allocations: dict[str, Allocation]) -> list[str]:
        """The pods' keys in order: the last scrape's order with the pods that came and went
        put in or taken out (sorting 10,000 keys took more than the pods that changed)."""
        before = self._pods.keys()
        if before == allocations.keys():
            return self._order
        gone = before - allocations.keys()
        came = allocations.keys() - before
        if len(gone) + len(came) > len(allocations) // 8:
            return sorted(allocations)
        order = list(self._order)
        for key in gone:
            del order[bisect_left(order, key)]
        for key in came:
            insort(order, key)
        return order

    @staticmethod
    def _containers(fleet: Fleet) -> Iterator[Metric]:
        """Every pod holding cards, reserved or bound; containers numbered as in the
        allocation annotation (init containers first), as HAMi numbers them."""
        memory = _gauge(*CONTAINER_FAMILIES[0], HAMI_CONTAINER_LABELS)
        cores = _gauge(*CONTAINER_FAMILIES[1], HAMI_CONTAINER_LABELS)
        for key, allocation in sorted(fleet.allocations().items()):
            namespace, _, pod = key.partition("/")
            for position, grants in enumerate(allocation.containers):
                for grant in grants:
                    series = [namespace, allocation.node, pod, str(position), grant.uuid,
                              HAMI_ZONE]
                    memory.add_metric(series, grant.memory * MIB)
                    cores.add_metric(series, grant.cores)
        pods = sorted(fleet.allocations().items())
        yield from (memory, cores, HamiCollector._mig_instances(fleet, pods))

    @staticmethod
    def _mig_instances(fleet: Fleet, pods: Iterable[tuple[str, Allocation]]) -> Metric:
        """HAMi's ``hami_node_gpu_mig_instance_info``: one series per MIG instance its node
        made (the runtime identity recorded on the pod), none before; ``pods`` in name
        order (those that made none may be left out)."""
        info = _gauge("hami_node_gpu_mig_instance_info", "MIG instance information",
                      ["node", "device_uuid", "device_index", "mig_uuid", "profile",
                       "gpu_instance_id", "compute_instance_id", "placement_start",
                       "placement_size"])
        for _, allocation in pods:
            made_here = [(grant.uuid, grant.instance) for grants in allocation.containers
                         for grant in grants
                         if grant.instance is not None and grant.instance.mig_uuid]
            if not made_here:
                continue  # most pods: no MIG instance, no node to look up
            node = fleet.node(allocation.node)
            index = {d.uuid: d.index for d in node.cards} if node is not None else {}
            for uuid, made in made_here:
                info.add_metric([allocation.node, uuid, str(index.get(uuid, "")),
                                 made.mig_uuid, made.profile, str(made.gpu_instance_id),
                                 str(made.compute_instance_id), str(made.placement.start),
                                 str(made.placement.size)], 1)
        return info


@dataclass(frozen=True, slots=True, eq=False)
class _PodLines:
    """A pod's lines of ``CONTAINER_FAMILIES``, written for ``allocation`` (compared by
    identity)."""

    allocation: Allocation
    memory: str
    cores: str
    makes_mig: bool
    """A MIG instance was made for the pod (``_mig_instances`` shows it)."""
    ends_block: bool

    @classmethod
    def of(cls, key: str, allocation: Allocation, pods_per_block: int) -> _PodLines:
        memory, cores = _container_lines(key, allocation)
        makes_mig = any(grant.instance is not None and grant.instance.mig_uuid
                        for grants in allocation.containers for grant in grants)
        return cls(allocation, memory, cores, makes_mig,
                   zlib.crc32(key.encode()) % pods_per_block == 0)


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


@dataclass(eq=False, slots=True)
class _Block:
    """The text of a run of nodes, per family of a part (``CARD_FAMILIES``, or
    ``MEASURED_CARD_FAMILIES``), kept compressed only: a block is about 19 KB of text a
    family and 1 to 2 KB compressed, so 5,000 nodes hold about 4 MB rather than 67 MB."""

    texts: tuple[Deflated, ...]


_Inflated = Callable[[_Block], tuple[bytes, ...]]
"""A block's texts, decompressed at most once a scrape (``_Inflater``)."""


class _Inflater:
    """The texts of the blocks that a scrape rebuilds, each decompressed once."""

    def __init__(self) -> None:
        self._texts: dict[_Block, tuple[bytes, ...]] = {}

    def __call__(self, block: _Block) -> tuple[bytes, ...]:
        texts = self._texts.get(block)
        if texts is None:
            texts = self._texts[block] = tuple(text.text() for text in block.texts)
        return texts


@dataclass(eq=False, slots=True)
class _Part:
    """One node's lines of the families of a part, compared by identity. The lines are kept
    in ``fresh`` until a block holds them, then as spans of its block's texts."""

    fresh: tuple[bytes, ...] | None
    block: _Block | None = None
    spans: array[int] = field(default_factory=partial(array, "I"))
    """Per family, where its lines start in ``block``'s text and (next) where they end."""

    def lines(self, inflated: _Inflated) -> Sequence[bytes | memoryview]:
        """Per family, the node's lines."""
        if self.fresh is not None:
            return self.fresh
        assert self.block is not None
        spans = self.spans
        return [memoryview(text)[spans[2 * family]:spans[2 * family + 1]]
                for family, text in enumerate(inflated(self.block))]


@dataclass(eq=False, slots=True)
class _NodeText:
    """One node's lines of every card family: ``cards`` as its inventory and its cards'
    usage were when they were written, ``used`` as its measured figures were."""

    node: Node
    figures: Measured | None
    ends_block: bool
    """The last node of a block: blocks end at nodes chosen by their names, so that a node
    that comes or goes changes its own block alone."""
    cards: _Part
    used: _Part


def _shares(node: Node) -> list[tuple[str, Card]]:
    """Each card with the labels its lines of every family share."""
    name = _escaped(node.name)
    return [(f'device_type="{_escaped(card.type)}",'
             f'device_uuid="{_escaped(card.uuid)}",node="{name}"', card)
            for card in node.cards]


def _card_part(fleet: Fleet, node: Node) -> _Part:
    cards = [(shared, card, fleet.usage(node.name, card.uuid))
             for shared, card in _shares(node)]
    return _Part(tuple("".join([write(shared, card, usage)
                                for shared, card, usage in cards]).encode()
                       for write in _WRITERS))


def _used_part(node: Node, figures: Measured | None) -> _Part:
    used: list[tuple[str, Card, MeasuredCard]] = []
    if figures is not None:
        by_uuid = {figure.uuid: figure for figure in figures.cards}
        used = [(shared, card, by_uuid[card.uuid]) for shared, card in _shares(node)
                if card.uuid in by_uuid]
    return _Part(tuple("".join([write_used(shared, card, figure)
                                for shared, card, figure in used]).encode()
                       for _, _, write_used in MEASURED_CARD_FAMILIES))


def _same_figures(before: Measured | None, now: Measured | None) -> bool:
    """The same figures for every card (a new message, another ``at``, the same use)."""
    if before is None or now is None:
        return before is now
    return before.cards == now.cards


def _block(parts: tuple[_Part, ...], families: int, level: int,
           inflated: _Inflated) -> _Block:
    """The block of ``parts``, which then hold their lines as spans of it. A family whose
    text is that of a block the parts were in keeps its compressed text (a pod booked on a
    node changes its usage families, not its limits): not compressed again, and the same
    object, which ``CardGauges`` recognises."""
    rows = [part.lines(inflated) for part in parts]
    texts = [b"".join([row[family] for row in rows]) for family in range(families)]
    kept: list[Deflated | None] = [None] * families
    for before in {part.block for part in parts if part.block is not None}:
        for family, text in enumerate(inflated(before)):
            if kept[family] is None and text == texts[family]:
                kept[family] = before.texts[family]
    compressed = iter(deflate_each([text for text, same in zip(texts, kept, strict=True)
                                    if same is None], level))
    block = _Block(tuple(same or next(compressed) for same in kept))
    offsets = [0] * families
    for part, row in zip(parts, rows, strict=True):
        spans = array("I")
        for family, lines in enumerate(row):
            start = offsets[family]
            offsets[family] = start + len(lines)
            spans.extend((start, offsets[family]))
        part.block, part.spans, part.fresh = block, spans, None
    return block


@lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, None where the C library has none."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def _return_free_heap() -> None:
    """Give the C heap's free pages back to the system, after a scrape that wrote many
    blocks. Their texts were freed, but between them the compressed blocks kept were
    allocated, and glibc returns only the top of its heap: at 15,000 nodes, the scrape after
    every node changed left the daemon at 624 MB RSS, 467 MB with this (419 MB before
    the blocks were kept)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


KEPT_LEVEL = 3
"""The compression level of the kept blocks: compressed once, sent at every scrape."""
SCRAPE_LEVEL = 3
"""The level of what is compressed at each scrape (headers, the other collectors)."""


class CardGauges:
    """The per-card gauges (HAMi's, under HAMi's meaning: the registered figures, scaled by
    ``deviceMemoryScaling`` and ``deviceCoreScaling``; and pyhami's: ``pyhami_gpu_healthy``,
    the card's own figures and the measured ones) as exposition text, in pieces: per family,
    its header, then its lines a block of nodes at a time.

    Written here rather than through prometheus_client's collectors, which took 5 s of the
    event loop and 170 MB for the 320,000 samples of 5,000 nodes of 8 cards. The lines are
    the same in the classic text format and OpenMetrics.

    A scrape costs what changed since the last one, not what exists: each node's lines are
    kept, and written again only when its inventory (a new ``Node``) or the ledger's
    allocations on it changed (an allocation booked, released or replaced there: a card's
    usage is the sum of the allocations on it), its measured lines only when its cards'
    measured figures changed; each block's text (about ``cards_per_piece`` cards, its nodes
    chosen by name) is kept compressed (``Deflated``: ``/metrics`` sends it as it is to a
    scraper that accepts gzip), once, and decompressed, joined and compressed again only
    when one of its nodes' lines was written again."""

    def __init__(self, fleet: Callable[[], Fleet], cards_per_piece: int = 64,
                 measured: Callable[[], Mapping[str, Measured]] = dict,
                 level: int = KEPT_LEVEL) -> None:
        self._fleet = fleet
        self._level = level
        self._nodes_per_block = max(1, cards_per_piece // 8)
        self._measured = measured
        # What the last scrape saw: the fleet, its count of changes and its allocations.
        self._seen: tuple[Fleet | None, int, dict[str, Allocation]] = (None, 0, {})
        self._nodes: dict[str, _NodeText] = {}
        self._blocks: dict[tuple[_Part, ...], _Block] = {}
        # Per family, its blocks' compressed texts as one (only a cache: any run of the
        # same pieces is right, whatever scrape made it).
        self._runs = [DeflatedRun.of(()) for _ in _FAMILY_HEADERS]

    def _changed_nodes(self, fleet: Fleet) -> tuple[set[str], dict[str, Allocation]]:
        """The nodes where an allocation was booked, released or replaced since the last
        scrape (none when the fleet counts no change), and the allocations now."""
        seen_fleet, seen_changes, before = self._seen
        if fleet is seen_fleet and fleet.changes == seen_changes:
            return set(), before
        now = fleet.allocations()
        changed = set()
        for key, allocation in now.items():
            old = before.get(key)
            if old is not allocation:
                changed.add(allocation.node)
                if old is not None:
                    changed.add(old.node)
        changed.update(before[key].node for key in before.keys() - now.keys())
        return changed, now

    def _entry(self, fleet: Fleet, node: Node, figures: Measured | None,
               entry: _NodeText | None, changed: set[str]) -> _NodeText:
        """``entry`` if nothing of the node changed, else its lines written again where they
        changed."""
        if entry is None or entry.node is not node:
            ends = zlib.crc32(node.name.encode()) % self._nodes_per_block == 0
            return _NodeText(node, figures, ends, _card_part(fleet, node),
                             _used_part(node, figures))
        cards = _card_part(fleet, node) if node.name in changed else entry.cards
        used = entry.used
        if figures is not entry.figures:
            if not _same_figures(entry.figures, figures):
                used = _used_part(node, figures)
            elif cards is entry.cards:
                # The same figures in a new message (every agent's heartbeat): the entry
                # stands, and its next comparison is by identity. Harmless if this scrape is
                # left half way: the entry's lines are those of these figures.
                entry.figures = figures
                return entry
        if cards is entry.cards and used is entry.used:
            return entry
        return _NodeText(node, figures, entry.ends_block, cards, used)

    def pieces(self) -> Iterator[Segment]:
        """The text, a family's header (plain) or its lines for a block of nodes at a time
        (``Deflated``); each node as it was when it was gathered (empty pieces between nodes
        written again, so that writing 40,000 cards afresh does not hold the loop at once)."""
        fleet = self._fleet()
        measured = self._measured()
        changes = fleet.changes
        changed, allocations = self._changed_nodes(fleet)
        kept = self._nodes
        nodes: dict[str, _NodeText] = {}
        blocks: dict[tuple[_Part, ...], _Block] = {}
        card_blocks: list[_Block] = []
        used_blocks: list[_Block] = []
        run: list[_NodeText] = []
        written = 0
        inflated = _Inflater()
        rebuilt: list[_Block] = []

        def close() -> None:
            for parts, families, into in (
                    (tuple(entry.cards for entry in run), len(CARD_FAMILIES), card_blocks),
                    (tuple(entry.used for entry in run), len(MEASURED_CARD_FAMILIES),
                     used_blocks)):
                block = self._blocks.get(parts)
                if block is None:
                    block = _block(parts, families, self._level, inflated)
                    rebuilt.append(block)
                blocks[parts] = block
                into.append(block)
            run.clear()

        for node in list(fleet.nodes()):
            before = kept.get(node.name)
            entry = self._entry(fleet, node, measured.get(node.name), before, changed)
            if entry is not before:
                written += 1
                if written % self._nodes_per_block == 0:
                    yield b""
            nodes[node.name] = entry
            run.append(entry)
            if entry.ends_block:
                close()  # now, so that lines written afresh are held once
        if run:
            close()
        # Kept only once the whole gathering is done: a scrape left half way changes nothing.
        self._seen = (fleet, changes, allocations)
        self._nodes = nodes
        self._blocks = blocks
        if len(rebuilt) > len(blocks) // 4:
            del inflated, rebuilt
            _return_free_heap()
        for family, header in enumerate(_FAMILY_HEADERS):
            yield header
            if family < len(CARD_FAMILIES):
                texts = tuple([block.texts[family] for block in card_blocks])
            else:
                texts = tuple([block.texts[family - len(CARD_FAMILIES)]
                               for block in used_blocks])
            # A family whose blocks all kept their compressed text is the run of last time
            # (its CRC-32 combined then): compared by identity, piece by piece.
            family_run = self._runs[family]
            if family_run.pieces != texts:
                family_run = self._runs[family] = DeflatedRun.of(texts)
            yield family_run

    def text(self) -> str:
        return b"".join(plain(self.pieces())).decode()


Segment = bytes | Deflated | DeflatedRun
"""A piece of exposition text: plain, or kept compressed."""


def plain(segments: Iterable[Segment]) -> Iterator[bytes]:
    """``segments`` as plain text (the kept ones decompressed, by one decompressor: each
    refers to nothing outside itself, so they read as one deflate stream)."""
    decompressor = zlib.decompressobj(RAW_DEFLATE)
    for segment in segments:
        yield segment if isinstance(segment, bytes) else decompressor.decompress(segment.data)


def gzipped(segments: Iterable[Segment], level: int = SCRAPE_LEVEL,
            batch: int = 1 << 16) -> Iterator[bytes]:
    """``segments`` as one gzip member, in pieces of about ``batch`` bytes (and empty ones
    where ``segments`` has them: turns for the event loop)."""
    member = GzipMember(level)
    ready = [member.header()]
    size = len(ready[0])
    for segment in segments:
        if isinstance(segment, bytes):
            if not segment:
                yield b"".join(ready)
                ready.clear()
                size = 0
                continue
            out = member.plain(segment)
        else:
            out = member.kept(segment)
        if out:
            ready.append(out)
            size += len(out)
            if size >= batch:
                yield b"".join(ready)
                ready.clear()
                size = 0
    ready.append(member.end())
    yield b"".join(ready)


_FAMILY_HEADERS = tuple(
    f"# HELP {family} {documentation}\n# TYPE {family} gauge\n".encode()
    for family, documentation in (*CARD_FAMILIES,
                                  *((name, doc) for name, doc, _ in MEASURED_CARD_FAMILIES)))


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


NODE_FAMILIES = (
    ("pyhami_node_last_heard_timestamp_seconds",
     "When the node's agent last reported, in seconds since the epoch"),
    ("pyhami_node_stale", "1 while the node's inventory is older than --node-timeout"),
    ("pyhami_node_memory_slices_enforced",
     "1 where HAMi-core enforces the memory and core slices in the containers, 0 where the "
     "device plugin hands out cards without it"),
    ("pyhami_containers_over_slice",
     "Containers measured using more memory than their slice, on a node where nothing "
     "enforces the slices (no HAMi-core)"),
)


class DaemonCollector(Rendered):
    """The daemon's own gauges: build, readiness, node freshness, cards, orphans."""

    def __init__(self, sources: Sources) -> None:
        self._sources = sources
        self._build = [package_version(), platform.python_version()]
        self._lines = tuple(_Lines(_node_line(family)) for family, _ in NODE_FAMILIES)
        self._orphans_seen: tuple[Fleet | None, int, int] = (None, 0, 0)

    def _small(self) -> tuple[Metric, Metric, Metric]:
        build = _gauge("pyhami_build_info",
                       "pyhami's version and Python's, as labels; the value is always 1",
                       ["version", "python_version"])
        build.add_metric(self._build, 1.0)
        ready = GaugeMetricFamily("pyhami_ready", "1 while /readyz would answer 200")
        ready.add_metric([], 1.0 if self._sources.ready() else 0.0)
        leader = GaugeMetricFamily(
            "pyhami_leader", "1 while this daemon decides, 0 while it stands by")
        leader.add_metric([], 1.0 if self._sources.leading() else 0.0)
        return build, ready, leader

    def _rows(self) -> tuple[Mapping[str, float], ...]:
        """Per family of NODE_FAMILIES, its nodes' values."""
        heard = self._sources.last_heard()
        stale_nodes = self._sources.stale()
        return (heard, {name: 1.0 if name in stale_nodes else 0.0 for name in heard},
                {name: 1.0 if yes else 0.0
                 for name, yes in self._sources.slices_enforced().items()},
                dict(self._sources.over_slice()))

    def _orphans(self) -> Metric:
        orphans = GaugeMetricFamily(
            "pyhami_allocations_on_vanished_cards",
            "Cards still holding allocations that their node no longer reports")
        fleet = self._sources.fleet()
        seen_fleet, changes, count = self._orphans_seen
        if fleet is not seen_fleet or fleet.changes != changes:
            # Counted again only when nodes or ledger changed (it walks every booked card).
            count = len(fleet.orphans())
            self._orphans_seen = (fleet, fleet.changes, count)
        orphans.add_metric([], count)
        return orphans

    def collect(self) -> Iterable[Metric]:
        yield from self._small()
        for (family, documentation), rows in zip(NODE_FAMILIES, self._rows(), strict=True):
            gauge = _gauge(family, documentation, ["node"])
            for name, value in sorted(rows.items()):
                gauge.add_metric([name], value)
            yield gauge
        yield self._orphans()

    def rendered(self, encoder: Encoder,
                 encoding: tuple[object, ...]) -> Iterator[Segment]:
        """The families as ``collect`` gives them; a node's line written again only when its
        value changed."""
        for small in self._small():
            yield _encoded(encoder, small)
        for (family, documentation), lines, rows in zip(NODE_FAMILIES, self._lines,
                                                        self._rows(), strict=True):
            yield _header(encoder, encoding, family, documentation)
            yield lines.text(rows)
        yield _encoded(encoder, self._orphans())


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


class _Registry(CollectorRegistry):
    """A registry that keeps its collectors in the order registered, as it collects them."""

    def __init__(self) -> None:
        super().__init__()
        self.collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        super().register(collector)
        self.collectors.append(collector)

    def unregister(self, collector: Collector) -> None:
        super().unregister(collector)
        self.collectors.remove(collector)


class Metrics:
    """Every metric of ``/metrics``; ``names`` are the daemon's configured resource names
    (its device configuration), which the quota gauges name. ``cards_per_block`` and
    ``pods_per_block``: about how many cards (pods) are kept compressed together."""

    def __init__(self, sources: Sources, names: ResourceNames = DEFAULT_NAMES, *,
                 cards_per_block: int = 64, pods_per_block: int = 32) -> None:
        self.registry = _Registry()
        self.cards = CardGauges(sources.fleet, measured=sources.measured,
                                cards_per_piece=cards_per_block)
        self.registry.register(HamiCollector(sources.fleet, pods_per_block))
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

    def pieces(self, accept: str, gzip: bool = False) -> tuple[str, Iterator[bytes]]:
        """Every metric in the format ``accept`` (an Accept header) asks for, OpenMetrics
        when it names it, the classic text format otherwise: its content type, and the text
        in pieces to send one after the other, as one gzip member when ``gzip`` (the card
        gauges' blocks sent as they are kept, the rest compressed now; without it they are
        decompressed)."""
        content_type, segments = self.segments(accept)
        return content_type, gzipped(segments) if gzip else plain(segments)

    def segments(self, accept: str) -> tuple[str, Iterator[Segment]]:
        """``pieces``' content type and text, the card gauges' blocks as they are kept."""
        encoder, content_type = choose_encoder(accept)

        def pieces() -> Iterator[Segment]:
            yield from self.cards.pieces()
            # The rest collector by collector: those that keep their text from the last
            # scrape (a line a node or a pod) give it, the others family by family (a
            # family of a line a node, 5,000 nodes, took tens of milliseconds through
            # prometheus_client; the whole registry in one call 0.2 s).
            encoding = _encoding(encoder)
            end = b""
            for collector in list(self.registry.collectors):
                if isinstance(collector, Rendered) and encoding is not None:
                    yield from collector.rendered(encoder, encoding)
                    continue
                for family in collector.collect():
                    text = encoder(_OneFamily(family))
                    if text.endswith(OPENMETRICS_END):
                        text, end = text[:-len(OPENMETRICS_END)], OPENMETRICS_END
                    yield text
            yield end  # OpenMetrics' end mark, after every family

        return content_type, pieces()
