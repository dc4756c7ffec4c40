"""The agent's async shell: read the inventory, publish it on NATS, answer resync requests.

Reading and publishing are independent: the source is polled whether or not
NATS is reachable, and whatever was read last goes out as soon as a
connection is back. The pieces that decide what to send live in
``agent.report``; this module only moves bytes and keeps time.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from agent.inventory import InventorySource
from agent.report import Report
from common.messaging import NatsSettings, connect
from common.wire import (
    RESYNC_SUBJECT,
    Reason,
    ResyncRequest,
    WireError,
    decode_resync,
    encode,
    inventory_subject,
)

logger = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL_S = 5.0
DEFAULT_HEARTBEAT_INTERVAL_S = 10.0
DRAIN_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class AgentSettings:
    node: str
    poll_interval: float = DEFAULT_POLL_INTERVAL_S
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL_S
    cordoned: tuple[str, ...] = ()


class Agent:
    def __init__(self, settings: AgentSettings, source: InventorySource, nats: NatsSettings,
                 clock: Callable[[], float] = time.time) -> None:
        self._settings = settings
        self._source = source
        self._nats = nats
        self._clock = clock
        self._report = Report(settings.node, secrets.token_hex(8), settings.heartbeat_interval,
                              settings.cordoned)
        self._subject = inventory_subject(settings.node)
        self._client: Client | None = None
        self._publishing = asyncio.Lock()
        self._last_publish = time.monotonic()
        self._closing = False

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then drain the connection and close the source."""
        await asyncio.to_thread(self._source.open)
        try:
            self._report.observe(await asyncio.to_thread(self._source.read))
            if unknown := self._report.unknown_cordons():
                logger.warning("cordoned cards this node does not have: %s", ", ".join(unknown))
            self._last_publish = time.monotonic()
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._connect()),
                         group.create_task(self._poll()),
                         group.create_task(self._heartbeat())]
                await stop.wait()
                for task in tasks:
                    task.cancel()
        finally:
            await self._disconnect()
            await asyncio.to_thread(self._source.close)

    async def _connect(self) -> None:
        client = await connect(self._nats, f"pyhami-agent {self._settings.node}",
                               on_reconnected=self._on_reconnected,
                               on_disconnected=self._on_disconnected)
        self._client = client
        await client.subscribe(RESYNC_SUBJECT, cb=self._on_resync)
        url = client.connected_url
        logger.info("connected to NATS at %s", url.netloc if url else "?")
        await self._publish("start")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._settings.poll_interval)
            try:
                cards = await asyncio.to_thread(self._source.read)
            except Exception:  # one failed read must not stop the agent: keep the last state
                logger.exception("reading the inventory failed; keeping the last state")
                continue
            for line in self._report.observe(cards):
                logger.info("change: %s", line)
            if self._report.unpublished:
                await self._publish("change")

    async def _heartbeat(self) -> None:
        interval = self._settings.heartbeat_interval
        while True:
            quiet_for = time.monotonic() - self._last_publish
            if quiet_for < interval:
                await asyncio.sleep(interval - quiet_for)
            elif not await self._publish("heartbeat"):
                await asyncio.sleep(interval)  # not connected: the reconnect publishes

    async def _publish(self, reason: Reason) -> bool:
        """Send the latest observation; False when there is no connection to send it on."""
        async with self._publishing:
            client = self._client
            if client is None or not client.is_connected:
                return False
            message = self._report.message(reason, self._clock())
            try:
                await client.publish(self._subject, encode(message))
            except nats.errors.Error as error:
                logger.warning("publishing the inventory failed, will retry: %s", error)
                return False
            self._report.confirm(message)
            self._last_publish = time.monotonic()
            logger.debug("published %s #%d", reason, message.sequence)
            return True

    async def _on_resync(self, message: Msg) -> None:
        try:
            request = decode_resync(message.data)
        except WireError as error:
            logger.warning("%s; answering it as a request to every agent", error)
            request = ResyncRequest()
        if request.includes(self._settings.node):
            await self._publish("resync")

    async def _on_reconnected(self) -> None:
        logger.info("reconnected to NATS; publishing the latest inventory")
        await self._publish("reconnect")

    async def _on_disconnected(self) -> None:
        if not self._closing:
            logger.warning("disconnected from NATS; still polling, "
                           "the latest inventory goes out on reconnect")

    async def _disconnect(self) -> None:
        client = self._client
        if client is None or client.is_closed:
            return
        self._closing = True
        try:
            await asyncio.wait_for(client.drain(), DRAIN_TIMEOUT_S)
            logger.info("NATS connection drained")
        except (nats.errors.Error, TimeoutError) as error:
            logger.warning("could not drain the NATS connection (%s); closing it",
                           str(error) or type(error).__name__)
            await client.close()
