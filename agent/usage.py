"""The measured usage the agent sends the daemon: the port it reads the monitor's latest
measurement through, and the conversion of the monitor's model to the wire's ``Measured``.

Pure: no I/O, no clock (the moment of the measurement is an argument)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from agent.monitor.model import ContainerUsage, HostCard
from common.core.model import CARD_MEMORY_MAX_MIB, CARDS_PER_NODE_MAX, UUID_CHARACTERS, UUID_MAX
from common.wire import (
    MEASURED_CONTAINERS_MAX,
    UTILIZATION_SUM_MAX,
    Measured,
    MeasuredCard,
    MeasuredContainer,
)

MIB = 1024 * 1024
# The wire's bounds on the names (``PodUid``, ``ContainerName``): an entry past them could
# not be sent, and would make the daemon refuse the whole inventory.
POD_UID_MAX = 128
CONTAINER_NAME_MAX = 253
_UUID = re.compile(f"[{UUID_CHARACTERS}]{{1,{UUID_MAX}}}")


class UsageSnapshot(Protocol):
    """The node monitor's latest measurement, kept in memory: reading it is cheap and never
    blocks (the agent reads it on its event loop, at every publish)."""

    def measured(self) -> Measured | None:
        """The latest measurement; None before the first, or where nothing is measured."""


def mebibytes(size: int) -> int:
    """Bytes as whole MiB, rounded down (a container is never said to use more than it
    does), within the wire's bound."""
    return min(max(size, 0) // MIB, CARD_MEMORY_MAX_MIB)


def measured_from(cards: Sequence[HostCard], containers: Sequence[ContainerUsage],
                  at: float, limit: int = MEASURED_CONTAINERS_MAX) -> Measured:
    """The monitor's model as the wire carries it: bytes in MiB, utilization within its
    bound, one entry per container and card.

    An entry whose pod uid, container name or card UUID no message may carry is left out;
    beyond ``limit`` entries, those using the least memory are; both are counted in
    ``dropped``."""
    measured_cards = [
        MeasuredCard(uuid=card.uuid,
                     memory_used=None if card.memory_used is None
                     else mebibytes(card.memory_used),
                     utilization=None if card.utilization is None
                     else min(max(card.utilization, 0), 100))
        for card in cards if _UUID.fullmatch(card.uuid)][:CARDS_PER_NODE_MAX]
    entries: dict[tuple[str, str, str], MeasuredContainer] = {}
    dropped = 0
    for usage in containers:
        for device in usage.devices:
            if not _sendable(usage, device.device_uuid):
                dropped += 1
                continue
            key = (usage.pod_uid, usage.container, device.device_uuid)
            if key in entries:
                dropped += 1  # the monitor named one container's card twice: the first holds
                continue
            entries[key] = MeasuredContainer(
                pod_uid=usage.pod_uid, container=usage.container,
                device_uuid=device.device_uuid, memory_used=mebibytes(device.memory_used),
                utilization=min(max(device.utilization, 0), UTILIZATION_SUM_MAX),
                memory_limit=None if device.memory_limit is None
                else mebibytes(device.memory_limit),
                source=usage.source)
    kept = sorted(entries.values(), key=lambda entry: (
        -entry.memory_used, entry.pod_uid, entry.container, entry.device_uuid))
    dropped += max(len(kept) - limit, 0)
    return Measured(at=at, cards=measured_cards, containers=kept[:limit], dropped=dropped)


def _sendable(usage: ContainerUsage, device_uuid: str) -> bool:
    return (0 < len(usage.pod_uid) <= POD_UID_MAX and len(usage.container) <= CONTAINER_NAME_MAX
            and _UUID.fullmatch(device_uuid) is not None)


class LatestUsage:
    """A ``UsageSnapshot`` the monitor fills: each measurement converted once, when it is
    taken, and kept until the next."""

    def __init__(self) -> None:
        self._latest: Measured | None = None

    def record(self, cards: Sequence[HostCard], containers: Sequence[ContainerUsage],
               at: float) -> Measured:
        """Keep this measurement (taken at ``at``, Unix seconds) as the latest; returns it."""
        self._latest = measured_from(cards, containers, at)
        return self._latest

    def measured(self) -> Measured | None:
        return self._latest
