"""Allocations held by pods and what they add up to on each card."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from common.core.annotations import Containers
from common.core.mig import MigPlacement
from common.core.pod import QuotaSubject


@dataclass(frozen=True, slots=True)
class Usage:
    """What allocations put on one card: tenants, memory (MiB) and cores (%)."""

    tenants: int = 0
    memory: int = 0
    cores: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.tenants + other.tenants, self.memory + other.memory, self.cores + other.cores
        )

    def __sub__(self, other: Usage) -> Usage:
        return Usage(
            self.tenants - other.tenants, self.memory - other.memory, self.cores - other.cores
        )

    def peak(self, other: Usage) -> Usage:
        return Usage(
            max(self.tenants, other.tenants),
            max(self.memory, other.memory),
            max(self.cores, other.cores),
        )


@dataclass(frozen=True, slots=True)
class Allocation:
    """The cards a pod holds on a node, per container (init containers first)."""

    node: str
    containers: Containers
    init_containers: int = 0
    subject: QuotaSubject | None = field(default=None, compare=False)
    """Whose ResourceQuotas the cards are charged to; None: the namespace of the pod's key,
    matching only quotas without scopes (a ledger entry that knows no more of its pod)."""

    def footprint(self) -> dict[str, Usage]:
        """Per card: app containers summed, init containers at their peak (they run first)."""
        app: dict[str, Usage] = {}
        init: dict[str, Usage] = {}
        for position, grants in enumerate(self.containers):
            for grant in grants:
                one = Usage(1, grant.memory, grant.cores)
                if position < self.init_containers:
                    init[grant.uuid] = init.get(grant.uuid, Usage()).peak(one)
                else:
                    app[grant.uuid] = app.get(grant.uuid, Usage()) + one
        for uuid, usage in init.items():
            app[uuid] = app.get(uuid, Usage()).peak(usage)
        return app

    def instances(self) -> list[tuple[str, MigPlacement]]:
        """The MIG instances the pod holds: each card's UUID and its placement."""
        return [(grant.uuid, grant.instance.placement) for grants in self.containers
                for grant in grants if grant.instance is not None]

    def charge(self, footprint: Mapping[str, Usage] | None = None) -> Usage:
        """What the pod is charged under its namespace's quotas: its footprint summed over
        its cards (HAMi's rule: per card, init containers at their peak, app containers
        summed). ``footprint``: this allocation's, when the caller has it already."""
        total = Usage()
        for usage in (self.footprint() if footprint is None else footprint).values():
            total += usage
        return total
