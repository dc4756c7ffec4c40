"""``pyhami watch``: a live terminal view of the scheduler's telemetry on NATS.

It folds three streams into one picture: the daemon's per-node card usage
(``pyhami.usage.<node>``), its decisions (``pyhami.decisions``) and the agents'
inventories (``pyhami.inventory.<node>``), which say when a node was last heard
from and whether its cards are healthy. ``WatchModel`` and ``render`` do no
I/O; the async shell around them connects, decodes and redraws.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import msgspec
import uvloop
from nats.aio.client import Client
from nats.aio.msg import Msg
from rich import box
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.live import Live
from rich.table import Table
from rich.text import Text

from common import stopping, telemetry
from common.arguments import Subcommands, positive_int, positive_seconds
from common.core.errors import SettingsError
from common.messaging import (
    NatsSettings,
    add_nats_arguments,
    connect,
    nats_settings,
)
from common.telemetry import CardUsage, DecisionEvent, UsageEvent
from common.wire import (
    INVENTORY_SUBJECTS,
    RESYNC_SUBJECT,
    Inventory,
    ResyncRequest,
    WireError,
    decode_inventory,
)
from common.wire import encode as encode_wire
from pyhami.output import add_output_argument, print_json, stdout_console

CLIENT_NAME = "pyhami-watch"
REFRESH_S = 0.25
# An agent silent for this many heartbeat intervals is shown as silent.
SILENT_HEARTBEATS = 3
MEMORY_BAR_WIDTH = 10
MEMORY_BARS_MIN_WIDTH = 90

Decoded = TypeVar("Decoded", bound=msgspec.Struct)
TelemetryEvent = TypeVar("TelemetryEvent", UsageEvent, DecisionEvent)


def register(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "watch", help="live view of the scheduler's nodes, cards and decisions (NATS telemetry)")
    add_nats_arguments(parser)
    parser.add_argument("--once", action="store_true",
                        help="listen for --wait seconds, print one snapshot and exit")
    parser.add_argument("--wait", type=positive_seconds, default=2.0, metavar="SECONDS",
                        help="with --once: how long to listen, and to try to reach NATS "
                             "(default 2)")
    parser.add_argument("--decisions", type=positive_int, default=10, metavar="N",
                        help="how many recent decisions to show (default 10)")
    add_output_argument(parser, "table", "table: the live view, or with --once one snapshot; "
                                         "json: one object per line, for each message heard, "
                                         "or with --once one snapshot")
    parser.set_defaults(handler=run)


# The model: events folded into what the view shows.


@dataclass(frozen=True)
class CardView:
    uuid: str
    index: int
    type: str
    memory: int
    cores: int
    count: int
    health: bool
    health_detail: str = ""
    cordoned: bool = False
    usage: CardUsage | None = None
    """The daemon's accounting; None until it publishes this node's usage."""


@dataclass
class NodeView:
    name: str
    cards: dict[str, CardView] = field(default_factory=dict)
    heard_at: float | None = None
    """When the node's agent last published its inventory (the agent's clock)."""
    heartbeat_interval: float | None = None


class WatchModel:
    """What the telemetry has said so far. Every usage or inventory message lists all of a
    node's cards, so the latest one sets the card list; each keeps what the other
    stream said about a card it still lists."""

    def __init__(self, decisions: int = 10, source: str = "") -> None:
        self.source = source
        self.connection = "connecting"
        self.connection_error: str | None = None
        self.nodes: dict[str, NodeView] = {}
        self.decisions: deque[DecisionEvent] = deque(maxlen=decisions)
        self.last_explained: DecisionEvent | None = None
        """The latest scheduled decision that carries its selection path."""
        self.decisions_seen = 0
        self.pending_seen = 0
        self.undecodable = 0

    def _node(self, name: str) -> NodeView:
        return self.nodes.setdefault(name, NodeView(name))

    def apply_usage(self, event: UsageEvent) -> None:
        node = self._node(event.node)
        previous = node.cards
        node.cards = {}
        for card in event.cards:
            known = previous.get(card.uuid)
            node.cards[card.uuid] = CardView(
                uuid=card.uuid, index=card.index, type=card.type, memory=card.memory,
                cores=card.cores, count=card.count, health=card.health,
                health_detail=known.health_detail if known else "",
                cordoned=known.cordoned if known else False, usage=card)

    def apply_inventory(self, inventory: Inventory) -> None:
        node = self._node(inventory.node)
        node.heard_at = inventory.timestamp
        node.heartbeat_interval = inventory.heartbeat_interval
        previous = node.cards
        node.cards = {}
        for card in inventory.cards:
            known = previous.get(card.uuid)
            node.cards[card.uuid] = CardView(
                uuid=card.uuid, index=card.index, type=card.type, memory=card.memory,
                cores=card.cores, count=card.count, health=card.health,
                health_detail=card.health_detail, cordoned=card.uuid in inventory.cordoned,
                usage=known.usage if known else None)

    def apply_decision(self, event: DecisionEvent) -> None:
        self.decisions.append(event)
        self.decisions_seen += 1
        if not event.scheduled:
            self.pending_seen += 1
        elif event.explain:
            self.last_explained = event

    def note_undecodable(self) -> None:
        self.undecodable += 1


# The view.


def render(model: WatchModel, now: float) -> RenderableType:
    return Snapshot(model, now)


class Snapshot:
    """The model as it stands at ``now``, laid out for the width it is printed at."""

    def __init__(self, model: WatchModel, now: float) -> None:
        self.model = model
        self.now = now

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        model = self.model
        # A terminal's width is shared out: long values are cut short, and the memory bars
        # show only where they do not squeeze the other columns out of shape. Elsewhere
        # (a pipe, a file) every value is printed whole and the bars, mere pictures of the
        # numbers beside them, are left out.
        fit = options.is_terminal
        bars = fit and options.max_width >= MEMORY_BARS_MIN_WIDTH
        yield nodes_table(model, self.now, bars, fit)
        yield Text()
        yield decisions_table(model, fit)
        if model.last_explained is not None:
            yield Text()
            yield selection_path(model.last_explained)
        yield Text()
        yield footer(model)


def titled_table(title: str) -> Table:
    return Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
                 show_edge=False, collapse_padding=True)


def nodes_table(model: WatchModel, now: float, bars: bool = True,
                fit: bool = True) -> RenderableType:
    if not model.nodes:
        return Text("nodes: none heard yet (agents were asked to report)", style="dim")
    table = titled_table("nodes")
    # Only the node column gives way on a narrow terminal: a long name is cut short.
    table.add_column("node", overflow="ellipsis", min_width=12)
    table.add_column("GPU", justify="right", no_wrap=True)
    table.add_column("type", overflow="ellipsis", no_wrap=True, max_width=22 if fit else None)
    table.add_column("tenants", justify="right", no_wrap=True)
    table.add_column("memory MiB", justify="right", no_wrap=True)
    if bars:
        table.add_column("", no_wrap=True)
    table.add_column("cores", justify="right", no_wrap=True)
    table.add_column("health", overflow="ellipsis", no_wrap=True, max_width=12 if fit else None)
    for name in sorted(model.nodes):
        node = model.nodes[name]
        cards = sorted(node.cards.values(), key=lambda c: c.index)
        labels = [Text(name, style="bold"), heard(node, now)]
        if len(cards) < len(labels):
            labels = [Text("\n").join(labels)]
        if not cards:
            table.add_row(labels[0], "", Text("no cards", style="dim"))
        for row, card in enumerate(cards):
            label = labels[row] if row < len(labels) else ""
            usage = card.usage
            cells: list[RenderableType] = [
                label, str(card.index), card_type(card.type),
                "-" if usage is None else f"{usage.tenants}/{card.count}",
                "-" if usage is None else f"{usage.usedmem}/{card.memory}"]
            if bars:
                cells.append(memory_bar(usage.usedmem if usage else 0, card.memory))
            cells += ["-" if usage is None else f"{usage.usedcores}/{card.cores}", health(card)]
            table.add_row(*cells)
        table.add_section()
    return table


def card_type(name: str) -> str:
    """HAMi prefixes the NVML name with the vendor, doubling it on newer cards
    ("NVIDIA-NVIDIA A100-SXM4-80GB"): show it once so that the model fits."""
    return name.removeprefix("NVIDIA-") if name.startswith("NVIDIA-NVIDIA ") else name


def heard(node: NodeView, now: float) -> Text:
    ago = heard_ago(node, now)
    if ago is None:
        return Text("no report", style="dim")
    if is_silent(node, now):
        return Text(f"silent {ago:.0f}s", style="bold red")
    return Text(f"heard {ago:.0f}s ago", style="dim")


def heard_ago(node: NodeView, now: float) -> float | None:
    if node.heard_at is None:
        return None
    return max(0.0, now - node.heard_at)  # agent clocks may run a little ahead of ours


def is_silent(node: NodeView, now: float) -> bool:
    ago, interval = heard_ago(node, now), node.heartbeat_interval
    return ago is not None and bool(interval) and ago > SILENT_HEARTBEATS * (interval or 0.0)


def memory_bar(used: int, total: int) -> Text:
    share = min(1.0, used / total) if total else 0.0
    filled = round(share * MEMORY_BAR_WIDTH)
    if used and not filled:
        filled = 1  # any use shows
    style = "green" if share < 0.7 else "yellow" if share < 0.9 else "red"
    return Text.assemble(("█" * filled, style), ("░" * (MEMORY_BAR_WIDTH - filled), "dim"))


def health(card: CardView) -> Text:
    if not card.health:
        return Text(card.health_detail or "unhealthy", style="bold red")
    if card.cordoned:
        return Text("cordoned", style="yellow")
    return Text("ok", style="green")


def decisions_table(model: WatchModel, fit: bool = True) -> RenderableType:
    if not model.decisions:
        return Text("decisions: none yet", style="dim")
    table = titled_table("recent decisions")
    table.add_column("time", no_wrap=True)
    table.add_column("pod", overflow="fold", max_width=32 if fit else None)
    table.add_column("result", overflow="fold")
    table.add_column("ms", justify="right", no_wrap=True)
    table.add_column("ignored", overflow="fold", max_width=16 if fit else None)
    for event in reversed(model.decisions):
        pod = Text(event.pod)
        if event.verb != "filter":
            pod.append(f" {event.verb}", style="dim")
        table.add_row(clock(event.timestamp), pod, outcome(event), f"{event.duration_ms:.1f}",
                      ", ".join(event.ignored_policies))
    return table


def clock(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%H:%M:%S")


def outcome(event: DecisionEvent) -> Text:
    if event.scheduled:
        indexes = ",".join(str(card.index) for cards in event.cards for card in cards)
        return Text(f"{event.node} GPU {indexes}", style="green")
    return Text.assemble(("Pending", "bold yellow"), f" ({pending_reason(event)})")


def pending_reason(event: DecisionEvent) -> str:
    """The pod's own rejection, else the shortest node reason: the nearest miss to read first."""
    if event.reason:
        return event.reason
    if not event.failed_nodes:
        return "no node holds GPU cards"
    node, why = min(event.failed_nodes.items(), key=lambda item: (len(item[1]), item[0]))
    others = len(event.failed_nodes) - 1
    return f"{node}: {why}" + (f"; +{plural(others, 'node')}" if others else "")


