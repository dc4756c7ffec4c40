"""Messages between the node agents and the decision daemon: msgpack on NATS.

Every agent publishes its node's full inventory on ``inventory_subject(node)``:
at start, on every change it observes, after a reconnect, when asked through
``RESYNC_SUBJECT``, and as a heartbeat when it has published nothing for a
heartbeat interval. Each message is complete on its own, so a receiver never
needs an earlier one; ``instance`` and ``sequence`` order them.

The agent's device plugin asks the daemon, with a NATS request (empty body) on
``allocations_subject(node)``, which pods bound to its node still wait for their
cards; the daemon answers ``PendingAllocations``. Once the kubelet's Allocate is
served, the agent publishes an ``AllocationOutcome`` on ``allocated_subject(node)``.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec

from common.core.annotations import CORDON_ANNOTATION
from common.core.errors import InvalidInput
from common.core.model import (
    CARDS_PER_NODE_MAX,
    UUID_CHARACTERS,
    UUID_MAX,
    UUID_PATTERN,
    Card,
    MemoryMiB,
    Node,
    SmallCount,
    Uuid,
    repeated_card,
)
from common.core.names import InvalidName, check_label, check_subdomain, shown

SCHEMA_VERSION = 1

INVENTORY_SUBJECT_PREFIX = "pyhami.inventory"
# Node names may contain dots, which NATS reads as token separators: subscribe with ">".
INVENTORY_SUBJECTS = f"{INVENTORY_SUBJECT_PREFIX}.>"
RESYNC_SUBJECT = "pyhami.resync"
ALLOCATIONS_SUBJECT_PREFIX = "pyhami.allocations"
ALLOCATIONS_SUBJECTS = f"{ALLOCATIONS_SUBJECT_PREFIX}.>"
ALLOCATED_SUBJECT_PREFIX = "pyhami.allocated"
ALLOCATED_SUBJECTS = f"{ALLOCATED_SUBJECT_PREFIX}.>"

_CARD_FIELDS = len(Card.__struct_fields__)

Reason = Literal["start", "change", "heartbeat", "resync", "reconnect"]

Positive = Annotated[int, msgspec.Meta(ge=1)]
Seconds = Annotated[float, msgspec.Meta(gt=0, le=86400)]
Label = Annotated[str, msgspec.Meta(max_length=128)]
Detail = Annotated[str, msgspec.Meta(max_length=1024)]
Cordoned = Annotated[list[Uuid], msgspec.Meta(max_length=CARDS_PER_NODE_MAX)]


def inventory_subject(node: str) -> str:
    return f"{INVENTORY_SUBJECT_PREFIX}.{node}"


def subject_node(subject: str, prefix: str = INVENTORY_SUBJECT_PREFIX) -> str:
    """The node a subject is for: what follows the prefix (unchecked)."""
    return subject.removeprefix(f"{prefix}.")


def allocations_subject(node: str) -> str:
    """Where the agent of ``node`` asks for the pods waiting for their cards."""
    return f"{ALLOCATIONS_SUBJECT_PREFIX}.{node}"


def allocated_subject(node: str) -> str:
    """Where the agent of ``node`` reports how the kubelet's Allocate went."""
    return f"{ALLOCATED_SUBJECT_PREFIX}.{node}"


class WireError(InvalidInput):
    """A message that cannot be used; the text says why."""

    result = "rejected"
    """How the daemon counts the refusal (``pyhami_inventory_messages_total{result}``)."""


class WrongSubject(WireError):
    """An inventory for another node than the one its subject names."""

    result = "wrong_subject"


# A card's UUID as the decoder reads it; its characters are checked for every card of a
# message at once (``_uuid_refusal``): a pattern per card took a third of the decoding.
UnpatternedUuid = Annotated[str, msgspec.Meta(min_length=1, max_length=UUID_MAX)]
_UUID_STRING = re.compile(f"[{UUID_CHARACTERS}]*")


