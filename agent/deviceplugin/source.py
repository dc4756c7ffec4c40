"""Where the device plugin learns which pods wait for their cards, and tells what became of
them: a port, and its implementation over NATS (the daemon answers; the node needs no
credentials for the Kubernetes API)."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from nats.errors import Error as NatsError

from agent.errors import AgentError
from common.messaging import Connection, describe_error
from common.wire import (
    AllocationOutcome,
    HoldingPod,
    PendingAllocations,
    PendingPod,
    WireError,
    allocated_subject,
    allocations_subject,
    decode_pending,
    encode,
)

REQUEST_TIMEOUT_S = 5.0
# How long a question to the daemon is asked again while NATS or the daemon is away: a
# NATS server's loss (the client moves to another, under 2 s measured, docs/reliability.md)
# or a daemon's restart. The kubelet gives Allocate no deadline of its own, and holds the
# node's pod admissions meanwhile, so the wait is bounded here.
ASK_PATIENCE_S = 20.0  # the default of the agent's --allocate-patience
RETRY_PAUSE_S = 0.25


class AllocationSourceError(AgentError):
    """The pending pods cannot be learned, or an outcome cannot be told; the text says why."""


class _Unanswered(AllocationSourceError):
    """The question got no answer (not connected, no daemon listening, timed out): worth
    asking again."""


class AllocationSource(Protocol):
    async def pending(self, node: str) -> list[PendingPod]:
        """The pods bound to ``node`` whose cards are still to be allocated, oldest
        ``bind_time`` first; raises ``AllocationSourceError``."""

    async def report(self, outcome: AllocationOutcome) -> None:
        """Tell whether a pod's allocation succeeded; raises ``AllocationSourceError``."""


class LivePods(Protocol):
    async def live_pods(self, node: str) -> frozenset[str]:
        """The uids of every pod ``node`` runs now, complete (a partial answer would have
        live containers' folders removed); raises ``AllocationSourceError``."""


class HoldingPods(Protocol):
    async def holding_pods(self, node: str) -> list[HoldingPod]:
        """Every pod holding cards on ``node``, with its containers' cards and MIG
        reservations; raises ``AllocationSourceError``."""


class NatsAllocationSource:
    """Asks the daemon on ``allocations_subject(node)``, for the pods waiting for their
    cards and for those holding cards (one answer carries both); reports on
    ``allocated_subject``."""

    def __init__(self, connection: Connection, node: str,
                 timeout: float = REQUEST_TIMEOUT_S, patience: float = ASK_PATIENCE_S) -> None:
        self._connection = connection
        self._node = node
        self._timeout = timeout  # one request
        self._patience = patience  # asking again until an answer comes, at most this long

    async def pending(self, node: str) -> list[PendingPod]:
        return (await self._ask(node, "which pods wait for their cards")).pods

    async def live_pods(self, node: str) -> frozenset[str]:
        return frozenset(pod.uid for pod in await self.holding_pods(node))

    async def holding_pods(self, node: str) -> list[HoldingPod]:
        """Every pod holding cards on ``node``, with its containers and their cards."""
        answer = await self._ask(node, "which pods hold cards")
        if answer.holding is None:
            raise AllocationSourceError(f"the daemon's answer on {answer.node} lists no pods "
                                        "holding cards (a daemon older than this agent)")
        return answer.holding

    async def _ask(self, node: str, what: str) -> PendingAllocations:
        """The daemon's answer for ``node``, checked; asked again while it goes unanswered
        (the connection moving to another NATS server, the daemon reconnecting), up to the
        patience; raises ``AllocationSourceError``."""
        deadline = time.monotonic() + self._patience
        while True:
            try:
                return await self._ask_once(node, what, deadline)
            except _Unanswered as unanswered:
                if time.monotonic() + RETRY_PAUSE_S >= deadline:
                    raise AllocationSourceError(str(unanswered)) from None
            await asyncio.sleep(RETRY_PAUSE_S)

    async def _ask_once(self, node: str, what: str, deadline: float) -> PendingAllocations:
        client = self._connection.client
        if client is None or not client.is_connected:
            raise _Unanswered(f"not connected to NATS: cannot ask the daemon {what}")
        subject = allocations_subject(node)
        timeout = max(RETRY_PAUSE_S, min(self._timeout, deadline - time.monotonic()))
        try:
            reply = await client.request(subject, b"", timeout=timeout)
        except (NatsError, TimeoutError) as error:
            raise _Unanswered(f"the daemon did not answer on {subject} "
                              f"({describe_error(error)})") from None
        try:
            answer = decode_pending(reply.data)
        except WireError as error:
            raise AllocationSourceError(f"the daemon's answer on {subject}: {error}") from None
        if answer.node != node:
            raise AllocationSourceError(f"the daemon answered for node {answer.node!r} on "
                                        f"{subject}")
        return answer

    async def report(self, outcome: AllocationOutcome) -> None:
        subject = allocated_subject(self._node)
        unsent = await self._connection.publish(subject, encode(outcome))
        if unsent is not None:
            raise AllocationSourceError(f"the outcome for pod {outcome.namespace}/"
                                        f"{outcome.name} was not sent on {subject} ({unsent})")
