"""Reason names, as HAMi reports them, and the node reason string."""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum


class CardCheck(IntEnum):
    """Per-card checks in the order they run; the first failing one is the card's reason."""

    ELIGIBLE = 0
    NOT_HEALTHY = 1
    CORDONED = 2
    TYPE_MISMATCH = 3
    UUID_MISMATCH = 4
    SLOTS_EXHAUSTED = 5
    MUTEX_BUSY = 6
    INSUFFICIENT_MEMORY = 7
    INSUFFICIENT_CORE = 8
    WHOLE_CARD_BUSY = 9
    COMPUTE_EXHAUSTED = 10


CARD_REASON: dict[CardCheck, str] = {
    CardCheck.NOT_HEALTHY: "CardNotHealth",
    CardCheck.CORDONED: "CardCordoned",
    CardCheck.TYPE_MISMATCH: "CardTypeMismatch",
    CardCheck.UUID_MISMATCH: "CardUuidMismatch",
    CardCheck.SLOTS_EXHAUSTED: "CardTimeSlicingExhausted",
    CardCheck.MUTEX_BUSY: "ExclusiveDeviceAllocateConflict",
    CardCheck.INSUFFICIENT_MEMORY: "CardInsufficientMemory",
    CardCheck.INSUFFICIENT_CORE: "CardInsufficientCore",
    CardCheck.WHOLE_CARD_BUSY: "ExclusiveDeviceAllocateConflict",
    CardCheck.COMPUTE_EXHAUSTED: "CardComputeUnitsExhausted",
}

CHECK_COUNT = len(CardCheck)

INSUFFICIENT_CARDS = "AllocatedCardsInsufficientRequest"
NUMA_NOT_FIT = "NumaNotFit"
TOPOLOGY_NOT_FIT = "TopologyNotFit"
TOPOLOGY_UNKNOWN = "TopologyUnknown"
NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"


def reason_string(counts: Mapping[str, int], cards: int) -> str:
    """``count/cards Reason`` for every reason with a non-zero count, sorted as strings."""
    return ", ".join(sorted(f"{n}/{cards} {name}" for name, n in counts.items() if n > 0))
