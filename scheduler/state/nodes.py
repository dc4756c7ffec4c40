"""The node registry: what the agents report of their nodes, kept in the fleet.

Each agent message replaces its node in the fleet (``NodeRegistry.ingest``), after the
checks that keep a replayed, forged or conflicting message out: the agent instance's
sequence, and the cards another live node reports. The registry also knows when each
node was last heard (stale nodes take no new pods; silent ones are forgotten), the
cordons the cluster's node annotations add, and which node names a decision may use.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import msgspec

from common.core import Fleet, Node, NodeRefusal, Usage
from common.core.annotations import CORDON_ANNOTATION, cordoned_uuids
from common.wire import Inventory, Measured

NODE_UNKNOWN = "NodeUnknown"
NODE_STALE = "NodeInventoryStale"
NO_INVENTORY = NodeRefusal(NODE_UNKNOWN, "pyhami has no GPU inventory for this node")
"""Why a node no agent has reported takes no pod."""

# How far ahead of its last accepted message an agent instance's next one may run. An
# agent adds one per message, so a gap is messages the daemon missed while connected (a
# slow consumer's backlog that nats-server dropped). Within --node-timeout (30 s), past
# which the node is stale and the bound is lifted, an agent at the default intervals sends
# at most six changes (5 s polls), three heartbeats and one answer per resync request: a
# thousand leaves room for a 30 ms poll and bursts of resyncs. A forged message further
# ahead would make the real agent's next messages look like replays, so it is refused;
# one within the bound holds the node for at most --node-timeout. What went by while the
# daemon itself was off the bus is forgiven (``NodeRegistry.forgive_gaps``).
SEQUENCE_GAP_MAX = 1000


@dataclass(slots=True)
class NodeClock:
    """The last message accepted from a node's agent: which instance, its sequence, when."""

    instance: str
    sequence: int
    heard: float


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What became of one agent message (``NodeRegistry.ingest``)."""

    accepted: bool
    conflict: str | None = None
    """Why the message was refused: it lists a card another live node reports."""
    vanished: dict[str, Usage] = field(default_factory=dict)
    """Cards that left the inventory while allocations still hold them."""
    changed: bool = False
    """The node is new, was stale, or its cards changed: pending pods may fit now."""
    back_after: float | None = None
    """Seconds of silence of a node that ``newly_stale`` had reported stale, now heard again."""
    too_far_ahead: str | None = None
    """Why the message was refused: its sequence runs more than ``SEQUENCE_GAP_MAX`` ahead
    of the agent's last one."""


def _uuids(node: Node) -> list[str]:
    return [device.uuid for device in node.cards]


