"""The extender's listener: a lean HTTP/1.1 reader for the POSTs kube-scheduler makes,
every other request handed to aiohttp on the same connection.

kube-scheduler calls /filter and /bind for every pod, over kept-alive connections, with
a Content-Length and nothing else asked of HTTP. aiohttp's web framework spent about
0.35 ms of the daemon's CPU on each such pair before any decision (docs/performance.md,
"The HTTP layer"); this reader parses the request line and headers itself, calls the
verb with the body and writes the answer. The first request it does not take whole (any
other method or path, HTTP/1.0, a chunked body, ``Expect``, an upgrade, a header block
or body over the bounds) hands the connection, with every byte read so far, to aiohttp's
own protocol for the rest of its life: /explain, the probes, the pod API, and the 400s,
413s and 431s of malformed input are aiohttp's, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import cast

from aiohttp import web

from scheduler.web.extender import TEXT, Answer, BodyVerb
from scheduler.web.limits import EXTENDER_BODY_LIMIT
from scheduler.web.probes import HTTP_SHUTDOWN_S, set_up

logger = logging.getLogger(__name__)

HEAD_LIMIT = 8190
"""A request line and headers longer than this, together, are aiohttp's to read: its
bound on one line (8190 bytes) refuses what this reader would otherwise take."""
IDLE_TIMEOUT_S = 75.0
"""A connection with no request under way is closed after this long: aiohttp's
keep-alive timeout, and longer than Go's 90 s idle timeout needs (the client closes
first or sends)."""

_HEAD_END = b"\r\n\r\n"
# A header field as RFC 9110 writes it: a token, a colon, the value without control
# characters, spaces around it dropped.
_FIELD = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*((?:[^\x00-\x08\x0a-\x1f\x7f]*"
                    rb"[^\x00-\x20\x7f])?)[ \t]*")
# Headers that ask for more than a body of known length answered at once.
_NOT_SIMPLE = (b"transfer-encoding", b"expect", b"upgrade")

ProtocolFactory = Callable[[], asyncio.Protocol]


class _Request:
    __slots__ = ("body_end", "close", "path")

    def __init__(self, path: str, body_end: int, close: bool) -> None:
        self.path = path
        self.body_end = body_end
        self.close = close


def _simple_request(buffer: bytearray, head_end: int,
                    verbs: Mapping[str, BodyVerb]) -> _Request | None:
    """The request at the start of ``buffer`` if it is a POST to a verb this reader
    takes whole; None for anything else (aiohttp's to answer)."""
    head = bytes(buffer[:head_end])
    line, _, fields = head.partition(b"\r\n")
    parts = line.split(b" ")
    if len(parts) != 3 or parts[0] != b"POST" or parts[2] != b"HTTP/1.1":
        return None
    try:
        path = parts[1].decode("ascii")
    except UnicodeDecodeError:
        return None
    if path not in verbs:
        return None
    length: int | None = None
    close = False
    hosts = 0  # HTTP/1.1 asks for exactly one; aiohttp refuses a request without
    for line in fields.split(b"\r\n"):
        field = _FIELD.fullmatch(line)
        if field is None:  # not a token, a colon and visible characters: aiohttp's to judge
            return None
        name, value = field[1].lower(), field[2]
        if name == b"content-length":
            if length is not None or not value.isdigit():
                return None
            length = int(value)
        elif name == b"host":
            hosts += 1
        elif name == b"connection":
            close = b"close" in value.lower()
        elif name in _NOT_SIMPLE:
            return None
    if length is None or length > EXTENDER_BODY_LIMIT or hosts != 1:
        return None
    return _Request(path, head_end + len(_HEAD_END) + length, close)


def _response(answer: Answer, close: bool) -> bytes:
    status, content_type, body = answer
    reason = HTTPStatus(status).phrase
    connection = b"Connection: close\r\n" if close else b""
    return b"".join((
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n".encode(), connection, b"\r\n", body))


class VerbsProtocol(asyncio.Protocol):
    """One connection: verbs answered here, one at a time in the order sent, until a
    request this reader does not take hands the connection to ``fallback()``."""

    def __init__(self, verbs: Mapping[str, BodyVerb], fallback: ProtocolFactory,
                 connections: set[VerbsProtocol]) -> None:
        self._verbs = verbs
        self._fallback = fallback
        self._connections = connections
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._answering: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._paused = False
        self._writable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport's subclasses, only alike.
        self._transport = cast(asyncio.Transport, transport)
        self._connections.add(self)
        self._wait_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        # A verb under way goes on to its end, its answer dropped, as aiohttp lets a
        # handler finish (its handler_cancellation is off): a /bind stopped between its
        # Binding and its booking would leave the ledger behind the cluster.
        self._connections.discard(self)
        self._transport = None
        if self._idle is not None:
            self._idle.cancel()

    @property
    def answering(self) -> asyncio.Task[None] | None:
        """The verb under way on this connection, if any."""
        return self._answering

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) > EXTENDER_BODY_LIMIT + HEAD_LIMIT and not self._paused:
            # A client sending ahead of its answers waits for them. The buffer then holds
            # a whole request (one within the bounds is shorter), so reading resumes once
            # it is answered.
            assert self._transport is not None
            self._transport.pause_reading()
            self._paused = True
        if self._answering is None:
            self._next()

    def pause_writing(self) -> None:
        self._writable = False

    def resume_writing(self) -> None:
        self._writable = True
        if self._answering is None and self._buffer:
            self._next()

    def close(self) -> None:
        """Close the connection: an answer under way is dropped, its verb goes on."""
        if self._transport is not None:
            self._transport.close()

    def _next(self) -> None:
        """Start answering the next request in the buffer, or wait for more of it; not
        while the client has not read the answers written (the transport's buffer is
        full)."""
        if not self._writable or self._transport is None:
            return
        buffer = self._buffer
        head_end = buffer.find(_HEAD_END, 0, HEAD_LIMIT + len(_HEAD_END))
        if head_end < 0:
            if len(buffer) > HEAD_LIMIT:
                self._hand_over()
            return
        request = _simple_request(buffer, head_end, self._verbs)
        if request is None:
            self._hand_over()
            return
        if len(buffer) < request.body_end:
            return
        body = bytes(buffer[head_end + len(_HEAD_END):request.body_end])
        del buffer[:request.body_end]
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        verb = self._verbs[request.path]
        self._answering = asyncio.get_running_loop().create_task(
            self._answer(verb, body, request.close))

    async def _answer(self, verb: BodyVerb, body: bytes, close: bool) -> None:
        try:
            answer = await verb(body)
        except Exception:
            # What aiohttp does with a handler's exception: a 500 and the traceback logged.
            logger.exception("extender verb failed")
            answer = Answer(500, TEXT, b"500 Internal Server Error\n")
            close = True
        transport = self._transport
        self._answering = None
        if transport is None:
            return
        transport.write(_response(answer, close))
        if close:
            transport.close()
            return
        self._wait_idle()
        if self._buffer:
            self._next()
        if self._paused and len(self._buffer) <= EXTENDER_BODY_LIMIT + HEAD_LIMIT:
            self._paused = False
            transport.resume_reading()

    def _wait_idle(self) -> None:
        self._idle = asyncio.get_running_loop().call_later(IDLE_TIMEOUT_S, self.close)

    def _hand_over(self) -> None:
        """aiohttp's protocol takes the connection with what was read of it."""
        transport = self._transport
        assert transport is not None
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self._connections.discard(self)
        self._transport = None
        taker = self._fallback()
        transport.set_protocol(taker)
        taker.connection_made(transport)
        if self._paused:
            self._paused = False
            transport.resume_reading()
        pending, self._buffer = bytes(self._buffer), bytearray()
        if pending:
            taker.data_received(pending)


class VerbsServer:
    """The extender's listener: ``VerbsProtocol`` on every connection, aiohttp's
    ``app`` behind it; ``cleanup()`` stops both."""

    def __init__(self, runner: web.AppRunner, server: asyncio.AbstractServer,
                 connections: set[VerbsProtocol]) -> None:
        self._runner = runner
        self._server = server
        self._connections = connections

    @classmethod
    async def start(cls, app: web.Application, verbs: Mapping[str, BodyVerb],
                    address: tuple[str, int], tls: ssl.SSLContext | None) -> VerbsServer:
        """Listen on ``address`` (over TLS with ``tls``)."""
        runner = await set_up(app)
        handlers = runner.server
        assert handlers is not None, "the runner is set up"
        connections: set[VerbsProtocol] = set()
        server = await asyncio.get_running_loop().create_server(
            lambda: VerbsProtocol(verbs, handlers, connections), address[0], address[1],
            ssl=tls, reuse_address=True)
        return cls(runner, server, connections)

    async def cleanup(self) -> None:
        """Stop listening, let the verbs under way answer (for up to ``HTTP_SHUTDOWN_S``,
        as aiohttp's shutdown does), then close every connection."""
        self._server.close()
        under_way = [task for connection in self._connections
                     if (task := connection.answering) is not None]
        if under_way:
            await asyncio.wait(under_way, timeout=HTTP_SHUTDOWN_S)
        for connection in list(self._connections):
            connection.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)
        await self._runner.cleanup()
