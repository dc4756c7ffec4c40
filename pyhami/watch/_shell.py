"""The command around the model and the view: its arguments, the NATS subscription, and
the loops that print a snapshot, redraw the live view or stream JSON lines until stopped."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import msgspec
import uvloop
from nats.aio.client import Client
from nats.aio.msg import Msg
from rich.console import Console
from rich.live import Live

from common import stopping, telemetry
from common.arguments import Subcommands, positive_int, positive_seconds
from common.busaccess import WATCH_USER
from common.core.errors import SettingsError
from common.messaging import (
    NatsSettings,
    add_nats_arguments,
    connect,
    nats_settings,
)
from common.telemetry import DecisionEvent, UsageEvent
from common.wire import (
    INVENTORY_SUBJECTS,
    RESYNC_SUBJECT,
    ResyncRequest,
    WireError,
    decode_inventory,
)
from common.wire import encode as encode_wire
from pyhami.output import add_output_argument, print_json, silence_stdout, stdout_console
from pyhami.watch._model import WatchModel
from pyhami.watch._view import message_document, render, snapshot_document

CLIENT_NAME = telemetry.WATCH_CLIENT
REFRESH_S = 0.25

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
        if console.is_interactive:
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
            # The reader is gone (``| head``): the stream's end, as a signal would be.
            silence_stdout()
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
        # The read-only watcher user may not ask (the server would refuse it): nodes then
        # appear with their agents' next heartbeats.
        if settings.user != WATCH_USER:
            await client.publish(RESYNC_SUBJECT,
                                 encode_wire(ResyncRequest(requested_by=CLIENT_NAME)))
    except BaseException:
        await client.close()
        raise
    return client


def folding(model: WatchModel, kind: str, decode: Callable[[bytes], Decoded],
            apply: Callable[[Decoded], bool | None],
            emit: Emit | None = None) -> Callable[[Msg], Awaitable[None]]:
    """A subscription callback: decode, fold into the model, count what does not decode;
    with ``emit``, print each the model takes (a replayed decision it leaves out is not)
    as a JSON line too."""

    async def on_message(message: Msg) -> None:
        try:
            event = decode(message.data)
        except (msgspec.DecodeError, WireError) as error:
            model.note_undecodable()
            if emit is not None:
                emit({"event": "undecodable", "subject": message.subject, "error": str(error)})
            return
        if apply(event) is False:
            return
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