def selection_path(event: DecisionEvent) -> Table:
    table = titled_table(f"selection path of {event.pod} on {event.node}, "
                         f"{clock(event.timestamp)}")
    for column in ("GPU", "tenants", "score", "filtered by", "rank", ""):
        table.add_column(column, justify="right" if column in ("GPU", "tenants", "score",
                                                                 "rank") else "left")
    for row in event.explain:
        table.add_row(str(row.index), str(row.used), f"{row.score:.6f}", row.filtered_by or "-",
                      "-" if row.rank is None else str(row.rank),
                      Text("◀ chosen", style="bold green") if row.chosen else "")
    return table


def footer(model: WatchModel) -> Text:
    text = Text(f"{model.source} ", style="dim")
    text.append(model.connection, style="green" if model.connection == "connected" else "yellow")
    if model.connection != "connected" and model.connection_error:
        text.append(f" ({model.connection_error})", style="yellow")
    text.append(f" · {plural(len(model.nodes), 'node')}"
                f" · {plural(model.decisions_seen, 'decision')} seen, "
                f"{model.pending_seen} pending", style="dim")
    if model.undecodable:
        text.append(f" · {plural(model.undecodable, 'undecodable message')}", style="bold red")
    return text


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


# The view as JSON (``--output json``): one object per line, its kind in "event".


