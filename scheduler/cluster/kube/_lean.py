"""``LeanClient``: HTTP/1.1 to an API server reached directly, on asyncio protocols over
the endpoint's TLS context, its connections kept alive in a pool.

aiohttp's client cost the daemon about 0.2 ms of CPU a call, the Binding POST of every
pod among them, and its watch stream went through three async generators an event
(docs/performance.md, "Where the daemon's time goes"). The API server asks nothing of
HTTP beyond a request written whole and an answer framed by length or chunks: here a
request is one write, its answer is read by ``ResponseReader`` in the protocol's callback,
and a watch's body goes to its consumer from that same callback, with no task between.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

from scheduler.cluster.kube._http import (
    CONNECT_TIMEOUT_S,
    POOL_SIZE,
    READ_TIMEOUT_S,
    USER_AGENT,
    WATCH_DEADLINE_S,
    Answer,
    ConnectionClosed,
    Endpoint,
    HttpFailure,
)
from scheduler.cluster.kube._response import ResponseReader

KEEP_ALIVE_S = 15.0
"""A connection idle this long is closed rather than reused (aiohttp's default): the
server may be closing it as it is written to."""
# Sent again on a fresh connection when a reused one closed before any byte of the answer
# (the server closed it idle as the request went out): safe only where a repeat is.
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


class _Connection(asyncio.Protocol):
    """One connection to the API server, one exchange at a time: a request written, its
    answer fed to a ``ResponseReader`` as it arrives, the waiter woken when it is whole
    or has failed. A failed exchange aborts the connection: it is never used again."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._reader: ResponseReader | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._last_read = 0.0
        self.closed = False
        self.used = False  # has carried an exchange: a close before the answer may be stale
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        if reader is None:  # nothing asked: the connection is out of step with the server
            self.abort()
            return
        self._last_read = self._loop.time()
        try:
            done = reader.feed(data)
        except Exception as error:  # malformed, or the stream's consumer refused a line
            self._fail(error)
            return
        if done:
            self._wake()

    def eof_received(self) -> bool:
        self.closed = True  # not to be taken from the pool before connection_lost comes
        self._ended(None)
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._ended(exc)

    def _ended(self, exc: Exception | None) -> None:
        reader = self._reader
        if reader is None or self._waiter is None or self._waiter.done():
            return
        try:
            reader.eof()
        except ConnectionClosed as error:
            if exc is not None:
                error.__cause__ = exc
            self._fail(error)
            return
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error)
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    async def exchange(self, request: bytes, reader: ResponseReader, *,
                       deadline: bool) -> None:
        """Write the request, wait until ``reader`` holds the whole answer. Timed out
        after ``READ_TIMEOUT_S`` without a byte, or with ``deadline`` after
        ``WATCH_DEADLINE_S`` in all."""
        assert self._transport is not None
        if self.closed or self._transport.is_closing():
            raise ConnectionClosed("the API server closed the connection before any answer")
        self.used = True
        loop = self._loop
        self._reader = reader
        waiter = self._waiter = loop.create_future()
        self._last_read = loop.time()
        timer = (loop.call_later(WATCH_DEADLINE_S, self._past_deadline) if deadline
                 else loop.call_later(READ_TIMEOUT_S, self._check_reading))
        try:
            self._transport.write(request)
            await waiter
        finally:
            timer.cancel()
            self._reader = None
            self._waiter = None

    def _check_reading(self) -> None:
        # One timer a call rather than one a read: it checks when the last byte came.
        if self._waiter is None or self._waiter.done():
            return
        quiet = self._loop.time() - self._last_read
        if quiet >= READ_TIMEOUT_S:
            self._fail(TimeoutError(f"no answer from the API server for {READ_TIMEOUT_S:g} s"))
            return
        self._loop.call_later(READ_TIMEOUT_S - quiet, self._check_reading)

    def _past_deadline(self) -> None:
        self._fail(TimeoutError(f"the watch ran past {WATCH_DEADLINE_S:g} s"))


