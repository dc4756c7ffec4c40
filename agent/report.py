"""What the agent has observed and published, and the messages it builds: no I/O, no clock."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from common.version import package_version
from common.wire import SCHEMA_VERSION, Inventory, Measured, Reason, ReportedCard


def describe_changes(before: Sequence[ReportedCard], after: Sequence[ReportedCard]) -> list[str]:
    """One line per card added, removed, or with a field that changed, for the log."""
    old = {card.uuid: card for card in before}
    new = {card.uuid: card for card in after}
    lines = [f"{uuid}: removed" for uuid in old if uuid not in new]
    for uuid, card in new.items():
        previous = old.get(uuid)
        if previous is None:
            lines.append(f"{uuid}: added")
            continue
        lines.extend(f"{uuid}: {field} {getattr(previous, field)!r} -> {getattr(card, field)!r}"
                     for field in ReportedCard.__struct_fields__
                     if getattr(previous, field) != getattr(card, field))
    return lines


class Report:
    """The agent's state between reads and publishes.

    A message is built from the latest observation; only once it is out does
    ``confirm`` make it the published state. Until then ``unpublished`` stays
    true, so a change that could not be sent is sent on a later try.
    """

    def __init__(self, node: str, instance: str, heartbeat_interval: float,
                 cordoned: Sequence[str] = (), version: str | None = None) -> None:
        self.node = node
        self.instance = instance
        self.heartbeat_interval = heartbeat_interval
        self.cordoned = list(cordoned)
        self.version = version if version is not None else package_version()
        self.sequence = 0
        self._observed: list[ReportedCard] = []
        self.slices_enforced: bool | None = None
        """Told by the device plugin, when the agent serves one."""
        self._published: list[ReportedCard] | None = None
        self._published_measured: Measured | None = None

    @property
    def cards(self) -> list[ReportedCard]:
        return list(self._observed)

    def observe(self, cards: Sequence[ReportedCard]) -> list[str]:
        """Record a read; returns what changed since the previous one."""
        changes = describe_changes(self._observed, cards)
        self._observed = list(cards)
        return changes

    def unknown_cordons(self) -> list[str]:
        """Cordoned UUIDs that name none of the observed cards (a typo, or another node's)."""
        present = {card.uuid for card in self._observed}
        return [uuid for uuid in self.cordoned if uuid not in present]

    @property
    def unpublished(self) -> bool:
        return self._published != self._observed

    def usage_changed(self, measured: Measured | None) -> bool:
        """Whether ``measured`` says anything the last published message did not (its
        moment aside): a message of usage alone is worth sending."""
        published = self._published_measured
        if measured is None or published is None:
            return measured is not published
        return msgspec.structs.replace(measured, at=published.at) != published

    def message(self, reason: Reason, timestamp: float,
                measured: Measured | None = None) -> Inventory:
        return Inventory(schema=SCHEMA_VERSION, node=self.node, agent_version=self.version,
                         instance=self.instance, sequence=self.sequence + 1,
                         timestamp=timestamp, reason=reason,
                         heartbeat_interval=self.heartbeat_interval,
                         cards=list(self._observed), cordoned=list(self.cordoned),
                         slices_enforced=self.slices_enforced, measured=measured)

    def confirm(self, message: Inventory) -> None:
        self.sequence = message.sequence
        self._published = list(message.cards)
        self._published_measured = message.measured