class ReportedCard(Card, frozen=True, forbid_unknown_fields=False):
    """A card as the agent reports it: every ``Card`` field, then information fields.

    Unknown fields are accepted so that a newer agent may add information
    without breaking an older daemon; changing a field's meaning bumps
    ``SCHEMA_VERSION``.
    """

    uuid: UnpatternedUuid

    sm_count: SmallCount | None = None
    process_memory: MemoryMiB = 0
    """MiB held by the compute processes running on the card."""
    health_detail: Detail = ""
    """Why the card is unhealthy; empty while it is healthy."""

    def card(self) -> Card:
        # A subclass's fields start with its base's, in order: the leading values are a Card.
        return Card(*msgspec.structs.astuple(self)[:_CARD_FIELDS])


Cards = Annotated[list[ReportedCard], msgspec.Meta(max_length=CARDS_PER_NODE_MAX)]
# A Kubernetes uid is a 36-character UUID; standalone uids are too.
PodUid = Annotated[str, msgspec.Meta(max_length=128)]
# The whole of a pod's annotations may take 256 KiB; one value cannot be longer.
AnnotationValue = Annotated[str, msgspec.Meta(max_length=262144)]
UnixSeconds = Annotated[int, msgspec.Meta(ge=0)]
# A container name is a DNS-1123 label (63); the bound leaves room and the agent checks it.
ContainerName = Annotated[str, msgspec.Meta(max_length=253)]
# Kubernetes caps a pod's containers far below this; a bound on what a decoder accepts.
PENDING_CONTAINERS_MAX = 1024
# Far more pods than a node admits at once; a bound on what a decoder accepts.
PENDING_PODS_MAX = 16384

# Measured usage (``Inventory.measured``). A node runs far fewer containers on its cards
# than this; an agent that measures more sends the ones using the most memory and counts
# the rest in ``Measured.dropped``.
MEASURED_CONTAINERS_MAX = 1024
# A card's utilization as NVML gives it, percent.
CardPercent = Annotated[int, msgspec.Meta(ge=0, le=100)]
# HAMi sums its processes' SM utilization without clamping it: a container of many processes
# may read above 100. A hundred processes each at 100 % is the most this accepts.
UTILIZATION_SUM_MAX = 10000
UtilizationSum = Annotated[int, msgspec.Meta(ge=0, le=UTILIZATION_SUM_MAX)]
# Unix seconds from 1970 to beyond 2286: a clock far off still fits, NaN and infinity do not.
MeasuredAt = Annotated[float, msgspec.Meta(ge=0, le=1e10)]
# How many entries an agent left out; any real count is far below.
DROPPED_MAX = 2**31 - 1
UsageSource = Literal["hami-core", "nvml"]


class MeasuredCard(msgspec.Struct, frozen=True, kw_only=True):
    """One card as NVML measures it on the host, whoever uses it."""

    uuid: UnpatternedUuid
    memory_used: MemoryMiB | None = None
    """MiB in use on the card (NVML's ``memory.used``); None where NVML has no figure."""
    utilization: CardPercent | None = None
    """NVML's ``utilization.gpu``, percent; None where NVML has none."""


class MeasuredContainer(msgspec.Struct, frozen=True, kw_only=True):
    """One container's measured use of one card; (``pod_uid``, ``container``,
    ``device_uuid``) names it, once per message."""

    pod_uid: PodUid
    container: ContainerName
    """Empty where NVML's processes of one pod on one card cannot be told apart (several
    of its containers hold the card): the figures are the pod's on that card."""
    device_uuid: UnpatternedUuid
    memory_used: MemoryMiB
    """MiB: HAMi-core's sum over the container's processes, or NVML's ``usedGpuMemory``
    summed over them."""
    utilization: UtilizationSum
    """Percent of the card's SMs, summed over the container's processes (HAMi's figure,
    not clamped at 100)."""
    memory_limit: MemoryMiB | None = None
    """MiB: HAMi-core's limit for the container on the card; None from NVML."""
    source: UsageSource


MeasuredCards = Annotated[list[MeasuredCard], msgspec.Meta(max_length=CARDS_PER_NODE_MAX)]
MeasuredContainers = Annotated[list[MeasuredContainer],
                               msgspec.Meta(max_length=MEASURED_CONTAINERS_MAX)]


