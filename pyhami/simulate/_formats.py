"""The simulation's input files, each recognised from its content: pyhami's own cluster
and workload (JSON or YAML), or the node and pod lists of Alibaba's public GPU cluster
trace, cluster-trace-gpu-v2023 ("openb")."""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec

from common.core import (
    ClusterFile,
    ClusterFileError,
    PodManifest,
    PodRejected,
    fleet_from_cluster,
)
from common.core.deviceconfig import DeviceConfig
from common.core.groups import (
    KUEUE_COUNT_ANNOTATION,
    KUEUE_GROUP_LABEL,
    GroupRef,
    GroupSource,
    group_of,
)
from common.core.model import CARDS_PER_NODE_MAX, Card, Node
from common.core.pod import (
    DEFAULT_DEVICE,
    Container,
    ObjectMeta,
    PodSpec,
    ResourceRequirements,
)
from common.core.quota import Quota
from common.core.vendors import NVIDIA, ResourceNames
from common.files import InputFileError, parse_document, parse_pod_manifest
from pyhami.simulate._trace import SimPod, Trace

OPENB_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
OPENB_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec",
                     "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")

OPENB_MODEL_MEMORY_MIB = {
    "P100": 16 * 1024,
    "T4": 16 * 1024,
    "V100M16": 16 * 1024,
    "V100M32": 32 * 1024,
    "A10": 24 * 1024,
    # G1, G2 and G3 are models the trace does not disclose: 16 GiB, the trace's most
    # common size, is assumed. openb pods ask memory as a share of a card, so the figure
    # changes no placement.
    "G1": 16 * 1024,
    "G2": 16 * 1024,
    "G3": 16 * 1024,
}
"""Each openb GPU model's memory in MiB, as sold (NVML reports a little less)."""

OPENB_NAMESPACE = "default"
MILLI_PER_CARD = 1000
SHORTEST_RUN_SECONDS = 1.0
"""openb's times are whole seconds: a pod deleted within the second it started ran for
under one second, counted as one."""

_HEADER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SERIAL = re.compile(r"[A-Za-z0-9._/-]+")  # what a card UUID, "<sn>-<index>", may hold


def load_trace(cluster: Path, workload: Path, device: DeviceConfig = DEFAULT_DEVICE) -> Trace:
    """The nodes of ``cluster`` and the pods of ``workload``, each file in pyhami's own
    shape or openb's, under ``device`` (``--device-config``): the quotas' keys and
    ``memoryFactor``, the resource names a GPU pod asks with, and those openb's pods are
    written with. Pods that ask for no GPU are left out and counted in
    ``Trace.cpu_only``. Raises ``InputFileError`` naming the file, line or field."""
    nodes, quotas = _load_nodes(cluster, _read_text(cluster), device)
    pods, cpu_only = _load_pods(workload, _read_text(workload), device.resources)
    pods.sort(key=lambda pod: pod.arrival)  # stable: equal arrivals keep the file's order
    return Trace(nodes=nodes, pods=pods, cpu_only=cpu_only, quotas=quotas)


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise InputFileError(f"{path}: {error.strerror or error}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise InputFileError(f"{path}: not UTF-8 text (byte {error.start})") from None


def _csv_header(text: str) -> list[str] | None:
    """The column names when the first line is a CSV header (three or more bare names,
    comma-separated); None for anything else, such as JSON or YAML."""
    first_line = text.lstrip("\r\n").split("\n", 1)[0].strip()
    names = [name.strip() for name in first_line.split(",")]
    if len(names) >= 3 and all(_HEADER_NAME.fullmatch(name) for name in names):
        return names
    return None


def _is_openb_pods(header: Sequence[str]) -> bool:
    return "num_gpu" in header or "gpu_milli" in header


def _load_nodes(path: Path, text: str,
                device: DeviceConfig) -> tuple[list[Node], tuple[Quota, ...]]:
    """The cluster's nodes and its ResourceQuotas (an openb node list has none)."""
    header = _csv_header(text)
    if header is None:
        return _own_nodes(path, text, device)
    if _is_openb_pods(header):
        raise InputFileError(f"{path}: an openb pod list where a cluster was expected")
    return _openb_nodes(path, text), ()


def _load_pods(path: Path, text: str, names: ResourceNames) -> tuple[list[SimPod], int]:
    header = _csv_header(text)
    if header is None:
        return _own_pods(path, text, names)
    if "sn" in header:
        raise InputFileError(f"{path}: an openb node list where a workload was expected")
    return _openb_pods(path, text, names)


# pyhami's own shapes ------------------------------------------------------------------

def _document(text: str, source: str) -> object:
    """Plain values from JSON (msgspec, fast) or else YAML (the safe loader)."""
    try:
        return msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError):
        return parse_document(text, source)


