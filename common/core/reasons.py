"""Reason names, as HAMi reports them, and why a node fails a pod, kept as data.

A node's reasons stay structured (``NodeReasons``, ``NodeRefusal``) through the core and
the daemon; ``text`` writes them as HAMi does, at the edges that show them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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
    QUOTA_NOT_FIT = 7
    """The pod's charge on this card would exceed a ResourceQuota of its namespace."""
    INSUFFICIENT_MEMORY = 8
    INSUFFICIENT_CORE = 9
    WHOLE_CARD_BUSY = 10
    COMPUTE_EXHAUSTED = 11
    MIG_INFEASIBLE = 12
    """A MIG card with no allowed profile that covers the memory asked for and has a
    placement free of the card's instances."""


CARD_REASON: dict[CardCheck, str] = {
    CardCheck.NOT_HEALTHY: "CardNotHealth",
    CardCheck.CORDONED: "CardCordoned",
    CardCheck.TYPE_MISMATCH: "CardTypeMismatch",
    CardCheck.UUID_MISMATCH: "CardUuidMismatch",
    CardCheck.SLOTS_EXHAUSTED: "CardTimeSlicingExhausted",
    CardCheck.MUTEX_BUSY: "ExclusiveDeviceAllocateConflict",
    CardCheck.QUOTA_NOT_FIT: "ResourceQuotaNotFit",
    CardCheck.INSUFFICIENT_MEMORY: "CardInsufficientMemory",
    CardCheck.INSUFFICIENT_CORE: "CardInsufficientCore",
    CardCheck.WHOLE_CARD_BUSY: "ExclusiveDeviceAllocateConflict",
    CardCheck.COMPUTE_EXHAUSTED: "CardComputeUnitsExhausted",
    CardCheck.MIG_INFEASIBLE: "CardMigTopologyInfeasible",
}

CHECK_COUNT = len(CardCheck)
QUOTA_REASON = CARD_REASON[CardCheck.QUOTA_NOT_FIT]

INSUFFICIENT_CARDS = "AllocatedCardsInsufficientRequest"
NUMA_NOT_FIT = "NumaNotFit"
TOPOLOGY_NOT_FIT = "TopologyNotFit"
TOPOLOGY_SEARCH_LIMIT = "TopologyNotFit (search limit reached)"
"""The linked-set search ran out of steps (``common.core.linksets.SEARCH_STEPS``) before
finding a set or proving there is none: HAMi's reason with that said after it, as other
reasons' details are, so that ``TopologyNotFit`` still finds it."""
TOPOLOGY_UNKNOWN = "TopologyUnknown"
NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"


def reason_token(reason: str, count: int, cards: int) -> str:
    """``count/cards Reason``: HAMi's token for the cards of a node one reason removed."""
    return f"{count}/{cards} {reason}"


@dataclass(frozen=True, slots=True)
class NodeReasons:
    """Why the core refused one node: each reason with the cards it removed, out of the
    node's ``cards``, in the order HAMi writes them (by their tokens as strings)."""

    cards: int
    counts: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, counts: Mapping[str, int], cards: int) -> NodeReasons:
        """The reasons with a non-zero count. Ordering by (count as text, name) orders
        the tokens as strings: they differ only there, and '/' sorts before digits."""
        kept = sorted(((name, n) for name, n in counts.items() if n > 0),
                      key=lambda item: (str(item[1]), item[0]))
        return cls(cards, tuple(kept))

    def text(self, details: Mapping[str, str] | None = None) -> str:
        """``count/cards Reason, ...`` as HAMi's FailedNodes carries it; a reason with an
        entry in ``details`` is followed by it in parentheses."""
        tokens = [reason_token(name, n, self.cards) for name, n in self.counts]
        if details:
            tokens = [f"{token} ({details[name]})" if name in details else token
                      for token, (name, _) in zip(tokens, self.counts, strict=True)]
        return ", ".join(tokens)

    def removed(self) -> tuple[tuple[str, int], ...]:
        """Reason -> the cards it removed."""
        return self.counts


@dataclass(frozen=True, slots=True)
class NodeRefusal:
    """A node refused before the core judged its cards (no inventory, a stale one, ...)."""

    reason: str
    detail: str

    def text(self, details: Mapping[str, str] | None = None) -> str:
        """``Reason: detail``."""
        return f"{self.reason}: {self.detail}"

    def removed(self) -> tuple[tuple[str, int], ...]:
        """The refusal counts once, having judged no card."""
        return ((self.reason, 1),)


FailedNode = NodeReasons | NodeRefusal


def failed_node_texts(failures: Mapping[str, FailedNode],
                      details: Mapping[str, str] | None = None) -> dict[str, str]:
    """Node -> its reasons as HAMi writes them (``details``: words after some reasons).
    Nodes that fail the same way share one reasons object in a decision: each object is
    written once."""
    written: dict[int, str] = {}
    texts: dict[str, str] = {}
    for name, failure in failures.items():
        text = written.get(id(failure))
        if text is None:
            text = written[id(failure)] = failure.text(details)
        texts[name] = text
    return texts


def removed_most(failures: Iterable[FailedNode]) -> str | None:
    """The reason that removed the most cards over all the nodes (the first met on a tie),
    or None when no node failed."""
    removed: Counter[str] = Counter()
    for failure in failures:
        for reason, count in failure.removed():
            removed[reason] += count
    return removed.most_common(1)[0][0] if removed else None
