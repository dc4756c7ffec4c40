"""The cache: which pods hold which cards in the fleet, and the decisions that book them.

A decision (``SchedulingCache.filter``) reserves the cards it chose at once, in the same
synchronous call: a reservation holds them until the pod's bind confirms it (the pod is
then bound, part of the ledger until it ends) or until it expires. In kube-scheduler's
words, ``filter`` runs a scheduling cycle and its Reserve, ``release_reservation`` is the
Unreserve of a bind that failed, and ``confirm`` the end of a bind that succeeded.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace

from common.core import Allocation, Decision, FailedNode, Fleet, NodeRefusal, PodRequest, decide
from common.core.fiterror import fit_error_message
from common.core.groups import (
    GroupPlacement,
    PlacementSteps,
    idle_placement_steps,
    placement_steps,
)
from scheduler.state.nodes import NO_INVENTORY, NodeRegistry

POD_BOUND = "PodAlreadyBound"


@dataclass(slots=True)
class _Reservation:
    """Cards held for a pod until ``expires``, unless its bind confirms them first."""

    allocation: Allocation
    expires: float


class SchedulingCache:
    """The pods' cache in ``fleet``: reservations made by ``filter`` and not yet
    confirmed by a bind, and the bound pods' allocations (the ledger). Decisions are
    made among the nodes of ``nodes`` that are known and fresh."""

    def __init__(self, fleet: Fleet, nodes: NodeRegistry, *, reservation_ttl: float) -> None:
        self._fleet = fleet
        self._nodes = nodes
        self._reservation_ttl = reservation_ttl
        self._reservations: dict[str, _Reservation] = {}
        self._bound: set[str] = set()

    @property
    def reservation_ttl(self) -> float:
        """How long a reservation waits for its bind before it expires."""
        return self._reservation_ttl

    @property
    def bound(self) -> AbstractSet[str]:
        """The keys of the bound pods whose cards are in the ledger."""
        return self._bound

    @property
    def reservation_count(self) -> int:
        """How many reservations wait for their bind."""
        return len(self._reservations)

    def reservations(self) -> Iterator[tuple[str, Allocation, float]]:
        """Each reservation no bind has confirmed yet: the pod's key, the cards reserved,
        and when the reservation expires (``reservation_ttl`` after it was made)."""
        for key, held in self._reservations.items():
            yield key, held.allocation, held.expires

    def reservation(self, key: str) -> Allocation | None:
        """The cards reserved for the pod, while no bind has confirmed them."""
        held = self._reservations.get(key)
        return held.allocation if held is not None else None

    # Decisions ---------------------------------------------------------------

    def filter(self, request: PodRequest, node_names: Collection[str] | None, now: float,
               *, explain_chosen: bool = False) -> Decision:
        """Decide among the fresh known nodes and reserve the cards chosen.

        Nodes that are unknown or stale get a reason of their own in ``failures``.
        A pod already bound is not decided again: it keeps its cards, on its node.
        """
        held = self._fleet.allocation(request.key) if request.key in self._bound else None
        if held is not None:
            return self._bound_decision(request, held, node_names)
        self.release_reservation(request.key)
        decision = self.preview(request, node_names, now, explain_chosen=explain_chosen,
                                describe=True)
        if decision.allocation is not None:
            self._fleet.allocate(request.key, decision.allocation)
            self._reservations[request.key] = _Reservation(decision.allocation,
                                                           now + self._reservation_ttl)
        return decision

    def _bound_decision(self, request: PodRequest, held: Allocation,
                        node_names: Collection[str] | None) -> Decision:
        asked = self._nodes.asked(node_names)
        bound = NodeRefusal(POD_BOUND, f"the pod already holds cards on node {held.node}")
        failed: dict[str, FailedNode] = {name: bound for name in asked if name != held.node}
        if held.node not in asked:
            return Decision(pod=request.key, scheduled=False, failures=failed,
                            message=fit_error_message(self._fleet, request, failed))
        return Decision(pod=request.key, scheduled=True, node=held.node, allocation=held,
                        failures=failed)

    def preview(self, request: PodRequest, node_names: Collection[str] | None, now: float,
                *, explain: bool = False, explain_chosen: bool = False,
                describe: bool = False, holding_nothing: bool = False) -> Decision:
        """The decision among the fresh known nodes, booking nothing; with ``describe``,
        a pod placed nowhere gets its sentence (``Decision.message``); with
        ``holding_nothing``, as if the pod held no cards, the ledger left as it is."""
        fleet = self._fleet.without(request.key) if holding_nothing else self._fleet
        failed, usable = self._usable(node_names, now)
        decision = decide(fleet, request, nodes=usable,
                          explain=explain, explain_chosen=explain_chosen,
                          describe=describe and not failed)
        if failed and decision.failures is not None:
            failures = {**failed, **decision.failures}
            message = decision.message
            if describe and not decision.scheduled:
                message = fit_error_message(fleet, request, failures)
            return replace(decision, failures=failures, message=message)
        return decision

    @property
    def fleet_changes(self) -> int:
        """``Fleet.changes``: equal twice, a group's placement would be found again."""
        return self._fleet.changes

    def group_steps(self, group: str, members: Sequence[PodRequest],
                    node_names: Collection[str] | None, now: float
                    ) -> tuple[PlacementSteps, int]:
        """The steps that place every member of ``group`` at once among the fresh known
        nodes, on a copy of the fleet (the reservations the members held before are
        released first), and the fleet's generation, which ``reserve_group`` needs."""
        for member in members:
            self.release_reservation(member.key)
        _, usable = self._usable(node_names, now)
        return placement_steps(self._fleet, group, members, nodes=usable), \
            self._fleet.generation

    def idle_group_steps(self, group: str, members: Sequence[PodRequest],
                         node_names: Collection[str] | None, now: float) -> PlacementSteps:
        """The steps that place ``group`` among the fresh known nodes as if no pod held any
        card: whether it could start on what exists."""
        _, usable = self._usable(node_names, now)
        return idle_placement_steps(self._fleet, group, members, nodes=usable)

    def reserve_group(self, placement: GroupPlacement, generation: int, now: float,
                      ttl: float) -> bool:
        """Reserve the cards of a placed group together until ``now + ttl``, if the fleet
        is still at the ``generation`` the placement was tried on (nothing booked, no node's
        cards changed since: the trial may no longer fit otherwise); False, nothing
        reserved, if it is not."""
        if not placement.placed or self._fleet.generation != generation:
            return False
        for decision in placement.decisions:
            if decision.allocation is not None:
                self._fleet.allocate(decision.pod, decision.allocation)
                self._reservations[decision.pod] = _Reservation(decision.allocation, now + ttl)
        return True

    def _usable(self, node_names: Collection[str] | None, now: float
                ) -> tuple[dict[str, FailedNode], AbstractSet[str] | None]:
        """The nodes asked that are unknown or stale, each with its reason, and those left
        to decide among (None: every known node, the usual case, no subset to pick out)."""
        nodes = self._nodes
        stale = nodes.stale_nodes(now)
        asked = nodes.asked(node_names)
        usable: AbstractSet[str] = asked
        failed: dict[str, FailedNode] = {name: stale[name] for name in asked.intersection(stale)}
        if failed:
            usable = asked - failed.keys()
        unknown = nodes.unknown(asked) if usable is asked else usable - nodes.known
        if unknown:
            failed.update(dict.fromkeys(unknown, NO_INVENTORY))
            usable = usable - unknown
        everything = not failed and len(usable) == len(nodes.known)
        return failed, None if everything else usable

    # Reservations and the ledger -----------------------------------------------

    def confirm(self, key: str, allocation: Allocation) -> None:
        """The pod is bound with ``allocation``: it is part of the ledger for good, booked
        again should its reservation have expired while the bind was under way."""
        self._reservations.pop(key, None)
        if self._fleet.allocation(key) is not allocation:
            self._fleet.allocate(key, allocation)
        self._bound.add(key)

    def release_reservation(self, key: str) -> Allocation | None:
        """Free the cards reserved for the pod, if a reservation holds them (a bound pod's
        stay booked)."""
        held = self._reservations.pop(key, None)
        if held is None:
            return None
        self._fleet.release(key)
        return held.allocation

    def hand_over(self, placeholder: str, key: str, now: float) -> Allocation | None:
        """The cards reserved under ``placeholder`` (a Kueue workload's pod before it
        existed) reserved for the pod ``key`` instead, until its bind confirms them or
        ``reservation_ttl`` passes; None, nothing changed, if none are reserved there."""
        held = self._reservations.pop(placeholder, None)
        if held is None:
            return None
        self._fleet.release(placeholder)
        self.release_reservation(key)
        self._fleet.allocate(key, held.allocation)
        self._reservations[key] = _Reservation(held.allocation, now + self._reservation_ttl)
        return held.allocation

    def release(self, key: str) -> Allocation | None:
        """The pod is gone (deleted, Failed or Succeeded): free whatever it held."""
        self._reservations.pop(key, None)
        self._bound.discard(key)
        return self._fleet.release(key)

    def expire(self, now: float) -> dict[str, Allocation]:
        """Release reservations that no bind confirmed in time."""
        late = [key for key, held in self._reservations.items() if held.expires <= now]
        return {key: allocation for key in late
                if (allocation := self.release_reservation(key)) is not None}

    def drop_reservations(self) -> dict[str, Allocation]:
        """Release every reservation (a standby's bind will never confirm them)."""
        return {key: allocation for key in list(self._reservations)
                if (allocation := self.release_reservation(key)) is not None}

    def replace_ledger(self, entries: Iterable[tuple[str, Allocation]]) -> None:
        """Forget every booking, then restore these (the ledger read afresh)."""
        for key in list(self._fleet.allocations()):
            self._fleet.release(key)
        self._reservations.clear()
        self._bound.clear()
        self.restore(entries)

    def restore(self, entries: Iterable[tuple[str, Allocation]]) -> None:
        """Rebuild the ledger from the pods' allocation annotations."""
        for key, allocation in entries:
            self._fleet.allocate(key, allocation)
            self._bound.add(key)
