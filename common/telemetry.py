"""Live telemetry the daemon publishes on NATS (msgpack), and ``pyhami watch`` reads.

- ``pyhami.decisions``: every filter decision, with the chosen node's selection path.
- ``pyhami.usage.<node>``: a node's card usage each time it changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import msgspec

from common.core import Decision, ExplainRow

SCHEMA_VERSION = 1
DECISIONS_SUBJECT = "pyhami.decisions"
USAGE_SUBJECT_PREFIX = "pyhami.usage"
USAGE_SUBJECTS = f"{USAGE_SUBJECT_PREFIX}.>"
# Who ``pyhami watch`` says it is in its resync request (``ResyncRequest.requested_by``):
# the leading daemon answers it with its recent decisions, replayed.
WATCH_CLIENT = "pyhami-watch"


def usage_subject(node: str) -> str:
    return f"{USAGE_SUBJECT_PREFIX}.{node}"


class ChosenCard(msgspec.Struct, frozen=True):
    uuid: str
    index: int
    usedmem: int
    usedcores: int


class DecisionEvent(msgspec.Struct, frozen=True, kw_only=True):
    schema: int = SCHEMA_VERSION
    pod: str
    verb: Literal["filter", "bind"]
    scheduled: bool
    node: str | None
    cards: list[list[ChosenCard]]
    failed_nodes: dict[str, str]
    ignored_policies: list[str]
    reason: str | None
    explain: list[ExplainRow]
    timestamp: float
    duration_ms: float
    decider: str = ""
    """The identity of the daemon that decided (``pyhami scheduler --identity``)."""
    term: int = 0
    """The decider's term of leadership, where terms are counted (standalone: the lease's
    revision when it took it, so later terms have larger numbers); 0 elsewhere."""
    replayed: bool = False
    """Sent again, for a watcher that just connected (``pyhami watch`` asks on connecting):
    a decision made before, which those listening then heard already."""

    @classmethod
    def of(cls, decision: Decision, verb: Literal["filter", "bind"], timestamp: float,
           duration_ms: float, *, decider: str = "", term: int = 0,
           failed_nodes: Mapping[str, str] | None = None) -> DecisionEvent:
        """``failed_nodes``: the decision's ``failed_nodes`` where the caller wrote them
        already (/filter's answer): written once, not again here."""
        if failed_nodes is None:
            failed_nodes = decision.failed_nodes or {}
        return cls(
            pod=decision.pod, verb=verb, scheduled=decision.node is not None,
            node=decision.node,
            cards=[[ChosenCard(c.uuid, c.index, c.memory, c.cores) for c in cards]
                   for cards in decision.cards],
            failed_nodes=dict(failed_nodes),
            ignored_policies=list(decision.ignored_policies), reason=decision.reason,
            explain=list(decision.explain or ()),
            timestamp=timestamp, duration_ms=duration_ms, decider=decider, term=term,
        )


class CardUsage(msgspec.Struct, frozen=True):
    """One card's booked usage beside its registered capacity (``memory``, ``cores``)."""

    uuid: str
    index: int
    type: str
    tenants: int
    used: int
    usedmem: int
    memory: int
    usedcores: int
    cores: int
    count: int
    health: bool
    physical_memory: int | None = None
    """The card's own MiB where ``memory`` is scaled (HAMi's ``deviceMemoryScaling``);
    None: ``memory`` is it. Absent from an older daemon's messages."""
    physical_cores: int | None = None
    """The card's own cores where ``cores`` is scaled (``deviceCoreScaling``); None:
    ``cores`` is it."""


class UsageEvent(msgspec.Struct, frozen=True, kw_only=True):
    schema: int = SCHEMA_VERSION
    node: str
    timestamp: float
    cards: list[CardUsage]


_encoder = msgspec.msgpack.Encoder()
_decision_decoder = msgspec.msgpack.Decoder(DecisionEvent)
_usage_decoder = msgspec.msgpack.Decoder(UsageEvent)


def encode(event: DecisionEvent | UsageEvent) -> bytes:
    return _encoder.encode(event)


def decode_decision(data: bytes) -> DecisionEvent:
    return _decision_decoder.decode(data)


def decode_usage(data: bytes) -> UsageEvent:
    return _usage_decoder.decode(data)
