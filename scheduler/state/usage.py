"""Containers using more memory than their slice, on nodes where nothing enforces it.

Where HAMi-core runs in the containers it holds each to the memory the ledger booked for
it. Where it does not (the agent's device plugin says ``slices_enforced`` is false), a
container may take more than its slice, and the pods sharing its card find less than they
were promised. ``SliceWatch`` compares each container's measured memory (the agent's
``Measured``) with its slice, says which containers are over it now, and which of them to
tell of: each container and card once per ``every`` seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from common.core import Allocation
from common.wire import Measured, MeasuredContainer
from scheduler.cluster import ClusterPod

# Once per container and card per 10 minutes: an operator learns of it without a Warning
# Event on every inventory (every few seconds) while it lasts.
SLICE_EXCEEDED_EVERY_S = 600.0


@dataclass(frozen=True, slots=True)
class OverSlice:
    """A container measured using more memory on a card than the ledger booked for it."""

    namespace: str
    pod: str
    container: str
    """Empty where the agent could not tell the pod's containers apart on the card: the
    figures are the pod's, its slice the pod's containers' on the card together."""
    uuid: str
    used: int
    """MiB measured."""
    slice: int
    """MiB booked."""

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.namespace, self.pod, self.container, self.uuid)

    def sentence(self) -> str:
        """The Warning Event's message."""
        who = (f"container {self.container} uses" if self.container
               else "the pod's containers together use")
        return (f"{who} {self.used} MiB of card {self.uuid}, more than its slice of "
                f"{self.slice} MiB; nothing enforces slices on this node (no HAMi-core), so "
                "the pods sharing the card may find less memory than they were given")


@dataclass(frozen=True, slots=True)
class SliceCheck:
    """What one measurement of a node said."""

    announce: list[OverSlice]
    """Over their slice and not told of within the window: one Warning Event each."""
    unmatched: int
    """Entries naming a pod the daemon does not know bound to the node, or a container or
    card the ledger books nothing for: ignored."""


class SliceWatch:
    """The containers over their slice on each node now, and when each was last told of."""

    def __init__(self, every: float = SLICE_EXCEEDED_EVERY_S) -> None:
        self._every = every
        self._over: dict[str, tuple[OverSlice, ...]] = {}
        self._announced: dict[tuple[str, str, str, str], float] = {}

    def check(self, node: str, measured: Measured,
              pod_of: Callable[[str], ClusterPod | None],
              allocation_of: Callable[[str], Allocation | None], now: float) -> SliceCheck:
        """Compare ``node``'s measured containers with their slices (``pod_of`` a uid's
        bound pod, ``allocation_of`` a pod key's cards); keep which are over now."""
        over: list[OverSlice] = []
        unmatched = 0
        for entry in measured.containers:
            pod = pod_of(entry.pod_uid)
            allocation = None if pod is None else allocation_of(pod.key)
            booked = (None if pod is None or allocation is None or allocation.node != node
                      else _slice(pod, allocation, entry))
            if pod is None or booked is None:
                unmatched += 1
            elif entry.memory_used > booked:
                over.append(OverSlice(pod.namespace, pod.name, entry.container,
                                      entry.device_uuid, entry.memory_used, booked))
        self._over[node] = tuple(over)
        # Forget what was told longer ago than the window: it may be told again.
        self._announced = {key: when for key, when in self._announced.items()
                           if now - when < self._every}
        announce = [found for found in over if found.key not in self._announced]
        for found in announce:
            self._announced[found.key] = now
        return SliceCheck(announce, unmatched)

    def clear(self, node: str) -> None:
        """The node's slices are enforced, or it sends no usage: none is over."""
        self._over.pop(node, None)

    def over(self, known: AbstractSet[str]) -> list[OverSlice]:
        """The containers over their slice now, on the nodes still ``known``."""
        return [found for node in sorted(self._over) if node in known
                for found in self._over[node]]

    def counts(self, known: AbstractSet[str]) -> Mapping[str, int]:
        """Per node still ``known`` whose usage is checked, how many containers are over."""
        return {node: len(found) for node, found in self._over.items() if node in known}


def _slice(pod: ClusterPod, allocation: Allocation, entry: MeasuredContainer) -> int | None:
    """MiB the ledger booked for the entry's container on its card (init containers come
    first in the allocation, as in the pod's spec); an entry without a container name is the
    pod's containers on the card together. None where the ledger books it nothing there."""
    if not entry.container:
        usage = allocation.footprint().get(entry.device_uuid)
        return None if usage is None else usage.memory
    spec = pod.manifest.spec
    names = [container.name for container in [*(spec.init_containers or ()), *spec.containers]]
    if entry.container not in names:
        return None
    position = names.index(entry.container)
    if position >= len(allocation.containers):
        return None
    return next((grant.memory for grant in allocation.containers[position]
                 if grant.uuid == entry.device_uuid), None)
