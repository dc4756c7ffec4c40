"""The daemon's live state: the fleet, the nodes the agents report, the pods' cache.

``LiveState`` owns the one ``Fleet`` of the decision core (every node's cards and the
usage booked on them) and its two keepers: the ``NodeRegistry`` (``nodes.py``) puts the
agents' inventories in it, and knows which nodes are fresh; the ``SchedulingCache``
(``cache.py``) decides among those nodes and holds the pods' cards in it, reserved
and then bound. In kube-scheduler's terms the fleet is its cache of NodeInfos, the
registry what keeps them current, and the cache its assumed and bound pods. Beside
them, ``PodsInFlight`` (``pods.py``) is what the service remembers of pods beyond their
cards, as kube-scheduler's queue and cache do.

Everything here is synchronous and takes the time as an argument, so one
decision and its reservation happen without any await in between: concurrent
requests on the event loop can never book the same capacity twice.
"""

from __future__ import annotations

from typing import Final

from common.core import Fleet
from scheduler.state.cache import POD_BOUND, SchedulingCache
from scheduler.state.groups import Groups, Starving, Tried, Waiting
from scheduler.state.nodes import (
    NODE_STALE,
    NODE_UNKNOWN,
    SEQUENCE_GAP_MAX,
    IngestResult,
    NodeRegistry,
)
from scheduler.state.pods import PodsInFlight
from scheduler.state.usage import OverSlice, SliceWatch
from scheduler.state.workloads import HeldWorkloads

__all__ = [
    "NODE_STALE",
    "NODE_UNKNOWN",
    "POD_BOUND",
    "SEQUENCE_GAP_MAX",
    "Groups",
    "HeldWorkloads",
    "IngestResult",
    "LiveState",
    "NodeRegistry",
    "OverSlice",
    "PodsInFlight",
    "SchedulingCache",
    "SliceWatch",
    "Starving",
    "Tried",
    "Waiting",
]


class LiveState:
    """The fleet and its two keepers, built together around it: ``nodes`` (what the
    agents report) and ``cache`` (what the pods hold)."""

    def __init__(self, *, node_timeout: float, reservation_ttl: float,
                 node_retention: float | None = None) -> None:
        # Plain attributes, never rebound (Final): /filter reaches the cache through
        # one attribute lookup.
        self.fleet: Final = Fleet()
        self.nodes: Final = NodeRegistry(self.fleet, node_timeout=node_timeout,
                                         node_retention=node_retention)
        self.cache: Final = SchedulingCache(self.fleet, self.nodes,
                                        reservation_ttl=reservation_ttl)
        self.slices: Final = SliceWatch()
        self.groups: Final = Groups()
        self.workloads: Final = HeldWorkloads()
        """The Kueue workloads whose pods' cards the admission check holds."""
