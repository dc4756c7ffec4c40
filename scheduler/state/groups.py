"""The pod groups seen: their members, how many members each needs, and whether their
cards are held together.

A group's members arrive one by one (the pod watch, the pod API, /filter), and none is
given cards until the group counts as many members as it declares; then every member
still waiting is placed at once (``SchedulingCache.reserve_group``), or none. The cards of a
group placed together are held for ``ttl`` (kube-scheduler's Permit): a member whose bind
does not come in time has the whole group's reservations released, not its own alone.
Synchronous, the time an argument, as the rest of the state.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from common.core import PodManifest, PodRequest
from common.core.groups import GroupRef


@dataclass(slots=True)
class _Member:
    manifest: PodManifest
    request: PodRequest | None
    """None: the member asks for no GPU (counted; kube-scheduler places it alone)."""
    bound: bool
    count: int | None
    """The count the member itself declares (Kueue's annotation)."""


@dataclass(slots=True)
class _Group:
    ref: GroupRef
    count: int | None
    members: dict[str, _Member] = field(default_factory=dict)
    held_until: float | None = None
    """Set while the waiting members' cards are reserved together."""
    blocked_since: float | None = None
    """Set while the group is whole, its members do not fit, and they could on idle cards;
    moved to the end of a turn ahead, when the wait for the next turn starts."""
    priority: int = 0
    """Its waiting members' highest priority when it was last found not fitting."""
    claimed: frozenset[str] = frozenset()
    """The nodes its members that fit were placed on at its last try: while it goes ahead,
    pods of its priority or lower are not placed there."""
    turns: int = 0
    """Turns ahead it had since it last fitted: each doubles the wait before the next."""
    last_try: Tried | None = None


def _needs_cards(member: _Member) -> bool:
    """A member that asks for cards and holds none bound: one the group waits to place."""
    return member.request is not None and member.request.wants_gpu and not member.bound


@dataclass(frozen=True, slots=True)
class Waiting:
    """A member that needs cards and has none bound."""

    key: str
    manifest: PodManifest
    request: PodRequest


@dataclass(frozen=True, slots=True)
class Tried:
    """A try at placing a group that found no room: the same refusal is answered while
    nothing changed (``fleet_changes`` and the nodes offered) and for ``RETRY_AFTER``
    seconds whatever changed, so a group of a thousand members tried by each of them
    costs one placement, not a thousand."""

    at: float
    fleet_changes: int
    offered: frozenset[str] | None
    reason: str
    """``GroupDoesNotFit``, or ``GroupNeverFits`` when it would not fit on idle cards."""
    detail: str
    message: str


RETRY_AFTER = 1.0
"""Seconds a group's failed try is answered again even if cards changed meanwhile: the
members of a large group are tried one after the other, each would place all of them."""
TURN_WAIT_MAX = 3600.0
"""The longest wait for a turn ahead, however many turns a group had (Kueue's default
longest requeue backoff for a workload whose pods did not start)."""


@dataclass(frozen=True, slots=True)
class Starving:
    """A group whole and not fitting for longer than the daemon's patience, which could
    start on idle cards: pods of its priority or lower are not placed on the nodes it
    would use (``claimed``) until ``until`` (``--group-patience``, ``--group-turn``)."""

    ref: GroupRef
    priority: int
    since: float
    """When its turn ahead began."""
    until: float
    claimed: frozenset[str]


class Groups:
    """The groups by ``namespace/name``, and which group each member pod is in."""

    def __init__(self) -> None:
        self._groups: dict[str, _Group] = {}
        self._group_of: dict[str, str] = {}

    def note(self, ref: GroupRef, key: str, manifest: PodManifest,
             request: PodRequest | None, *, bound: bool) -> None:
        """A member as last seen (a pod moved to another group leaves its old one)."""
        previous = self._group_of.get(key)
        if previous is not None and previous != ref.key:
            self.forget(key)
        group = self._groups.get(ref.key)
        if group is None:
            group = self._groups[ref.key] = _Group(ref, ref.count)
        elif ref.count is not None:
            group.count = ref.count
        member = group.members.get(key)
        group.members[key] = _Member(manifest, request,
                                     bound or (member is not None and member.bound), ref.count)
        self._group_of[key] = ref.key

    def forget(self, key: str) -> GroupRef | None:
        """The member ended; the group it was in (forgotten with its last member)."""
        group_key = self._group_of.pop(key, None)
        if group_key is None:
            return None
        group = self._groups[group_key]
        group.members.pop(key, None)
        if not group.members:
            del self._groups[group_key]
        return group.ref

    def bound(self, key: str) -> None:
        """The member's bind succeeded."""
        group = self._of(key)
        if group is None:
            return
        group.members[key].bound = True
        if not self._waiting(group):
            group.held_until = None

    def group_of(self, key: str) -> GroupRef | None:
        group = self._of(key)
        return group.ref if group is not None else None

    def count(self, group_key: str) -> int | None:
        group = self._groups.get(group_key)
        return group.count if group is not None else None

    def set_count(self, group_key: str, count: int) -> None:
        """The member count read from the group's PodGroup object."""
        group = self._groups.get(group_key)
        if group is not None:
            group.count = count

    def disagreement(self, group_key: str) -> str | None:
        """Where the members declare different counts, which says what, in a phrase."""
        group = self._groups.get(group_key)
        if group is None:
            return None
        by_count: dict[int, list[str]] = {}
        for key, member in sorted(group.members.items()):
            if member.count is not None:
                by_count.setdefault(member.count, []).append(key.partition("/")[2])
        if len(by_count) < 2:
            return None
        return "; ".join(f"{count} by {', '.join(names[:3])}"
                         + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                         for count, names in sorted(by_count.items()))

    def elsewhere(self, group_key: str) -> int:
        """Members of groups of the same name in other namespaces (a group's members share
        one namespace, so those are groups of their own)."""
        namespace, _, name = group_key.partition("/")
        return sum(len(group.members) for key, group in self._groups.items()
                   if group.ref.name == name and group.ref.namespace != namespace)

    def seen(self, group_key: str) -> int:
        """How many members exist now."""
        group = self._groups.get(group_key)
        return len(group.members) if group is not None else 0

    def bound_members(self, group_key: str) -> int:
        group = self._groups.get(group_key)
        return sum(m.bound for m in group.members.values()) if group is not None else 0

    def waiting(self, group_key: str) -> list[Waiting]:
        """The members that need cards and have none bound, by key."""
        group = self._groups.get(group_key)
        return self._waiting(group) if group is not None else []

    def hold(self, group_key: str, until: float) -> None:
        """The waiting members' cards are reserved together until ``until``."""
        group = self._groups.get(group_key)
        if group is not None:
            group.held_until = until

    def held(self, group_key: str) -> bool:
        group = self._groups.get(group_key)
        return group is not None and group.held_until is not None

    def let_go(self, group_key: str) -> None:
        """The group's cards are no longer held together (released, or all bound)."""
        group = self._groups.get(group_key)
        if group is not None:
            group.held_until = None

    def blocked(self, group_key: str, now: float, priority: int,
                claimed: frozenset[str]) -> None:
        """The whole group did not fit, though it would on idle cards (its first try counts
        from then): ``claimed``, the nodes its fitting members were placed on."""
        group = self._groups.get(group_key)
        if group is None:
            return
        if group.blocked_since is None:
            group.blocked_since = now
        group.priority = priority
        group.claimed = claimed

    def never_fits(self, group_key: str) -> None:
        """The whole group would not fit even on idle cards: it never goes ahead."""
        group = self._groups.get(group_key)
        if group is not None:
            group.blocked_since = None
            group.claimed = frozenset()

    def unblocked(self, group_key: str) -> None:
        """The group fitted: its wait, turns and failed try are over."""
        group = self._groups.get(group_key)
        if group is not None:
            group.blocked_since = None
            group.claimed = frozenset()
            group.turns = 0
            group.last_try = None

    def tried(self, group_key: str, tried: Tried) -> None:
        group = self._groups.get(group_key)
        if group is not None:
            group.last_try = tried

    def last_try(self, group_key: str, now: float, fleet_changes: int,
                 offered: frozenset[str] | None) -> Tried | None:
        """The group's last failed try, if it still holds: nothing changed since, or it is
        younger than ``RETRY_AFTER``."""
        group = self._groups.get(group_key)
        tried = group.last_try if group is not None else None
        if tried is None:
            return None
        if now - tried.at < RETRY_AFTER or (tried.fleet_changes == fleet_changes
                                             and tried.offered == offered):
            return tried
        return None

    def starving(self, now: float, patience: float, turn: float) -> Starving | None:
        """The group ahead of every other pod now, if any: of the groups whole, not fitting
        and able to fit on idle cards, one whose wait is over and whose turn is not. A
        group's wait is ``patience`` doubled for each turn it had (at most
        ``TURN_WAIT_MAX``), its turn lasts ``turn``; a turn that ends starts the next wait.
        Of several, the highest priority (its members' highest), then the one blocked
        first, then by name."""
        found: list[Starving] = []
        for group in self._groups.values():
            since = group.blocked_since
            # Asked on every /filter: a group not blocked long enough costs one comparison.
            if since is None or now - since < patience:
                continue
            begins = since + min(patience * 2 ** group.turns, max(patience, TURN_WAIT_MAX))
            if now < begins:
                continue
            if now >= begins + turn:
                group.turns += 1
                group.blocked_since = now
                continue
            if not any(map(_needs_cards, group.members.values())):
                continue
            found.append(Starving(group.ref, group.priority, begins, begins + turn,
                                  group.claimed))
        return min(found, key=lambda group: (-group.priority, group.since, group.ref.key),
                   default=None)

    def overdue(self, now: float) -> Iterator[GroupRef]:
        """The groups whose cards were held together past their time."""
        for group in self._groups.values():
            if group.held_until is not None and group.held_until <= now:
                yield group.ref

    def _of(self, key: str) -> _Group | None:
        group_key = self._group_of.get(key)
        return self._groups.get(group_key) if group_key is not None else None

    @staticmethod
    def _waiting(group: _Group) -> list[Waiting]:
        return [Waiting(key, member.manifest, member.request)
                for key, member in sorted(group.members.items())
                if _needs_cards(member) and member.request is not None]