def _own_nodes(path: Path, text: str,
               device: DeviceConfig) -> tuple[list[Node], tuple[Quota, ...]]:
    try:
        cluster = msgspec.convert(_document(text, str(path)), ClusterFile)
    except msgspec.ValidationError as error:
        raise InputFileError(f"{path}: {error}") from None
    if cluster.pods:
        # A simulation starts from empty cards: pods already running belong in the
        # workload, arriving at 0.
        raise InputFileError(
            f"{path}: pods: a simulated cluster starts empty; list running pods in the "
            "workload with arrival 0 instead")
    try:
        # Names and cards listed twice, quotas that cannot be applied.
        fleet = fleet_from_cluster(cluster, device)
    except ClusterFileError as error:
        raise InputFileError(f"{path}: {error}") from None
    return cluster.nodes, tuple(fleet.quotas.quotas())


class _WorkloadPod(msgspec.Struct, forbid_unknown_fields=True):
    pod: dict[str, Any]
    arrival: float
    duration: float | None = None


class _Workload(msgspec.Struct, forbid_unknown_fields=True):
    pods: list[_WorkloadPod]


def _own_pods(path: Path, text: str, names: ResourceNames) -> tuple[list[SimPod], int]:
    document = _document(text, str(path))
    try:
        entries = (msgspec.convert(document, list[_WorkloadPod]) if isinstance(document, list)
                   else msgspec.convert(document, _Workload).pods)
    except msgspec.ValidationError as error:
        raise InputFileError(f"{path}: {error}") from None
    prefix = "$" if isinstance(document, list) else "$.pods"
    pods: list[SimPod] = []
    cpu_only = 0
    places: dict[str, str] = {}
    groups = _Groups()
    for position, entry in enumerate(entries):
        where = f"{path}: {prefix}[{position}]"
        if not (math.isfinite(entry.arrival) and entry.arrival >= 0):
            raise InputFileError(f"{where}.arrival: {entry.arrival!r} is not a finite "
                                 "number of seconds, 0 or more")
        if entry.duration is not None and not (
                math.isfinite(entry.duration) and entry.duration > 0):
            raise InputFileError(f"{where}.duration: {entry.duration!r} is not a finite "
                                 "number of seconds above 0")
        manifest = _manifest(entry.pod, f"{where}.pod")
        if manifest.key in places:
            raise InputFileError(f"{where}.pod: {manifest.key} is listed twice "
                                 f"(first at {places[manifest.key]})")
        places[manifest.key] = f"{prefix}[{position}]"
        group = groups.member(manifest, f"{where}.pod")
        # A group's member that asks for no GPU stays: its group is whole only with it.
        if group is None and not manifest.asks_for_gpu(names):
            cpu_only += 1
            continue
        pods.append(SimPod(manifest, entry.arrival, entry.duration, group))
    return pods, cpu_only


