"""The agent's async shell: read the inventory, publish it on NATS, answer resync requests.

Reading and publishing are independent: the source is polled whether or not
NATS is reachable, and whatever was read last goes out as soon as a
connection is back. The pieces that decide what to send live in
``agent.report``; this module only moves bytes and keeps time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from aiohttp import web
from nats.aio.client import Client
from nats.aio.msg import Msg

from agent.deviceplugin.plugin import DevicePlugin, PluginSettings
from agent.deviceplugin.source import ASK_PATIENCE_S, NatsAllocationSource
from agent.mig.manager import MigManager
from agent.mig.static import StaticMigSource
from agent.monitor.model import HostProbe
from agent.monitor.monitor import MonitorSettings, NodeMonitor
from agent.monitor.server import serve_monitor
from agent.registration import ConfiguredSource
from agent.report import Report
from agent.usage import UsageSnapshot
from agent.vendors.port import InventorySource
from common.arguments import positive_seconds, seconds_or_off
from common.busaccess import agent_inbox_prefix
from common.core.annotations import comma_list
from common.core.deviceconfig import NodeDeviceConfig
from common.messaging import Connection, NatsSettings
from common.settings import setting
from common.supervision import Supervisor
from common.wire import (
    RESYNC_SUBJECT,
    Measured,
    Reason,
    ReportedCard,
    ResyncRequest,
    WireError,
    decode_resync,
    encode,
    inventory_subject,
)

logger = logging.getLogger(__name__)

# Stopping must end within 10 s even while a card read hangs in its thread.
SOURCE_CLOSE_TIMEOUT_S = 3.0


def uuid_list(text: str) -> tuple[str, ...]:
    """``--cordon``'s cards, in the order given: the order they are reported in."""
    return tuple(comma_list(text))


@dataclass(frozen=True)
class AgentSettings:
    """How the agent reports its node: how often it reads the cards and speaks, and which
    cards it reports cordoned."""

    node: str
    """This node's name (``--node``, else $NODE_NAME: ``agent.cli`` reads and checks it)."""
    poll_interval: float = setting(
        5.0, parse=positive_seconds, metavar="SECONDS",
        help="read the cards this often (default: {default})")
    heartbeat_interval: float = setting(
        10.0, parse=positive_seconds, metavar="SECONDS",
        help="republish after this long without a message (default: {default})")
    usage_interval: float = setting(
        10.0, parse=seconds_or_off, metavar="SECONDS",
        help="send the measured usage when it changed, at most this often; 0: send none "
             "(default: {default})")
    cordoned: tuple[str, ...] = setting(
        (), flag="--cordon", parse=uuid_list, metavar="UUID[,UUID...]",
        help="cards to report as cordoned: the scheduler leaves them alone")
    device: NodeDeviceConfig = field(default_factory=NodeDeviceConfig)
    """HAMi's device configuration for this node (``--device-config`` with its
    ``--node-config`` entry applied): every card is registered under it
    (``agent.registration``); the device plugin's part comes in its ``PluginSettings``."""


