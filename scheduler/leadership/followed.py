"""``FollowedLease`` (Kubernetes): the role of the daemon beside a kube-scheduler, read
from kube-scheduler's Lease."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from scheduler.cluster import ClusterError
from scheduler.leadership.port import Hook, Role

logger = logging.getLogger(__name__)

LEASE_READ_PERIOD_S = 1.0


class LeaseReader(Protocol):
    async def lease_holder(self, namespace: str, name: str) -> str | None:
        """The Lease's ``holderIdentity`` ("" when it names none); None when there is no
        such Lease. Raises ``ClusterError``."""
        ...


class FollowedLease:
    """The role of the daemon beside a kube-scheduler, read from kube-scheduler's Lease.

    kube-scheduler names itself ``<host name>_<uuid>``; in a pod the host name is the
    pod's name, the daemon's default identity. No such Lease (leader election off): the
    leader. A Lease that cannot be read: the last role, or leader at first, so that an
    RBAC mistake never leaves the device plugins unanswered (logged).
    """

    def __init__(self, reader: LeaseReader, namespace: str, name: str, identity: str, *,
                 period: float = LEASE_READ_PERIOD_S, on_elected: Hook | None = None) -> None:
        self._reader = reader
        self._namespace, self._name = namespace, name
        self.identity = identity
        self._period = period
        self._on_elected = on_elected
        self.term = 0
        self.role: Role = "leader"
        self.holder: str | None = None
        self._unread: str | None = None

    def leading(self) -> bool:
        return self.role == "leader"

    def refusal(self) -> str | None:
        return None

    def describe(self) -> dict[str, object]:
        described: dict[str, object] = {
            "role": self.role, "identity": self.identity, "holder": self.holder,
            "lease": f"kube-scheduler Lease {self._namespace}/{self._name}"}
        if self._unread is not None:
            described["lease_unread"] = self._unread
        return described

    def mine(self, holder: str) -> bool:
        return holder == self.identity or holder.startswith(f"{self.identity}_")

    async def start(self) -> None:
        await self.refresh()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._period)
            await self.refresh()

    async def refresh(self) -> None:
        try:
            holder = await self._reader.lease_holder(self._namespace, self._name)
        except ClusterError as error:
            if self._unread is None:
                logger.warning("%s; keeping the role %s", error, self.role)
            self._unread = str(error)
            return
        self._unread = None
        self.holder = holder
        role: Role = "leader" if holder is None or self.mine(holder) else "standby"
        if role == self.role:
            return
        self.role = role
        if role == "standby":
            logger.info("standing by: kube-scheduler %s leads", holder or "(none yet)")
            return
        logger.info("leading: this pod's kube-scheduler holds Lease %s/%s", self._namespace,
                    self._name)
        if self._on_elected is not None:
            await self._on_elected()

    async def resign(self) -> None:
        return None