class _Groups:
    """The groups a workload file declares, checked member by member as they are read: one
    declaration, Kueue's (the only one that carries its count on the pod), one count for
    all members, no more members than the count."""

    def __init__(self) -> None:
        self.first: dict[str, tuple[str, int]] = {}
        """Per group key: its first member's key and the count it gave."""
        self.members: dict[str, int] = {}

    def member(self, manifest: PodManifest, where: str) -> GroupRef | None:
        """The group ``manifest`` declares; raises ``InputFileError`` naming the pod and
        the field for a declaration the simulation cannot use."""
        try:
            group = group_of(manifest)
        except PodRejected as error:
            raise InputFileError(f"{where}: {manifest.key}: {error}") from None
        if group is None:
            return None
        if group.source is not GroupSource.KUEUE or group.count is None:
            raise InputFileError(
                f"{where}: {manifest.key}: {group.source.field}: a workload file declares "
                f"groups with Kueue's label {KUEUE_GROUP_LABEL} and annotation "
                f"{KUEUE_COUNT_ANNOTATION}, which carry the member count on the pod")
        field = f"metadata.annotations[{KUEUE_COUNT_ANNOTATION}]"
        first = self.first.setdefault(group.key, (manifest.key, group.count))
        if first[1] != group.count:
            raise InputFileError(
                f"{where}: {manifest.key}: {field}: {group.count} members, but {first[0]} "
                f"of the same group {group.name} says {first[1]}")
        self.members[group.key] = self.members.get(group.key, 0) + 1
        if self.members[group.key] > group.count:
            raise InputFileError(
                f"{where}: {manifest.key}: {field}: group {group.name} counts "
                f"{group.count} members, and this is member {self.members[group.key]}")
        return group


def _manifest(pod: dict[str, Any], source: str) -> PodManifest:
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict) or not metadata.get("name"):
        raise InputFileError(f"{source}.metadata.name: a pod needs a name")
    # Re-encoded and read by the decoder `pyhami decide --pod` uses: the same checks.
    return parse_pod_manifest(msgspec.json.encode(pod), source)


# openb ---------------------------------------------------------------------------------