class Measured(msgspec.Struct, frozen=True, kw_only=True):
    """What the node's monitor measured at ``at``: each card's use, whoever uses it, and
    each container's use of its cards."""

    at: MeasuredAt
    """Unix seconds of the measurement (the agent's clock)."""
    cards: MeasuredCards = []
    containers: MeasuredContainers = []
    dropped: Annotated[int, msgspec.Meta(ge=0, le=DROPPED_MAX)] = 0
    """Container entries the agent measured and left out: those beyond
    ``MEASURED_CONTAINERS_MAX`` (the least memory first) and any whose names no message may
    carry."""


class Inventory(msgspec.Struct, frozen=True, kw_only=True):
    """One node's complete state, as one agent instance saw it at ``timestamp``."""

    schema: int
    node: str
    agent_version: Label
    instance: Label
    """Random per agent process: a new instance starts its sequence again at 1."""
    sequence: Positive
    timestamp: float
    """Unix seconds."""
    reason: Reason
    heartbeat_interval: Seconds
    """The longest the agent stays silent while connected; a receiver may call
    the node stale after a few of these without a message."""
    cards: Cards
    cordoned: Cordoned = []
    """UUIDs the agent reports as cordoned: the scheduler must not use them."""
    slices_enforced: bool | None = None
    """With the agent's device plugin: whether HAMi-core is there to enforce the memory
    and core slices in the containers; None when the agent serves no device plugin."""
    measured: Measured | None = None
    """The latest usage the node's monitor measured; None from an agent that measures
    none (or predates it: an older daemon ignores the field)."""

    def to_node(self) -> Node:
        annotations = {CORDON_ANNOTATION: ",".join(self.cordoned)} if self.cordoned else {}
        return Node(name=self.node, cards=[card.card() for card in self.cards],
                    annotations=annotations)


class ResyncRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Asks agents to publish their inventory now; ``nodes`` empty means every agent."""

    requested_by: str = ""
    nodes: list[str] = []

    def includes(self, node: str) -> bool:
        return not self.nodes or node in self.nodes


class PendingContainer(msgspec.Struct, frozen=True, kw_only=True):
    """One container of a pending pod, as the device plugin needs it for HAMi-core."""

    name: ContainerName
    """The container's name: HAMi-core's folder on the node is ``<pod uid>_<name>``."""
    control_disabled: bool = False
    """The container's own env sets ``CUDA_DISABLE_CONTROL`` true: no ld.so.preload."""


PendingContainers = Annotated[tuple[PendingContainer, ...],
                              msgspec.Meta(max_length=PENDING_CONTAINERS_MAX)]


class PendingPod(msgspec.Struct, frozen=True, kw_only=True):
    """A pod bound to the node whose cards are still to be handed to its containers."""

    namespace: str
    name: str
    uid: PodUid
    devices: AnnotationValue
    """The pod's ``hami.io/vgpu-devices-to-allocate`` (``common.core.decode_devices``)."""
    bind_time: UnixSeconds
    """The pod's ``hami.io/bind-time``."""
    containers: PendingContainers = ()
    """The pod's containers in the annotation's order (init containers first); empty from
    a daemon that predates them."""
    mig_allocations: AnnotationValue = ""
    """The pod's ``hami.io/vgpu-mig-allocations``: the MIG instances its containers are to
    get (empty: none)."""


PendingPods = Annotated[list[PendingPod], msgspec.Meta(max_length=PENDING_PODS_MAX)]


class HoldingContainer(msgspec.Struct, frozen=True, kw_only=True):
    """One container of a pod holding cards, and the cards it holds (none for a container
    without GPU)."""

    name: ContainerName
    init: bool = False
    """An init container (HAMi's node monitor reports app containers only)."""
    cards: Annotated[tuple[UnpatternedUuid, ...], msgspec.Meta(max_length=CARDS_PER_NODE_MAX)] = ()


HoldingContainers = Annotated[tuple[HoldingContainer, ...],
                              msgspec.Meta(max_length=PENDING_CONTAINERS_MAX)]


