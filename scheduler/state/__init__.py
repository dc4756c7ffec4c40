"""The daemon's live state: nodes from the agents, the ledger, and pending reservations.

Everything here is synchronous and takes the time as an argument, so one
decision and its reservation happen without any await in between: concurrent
requests on the event loop can never book the same capacity twice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace

import msgspec

from common.core import (
    Allocation,
    Decision,
    FailedNode,
    Fleet,
    Node,
    NodeRefusal,
    PodRequest,
    Usage,
    decide,
)
from common.core.annotations import CORDON_ANNOTATION, cordoned_uuids
from common.core.refusal import refusal_message
from common.wire import Inventory

NODE_UNKNOWN = "NodeUnknown"
NODE_STALE = "NodeInventoryStale"
POD_BOUND = "PodAlreadyBound"
_NO_INVENTORY = NodeRefusal(NODE_UNKNOWN, "pyhami has no GPU inventory for this node")

# How far ahead of its last accepted message an agent instance's next one may run. An
# agent adds one per message, so a gap is messages the daemon missed while connected (a
# slow consumer's backlog that nats-server dropped). Within --node-timeout (30 s), past
# which the node is stale and the bound is lifted, an agent at the default intervals sends
# at most six changes (5 s polls), three heartbeats and one answer per resync request: a
# thousand leaves room for a 30 ms poll and bursts of resyncs. A forged message further
# ahead would make the real agent's next messages look like replays, so it is refused;
# one within the bound holds the node for at most --node-timeout. What went by while the
# daemon itself was off the bus is forgiven (``LiveState.forgive_gaps``).
SEQUENCE_GAP_MAX = 1000


@dataclass(slots=True)
class Reservation:
    allocation: Allocation
    expires: float


@dataclass(slots=True)
class NodeClock:
    instance: str
    sequence: int
    heard: float


@dataclass(frozen=True, slots=True)
class IngestResult:
    accepted: bool
    conflict: str | None = None
    """Why the message was refused: it lists a card another live node reports."""
    vanished: dict[str, Usage] = field(default_factory=dict)
    """Cards that left the inventory while allocations still hold them."""
    news: bool = False
    """The node is new, was stale, or its cards changed: pending pods may fit now."""
    back_after: float | None = None
    """Seconds of silence of a node that ``newly_stale`` had reported stale, now heard again."""
    jump: str | None = None
    """Why the message was refused: its sequence runs more than ``SEQUENCE_GAP_MAX`` ahead
    of the agent's last one."""


def _uuids(node: Node) -> list[str]:
    return [device.uuid for device in node.devices]