class NodeRegistry:
    """The nodes the agents report, kept in ``fleet``: ingesting their messages, their
    freshness, the cluster's cordons, and forgetting a node."""

    def __init__(self, fleet: Fleet, *, node_timeout: float,
                 node_retention: float | None = None) -> None:
        self._fleet = fleet
        self._node_timeout = node_timeout
        self._node_retention = node_retention
        self._reported: dict[str, Node] = {}
        self._known: set[str] = set()
        # Bumped whenever ``_known`` changes (nodes come and are forgotten), for the cache.
        self._known_version = 0
        self._first_heard: dict[str, float] = {}
        self._stale: set[str] = set()
        self._last_asked: tuple[tuple[str, ...], frozenset[str]] = ((), frozenset())
        self._last_unknown: tuple[frozenset[str] | None, int, frozenset[str]] = (
            None, -1, frozenset())
        self._cluster_cordons: dict[str, frozenset[str]] = {}
        # Least recently heard first, so finding the stale nodes stops at the first fresh one.
        self._clocks: OrderedDict[str, NodeClock] = OrderedDict()
        # Nodes whose agent serves a device plugin -> whether HAMi-core enforces the slices.
        self._slices_enforced: dict[str, bool] = {}
        # Node -> the usage its agent measured last (the latest message that carried any).
        self._measured: dict[str, Measured] = {}
        # Card uuid -> the node that last reported it; checked against that node's report.
        self._card_node: dict[str, str] = {}
        # A node last heard at or before this moment may skip any number of sequences.
        self._gaps_forgiven_before = float("-inf")

    @property
    def known(self) -> AbstractSet[str]:
        """The names of the nodes an agent has reported, less those forgotten."""
        return self._known

    @property
    def slices_enforced(self) -> Mapping[str, bool]:
        """For each node whose agent serves a device plugin, whether HAMi-core enforces
        the memory slices."""
        return self._slices_enforced

    @property
    def measured(self) -> Mapping[str, Measured]:
        """For each node whose agent sends measured usage, the latest it sent."""
        return self._measured

    # Inventory ---------------------------------------------------------------

    def ingest(self, inventory: Inventory, now: float) -> IngestResult:
        """Apply one agent message.

        While the node is fresh, a message of the same agent instance must come after the
        last one (an older one is dropped) and at most ``SEQUENCE_GAP_MAX`` after it (a
        further jump is refused); a stale node's message is taken whatever its sequence.
        A message that lists a card another live node reports is refused."""
        clock = self._clocks.get(inventory.node)
        if clock is not None and clock.instance == inventory.instance and self._fresh(clock, now):
            if inventory.sequence <= clock.sequence:
                return IngestResult(accepted=False)
            gap = inventory.sequence - clock.sequence
            if gap > SEQUENCE_GAP_MAX and clock.heard > self._gaps_forgiven_before:
                return IngestResult(accepted=False, too_far_ahead=(
                    f"node {inventory.node!r}: sequence {inventory.sequence} of agent instance "
                    f"{inventory.instance!r} runs {gap} ahead of its last, {clock.sequence} "
                    f"(at most {SEQUENCE_GAP_MAX})"))
        conflict = self._claimed_elsewhere(inventory, now)
        if conflict is not None:
            return IngestResult(accepted=False, conflict=conflict)
        was_stale = clock is None or not self._fresh(clock, now)
        back_after = (now - clock.heard if clock is not None and inventory.node in self._stale
                      else None)
        self._clocks[inventory.node] = NodeClock(inventory.instance, inventory.sequence, now)
        self._clocks.move_to_end(inventory.node)
        self._stale.discard(inventory.node)
        if inventory.slices_enforced is None:
            self._slices_enforced.pop(inventory.node, None)
        else:
            self._slices_enforced[inventory.node] = inventory.slices_enforced
        if inventory.measured is None:
            self._measured.pop(inventory.node, None)
        else:
            self._measured[inventory.node] = inventory.measured
        if inventory.node not in self._known:
            self._known.add(inventory.node)
            self._known_version += 1
            self._first_heard[inventory.node] = now
        before = self._reported.get(inventory.node)
        self._reported[inventory.node] = reported = inventory.to_node()
        # Most messages list the cards of the node's previous one (a change of use, health
        # or processes): none can have left, and the card-to-node map needs no entry dropped.
        same_cards = before is not None and _uuids(before) == _uuids(reported)
        if same_cards:
            for device in reported.cards:
                self._card_node[device.uuid] = reported.name
        else:
            self._record_card_nodes(before, reported)
        node = self._with_cluster_cordons(reported)
        if not was_stale and node == self._fleet.node(node.name):
            return IngestResult(accepted=True)  # a heartbeat: nothing changed
        vanished = {} if same_cards else self._vanished(node)
        self._fleet.upsert_node(node)
        return IngestResult(accepted=True, vanished=vanished, changed=True, back_after=back_after)

    def forgive_gaps(self, now: float) -> None:
        """The daemon was off the bus and may have missed any number of messages: each node's
        next message may run any distance ahead of its last (never behind it)."""
        self._gaps_forgiven_before = now

    def _fresh(self, clock: NodeClock, now: float) -> bool:
        return now - clock.heard <= self._node_timeout

    def _claimed_elsewhere(self, inventory: Inventory, now: float) -> str | None:
        """A card of ``inventory`` that a live (not stale) other node reports, as a reason.

        ``_card_node`` names, for each card, the node whose latest report lists it."""
        for card in inventory.cards:
            holder = self._card_node.get(card.uuid)
            if holder is None or holder == inventory.node:
                continue
            clock = self._clocks.get(holder)
            if clock is not None and self._fresh(clock, now):
                return (f"node {inventory.node!r} lists card {card.uuid!r}, which live node "
                        f"{holder!r} reports")
        return None

    def _record_card_nodes(self, before: Node | None, reported: Node) -> None:
        self._drop_card_nodes(before)
        for device in reported.cards:
            self._card_node[device.uuid] = reported.name

    def _drop_card_nodes(self, node: Node | None) -> None:
        if node is None:
            return
        for device in node.cards:
            if self._card_node.get(device.uuid) == node.name:
                del self._card_node[device.uuid]

    def set_cluster_cordons(self, cordons: Mapping[str, frozenset[str]]) -> set[str]:
        """Cards cordoned by the nodes' annotations; returns the nodes whose set changed."""
        none: frozenset[str] = frozenset()
        changed = {name for name in set(cordons) | set(self._cluster_cordons)
                   if cordons.get(name, none) != self._cluster_cordons.get(name, none)}
        self._cluster_cordons = {name: cards for name, cards in cordons.items() if cards}
        for name in changed:
            reported = self._reported.get(name)
            if reported is not None:
                self._fleet.upsert_node(self._with_cluster_cordons(reported))
        return changed

    def _with_cluster_cordons(self, node: Node) -> Node:
        """The agent's report with the node annotation's cordons added to its own."""
        extra = self._cluster_cordons.get(node.name)
        if not extra:
            return node
        cordoned = ",".join(sorted(cordoned_uuids(node.annotations) | extra))
        return msgspec.structs.replace(node, annotations={**node.annotations,
                                                          CORDON_ANNOTATION: cordoned})

    def _vanished(self, node: Node) -> dict[str, Usage]:
        before = self._fleet.node(node.name)
        if before is None:
            return {}
        now_present = {d.uuid for d in node.cards}
        gone = (d.uuid for d in before.cards if d.uuid not in now_present)
        return {uuid: usage for uuid in gone
                if (usage := self._fleet.usage(node.name, uuid)) != Usage()}

    # Freshness ---------------------------------------------------------------

    def silence(self, now: float) -> dict[str, float]:
        """Seconds since each node was last heard from."""
        return {name: now - clock.heard for name, clock in self._clocks.items()}

    def stale_nodes(self, now: float) -> dict[str, NodeRefusal]:
        """The nodes silent longer than ``node_timeout``, with why each takes no pod."""
        stale = {}
        for name, clock in self._clocks.items():
            quiet = now - clock.heard
            if quiet <= self._node_timeout:
                break
            stale[name] = NodeRefusal(NODE_STALE, f"no inventory from the node's agent for "
                                                  f"{quiet:.0f}s (limit {self._node_timeout:g}s)")
        return stale

    def newly_stale(self, now: float) -> dict[str, NodeRefusal]:
        """The nodes that went stale since the last call, with why (to log each once)."""
        stale = self.stale_nodes(now)
        went_stale = {name: why for name, why in stale.items() if name not in self._stale}
        self._stale = set(stale)
        return went_stale

    def silent_beyond_retention(self, now: float) -> dict[str, float]:
        """Nodes silent longer than ``node_retention``, with their seconds of silence."""
        if self._node_retention is None:
            return {}
        silent = {}
        for name, clock in self._clocks.items():
            quiet = now - clock.heard
            if quiet <= self._node_retention:
                break
            silent[name] = quiet
        return silent

    def unlisted(self, listed: Collection[str], listed_since: float) -> list[str]:
        """Known nodes absent from a Node list requested at ``listed_since`` (a node first
        heard after that moment may be too new for the list)."""
        return sorted(name for name in self._known
                      if name not in listed and self._first_heard[name] < listed_since)

    def forget(self, name: str) -> None:
        """Drop a node entirely. Allocations on its cards stay in the ledger (their pods
        still hold them) and show as orphans; a node that comes back starts afresh."""
        self._fleet.remove_node(name)
        self._drop_card_nodes(self._reported.pop(name, None))
        self._clocks.pop(name, None)
        self._slices_enforced.pop(name, None)
        self._measured.pop(name, None)
        self._first_heard.pop(name, None)
        self._stale.discard(name)
        if name in self._known:
            self._known.discard(name)
            self._known_version += 1

    # The nodes a decision is asked about ----------------------------------------

    def asked(self, node_names: Collection[str] | None) -> frozenset[str]:
        """The node names as a set (None: every known node); kube-scheduler sends the same
        list call after call, so the last one is kept rather than hashed again (a tuple,
        unchangeable, is known again by its identity: ``ExtenderArgsDecoder`` gives the
        same one again)."""
        if node_names is None:
            return frozenset(self._known)
        names = tuple(node_names)  # a tuple itself, not a copy
        if names is not self._last_asked[0] and names != self._last_asked[0]:
            self._last_asked = (names, frozenset(names))
        return self._last_asked[1]

    def unknown(self, asked: frozenset[str]) -> frozenset[str]:
        """The names in ``asked`` no agent has reported; kept for the same set until a node
        comes or is forgotten."""
        if (self._last_unknown[0] is not asked
                or self._last_unknown[1] != self._known_version):
            self._last_unknown = (asked, self._known_version, frozenset(asked - self._known))
        return self._last_unknown[2]