class HoldingPod(msgspec.Struct, frozen=True, kw_only=True):
    """A pod bound to the node that holds cards pyhami booked: HAMi-core's folders of its
    containers are in use, and the node's monitor names its usage by these names."""

    namespace: str
    name: str
    uid: PodUid
    containers: HoldingContainers = ()
    """Init containers first, then app containers, as the allocation annotation lists
    them; empty from a daemon that predates them."""
    mig_allocations: AnnotationValue = ""
    """The pod's ``hami.io/vgpu-mig-allocations``: the MIG instances it holds, which the
    node keeps while the pod holds them (empty: none)."""


HoldingPods = Annotated[list[HoldingPod], msgspec.Meta(max_length=PENDING_PODS_MAX)]


class PendingAllocations(msgspec.Struct, frozen=True, kw_only=True):
    """The daemon's answer to an allocations request: the pods bound to ``node`` whose
    ``hami.io/bind-phase`` is ``allocating``, oldest ``bind_time`` first, and every pod
    holding cards on ``node``."""

    node: str
    pods: PendingPods
    holding: HoldingPods | None = None
    """Every pod bound to ``node`` that holds cards, whatever its bind-phase: the device
    plugin keeps their HAMi-core folders and sweeps the others'. None from a daemon that
    predates it (nothing is swept then: an empty list would sweep every folder)."""


class MigRuntime(msgspec.Struct, frozen=True, kw_only=True):
    """The MIG instance the node made for one reservation of a pod: the entry of
    ``hami.io/vgpu-mig-allocations`` it belongs to and the instance's runtime identity."""

    container_index: Annotated[int, msgspec.Meta(ge=0, le=PENDING_CONTAINERS_MAX)]
    device_index: Annotated[int, msgspec.Meta(ge=0, le=CARDS_PER_NODE_MAX * 8)]
    mig_uuid: Annotated[str, msgspec.Meta(min_length=1, max_length=128,
                                          pattern=f"^[{UUID_CHARACTERS}]+$")]
    gpu_instance_id: Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
    compute_instance_id: Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]


class AllocationOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How the kubelet's Allocate went for one pod: its bind-phase becomes ``success``,
    or ``failed`` with ``reason``; with ``success``, the MIG instances made for it."""

    namespace: str
    name: str
    uid: PodUid
    ok: bool
    reason: Detail = ""
    mig_instances: Annotated[tuple[MigRuntime, ...],
                             msgspec.Meta(max_length=CARDS_PER_NODE_MAX * 8)] = ()


class _Envelope(msgspec.Struct):
    schema: int


_encoder = msgspec.msgpack.Encoder()
_inventory_decoder = msgspec.msgpack.Decoder(Inventory)
_envelope_decoder = msgspec.msgpack.Decoder(_Envelope)
_resync_decoder = msgspec.msgpack.Decoder(ResyncRequest)
_pending_decoder = msgspec.msgpack.Decoder(PendingAllocations)
_outcome_decoder = msgspec.msgpack.Decoder(AllocationOutcome)


def encode(message: Inventory | ResyncRequest | PendingAllocations
           | AllocationOutcome) -> bytes:
    return _encoder.encode(message)


def decode_inventory(data: bytes, subject: str | None = None) -> Inventory:
    """Raises ``WireError`` for a malformed message or another schema version.

    Every field is checked within its bounds, the node's name must be a valid
    one, and, given the ``subject`` the message came on, the node it names.
    """
    try:
        inventory = _inventory_decoder.decode(data)
    except msgspec.DecodeError as error:
        try:
            schema = _envelope_decoder.decode(data).schema
        except msgspec.DecodeError:
            raise WireError(f"malformed inventory message: {error}") from None
        if schema != SCHEMA_VERSION:
            raise _schema_error(schema) from None
        raise WireError(f"malformed inventory message: {error}") from None
    if inventory.schema != SCHEMA_VERSION:
        raise _schema_error(inventory.schema)
    refusal = _uuid_refusal(inventory.cards)
    if refusal is None and inventory.measured is not None:
        refusal = _measured_refusal(inventory.measured)
    if refusal is not None:
        raise WireError(f"malformed inventory message: {refusal}")
    try:
        check_subdomain("node", inventory.node)
    except InvalidName as error:
        raise WireError(f"inventory refused: {error}") from None
    if subject is not None and subject_node(subject) != inventory.node:
        raise WrongSubject(f"inventory refused: node {inventory.node!r} arrived on subject "
                           f"{shown(subject)}, which is another node's")
    repeated = repeated_card(inventory.cards)
    if repeated is not None:
        raise WireError(f"inventory refused: node {inventory.node!r}: {repeated}")
    return inventory


def _uuid_refusal(cards: list[ReportedCard]) -> str | None:
    """What ``Uuid``'s pattern would say of the first card whose UUID breaks it, or None."""
    if _UUID_STRING.fullmatch("".join([card.uuid for card in cards])):
        return None
    position = next(position for position, card in enumerate(cards)
                    if not _UUID_STRING.fullmatch(card.uuid))
    return f"Expected `str` matching regex '{UUID_PATTERN}' - at `$.cards[{position}].uuid`"