def snapshot_document(model: WatchModel, now: float) -> dict[str, Any]:
    """What the table view shows at ``now``, whole (``--once --output json``)."""
    return {
        "event": "snapshot",
        "time": now,
        "source": model.source,
        "connection": model.connection,
        "nodes": [node_document(model.nodes[name], now) for name in sorted(model.nodes)],
        "decisions": [msgspec.to_builtins(event) for event in model.decisions],  # oldest first
        "decisions_seen": model.decisions_seen,
        "pending_seen": model.pending_seen,
        "undecodable": model.undecodable,
    }


def node_document(node: NodeView, now: float) -> dict[str, Any]:
    return {
        "node": node.name,
        "heard_at": node.heard_at,
        "silent": is_silent(node, now),
        "cards": [card_document(card)
                  for card in sorted(node.cards.values(), key=lambda c: c.index)],
    }


def card_document(card: CardView) -> dict[str, Any]:
    usage = card.usage
    return {
        "uuid": card.uuid, "index": card.index, "type": card.type, "memory": card.memory,
        "cores": card.cores, "count": card.count, "health": card.health,
        "health_detail": card.health_detail, "cordoned": card.cordoned,
        "usage": None if usage is None else {
            "tenants": usage.tenants, "used": usage.used, "usedmem": usage.usedmem,
            "usedcores": usage.usedcores},
    }


