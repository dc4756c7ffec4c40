"""The service's event handlers (kube-scheduler's word): what the daemon does when the
cluster or the bus speaks, one module per job.

- ``ledger``: the ledger rebuilt from the pods' allocation annotations at start-up.
- ``inventories``: the agents' reports, the resync's answers, nodes that fall silent.
- ``allocations``: the device plugins' allocation handshake, requests and outcomes.
- ``pods``: the pod watch, and a fresh list of the pods after a lost watch.
- ``groups``: the pod groups' members noted, and groups let go whole.
- ``quotas``: the namespaces' ResourceQuotas.
- ``cordons``: the nodes' device cordons, and Nodes no longer listed.
- ``reservations``: reservations no bind confirmed in time, or that a standby drops.

Each is a ``ServicePart``; one that needs another's help is given it at construction.
"""

from __future__ import annotations

from scheduler.metrics import Metrics
from scheduler.service.handlers.allocations import Allocations
from scheduler.service.handlers.cordons import Cordons
from scheduler.service.handlers.groups import GroupMembers
from scheduler.service.handlers.inventories import Inventories
from scheduler.service.handlers.ledger import Ledger
from scheduler.service.handlers.pods import PodEvents
from scheduler.service.handlers.quotas import Quotas
from scheduler.service.handlers.reservations import Reservations
from scheduler.service.shared import Reports, Shared

__all__ = ["Allocations", "Cordons", "GroupMembers", "Handlers", "Inventories", "Ledger",
           "PodEvents", "Quotas", "Reservations"]


class Handlers:
    """The event handlers built around the shared state; callers use them by job
    (``handlers.inventories.receive_inventory``, ``handlers.ledger.rebuild``)."""

    def __init__(self, shared: Shared, metrics: Metrics, reports: Reports) -> None:
        self.inventories = inventories = Inventories(shared, metrics, reports)
        self.allocations = allocations = Allocations(shared, metrics, reports)
        self.groups = groups = GroupMembers(shared, metrics, reports)
        self.pods = PodEvents(shared, metrics, reports, allocations=allocations, groups=groups)
        self.quotas = quotas = Quotas(shared, metrics, reports)
        self.cordons = cordons = Cordons(shared, metrics, reports, inventories=inventories)
        self.reservations = Reservations(shared, metrics, reports, groups=groups)
        self.ledger = Ledger(shared, metrics, reports, allocations=allocations, groups=groups,
                             quotas=quotas, cordons=cordons)
