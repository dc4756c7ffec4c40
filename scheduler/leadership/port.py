"""The ``Leadership`` port (who decides when several daemons run) and ``AlwaysLeader``, the
daemon alone; the other leaderships (``FollowedLease``, ``NatsLease``) implement it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Literal, Protocol

Role = Literal["leader", "standby"]
Hook = Callable[[], Awaitable[None]]


class Leadership(Protocol):
    identity: str
    """This daemon's name (``--identity``), carried by every decision it publishes."""
    term: int
    """Which term of leadership its decisions belong to, where terms are counted (the
    standalone lease); 0 elsewhere."""

    @property
    def role(self) -> Role: ...

    def leading(self) -> bool:
        """This daemon decides now: it may answer the device plugins and stamp retries."""
        ...

    def refusal(self) -> str | None:
        """Why the verbs and the pod API answer 503 now; None when they serve."""
        ...

    def describe(self) -> dict[str, object]:
        """``/statusz``'s ``leadership``: role, identity, holder, what is followed."""
        ...

    async def start(self) -> None:
        """Learn the role before the daemon answers (standalone: try to take the lease)."""
        ...

    async def run(self) -> None:
        """Keep the role current, for as long as the daemon runs."""
        ...

    async def resign(self) -> None:
        """Stopping: hand the lease on at once instead of letting it expire."""
        ...


class AlwaysLeader:
    """The only daemon: always the leader."""

    role: Role = "leader"
    term = 0

    def __init__(self, identity: str) -> None:
        self.identity = identity

    def leading(self) -> bool:
        return True

    def refusal(self) -> str | None:
        return None

    def describe(self) -> dict[str, object]:
        return {"role": self.role, "identity": self.identity, "holder": self.identity,
                "lease": None}

    async def start(self) -> None:
        return None

    async def run(self) -> None:
        await asyncio.Event().wait()

    async def resign(self) -> None:
        return None