class _Row:
    """One CSV line's fields by column name, with errors naming the file, line and column."""

    def __init__(self, path: Path, line: int, fields: dict[str, str]) -> None:
        self.path, self.line, self.fields = path, line, fields

    def error(self, column: str, problem: str) -> InputFileError:
        return InputFileError(f"{self.path}: line {self.line}, column {column}: {problem}")

    def text(self, column: str) -> str:
        return self.fields[column].strip()

    def count(self, column: str, at_most: int) -> int:
        """A whole number from 0 to ``at_most``; pandas may have written it as ``2.0``."""
        value = self._number(column)
        if value is None:
            raise self.error(column, "empty, expected a whole number")
        if value != int(value) or value < 0:
            raise self.error(column, f"{self.text(column)!r} is not a whole number, 0 or more")
        if value > at_most:
            raise self.error(column, f"{self.text(column)} is above {at_most}")
        return int(value)

    def seconds(self, column: str) -> float | None:
        """A time in seconds, 0 or more; None when the field is empty."""
        value = self._number(column)
        if value is not None and value < 0:
            raise self.error(column, f"{self.text(column)!r} is negative")
        return value

    def _number(self, column: str) -> float | None:
        text = self.text(column)
        if text == "" or text.lower() == "nan":  # pandas writes a missing value as nan
            return None
        try:
            value = float(text)
        except ValueError:
            raise self.error(column, f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise self.error(column, f"{text!r} is not a finite number")
        return value


def _rows(path: Path, text: str, columns: Sequence[str]) -> Iterator[_Row]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [name.strip() for name in next((fields for fields in reader if fields), [])]
        missing = [name for name in columns if name not in header]
        if missing:
            raise InputFileError(f"{path}: line {reader.line_num}: no column "
                                 f"{', '.join(missing)} (openb's columns are {','.join(columns)})")
        for fields in reader:
            if not any(field.strip() for field in fields):
                continue
            if len(fields) != len(header):
                raise InputFileError(f"{path}: line {reader.line_num}: {len(fields)} fields, "
                                     f"the header names {len(header)}")
            yield _Row(path, reader.line_num, dict(zip(header, fields, strict=True)))
    except csv.Error as error:
        raise InputFileError(f"{path}: line {reader.line_num}: {error}") from None


def _openb_nodes(path: Path, text: str) -> list[Node]:
    nodes: list[Node] = []
    lines: dict[str, int] = {}
    for row in _rows(path, text, OPENB_NODE_COLUMNS):
        cards = row.count("gpu", CARDS_PER_NODE_MAX)
        if cards == 0:  # a CPU node: no GPU pod can go there
            continue
        serial = row.text("sn")
        if not _SERIAL.fullmatch(serial):
            raise row.error("sn", f"{serial!r}: expected letters, digits and . _ / -")
        if serial in lines:
            raise row.error("sn", f"{serial!r} is listed twice (first on line {lines[serial]})")
        lines[serial] = row.line
        model = row.text("model")
        memory = OPENB_MODEL_MEMORY_MIB.get(model)
        if memory is None:
            raise row.error("model", f"{model!r} is not a GPU model whose memory is known "
                                     f"({', '.join(OPENB_MODEL_MEMORY_MIB)})")
        devices = [Card(uuid=f"{serial}-{index}", index=index, type=model, memory=memory)
                   for index in range(cards)]
        nodes.append(Node(name=serial, cards=devices))
    return nodes


def _openb_pods(path: Path, text: str, names: ResourceNames) -> tuple[list[SimPod], int]:
    pods: list[SimPod] = []
    cpu_only = 0
    lines: dict[str, int] = {}
    for row in _rows(path, text, OPENB_POD_COLUMNS):
        name = row.text("name")
        if not name:
            raise row.error("name", "empty")
        if name in lines:
            raise row.error("name", f"{name!r} is listed twice (first on line {lines[name]})")
        lines[name] = row.line
        cards = row.count("num_gpu", CARDS_PER_NODE_MAX)
        if cards == 0:
            cpu_only += 1
            continue
        milli = row.count("gpu_milli", MILLI_PER_CARD)
        created = row.seconds("creation_time")
        if created is None:
            raise row.error("creation_time", "empty, expected seconds")
        pods.append(SimPod(_openb_manifest(name, cards, milli, row.text("gpu_spec"), names),
                           created, _openb_duration(row, created)))
    if pods:
        start = min(pod.arrival for pod in pods)
        pods = [SimPod(pod.manifest, pod.arrival - start, pod.duration) for pod in pods]
    return pods, cpu_only


def _openb_duration(row: _Row, created: float) -> float | None:
    """From scheduling to deletion; from creation for a pod never scheduled; None (to
    the end) without a deletion time."""
    deleted = row.seconds("deletion_time")
    if deleted is None:
        return None
    scheduled = row.seconds("scheduled_time")
    started, column = ((scheduled, "scheduled_time") if scheduled is not None
                       and scheduled >= created else (created, "creation_time"))
    if deleted < started:
        raise row.error("deletion_time", f"{row.text('deletion_time')} is before "
                                         f"{column} {row.text(column)}")
    return max(deleted - started, SHORTEST_RUN_SECONDS)


def _openb_manifest(name: str, cards: int, milli: int, gpu_spec: str,
                    names: ResourceNames) -> PodManifest:
    # A share of one card (0 < milli < 1000) is its cores and memory alike, in whole
    # percent rounded up, so that a pod never gets less than it asked; 0 or 1000: whole.
    share = 100 if milli in (0, MILLI_PER_CARD) else -(-milli // 10)
    limits: dict[str, str | int | float] = {
        names.count: cards, names.cores: share, names.memory_percentage: share}
    types = [model.strip() for model in gpu_spec.split("|")
             if model.strip() and model.strip().lower() != "nan"]
    annotations = ({NVIDIA.pod_annotations.use_type: ",".join(dict.fromkeys(types))}
                   if types else None)
    return PodManifest(
        metadata=ObjectMeta(name=name, namespace=OPENB_NAMESPACE, annotations=annotations),
        spec=PodSpec(containers=[Container(
            name="main", resources=ResourceRequirements(limits=limits))]),
    )
