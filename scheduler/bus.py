"""The daemon's face on the bus, as ``web/`` is its face over HTTP: the agents' subjects
subscribed and handed to the service's handlers, the telemetry published, and the
readiness check of the NATS connection."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg

from common import telemetry
from common.messaging import Connection
from common.supervision import Supervisor
from common.wire import (
    ALLOCATED_SUBJECTS,
    ALLOCATIONS_SUBJECTS,
    INVENTORY_SUBJECTS,
    RESYNC_SUBJECT,
    WireError,
    decode_resync,
    encode,
)
from scheduler.leadership import Leadership
from scheduler.service import SchedulerService


async def subscribe_to_agents(connection: Connection, supervisor: Supervisor,
                              service: SchedulerService, leadership: Leadership) -> None:
    """Inventories from the agents; the device plugins' requests and outcomes, which only
    the leader answers (a standby's view may lag). A message that crashes its handler is
    logged and counted, and the next one is handled as usual."""
    handlers = service.handlers

    async def on_inventory(message: Msg) -> None:
        with supervisor.contained("inventory message"):
            await handlers.inventories.receive_inventory(message.subject, message.data)

    async def on_allocations_request(message: Msg) -> None:
        if not leadership.leading():
            return
        with supervisor.contained("allocations request"):
            pending = await handlers.allocations.pending_allocations(message.subject)
            if pending is not None and message.reply:
                await connection.publish(message.reply, encode(pending))

    async def on_resync(message: Msg) -> None:
        # A watcher connecting asks the agents to report; the leader answers it with the
        # decisions it made before (the agents' answers bring the usage:
        # handlers/inventories.py).
        if not leadership.leading():
            return
        try:
            asker = decode_resync(message.data).requested_by
        except WireError:
            return  # the agents answer it as a request to all; nothing here to replay
        if asker == telemetry.WATCH_CLIENT:
            service.reporting.replay_decisions()

    async def on_allocation_outcome(message: Msg) -> None:
        if not leadership.leading():
            # Kept a while: the lease may move before the holder wrote it.
            handlers.allocations.keep_outcome(message.subject, message.data)
            return
        with supervisor.contained("allocation outcome"):
            await handlers.allocations.allocation_outcome(message.subject, message.data)

    await connection.subscribe(INVENTORY_SUBJECTS, on_inventory)
    await connection.subscribe(ALLOCATIONS_SUBJECTS, on_allocations_request)
    await connection.subscribe(ALLOCATED_SUBJECTS, on_allocation_outcome)
    await connection.subscribe(RESYNC_SUBJECT, on_resync)


def telemetry_publisher(connection: Connection) -> Callable[
        [telemetry.DecisionEvent | telemetry.UsageEvent], Awaitable[None]]:
    """Telemetry never fails a request: what cannot go is counted by the connection."""

    async def publish(event: telemetry.DecisionEvent | telemetry.UsageEvent) -> None:
        subject = (telemetry.DECISIONS_SUBJECT if isinstance(event, telemetry.DecisionEvent)
                   else telemetry.usage_subject(event.node))
        await connection.publish(subject, telemetry.encode(event))

    return publish


def nats_check(connection: Connection, grace: float) -> Callable[[], str | None]:
    """The readiness check of the connection: not ready once down longer than ``grace``."""

    def check() -> str | None:
        down = connection.down_for()
        if down <= grace:
            return None
        return f"NATS disconnected for {down:.0f}s (grace {grace:g}s)"

    return check
