"""HAMi's priority feedback loop: pause a container's kernels while a container of higher
priority (a lower number) is busy on one of its cards, and tell HAMi-core when its core
limit matters (``utilization_switch``), as HAMi v2.10's monitor does every 5 s
(``cmd/vGPUmonitor/feedback.go:Observe``).

The decision is pure (``decide``: from each region's priority, ``recent_kernel`` and cards
to the values to write), over the cards each container was given only (the others its file
names are never counted, so a container cannot pause a neighbour's kernels by naming its
card); the writes are ``os.pwrite`` of one int32 at the field's offset,
which goes through the page cache HAMi-core's mapping of the file shares.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from agent.monitor.cache import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    Reason,
    Refused,
    Region,
    identity_of,
    open_regular,
    read_exactly,
)

_INT32 = struct.Struct("<i")
T = TypeVar("T")
PAUSED = -1
"""``recent_kernel`` at -1: HAMi-core's rate limiter sleeps before each launch until it is
0 or more again."""


@dataclass(frozen=True, slots=True)
class Control:
    """What the loop decides from, for one container, read just before deciding."""

    priority: int
    recent_kernel: int
    """HAMi-core sets 2 at each kernel launch; the loop counts it down every round."""
    utilization_switch: int
    cards: tuple[str, ...]
    """The uuids set in the region that the container was given (``containers.vouch``);
    HAMi takes every uuid set, whoever's card it is."""


@dataclass(frozen=True, slots=True)
class Writes:
    """The new values of one region's fields; None leaves the field as it is."""

    recent_kernel: int | None = None
    utilization_switch: int | None = None

    @property
    def needed(self) -> bool:
        return self.recent_kernel is not None or self.utilization_switch is not None


def decide(controls: Sequence[Control]) -> list[Writes]:
    """What HAMi's ``Observe`` writes, one ``Writes`` per control, in order.

    1. Census: a container whose ``recent_kernel`` is above 0 has it counted down; if it
       is still above 0, the container is busy, counted once per card at its priority
       (priorities below 0 are not counted).
    2. Per container at priority ``p``: blocked while any priority ``q < p`` is busy on
       one of its cards (``recent_kernel`` = -1 unless already below 0); else a paused one
       is released (below 0 becomes 0). ``utilization_switch`` is 1 while a higher
       priority is busy on one of its cards or more than one container at ``p`` is,
       else 0.
    """
    busy: dict[str, Counter[int]] = {}
    counted_down = []
    for control in controls:
        recent = control.recent_kernel
        if recent > 0:
            recent -= 1
            if recent > 0 and control.priority >= 0:
                for card in control.cards:
                    busy.setdefault(card, Counter())[control.priority] += 1
        counted_down.append(recent)
    decided = []
    for control, counted in zip(controls, counted_down, strict=True):
        on_cards = [busy[card] for card in control.cards if card in busy]
        higher = any(count > 0 and priority < control.priority
                     for counts in on_cards for priority, count in counts.items())
        crowded = control.priority >= 0 and any(
            counts[control.priority] > 1 for counts in on_cards)
        recent = counted
        if higher:
            if counted >= 0:
                recent = PAUSED
        elif counted < 0:
            recent = 0
        switch = 1 if higher or crowded else 0
        decided.append(Writes(
            recent_kernel=recent if recent != control.recent_kernel else None,
            utilization_switch=switch if switch != control.utilization_switch else None))
    return decided


def _same_file(region: Region, fd: int) -> Refused | None:
    """Refused when the file at the path is no longer the one read at the scan (another
    file, another size, or no longer HAMi-core's magic)."""
    if identity_of(fd) != region.identity:
        return Refused("changed", f"{region.path}: changed since it was read")
    header = read_exactly(fd, HEADER_SIZE, 0, region.path, "the header")
    if isinstance(header, Refused):
        return header
    if HEADER.unpack(header)[0] != MAGIC:
        return Refused("changed", f"{region.path}: no longer HAMi-core's (magic changed)")
    return None


def _on_same_file(region: Region, flags: int, failed: Reason,
                  act: Callable[[int], T | Refused]) -> T | Refused:
    """``act`` on the region's file opened with ``flags``, if it is still the file read at
    the scan; an OS error is refused with the reason ``failed``."""
    fd = open_regular(region.path, flags)
    if isinstance(fd, Refused):
        return fd
    try:
        changed = _same_file(region, fd)
        return changed if changed is not None else act(fd)
    except OSError as error:
        return Refused(failed, f"{region.path}: {error.strerror or error}")
    finally:
        os.close(fd)


def read_control(region: Region, cards: tuple[str, ...]) -> Control | Refused:
    """The region's feedback fields as they are now, deciding for ``cards`` (those of the
    region's that the container was given); refused when the file changed."""
    def read(fd: int) -> Control | Refused:
        fields = read_exactly(fd, 16, region.layout.proc_num, region.path, "the tail fields")
        if isinstance(fields, Refused):
            return fields
        _, switch, recent, priority = struct.unpack("<4i", fields)
        return Control(priority=priority, recent_kernel=recent, utilization_switch=switch,
                       cards=cards)

    return _on_same_file(region, os.O_RDONLY, "unreadable", read)


def write_control(region: Region, writes: Writes) -> Refused | None:
    """Write ``writes`` into the region's file, unless it changed since it was read."""
    def write(fd: int) -> None:
        layout = region.layout
        if writes.recent_kernel is not None:
            os.pwrite(fd, _INT32.pack(writes.recent_kernel), layout.recent_kernel)
        if writes.utilization_switch is not None:
            os.pwrite(fd, _INT32.pack(writes.utilization_switch), layout.utilization_switch)

    return _on_same_file(region, os.O_RDWR, "unwritable", write)