def message_document(kind: str, message: msgspec.Struct) -> dict[str, Any]:
    """A message as heard (``--output json`` without --once): ``usage``, ``decision`` or
    ``inventory``, then the message's own fields."""
    fields: dict[str, Any] = msgspec.to_builtins(message)
    return {"event": kind, **fields}


# The async shell.

Emit = Callable[[dict[str, Any]], None]
"""Prints one JSON line (``--output json``)."""
Show = Callable[[WatchModel, float], None]
"""Prints the model as it stands at a time (``--once``)."""


def run(args: argparse.Namespace) -> int:
    try:
        settings = nats_settings(args)
    except SettingsError as error:
        print(f"pyhami watch: {error}", file=sys.stderr)
        return 2
    model = WatchModel(args.decisions, ",".join(settings.servers))
    with connection_errors_into(model):
        if args.once:
            return uvloop.run(snapshot(settings, model, args.wait, shown_as(args.output)))
        if args.output == "json":
            return uvloop.run(stream(settings, model))
        return uvloop.run(live(settings, model, stdout_console()))


def shown_as(output: str) -> Show:
    if output == "json":
        return lambda model, now: print_json(snapshot_document(model, now), indent=None)
    console = stdout_console()
    return lambda model, now: console.print(render(model, now))


@contextlib.contextmanager
def connection_errors_into(model: WatchModel) -> Iterator[None]:
    """The NATS client logs each failed connection attempt: show the latest in the footer
    rather than let the log scribble over the view."""

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                model.connection_error = record.getMessage()

    messaging_log = logging.getLogger("common.messaging")
    recorder = Recorder()
    propagate = messaging_log.propagate
    messaging_log.addHandler(recorder)
    messaging_log.propagate = False
    try:
        yield
    finally:
        messaging_log.removeHandler(recorder)
        messaging_log.propagate = propagate


def stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    stopping.stop_on_signals(stop.set)
    return stop


async def snapshot(settings: NatsSettings, model: WatchModel, wait: float, show: Show) -> int:
    stop = stop_on_signals()
    try:
        client = await asyncio.wait_for(listen(settings, model), wait)
    except TimeoutError:
        detail = f" ({model.connection_error})" if model.connection_error else ""
        print(f"pyhami watch: cannot reach NATS at {model.source} within {wait:g} s{detail}",
              file=sys.stderr)
        return 1
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)
        show(model, time.time())  # before closing, which reads as a disconnect
    finally:
        await client.close()
    return 0