def _measured_refusal(measured: Measured) -> str | None:
    """Why ``measured`` cannot be used: a card UUID ``Uuid``'s pattern refuses, or a
    container entry or card listed twice; None when it can."""
    uuids = [card.uuid for card in measured.cards]
    uuids += [entry.device_uuid for entry in measured.containers]
    if not _UUID_STRING.fullmatch("".join(uuids)):
        position = next(position for position, uuid in enumerate(uuids)
                        if not _UUID_STRING.fullmatch(uuid))
        where = (f"cards[{position}].uuid" if position < len(measured.cards)
                 else f"containers[{position - len(measured.cards)}].device_uuid")
        return f"Expected `str` matching regex '{UUID_PATTERN}' - at `$.measured.{where}`"
    if len(set(uuids[:len(measured.cards)])) != len(measured.cards):
        return "`$.measured.cards` lists a card twice"
    keys = {(entry.pod_uid, entry.container, entry.device_uuid)
            for entry in measured.containers}
    if len(keys) != len(measured.containers):
        return "`$.measured.containers` lists a container's card twice"
    return None


def decode_resync(data: bytes) -> ResyncRequest:
    """An empty body is a request to every agent. Raises ``WireError`` when malformed."""
    if not data:
        return ResyncRequest()
    try:
        return _resync_decoder.decode(data)
    except msgspec.DecodeError as error:
        raise WireError(f"malformed resync request: {error}") from None


def _schema_error(schema: int) -> WireError:
    return WireError(f"inventory schema version {schema} is not supported "
                     f"(this build reads version {SCHEMA_VERSION})")


def subject_node_checked(subject: str, prefix: str) -> str:
    """The node named by ``subject`` under ``prefix``; raises ``WireError`` when the subject
    is not under it or names no valid node."""
    if not subject.startswith(f"{prefix}."):
        raise WireError(f"subject {shown(subject)} is not under {prefix}")
    try:
        return _checked_node(subject_node(subject, prefix))
    except WireError as error:
        raise WireError(f"subject {shown(subject)}: {error}") from None


def decode_pending(data: bytes) -> PendingAllocations:
    """Raises ``WireError`` for a malformed answer or one naming an invalid node or pod."""
    try:
        pending = _pending_decoder.decode(data)
    except msgspec.DecodeError as error:
        raise WireError(f"malformed pending allocations: {error}") from None
    _checked_node(pending.node)
    for pod in [*pending.pods, *(pending.holding or ())]:
        _check_pod_names(pod.namespace, pod.name, "pending allocations")
    return pending


def decode_outcome(data: bytes) -> AllocationOutcome:
    """Raises ``WireError`` for a malformed outcome or one naming an invalid pod."""
    try:
        outcome = _outcome_decoder.decode(data)
    except msgspec.DecodeError as error:
        raise WireError(f"malformed allocation outcome: {error}") from None
    _check_pod_names(outcome.namespace, outcome.name, "allocation outcome")
    return outcome


def _checked_node(node: str) -> str:
    try:
        check_subdomain("node", node)
    except InvalidName as error:
        raise WireError(str(error)) from None
    return node


def _check_pod_names(namespace: str, name: str, what: str) -> None:
    try:
        check_label("namespace", namespace)
        check_subdomain("name", name)
    except InvalidName as error:
        raise WireError(f"{what} refused: {error}") from None
