"""The extender's listener: verbs read by the lean reader, everything else handed to
aiohttp on the same connection, with the bytes read so far."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TypeVar

import pytest
import uvloop
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyhami.natsserver import free_port
from scheduler.web.extender import Answer, BodyVerb
from scheduler.web.fastpath import HEAD_LIMIT, VerbsServer
from scheduler.web.limits import EXTENDER_BODY_LIMIT, read_body

T = TypeVar("T")
Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def echo(body: bytes) -> Answer:
    return Answer(200, "application/json", b'{"echo":' + str(len(body)).encode() + b"}")


async def broken(_: bytes) -> Answer:
    raise RuntimeError("a bug in a verb")


class Slow:
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.finished: list[bytes] = []

    async def __call__(self, body: bytes) -> Answer:
        await self.release.wait()
        self.finished.append(body)
        return Answer(200, "text/plain; charset=utf-8", body)


@pytest.fixture
async def listener() -> AsyncIterator[tuple[Connect, Slow]]:
    slow = Slow()
    verbs: dict[str, BodyVerb] = {"/filter": echo, "/bind": echo, "/broken": broken,
                                  "/slow": slow}

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def aiohttp_filter(request: web.Request) -> web.Response:
        body = await read_body(request, EXTENDER_BODY_LIMIT)
        return web.Response(text=f"aiohttp read {len(body)}\n")

    app = web.Application(client_max_size=EXTENDER_BODY_LIMIT)
    app.add_routes([web.get("/healthz", healthz), web.post("/filter", aiohttp_filter)])
    port = free_port()
    server = await VerbsServer.start(app, verbs, ("127.0.0.1", port), None)

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", port)

    yield connect, slow
    slow.release.set()
    await server.cleanup()


def post(path: str, body: bytes, *extra: bytes) -> bytes:
    return b"".join([f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode(), *(h + b"\r\n" for h in extra),
                     f"Content-Length: {len(body)}\r\n\r\n".encode(), body])


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    if status == 100:  # Continue: the answer follows
        return await answer(reader)
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:]
                                                     if line)}
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:  # chunked: read to the end
        body = await asyncio.wait_for(reader.read(), 5)
    return status, headers, body


async def test_verbs_are_answered_one_after_the_other_on_one_connection(
        listener: tuple[Connect, Slow]) -> None:
    reader, writer = await listener[0]()
    # Three requests in one write, the last split across two.
    pipelined = post("/filter", b"x" * 10) + post("/bind", b"") + post("/filter", b"abc")
    writer.write(pipelined[:-2])
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.write(pipelined[-2:])
    for expected in (b'{"echo":10}', b'{"echo":0}', b'{"echo":3}'):
        status, headers, body = await answer(reader)
        assert (status, headers["content-type"], body) == (200, "application/json", expected)
    writer.close()


@pytest.mark.parametrize(("request_bytes", "status", "says"), [
    # Another method or path: aiohttp's.
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 200, b"ok\n"),
    (b"POST /explain HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 404, b""),
    # A verb asked in a way the reader does not take: aiohttp's route answers.
    (b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"3\r\nabc\r\n0\r\n\r\n", 200, b"aiohttp read 3\n"),
    (post("/filter", b"abcd", b"Expect: 100-continue"), 200, b"aiohttp read 4\n"),
    (b"POST /filter HTTP/1.0\r\nContent-Length: 2\r\n\r\nab", 200, b"aiohttp read 2\n"),
    (b"POST /filter HTTP/1.1\r\nHost: x\r\n\r\n", 200, b"aiohttp read 0\n"),
    (b"POST /filter HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab", 400, b""),
    (b"POST /filter HTTP/1.1\r\nContent-Length : 2\r\n\r\nab", 400, b""),
    (b"POST /filter HTTP/1.1\r\nContent-Length: -2\r\n\r\n", 400, b""),
    (f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {EXTENDER_BODY_LIMIT + 1}\r\n"
     f"\r\n".encode(), 413, b""),
    (b"POST /filter HTTP/1.1\r\nContent-Length: 2\r\n\r\nab", 400, b""),  # no Host
    # A header line longer than aiohttp allows, or a head longer than the reader reads.
    (b"POST /filter HTTP/1.1\r\nX: " + b"a" * 8200 + b"\r\nContent-Length: 0\r\n\r\n",
     400, b""),
    (b"POST /filter HTTP/1.1\r\n" + b"X: a\r\n" * (HEAD_LIMIT // 6) + b"\r\n", 400, b""),
    (b"NOT HTTP AT ALL\r\n\r\n", 400, b""),
])
async def test_what_the_reader_does_not_take_is_aiohttps_to_answer(
        listener: tuple[Connect, Slow], request_bytes: bytes, status: int,
        says: bytes) -> None:
    reader, writer = await listener[0]()
    # A verb first, so that the hand-over happens on a connection already used.
    writer.write(post("/bind", b"{}") + request_bytes)
    assert (await answer(reader))[2] == b'{"echo":2}'
    got, _, body = await answer(reader)
    assert got == status
    if says:
        assert body == says
    writer.close()


async def test_a_client_sending_far_ahead_of_its_answers_gets_them_all(
        listener: tuple[Connect, Slow]) -> None:
    connect, slow = listener
    reader, writer = await connect()
    big = b"x" * (5 * 1024 * 1024)
    # The first verb waits: the two requests after it pass the buffer's bound, and the
    # reader stops reading until the answers go out.
    writer.write(post("/slow", b"first") + post("/filter", big) + post("/filter", big))
    await asyncio.sleep(0.2)
    slow.release.set()
    await writer.drain()
    bodies = [(await answer(reader))[2] for _ in range(3)]
    assert bodies == [b"first", b'{"echo":5242880}', b'{"echo":5242880}']
    writer.close()


async def test_a_verb_that_fails_is_a_500_and_the_connection_ends(
        listener: tuple[Connect, Slow]) -> None:
    reader, writer = await listener[0]()
    writer.write(post("/broken", b"{}") + post("/filter", b""))
    status, headers, _ = await answer(reader)
    assert (status, headers["connection"]) == (500, "close")
    assert await asyncio.wait_for(reader.read(), 5) == b""


async def test_connection_close_is_honoured(listener: tuple[Connect, Slow]) -> None:
    reader, writer = await listener[0]()
    writer.write(post("/filter", b"ab", b"Connection: close"))
    status, headers, body = await answer(reader)
    assert (status, headers["connection"], body) == (200, "close", b'{"echo":2}')
    assert await asyncio.wait_for(reader.read(), 5) == b""


async def test_a_client_gone_before_its_answer_leaves_the_listener_serving(
        listener: tuple[Connect, Slow]) -> None:
    connect, slow = listener
    reader, writer = await connect()
    writer.write(post("/slow", b"late"))
    await writer.drain()
    writer.close()
    await asyncio.sleep(0.05)
    slow.release.set()
    reader, writer = await connect()
    writer.write(post("/slow", b"next"))
    assert (await answer(reader))[2] == b"next"
    writer.close()
    # The verb of the client that left ran to its end, as aiohttp lets a handler finish.
    assert slow.finished == [b"late", b"next"]


async def test_stopping_lets_the_verb_under_way_answer_first() -> None:
    slow = Slow()
    port = free_port()
    server = await VerbsServer.start(web.Application(), {"/slow": slow}, ("127.0.0.1", port),
                                     None)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/slow", b"last"))
    await writer.drain()
    await asyncio.sleep(0.05)
    stopping = asyncio.ensure_future(server.cleanup())
    await asyncio.sleep(0.05)
    slow.release.set()
    assert (await answer(reader))[2] == b"last"
    await stopping
    assert await asyncio.wait_for(reader.read(), 5) == b""


async def test_stopping_closes_kept_alive_connections() -> None:
    app = web.Application()
    port = free_port()
    server = await VerbsServer.start(app, {"/filter": echo}, ("127.0.0.1", port), None)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/filter", b""))
    assert (await answer(reader))[0] == 200
    await server.cleanup()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


# Fuzz: the listener's door ----------------------------------------------------------------


class ListenerThread:
    """A VerbsServer with aiohttp behind it on a uvloop event loop (the daemon's) of its
    own thread, for hypothesis to drive with blocking sockets."""

    def __init__(self) -> None:
        self.port = free_port()
        self.loop = uvloop.new_event_loop()  # the daemon's loop
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = self._run(self._start())

    def _run(self, work: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(10)  # type: ignore[arg-type]

    async def _start(self) -> VerbsServer:
        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok\n")

        app = web.Application(client_max_size=EXTENDER_BODY_LIMIT)
        app.add_routes([web.get("/healthz", healthz)])
        return await VerbsServer.start(app, {"/filter": echo}, ("127.0.0.1", self.port), None)

    def stop(self) -> None:
        self._run(self.server.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def statuses(raw: bytes) -> list[int]:
    """The status codes of the answers in ``raw``."""
    return [int(match) for match in re.findall(rb"HTTP/1\.[01] (\d{3}) ", raw)]


_METHODS = st.sampled_from([b"POST", b"GET", b"PUT", b"post", b"", b"POST POST"])
_PATHS = st.sampled_from([b"/filter", b"/healthz", b"/filter?x=1", b"/other", b"filter", b""])
_VERSIONS = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2", b"HTTP/1.1 x", b""])
_HEADERS = st.lists(st.one_of(
    st.sampled_from([b"Host: x", b"Content-Length: 3", b"Content-Length: 99999999",
                     b"Content-Length: -1", b"Content-Length: 3x", b"Transfer-Encoding: chunked",
                     b"Connection: close", b"Expect: 100-continue", b"Host:", b"X Y: z",
                     b" folded", b"Upgrade: h2c"]),
    st.binary(max_size=40)), max_size=6)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    line = b" ".join([draw(_METHODS), draw(_PATHS), draw(_VERSIONS)])
    head = b"\r\n".join([line, *draw(_HEADERS)])
    return head + b"\r\n\r\n" + draw(st.binary(max_size=8))


@pytest.fixture(scope="module")
def listener_thread() -> Iterator[ListenerThread]:
    running = ListenerThread()
    yield running
    running.stop()


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sent=st.lists(requests(), min_size=1, max_size=3), cut=st.integers(0, 200))
def test_fuzzed_requests_never_get_a_server_error_and_the_listener_keeps_serving(
        listener_thread: ListenerThread, sent: list[bytes], cut: int) -> None:
    raw = b"".join(sent)
    with socket.create_connection(("127.0.0.1", listener_thread.port), timeout=5) as client:
        # The server may close the connection after a 400 before all is sent.
        with contextlib.suppress(OSError):
            client.sendall(raw[:cut])
            client.sendall(raw[cut:])
            client.shutdown(socket.SHUT_WR)
        answers = b""
        with contextlib.suppress(OSError):
            while chunk := client.recv(65536):
                answers += chunk
    assert not [status for status in statuses(answers) if status >= 500], answers[:300]
    with socket.create_connection(("127.0.0.1", listener_thread.port), timeout=5) as client:
        client.sendall(post("/filter", b"abc"))
        assert client.recv(65536).startswith(b"HTTP/1.1 200 OK")
