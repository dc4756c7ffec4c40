"""Declared data: cards, nodes and the ledger's pod records (the cluster file that lists
them is declared with its reader, ``common.core.cluster``).

These types are the one declaration of the shapes the core consumes; the agent's
wire messages and the daemon's state are converted into them.

The bounds on a card's fields are far beyond any real GPU, and keep every sum
the core computes (256 cards a node, 2^24 MiB a card, over any fleet) inside
int64 and every score finite: a decoded value outside them is refused with the
field's path, before it reaches a numpy array.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec

from common.core.mig import CardMode, MigProfiles

CARD_MEMORY_MAX_MIB = 2**24
"""16 TiB a card; the largest card sold holds under 2^19 MiB."""
CARD_COUNT_MAX = 2**16
"""Bound on a card's cores, tenant slots, processes, index, NUMA id and link weights."""
CARDS_PER_NODE_MAX = 256
"""A node holds at most 16 GPUs today; also the bound on a node's cordon list."""
LINKS_PER_CARD_MAX = 1024
"""NVLink peers a card may list (NVLink domains reach 576 GPUs)."""
UUID_MAX = 128
"""NVML UUIDs are 40 characters, MIG ones under 100."""
TYPE_MAX = 128
"""NVML's model name buffer is 96 bytes."""

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
SmallCount = Annotated[int, msgspec.Meta(ge=0, le=CARD_COUNT_MAX)]
NumaId = Annotated[int, msgspec.Meta(ge=-1, le=CARD_COUNT_MAX)]
MemoryMiB = Annotated[int, msgspec.Meta(ge=0, le=CARD_MEMORY_MAX_MIB)]
UUID_CHARACTERS = "A-Za-z0-9._/-"
"""A card UUID's characters, as the inside of a regex's character class: the allocation
annotation separates cards with ':' and fields with ','; a UUID holds neither."""
UUID_PATTERN = f"^[{UUID_CHARACTERS}]+$"
Uuid = Annotated[str, msgspec.Meta(min_length=1, max_length=UUID_MAX, pattern=UUID_PATTERN)]
CardType = Annotated[str, msgspec.Meta(max_length=TYPE_MAX)]
# A peer is only looked up among the node's cards: its length is bounded, not its alphabet.
PeerUuid = Annotated[str, msgspec.Meta(max_length=UUID_MAX)]
Links = Annotated[dict[PeerUuid, SmallCount], msgspec.Meta(max_length=LINKS_PER_CARD_MAX)]


class Card(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One physical GPU card as the scheduler sees it.

    ``memory`` and ``cores`` are the registered figures, the ones decisions use: the
    card's own times HAMi's ``deviceMemoryScaling`` and ``deviceCoreScaling``.
    ``links`` is ``None`` when the card's NVLink topology is unknown and ``{}``
    when the card has no NVLink peers.
    """

    uuid: Uuid
    index: SmallCount
    type: CardType
    memory: MemoryMiB
    cores: SmallCount = 100
    count: SmallCount = 10
    numa: NumaId = -1
    health: bool = True
    links: Links | None = None
    processes: SmallCount = 0
    """The tenants the node's agent sees on the card: a pod once, however many compute
    processes it runs there, and a process no pod owns once. The card's slots in use are
    these or its booked tenants, whichever are more (``fleet.occupied_slots``). Named for
    what it counted at first: the wire and cluster files keep the name."""
    physical_memory: MemoryMiB | None = None
    """The card's own MiB where ``memory`` registers another figure (HAMi's
    ``deviceMemoryScaling``, ``preConfiguredDeviceMemory``); None: ``memory`` is it."""
    physical_cores: SmallCount | None = None
    """The card's own cores (100) where ``cores`` registers another figure (HAMi's
    ``deviceCoreScaling``); None: ``cores`` is it."""
    mode: CardMode = "hami-core"
    """``hami-core``: shared under HAMi-core's limits; ``mig``: cut into MIG instances,
    one per card a container asks for, sized from ``mig_profiles``."""
    mig_profiles: MigProfiles = ()
    """The GPU-instance profiles the node allows on a card in MIG mode, with NVML's
    figures and placements; none on a card in ``hami-core`` mode."""

    @property
    def own_memory(self) -> int:
        """The card's own MiB, before any scaling: for reports, never for decisions."""
        return self.memory if self.physical_memory is None else self.physical_memory

    @property
    def own_cores(self) -> int:
        """The card's own cores, before any scaling: for reports, never for decisions."""
        return self.cores if self.physical_cores is None else self.physical_cores


NodeCards = Annotated[list[Card], msgspec.Meta(max_length=CARDS_PER_NODE_MAX)]


def repeated_card(devices: Sequence[Card]) -> str | None:
    """What is listed twice among one node's cards (a UUID or an index), or None.

    A card listed twice could be given twice to one pod.
    """
    uuids: set[str] = set()
    indexes: set[int] = set()
    for device in devices:
        if device.uuid in uuids:
            return f"card uuid {device.uuid!r} is listed twice"
        if device.index in indexes:
            return f"card index {device.index} is listed twice"
        uuids.add(device.uuid)
        indexes.add(device.index)
    return None


class Node(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    # "devices" on the wire: the cluster file's key since its first version.
    cards: NodeCards = msgspec.field(name="devices")
    annotations: dict[str, str] = {}


class PodRecord(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A pod that already holds cards, known from its allocation annotation.

    ``init_containers`` says how many leading containers of the annotation are
    init containers, whose cards count at their peak rather than summed. The last three
    fields are what a ResourceQuota's scopes match on: the pod's
    ``spec.priorityClassName``, its ``spec.activeDeadlineSeconds`` (set: the pod is
    ``Terminating``) and whether its QoS class is BestEffort.
    """

    namespace: str
    name: str
    node: str
    annotations: dict[str, str] = {}
    init_containers: NonNegative = 0
    priority_class_name: str = ""
    active_deadline_seconds: NonNegative | None = None
    best_effort: bool = False
