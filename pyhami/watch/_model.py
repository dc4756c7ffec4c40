"""What the telemetry has said so far: messages folded into nodes, cards and decisions.

Pure: no terminal, no NATS, no clock. A question that depends on the time
(how long ago a node was heard) takes the time as an argument.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from common.telemetry import CardUsage, DecisionEvent, UsageEvent
from common.wire import Inventory, MeasuredCard

# An agent silent for this many heartbeat intervals is shown as silent.
SILENT_HEARTBEATS = 3


class ListedCard(Protocol):
    """What the usage and the inventory streams both say about a card."""

    @property
    def uuid(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def type(self) -> str: ...
    @property
    def memory(self) -> int: ...
    @property
    def cores(self) -> int: ...
    @property
    def count(self) -> int: ...
    @property
    def health(self) -> bool: ...
    @property
    def physical_memory(self) -> int | None: ...
    @property
    def physical_cores(self) -> int | None: ...


@dataclass(frozen=True)
class CardView:
    uuid: str
    index: int
    type: str
    memory: int
    cores: int
    count: int
    health: bool
    health_detail: str = ""
    cordoned: bool = False
    physical_memory: int | None = None
    """The card's own MiB where ``memory`` is the registered, scaled figure; None: the
    same."""
    physical_cores: int | None = None
    """The card's own cores where ``cores`` is scaled; None: the same."""
    usage: CardUsage | None = None
    """The daemon's accounting; None until it publishes this node's usage."""
    measured: MeasuredCard | None = None
    """What the node's agent measured on the card; None until it sends a measurement."""

    @classmethod
    def listed(cls, card: ListedCard, health_detail: str, cordoned: bool,
               usage: CardUsage | None, measured: MeasuredCard | None) -> CardView:
        return cls(uuid=card.uuid, index=card.index, type=card.type, memory=card.memory,
                   cores=card.cores, count=card.count, health=card.health,
                   health_detail=health_detail, cordoned=cordoned,
                   physical_memory=card.physical_memory, physical_cores=card.physical_cores,
                   usage=usage, measured=measured)


@dataclass
class NodeView:
    name: str
    cards: dict[str, CardView] = field(default_factory=dict)
    heard_at: float | None = None
    """When the node's agent last published its inventory (the agent's clock)."""
    heartbeat_interval: float | None = None

    def heard_ago(self, now: float) -> float | None:
        if self.heard_at is None:
            return None
        return max(0.0, now - self.heard_at)  # agent clocks may run a little ahead of ours

    def is_silent(self, now: float) -> bool:
        ago, interval = self.heard_ago(now), self.heartbeat_interval
        return ago is not None and bool(interval) and ago > SILENT_HEARTBEATS * (interval or 0.0)


class WatchModel:
    """What the telemetry has said so far. Every usage or inventory message lists all of a
    node's cards, so the latest one sets the card list; each keeps what the other
    stream said about a card it still lists."""

    def __init__(self, decisions: int = 10, source: str = "") -> None:
        self.source = source
        self.connection = "connecting"
        self.connection_error: str | None = None
        self.nodes: dict[str, NodeView] = {}
        self.decisions: deque[DecisionEvent] = deque(maxlen=decisions)
        self.last_explained: DecisionEvent | None = None
        """The latest scheduled decision that carries its selection path."""
        self.decisions_seen = 0
        self.pending_seen = 0
        self.undecodable = 0
        self.heard_live = False
        """Whether a decision has been heard as it was made (not replayed)."""

    def _node(self, name: str) -> NodeView:
        return self.nodes.setdefault(name, NodeView(name))

    def apply_usage(self, event: UsageEvent) -> None:
        node = self._node(event.node)
        before = node.cards
        node.cards = {}
        for card in event.cards:
            known = before.get(card.uuid)
            node.cards[card.uuid] = CardView.listed(
                card, health_detail=known.health_detail if known else "",
                cordoned=known is not None and known.cordoned, usage=card,
                measured=known.measured if known else None)

    def apply_inventory(self, inventory: Inventory) -> None:
        node = self._node(inventory.node)
        node.heard_at = inventory.timestamp
        node.heartbeat_interval = inventory.heartbeat_interval
        before = node.cards
        node.cards = {}
        # Each inventory carries the agent's latest measurement, or none (usage not sent).
        measured = ({} if inventory.measured is None
                    else {figure.uuid: figure for figure in inventory.measured.cards})
        for card in inventory.cards:
            known = before.get(card.uuid)
            node.cards[card.uuid] = CardView.listed(
                card, health_detail=card.health_detail, cordoned=card.uuid in inventory.cordoned,
                usage=known.usage if known else None, measured=measured.get(card.uuid))

    def apply_decision(self, event: DecisionEvent) -> bool:
        """Fold a decision in; False for a replayed one left out: the daemon replays its
        recent decisions whenever a watcher connects, to every watcher. Replays are taken
        only before any decision is heard as it is made (after, this watcher heard them
        itself, or newer ones matter more), and each once."""
        if event.replayed:
            if self.heard_live or any(_same(event, held) for held in self.decisions):
                return False
        else:
            self.heard_live = True
        self.decisions.append(event)
        self.decisions_seen += 1
        if not event.scheduled:
            self.pending_seen += 1
        elif event.explain:
            self.last_explained = event
        return True

    def note_undecodable(self) -> None:
        self.undecodable += 1


def _same(one: DecisionEvent, other: DecisionEvent) -> bool:
    return (one.pod, one.verb, one.timestamp, one.decider) == (
        other.pod, other.verb, other.timestamp, other.decider)


def pending_reason(event: DecisionEvent) -> str:
    """Why a pod is pending, in one line: its own rejection, else the shortest node reason,
    the nearest miss to read first. The one place that reads the decision's reasons."""
    if event.reason:
        return event.reason
    if not event.failed_nodes:
        return "no node holds GPU cards"
    node, why = min(event.failed_nodes.items(), key=lambda item: (len(item[1]), item[0]))
    others = len(event.failed_nodes) - 1
    return f"{node}: {why}" + (f"; +{plural(others, 'node')}" if others else "")


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