async def live(settings: NatsSettings, model: WatchModel, console: Console) -> int:
    stop = stop_on_signals()
    listening = asyncio.create_task(listen(settings, model))
    try:
        if console.is_terminal:
            # Redrawn from this loop rather than Live's own thread, which would read the
            # model while the message callbacks change it.
            with Live(console=console, screen=True, auto_refresh=False) as view:
                await until_stopped(listening, stop, lambda: view.update(
                    render(model, time.time()), refresh=True))
        else:  # no screen to redraw: the view as it stands when stopped
            await until_stopped(listening, stop)
            console.print(render(model, time.time()))
    finally:
        await close(listening)  # after the last frame, which would read it as a disconnect
    return 0


async def stream(settings: NatsSettings, model: WatchModel) -> int:
    """A JSON line on stdout for each message heard, until a signal or the reader leaves."""
    stop = stop_on_signals()

    def emit(document: dict[str, Any]) -> None:
        if stop.is_set():
            return
        try:
            print_json(document, indent=None)
        except BrokenPipeError:
            # The reader is gone (``| head``): stop, and let nothing write there at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            stop.set()

    listening = asyncio.create_task(listen(settings, model, emit))
    try:
        await until_stopped(listening, stop)
    finally:
        await close(listening)
    return 0


async def until_stopped(listening: asyncio.Task[Client], stop: asyncio.Event,
                        tick: Callable[[], None] | None = None) -> None:
    """Wait for ``stop``, calling ``tick`` every REFRESH_S; raise what stopped the listener,
    if anything did."""
    while not stop.is_set():
        if listening.done():
            listening.result()
        if tick is not None:
            tick()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), REFRESH_S)


async def close(listening: asyncio.Task[Client]) -> None:
    """Close the listener's client, or stop it connecting."""
    if listening.done() and not listening.cancelled() and listening.exception() is None:
        await listening.result().close()
    else:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)


async def listen(settings: NatsSettings, model: WatchModel, emit: Emit | None = None) -> Client:
    """Connect (retrying for as long as it takes), subscribe, and ask the agents to report.
    With ``emit``, every message heard and every change of the connection is also a line."""

    def connection(state: str) -> None:
        model.connection = state
        if emit is not None:
            emit({"event": "connection", "state": state, "source": model.source})

    async def disconnected() -> None:
        connection("disconnected, reconnecting")

    async def reconnected() -> None:
        connection("connected")

    client = await connect(settings, CLIENT_NAME, on_disconnected=disconnected,
                           on_reconnected=reconnected)
    connection("connected")
    try:
        await client.subscribe(telemetry.USAGE_SUBJECTS, cb=folding(
            model, "usage", decode_usage, model.apply_usage, emit))
        await client.subscribe(telemetry.DECISIONS_SUBJECT, cb=folding(
            model, "decision", decode_decision, model.apply_decision, emit))
        await client.subscribe(INVENTORY_SUBJECTS, cb=folding(
            model, "inventory", decode_inventory, model.apply_inventory, emit))
        await client.flush()  # subscribed at the server before the agents answer
        # Usage only goes out on change: the agents' inventories fill the view meanwhile.
        await client.publish(RESYNC_SUBJECT, encode_wire(ResyncRequest(requested_by=CLIENT_NAME)))
    except BaseException:
        await client.close()
        raise
    return client


def folding(model: WatchModel, kind: str, decode: Callable[[bytes], Decoded],
            apply: Callable[[Decoded], None],
            emit: Emit | None = None) -> Callable[[Msg], Awaitable[None]]:
    """A subscription callback: decode, fold into the model, count what does not decode;
    with ``emit``, print each as a JSON line too."""

    async def on_message(message: Msg) -> None:
        try:
            event = decode(message.data)
        except (msgspec.DecodeError, WireError) as error:
            model.note_undecodable()
            if emit is not None:
                emit({"event": "undecodable", "subject": message.subject, "error": str(error)})
            return
        apply(event)
        if emit is not None:
            emit(message_document(kind, event))

    return on_message


def decode_usage(data: bytes) -> UsageEvent:
    return checked(telemetry.decode_usage(data))


def decode_decision(data: bytes) -> DecisionEvent:
    return checked(telemetry.decode_decision(data))


def checked(event: TelemetryEvent) -> TelemetryEvent:
    if event.schema != telemetry.SCHEMA_VERSION:
        raise WireError(f"telemetry schema version {event.schema} is not supported")
    return event