class LiveState:
    def __init__(self, *, node_timeout: float, reservation_ttl: float,
                 node_retention: float | None = None) -> None:
        self.fleet = Fleet()
        self.node_timeout = node_timeout
        self.reservation_ttl = reservation_ttl
        self.node_retention = node_retention
        self.reservations: dict[str, Reservation] = {}
        self.bound: set[str] = set()
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
        self.slices_enforced: dict[str, bool] = {}
        # Card uuid -> the node that last reported it; checked against that node's report.
        self._card_node: dict[str, str] = {}
        # A node last heard at or before this moment may skip any number of sequences.
        self._gaps_forgiven_before = float("-inf")

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
                return IngestResult(accepted=False, jump=(
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
            self.slices_enforced.pop(inventory.node, None)
        else:
            self.slices_enforced[inventory.node] = inventory.slices_enforced
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
            for device in reported.devices:
                self._card_node[device.uuid] = reported.name
        else:
            self._record_card_nodes(before, reported)
        node = self._with_cluster_cordons(reported)
        if not was_stale and node == self.fleet.node(node.name):
            return IngestResult(accepted=True)  # a heartbeat: nothing changed
        vanished = {} if same_cards else self._vanished(node)
        self.fleet.upsert_node(node)
        return IngestResult(accepted=True, vanished=vanished, news=True, back_after=back_after)

    def forgive_gaps(self, now: float) -> None:
        """The daemon was off the bus and may have missed any number of messages: each node's
        next message may run any distance ahead of its last (never behind it)."""
        self._gaps_forgiven_before = now

    def _fresh(self, clock: NodeClock, now: float) -> bool:
        return now - clock.heard <= self.node_timeout

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
        for device in reported.devices:
            self._card_node[device.uuid] = reported.name

    def _drop_card_nodes(self, node: Node | None) -> None:
        if node is None:
            return
        for device in node.devices:
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
                self.fleet.upsert_node(self._with_cluster_cordons(reported))
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
        before = self.fleet.node(node.name)
        if before is None:
            return {}
        now_present = {d.uuid for d in node.devices}
        gone = (d.uuid for d in before.devices if d.uuid not in now_present)
        return {uuid: usage for uuid in gone
                if (usage := self.fleet.usage(node.name, uuid)) != Usage()}

    def silence(self, now: float) -> dict[str, float]:
        """Seconds since each node was last heard from."""
        return {name: now - clock.heard for name, clock in self._clocks.items()}

    def stale_nodes(self, now: float) -> dict[str, NodeRefusal]:
        stale = {}
        for name, clock in self._clocks.items():
            quiet = now - clock.heard
            if quiet <= self.node_timeout:
                break
            stale[name] = NodeRefusal(NODE_STALE, f"no inventory from the node's agent for "
                                                  f"{quiet:.0f}s (limit {self.node_timeout:g}s)")
        return stale

    def newly_stale(self, now: float) -> dict[str, NodeRefusal]:
        """The nodes that went stale since the last call, with why (to log each once)."""
        stale = self.stale_nodes(now)
        went_stale = {name: why for name, why in stale.items() if name not in self._stale}
        self._stale = set(stale)
        return went_stale

    def silent_beyond_retention(self, now: float) -> dict[str, float]:
        """Nodes silent longer than ``node_retention``, with their seconds of silence."""
        if self.node_retention is None:
            return {}
        silent = {}
        for name, clock in self._clocks.items():
            quiet = now - clock.heard
            if quiet <= self.node_retention:
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
        self.fleet.remove_node(name)
        self._drop_card_nodes(self._reported.pop(name, None))
        self._clocks.pop(name, None)
        self.slices_enforced.pop(name, None)
        self._first_heard.pop(name, None)
        self._stale.discard(name)
        if name in self._known:
            self._known.discard(name)
            self._known_version += 1

    # Decisions ---------------------------------------------------------------

    def filter(self, request: PodRequest, node_names: Collection[str] | None, now: float,
               *, explain_chosen: bool = False) -> Decision:
        """Decide among the fresh known nodes and reserve the cards chosen.

        Nodes that are unknown or stale get a reason of their own in ``failures``.
        A pod already bound is not decided again: it keeps its cards, on its node.
        """
        held = self.fleet.allocation(request.key) if request.key in self.bound else None
        if held is not None:
            return self._bound_decision(request, held, node_names)
        self.release_reservation(request.key)
        decision = self.preview(request, node_names, now, explain_chosen=explain_chosen,
                                describe=True)
        if decision.allocation is not None:
            self.fleet.allocate(request.key, decision.allocation)
            self.reservations[request.key] = Reservation(decision.allocation,
                                                         now + self.reservation_ttl)
        return decision

    def _bound_decision(self, request: PodRequest, held: Allocation,
                        node_names: Collection[str] | None) -> Decision:
        asked = self._asked(node_names)
        bound = NodeRefusal(POD_BOUND, f"the pod already holds cards on node {held.node}")
        failed: dict[str, FailedNode] = {name: bound for name in asked if name != held.node}
        if held.node not in asked:
            return Decision(pod=request.key, scheduled=False, failures=failed,
                            message=refusal_message(self.fleet, request, failed))
        return Decision(pod=request.key, scheduled=True, node=held.node, allocation=held,
                        failures=failed)

    def preview(self, request: PodRequest, node_names: Collection[str] | None, now: float,
                *, explain: bool = False, explain_chosen: bool = False,
                describe: bool = False, holding_nothing: bool = False) -> Decision:
        """The decision among the fresh known nodes, booking nothing; with ``describe``,
        a pod placed nowhere gets its sentence (``Decision.message``); with
        ``holding_nothing``, as if the pod held no cards, the ledger left as it is."""
        fleet = self.fleet.without(request.key) if holding_nothing else self.fleet
        stale = self.stale_nodes(now)
        asked = self._asked(node_names)
        usable: AbstractSet[str] = asked
        failed: dict[str, FailedNode] = {name: stale[name] for name in asked.intersection(stale)}
        if failed:
            usable = asked - failed.keys()
        unknown = self._unknown(asked) if usable is asked else usable - self._known
        if unknown:
            failed.update(dict.fromkeys(unknown, _NO_INVENTORY))
            usable = usable - unknown
        # Every known node asked and fresh (the usual case): no subset to pick out.
        everything = not failed and len(usable) == len(self._known)
        decision = decide(fleet, request, nodes=None if everything else usable,
                          explain=explain, explain_chosen=explain_chosen,
                          describe=describe and not failed)
        if failed and decision.failures is not None:
            failures = {**failed, **decision.failures}
            message = decision.message
            if describe and not decision.scheduled:
                message = refusal_message(fleet, request, failures)
            return replace(decision, failures=failures, message=message)
        return decision

    def _asked(self, node_names: Collection[str] | None) -> frozenset[str]:
        """The node names as a set; kube-scheduler sends the same list call after call,
        so the last one is kept rather than hashed again (a tuple, unchangeable, is known
        again by its identity: ``ExtenderArgsDecoder`` gives the same one again)."""
        if node_names is None:
            return frozenset(self._known)
        names = tuple(node_names)  # a tuple itself, not a copy
        if names is not self._last_asked[0] and names != self._last_asked[0]:
            self._last_asked = (names, frozenset(names))
        return self._last_asked[1]

    def _unknown(self, asked: frozenset[str]) -> frozenset[str]:
        if (self._last_unknown[0] is not asked
                or self._last_unknown[1] != self._known_version):
            self._last_unknown = (asked, self._known_version, frozenset(asked - self._known))
        return self._last_unknown[2]

    def reservation(self, key: str) -> Allocation | None:
        held = self.reservations.get(key)
        return held.allocation if held is not None else None

    def confirm(self, key: str, allocation: Allocation) -> None:
        """The pod is bound with ``allocation``: it is part of the ledger for good, booked
        again should its reservation have expired while the bind was under way."""
        self.reservations.pop(key, None)
        if self.fleet.allocation(key) is not allocation:
            self.fleet.allocate(key, allocation)
        self.bound.add(key)

    def release_reservation(self, key: str) -> Allocation | None:
        held = self.reservations.pop(key, None)
        if held is None:
            return None
        self.fleet.release(key)
        return held.allocation

    def release(self, key: str) -> Allocation | None:
        """The pod is gone (deleted, Failed or Succeeded): free whatever it held."""
        self.reservations.pop(key, None)
        self.bound.discard(key)
        return self.fleet.release(key)

    def expire(self, now: float) -> dict[str, Allocation]:
        """Release reservations that no bind confirmed in time."""
        late = [key for key, held in self.reservations.items() if held.expires <= now]
        return {key: allocation for key in late
                if (allocation := self.release_reservation(key)) is not None}

    def drop_reservations(self) -> dict[str, Allocation]:
        """Release every reservation (a standby's bind will never confirm them)."""
        return {key: allocation for key in list(self.reservations)
                if (allocation := self.release_reservation(key)) is not None}

    def replace_ledger(self, entries: Iterable[tuple[str, Allocation]]) -> None:
        """Forget every booking, then restore these (the ledger read afresh)."""
        for key in list(self.fleet.allocations()):
            self.fleet.release(key)
        self.reservations.clear()
        self.bound.clear()
        self.restore(entries)

    def restore(self, entries: Iterable[tuple[str, Allocation]]) -> None:
        """Rebuild the ledger from the pods' allocation annotations."""
        for key, allocation in entries:
            self.fleet.allocate(key, allocation)
            self.bound.add(key)