class ConnectionPool:
    """At most ``size`` connections open, the idle ones reused newest first; a request
    past the bound waits until one comes back or closes."""

    def __init__(self, endpoint: Endpoint, size: int = POOL_SIZE) -> None:
        url = urlsplit(endpoint.base_url)
        if url.scheme not in ("http", "https") or url.hostname is None:
            raise ValueError(f"not an http(s) URL: {endpoint.base_url}")
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self.authority = url.netloc.rpartition("@")[2]
        self._ssl = endpoint.ssl_context if url.scheme == "https" else None
        if url.scheme == "https" and self._ssl is None:  # the system's trust, as aiohttp's
            self._ssl = ssl.create_default_context()
        self._server_name = endpoint.server_name
        self._size = size
        self._open = 0
        self._idle: list[_Connection] = []
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    async def acquire(self) -> _Connection:
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise ConnectionClosed("the API client is closed")
            now = loop.time()
            while self._idle:
                connection = self._idle.pop()
                if not connection.closed and now - connection.idle_since < KEEP_ALIVE_S:
                    return connection
                self._discard(connection)
            if self._open < self._size:
                self._open += 1
                try:
                    return await self._connect()
                except BaseException:
                    self._open -= 1
                    self._wake_one()
                    raise
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken as it was cancelled: pass the turn on
                raise

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, connection = await loop.create_connection(
                    _Connection, self._host, self._port, ssl=self._ssl,
                    server_hostname=(self._server_name or self._host) if self._ssl else None)
        except TimeoutError as error:
            raise TimeoutError(f"no connection to the API server at {self.authority} in "
                               f"{CONNECT_TIMEOUT_S:g} s") from error
        return connection

    def release(self, connection: _Connection, reusable: bool) -> None:
        """Take a connection back: kept for the next request when ``reusable`` (its last
        answer read whole, nothing after it), else closed."""
        if reusable and not connection.closed and not self._closed:
            connection.idle_since = asyncio.get_running_loop().time()
            self._idle.append(connection)
        else:
            self._discard(connection)
        self._wake_one()

    def _discard(self, connection: _Connection) -> None:
        connection.abort()
        self._open -= 1

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
            self._open -= 1
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)  # wakes to find the pool closed
        self._waiters.clear()


class LeanClient:
    """``HttpClient`` on ``ConnectionPool``: one write a request, the answer read in the
    connection's callback."""

    def __init__(self, endpoint: Endpoint, size: int = POOL_SIZE) -> None:
        self._pool = ConnectionPool(endpoint, size)
        # What every request says first, after its request line.
        self._common = (f"Host: {self._pool.authority}\r\nUser-Agent: {USER_AGENT}\r\n"
                        "Accept: application/json\r\n")

    def _request(self, method: str, target: str, authorization: str | None,
                 body: bytes | None, content_type: str | None) -> bytes:
        head = [f"{method} {target} HTTP/1.1\r\n", self._common]
        if authorization:
            if "\r" in authorization or "\n" in authorization:
                raise HttpFailure("the Authorization header holds a line break")
            head.append(f"Authorization: {authorization}\r\n")
        if body is not None:
            if content_type is not None:
                head.append(f"Content-Type: {content_type}\r\n")
            head.append(f"Content-Length: {len(body)}\r\n")
        head.append("\r\n")
        request = "".join(head).encode("latin-1")
        return request + body if body else request

    async def request(self, method: str, target: str, *, authorization: str | None,
                      body: bytes | None, content_type: str | None) -> Answer:
        request = self._request(method, target, authorization, body, content_type)
        retry = method in _IDEMPOTENT
        while True:
            connection = await self._pool.acquire()
            reused = connection.used
            reader = ResponseReader()
            whole = False
            try:
                await connection.exchange(request, reader, deadline=False)
                whole = True
            except ConnectionClosed:
                if retry and reused and not reader.received:
                    retry = False
                    continue  # a stale kept-alive connection: once more on another
                raise
            finally:
                self._pool.release(connection, whole and reader.keep_alive)
            return Answer(reader.status, reader.reason, reader.body())

    async def stream(self, target: str, *, authorization: str | None,
                     on_open: Callable[[], None],
                     on_data: Callable[[bytes], None]) -> Answer | None:
        request = self._request("GET", target, authorization, None, None)
        connection = await self._pool.acquire()
        reader = ResponseReader(on_data, on_open)
        whole = False
        try:
            await connection.exchange(request, reader, deadline=True)
            whole = True
        finally:
            self._pool.release(connection, whole and reader.keep_alive)
        return Answer(reader.status, reader.reason, reader.body()) if reader.status >= 400 \
            else None

    async def close(self) -> None:
        self._pool.close()