class Agent:
    """The node agent: its cards read and published, its usage sent with them (given a
    ``usage`` snapshot), its device plugin served (given its settings)."""

    def __init__(self, settings: AgentSettings, source: InventorySource, nats: NatsSettings,
                 *, clock: Callable[[], float] = time.time,
                 device_plugin: PluginSettings | None = None,
                 usage: UsageSnapshot | None = None,
                 monitor: MonitorSettings | None = None,
                 probe: HostProbe | None = None,
                 mig: MigManager | None = None,
                 static_mig: StaticMigSource | None = None) -> None:
        """``mig``: the node's MIG instances, for a node in MIG mode (``source`` then reports
        its cards in MIG mode: ``agent.mig.inventory.MigSource``); ``static_mig``: the
        source, when it serves MIG devices an operator made (``--mig-strategy mixed``: the
        device plugin serves their resources)."""
        self._settings = settings
        self._source = ConfiguredSource(source, settings.device)
        self._nats = nats
        self._clock = clock
        self._report = Report(settings.node, secrets.token_hex(8), settings.heartbeat_interval,
                              settings.cordoned)
        self._subject = inventory_subject(settings.node)
        # Replies come to the node's own inbox: the one its NATS permissions allow.
        self._connection = Connection(
            replace(nats, inbox_prefix=agent_inbox_prefix(settings.node)),
            f"pyhami-agent {settings.node}")
        self._connection.when_up(self._on_up)
        self._published_once = False
        self._publishing = asyncio.Lock()
        self._last_publish = time.monotonic()
        self._allocations = NatsAllocationSource(
            self._connection, settings.node, patience=ASK_PATIENCE_S if device_plugin is None
            else device_plugin.allocate_patience)
        self._monitor = None if monitor is None or probe is None else NodeMonitor(
            settings.node, monitor, probe, self._allocations)
        self._metrics = None if self._monitor is None or monitor is None else monitor.metrics
        # Usage is sent only with an interval: 0 turns it off. The monitor measures it,
        # unless a snapshot is given (tests).
        measured = usage if usage is not None else self._monitor
        self._usage = measured if settings.usage_interval > 0 else None
        self._device_plugin = None if device_plugin is None else DevicePlugin(
            settings.node, device_plugin, self._allocations, mig)
        self._static_mig = static_mig
        if self._device_plugin is not None:
            self._report.slices_enforced = self._device_plugin.slices_enforced

    @property
    def connection(self) -> Connection:
        return self._connection

    @property
    def device_plugin(self) -> DevicePlugin | None:
        return self._device_plugin

    @property
    def monitor(self) -> NodeMonitor | None:
        return self._monitor

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then drain the connection and close the source.

        ``stop`` is obeyed in every state: opening the source, connecting, connected,
        or with NATS gone."""
        await self._connection.subscribe(RESYNC_SUBJECT, self._on_resync)
        opened = asyncio.create_task(self._open())
        stopping = asyncio.create_task(stop.wait())
        # These loops end only by crashing, and the agent with them (its DaemonSet starts
        # it again): none is restarted, and the crash is raised from run().
        supervisor = Supervisor()
        listener: web.AppRunner | None = None
        try:
            await asyncio.wait({opened, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                return
            opened.result()  # raises what stopped the source from opening
            supervisor.start("nats-connection", self._connection.run, restart=False)
            supervisor.start("poll", self._poll, restart=False)
            supervisor.start("heartbeat", self._heartbeat, restart=False)
            if self._monitor is not None:
                supervisor.start("monitor", self._monitor.run, restart=False)
                if self._metrics is not None:
                    listener = await serve_monitor(self._monitor, self._metrics)
            if self._usage is not None:
                supervisor.start("usage", self._send_usage, restart=False)
            if self._device_plugin is not None:
                supervisor.start("device-plugin", self._device_plugin.run, restart=False)
                supervisor.start("folder-sweep", functools.partial(
                    self._device_plugin.sweep_folders, self._allocations), restart=False)
                supervisor.start("outcomes", self._device_plugin.confirm_outcomes,
                                 restart=False)
                if self._device_plugin.serves_mig:
                    supervisor.start("mig-instances", functools.partial(
                        self._device_plugin.keep_mig_instances, self._allocations),
                        restart=False)
            await supervisor.until_stopped(stop)
        finally:
            stopping.cancel()
            opened.cancel()  # a read under way in its thread ends on its own
            supervisor.cancel()
            if listener is not None:
                await listener.cleanup()
            # Closed before the wait: the connection's loop ends on it even where nats-py
            # swallowed the cancellation; the wait is bounded for any other such loop.
            await self._connection.close()
            await supervisor.stop()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.to_thread(self._source.close),
                                       SOURCE_CLOSE_TIMEOUT_S)

    async def _open(self) -> None:
        await asyncio.to_thread(self._source.open)
        await self._observe(await asyncio.to_thread(self._source.read))
        if unknown := self._report.unknown_cordons():
            logger.warning("cordoned cards this node does not have: %s", ", ".join(unknown))
        self._last_publish = time.monotonic()

    async def _observe(self, cards: list[ReportedCard]) -> list[str]:
        """Record a read for the report and the device plugin; returns what changed."""
        if self._device_plugin is not None:
            await self._device_plugin.observe(cards)
            if self._static_mig is not None:
                await self._device_plugin.observe_mig_devices(self._static_mig.mig_devices)
        return self._report.observe(cards)

    async def _on_up(self, client: Client, new_client: bool) -> None:
        url = client.connected_url
        if not self._published_once:
            logger.info("connected to NATS at %s", url.netloc if url else "?")
            await self._publish("start")
            return
        logger.info("%s to NATS at %s; publishing the latest inventory",
                    "connected again" if new_client else "reconnected",
                    url.netloc if url else "?")
        await self._publish("reconnect")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._settings.poll_interval)
            try:
                cards = await asyncio.to_thread(self._source.read)
            except Exception:  # one failed read must not stop the agent: keep the last state
                logger.exception("reading the inventory failed; keeping the last state")
                continue
            for line in await self._observe(cards):
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

    async def _send_usage(self) -> None:
        """Usage that changed goes out at most every ``--usage-interval``. Every message
        carries the latest measurement, so only a spell that long without any message
        calls for one of its own (reason ``change``: a reason an older daemon knows)."""
        interval = self._settings.usage_interval
        while True:
            quiet_for = time.monotonic() - self._last_publish
            if quiet_for < interval:
                await asyncio.sleep(interval - quiet_for)
            elif (not self._report.usage_changed(self._measured())
                  or not await self._publish("change")):
                await asyncio.sleep(interval)

    def _measured(self) -> Measured | None:
        return None if self._usage is None else self._usage.measured()

    async def _publish(self, reason: Reason) -> bool:
        """Send the latest observation, with the latest measured usage; False when it could
        not go (the connection counts and logs why)."""
        async with self._publishing:
            if not self._connection.connected:
                return False
            message = self._report.message(reason, self._clock(), self._measured())
            if await self._connection.publish(self._subject, encode(message)) is not None:
                return False
            self._published_once = True
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
