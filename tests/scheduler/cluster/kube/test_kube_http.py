"""``scheduler.cluster.kube``'s lean HTTP/1.1 client: its answer reader (``_response``)
fuzzed and shown each fault it refuses, and the client (``_lean``, through
``ApiTransport``) against a scripted server on a real socket, plain and TLS: a server
closing mid-answer, malformed answers, a 401 then success, error statuses with a Status
body, a server that never answers, stale and cancelled connections, the pool's bound.

What a real kube-apiserver does with it is in tests/e2e/test_api_client.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.certificates import write_bundle
from scheduler.cluster.kube import _http, _lean, _transport
from scheduler.cluster.kube._http import ConnectionClosed, Endpoint, MalformedResponse
from scheduler.cluster.kube._response import HEAD_LIMIT, ResponseReader
from scheduler.cluster.kube._transport import (
    API_FAILURES,
    ApiStatusError,
    ApiTransport,
    describe_failure,
)

# The answer reader -------------------------------------------------------------------------


def read(raw: bytes, *, cuts: list[int] | None = None, closed: bool = False,
         ) -> ResponseReader:
    """``raw`` fed to a reader in pieces cut at ``cuts`` (every byte apart by default)."""
    reader = ResponseReader()
    points = sorted({0, len(raw), *(cuts if cuts is not None else range(len(raw)))})
    for start, end in itertools.pairwise(points):
        if reader.feed(raw[start:end]) and end == len(raw):
            break
    if closed:
        reader.eof()
    return reader


def test_an_answer_framed_by_its_length_reads_whole_however_it_is_cut() -> None:
    raw = (b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
           b"Audit-Id: 1\r\nContent-Length: 11\r\n\r\n{\"kind\":1}\n")
    cuts: list[int] | None
    for cuts in ([], None, [5, 17, 60, 70]):
        reader = read(raw, cuts=cuts)
        assert (reader.done, reader.status, reader.reason, reader.body(), reader.keep_alive) == (
            True, 201, "Created", b'{"kind":1}\n', True)


def test_a_chunked_answer_reads_whole_with_extensions_and_trailers() -> None:
    raw = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5;name=value\r\nhello\r\n1A \r\n" + b"x" * 26 + b"\r\n0\r\nX-Trailer: y\r\n\r\n")
    cuts: list[int] | None
    for cuts in ([], None):
        reader = read(raw, cuts=cuts)
        assert (reader.done, reader.body(), reader.keep_alive) == (True, b"hello" + b"x" * 26,
                                                                   True)


def test_a_body_framed_by_the_connections_end_is_whole_at_the_end() -> None:
    reader = read(b"HTTP/1.1 200 OK\r\n\r\nall of it", cuts=[])
    assert not reader.done
    assert reader.eof()
    assert (reader.body(), reader.keep_alive) == (b"all of it", False)


def test_an_informational_answer_is_skipped() -> None:
    reader = read(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
    assert (reader.done, reader.status, reader.body()) == (True, 204, b"")


@pytest.mark.parametrize(("raw", "close"), [
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", True),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", True),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
     True),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nextra", True),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", False),
])
def test_keep_alive_only_for_a_clean_http_1_1_answer(raw: bytes, close: bool) -> None:
    reader = read(raw, cuts=[])
    assert reader.done
    assert reader.keep_alive is not close


@pytest.mark.parametrize(("raw", "says"), [
    (b"HTTP/1.1 2000 OK\r\n\r\n", "malformed status line: b'HTTP/1.1 2000 OK'"),
    (b"HTTP/2 200 OK\r\n\r\n", "malformed status line"),
    (b"HTTP/1.1 099 Odd\r\n\r\n", "malformed status line"),
    (b"ICY 200 OK\r\n\r\n", "malformed status line"),
    (b"HTTP/1.1 200 O\x00K\r\n\r\n", "malformed status line"),
    (b"HTTP/1.1 200 OK\r\nNo colon\r\n\r\n", "malformed header line: b'No colon'"),
    (b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nA: b\nC: d\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "malformed Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "differ"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "transfer coding"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size line"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\n", "chunk size line"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"f" * 17 + b"\r\n",
     "chunk size line"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n", "CRLF"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nbad trailer\r\n\r\n",
     "trailer"),
    (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "101"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * HEAD_LIMIT, "run over"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 5000, "runs over"),
])
def test_a_malformed_answer_is_refused_in_one_line(raw: bytes, says: str) -> None:
    cuts: list[int] | None
    for cuts in ([], None):
        with pytest.raises(MalformedResponse) as refused:
            read(raw, cuts=cuts)
        assert says in str(refused.value)
        assert "\n" not in str(refused.value)


@pytest.mark.parametrize("raw", [
    b"", b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
])
def test_an_answer_cut_short_is_a_closed_connection(raw: bytes) -> None:
    with pytest.raises(ConnectionClosed, match="closed the connection"):
        read(raw, closed=True)


def test_a_streamed_body_goes_to_its_consumer_and_an_error_is_collected() -> None:
    got: list[bytes] = []
    opened: list[bool] = []
    reader = ResponseReader(got.append, lambda: opened.append(True))
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    assert reader.feed(raw)
    assert (b"".join(got), reader.body(), opened) == (b"abcde", b"", [True])
    refused = ResponseReader(got.append, lambda: opened.append(True))
    assert refused.feed(b"HTTP/1.1 410 Gone\r\nContent-Length: 2\r\n\r\n{}")
    assert (refused.status, refused.body(), opened) == (410, b"{}", [True])


# Fuzz: the reader's door -------------------------------------------------------------------

_TOKEN = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.!#$%&'*+^`|~",
                 min_size=1, max_size=12)
_VALUE = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e), max_size=20)


@dataclass
class Sent:
    raw: bytes
    status: int
    reason: str
    body: bytes
    keep_alive: bool
    until_close: bool = False
    extra: list[str] = field(default_factory=list)


@st.composite
def answers(draw: st.DrawFn) -> Sent:
    status = draw(st.integers(200, 599).filter(lambda code: code not in (204, 304)))
    reason = draw(st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=20))
    body = draw(st.binary(max_size=300))
    headers = [f"{name}: {value}" for name, value in draw(st.lists(
        st.tuples(_TOKEN.filter(lambda name: name.lower() not in (
            "content-length", "transfer-encoding", "connection")), _VALUE), max_size=4))]
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    if framing == "length":
        headers.append(f"Content-Length: {len(body)}")
        framed = body
    elif framing == "chunked":
        headers.append("Transfer-Encoding: chunked")
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=5)))
        pieces = [body[start:end] for start, end in zip([0, *cuts], [*cuts, len(body)],
                                                         strict=True) if end > start]
        ext = draw(st.sampled_from(["", ";a=b", " ;x"]))
        framed = b"".join(f"{len(piece):x}{ext}\r\n".encode() + piece + b"\r\n"
                          for piece in pieces) + b"0\r\n"
        framed += b"".join(f"{line}\r\n".encode() for line in draw(st.lists(
            st.builds(lambda name, value: f"{name}: {value}", _TOKEN, _VALUE), max_size=2)))
        framed += b"\r\n"
    else:
        framed = body
    head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{line}\r\n" for line in headers)
    return Sent(head.encode() + b"\r\n" + framed, status, reason, body, framing != "close",
                until_close=framing == "close")


@pytest.mark.slow  # long fuzzing
@settings(max_examples=500, deadline=None)
@given(sent=answers(), cuts=st.lists(st.integers(0, 700), max_size=8))
def test_fuzzed_answers_read_the_same_however_they_are_cut(sent: Sent, cuts: list[int]) -> None:
    reader = read(sent.raw, cuts=[cut for cut in cuts if cut < len(sent.raw)],
                  closed=sent.until_close)
    assert (reader.done, reader.status, reader.reason, reader.body(), reader.keep_alive) == (
        True, sent.status, sent.reason, sent.body, sent.keep_alive)


def outcome(raw: bytes, cuts: list[int]) -> tuple[object, ...]:
    """What a reader makes of ``raw`` cut at ``cuts``, then of the connection's end:
    only a whole answer, a refusal or an answer cut short."""
    reader = ResponseReader()
    try:
        points = sorted({0, len(raw), *(cut for cut in cuts if cut < len(raw))})
        for start, end in itertools.pairwise(points):
            reader.feed(raw[start:end])
        if reader.done:
            return ("done", reader.status, reader.body(), reader.keep_alive)
        reader.eof()
        return ("done at the end", reader.status, reader.body())
    except MalformedResponse:
        return ("malformed",)
    except ConnectionClosed:
        return ("cut short",)


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    raw = bytearray(draw(answers()).raw)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(raw)))
        change = draw(st.sampled_from(["insert", "delete", "replace"]))
        junk = draw(st.one_of(st.binary(min_size=1, max_size=6), st.sampled_from(
            [b"\r\n", b"\n", b"\r", b":", b" ", b"\x00", b"ffffffff", b"-1", b"0\r\n\r\n"])))
        if change == "insert":
            raw[at:at] = junk
        elif change == "delete":
            del raw[at:at + len(junk)]
        else:
            raw[at:at + len(junk)] = junk
    return bytes(raw)


@settings(max_examples=1000, deadline=None)
@given(raw=st.one_of(damaged(), st.binary(max_size=200)),
       cuts=st.lists(st.integers(0, 700), max_size=8))
@pytest.mark.slow  # long fuzzing
def test_fuzzed_damaged_answers_are_refused_or_read_never_otherwise(raw: bytes,
                                                                    cuts: list[int]) -> None:
    # Any other exception fails the test; how the bytes are cut changes nothing.
    assert outcome(raw, cuts) == outcome(raw, [])


# The client against a scripted server ------------------------------------------------------

def ok(body: bytes, status: str = "200 OK", *headers: str) -> bytes:
    extra = "".join(f"{line}\r\n" for line in headers)
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def status_body(code: int, reason: str, message: str) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "message": message, "reason": reason, "code": code}).encode()


CLOSE = b"<then close>"
"""A reply ending so is written, then the connection closed."""


@dataclass
class Scripted:
    """A server answering each request with the next reply of ``replies``: bytes written
    as they are (then the connection stays open unless they end with ``CLOSE``), ``None``
    to close the connection at once, ``"hang"`` to answer nothing."""

    replies: list[bytes | str | None]
    port: int = 0
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    handlers: set[asyncio.Task[None]] = field(default_factory=set)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                self.requests.append(head + await reader.readexactly(length))
                reply = self.replies.pop(0)
                if reply is None:
                    break
                if reply == "hang":
                    await self.released.wait()
                    break
                assert isinstance(reply, bytes)
                writer.write(reply.removesuffix(CLOSE))
                await writer.drain()
                if reply.endswith(CLOSE):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed the connection
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def scripted(*replies: bytes | str | None, tls: ssl.SSLContext | None = None,
                   ) -> AsyncIterator[Scripted]:
    script = Scripted(list(replies))
    server = await asyncio.start_server(script.handle, "127.0.0.1", 0, ssl=tls)
    script.port = server.sockets[0].getsockname()[1]
    try:
        yield script
    finally:
        script.released.set()
        server.close()
        # Each handler ends as the client closes its connection: none is left cancelled.
        if script.handlers:
            await asyncio.wait(script.handlers, timeout=5)


def transport(port: int, *, tokens: list[str] | None = None, scheme: str = "http",
              context: ssl.SSLContext | None = None, server_name: str | None = None,
              forgotten: list[bool] | None = None) -> ApiTransport:
    issued = iter(tokens or ["Bearer t"] * 100)
    forgets = forgotten if forgotten is not None else []
    return ApiTransport(Endpoint(
        base_url=f"{scheme}://127.0.0.1:{port}", ssl_context=context, server_name=server_name,
        proxy=None, authorization=lambda: next(issued),
        forget_authorization=lambda: forgets.append(True)))


async def test_kept_alive_calls_share_one_connection() -> None:
    async with scripted(ok(b"{}"), ok(b"[1]"), ok(b"")) as server:
        api = transport(server.port)
        try:
            assert await api.call("GET", "/a", query={"limit": "5", "continue": "x y/="}) == b"{}"
            assert await api.call("POST", "/b", body=b'{"x":1}',
                                  content_type="application/json") == b"[1]"
            assert await api.call("DELETE", "/c") == b""
        finally:
            await api.close()
    assert server.connections == 1
    first, second, _ = server.requests
    assert first.startswith(b"GET /a?limit=5&continue=x%20y%2F%3D HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer t\r\n" in first
    assert b"\r\nHost: 127.0.0.1:" in first
    assert b"Content-Length" not in first
    assert second.endswith(b"Content-Type: application/json\r\nContent-Length: 7\r\n\r\n"
                           b'{"x":1}')


async def test_a_401_is_tried_once_more_with_the_token_read_again() -> None:
    forgotten: list[bool] = []
    async with scripted(ok(status_body(401, "Unauthorized", "no"), "401 Unauthorized"),
                        ok(b'{"ok":1}')) as server:
        api = transport(server.port, tokens=["Bearer old", "Bearer new"], forgotten=forgotten)
        try:
            assert await api.call("POST", "/binding", body=b"{}") == b'{"ok":1}'
        finally:
            await api.close()
    assert forgotten == [True]
    assert b"Bearer old" in server.requests[0]
    assert b"Bearer new" in server.requests[1]


@pytest.mark.parametrize(("code", "reason", "line"), [
    (409, "Conflict", 'HTTP 409 Conflict: pod "p" is already bound'),
    (404, "Not Found", 'HTTP 404 NotFound: pods "p" not found'),
])
async def test_an_error_status_carries_the_api_status(code: int, reason: str,
                                                       line: str) -> None:
    message = 'pod "p" is already bound' if code == 409 else 'pods "p" not found'
    body = status_body(code, reason.replace(" ", ""), message)
    async with scripted(ok(body, f"{code} {reason}"), ok(b"{}")) as server:
        api = transport(server.port)
        try:
            with pytest.raises(ApiStatusError) as refused:
                await api.call("POST", "/binding", body=b"{}")
            assert await api.call("GET", "/after") == b"{}"  # the connection serves on
        finally:
            await api.close()
    assert describe_failure(refused.value) == line
    assert server.connections == 1


@pytest.mark.parametrize(("reply", "says"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc" + CLOSE,
     "ConnectionClosed: the API server closed the connection in the middle of the answer"),
    (None, "ConnectionClosed: the API server closed the connection before any answer"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n",
     "MalformedResponse: a malformed Content-Length: b'1x'"),
    (b"HTTP/1.1 OK\r\n\r\n", "MalformedResponse: a malformed status line: b'HTTP/1.1 OK'"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nnope\r\n",
     "MalformedResponse: a malformed chunk size line: b'nope'"),
])
async def test_a_broken_answer_fails_the_call_in_one_line_and_drops_the_connection(
        reply: bytes | None, says: str) -> None:
    async with scripted(reply, ok(b"{}")) as server:
        api = transport(server.port)
        try:
            with pytest.raises(API_FAILURES) as failed:
                # A POST: not sent again when the connection closes before an answer.
                await api.call("POST", "/x", body=b"{}")
            assert await api.call("GET", "/after") == b"{}"
        finally:
            await api.close()
    assert describe_failure(failed.value) == says
    assert server.connections == 2  # the broken one dropped, a new one for the next call


async def test_an_answer_that_never_comes_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_lean, "READ_TIMEOUT_S", 0.2)
    async with scripted("hang", ok(b"{}")) as server:
        api = transport(server.port)
        try:
            with pytest.raises(TimeoutError) as failed:
                await asyncio.wait_for(api.call("GET", "/x"), 5)
            assert await api.call("GET", "/after") == b"{}"
        finally:
            await api.close()
    assert describe_failure(failed.value) == "TimeoutError: no answer from the API server for 0.2 s"
    assert isinstance(failed.value, API_FAILURES)
    assert server.connections == 2


async def test_a_stale_kept_alive_connection_is_replaced_for_a_get() -> None:
    # The server closes the connection after its answer, as an idle one is closed.
    async with scripted(ok(b"1"), None, ok(b"2")) as server:
        api = transport(server.port)
        try:
            assert await api.call("GET", "/x") == b"1"
            assert await api.call("GET", "/x") == b"2"
        finally:
            await api.close()
    assert server.connections == 2


async def test_a_cancelled_call_leaves_no_connection_behind() -> None:
    async with scripted("hang", ok(b"{}")) as server:
        api = transport(server.port)
        try:
            call = asyncio.create_task(api.call("GET", "/x"))
            await asyncio.sleep(0.1)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert await api.call("GET", "/after") == b"{}"
        finally:
            await api.close()
    assert server.connections == 2


async def test_the_pool_opens_no_more_than_its_bound() -> None:
    async with scripted(*[ok(b"{}")] * 6) as server:
        endpoint = Endpoint(f"http://127.0.0.1:{server.port}", None, None, None, lambda: None)
        api = ApiTransport(endpoint, _lean.LeanClient(endpoint, size=2))
        try:
            assert await asyncio.gather(*(api.call("GET", "/x") for _ in range(6))) == [b"{}"] * 6
        finally:
            await api.close()
    assert server.connections <= 2


async def test_a_watch_streams_lines_and_its_consumer_can_end_it() -> None:
    chunks = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"4\r\nab\nc\r\n3\r\nd\ne\r\n")
    async with scripted(chunks) as server:
        api = transport(server.port)
        got: list[bytes] = []
        opened: list[bool] = []

        def take(data: bytes) -> None:
            got.append(data)
            if b"e" in b"".join(got):
                raise LookupError("enough")

        try:
            with pytest.raises(LookupError, match="enough"):
                await api.stream("/w", {"watch": "true"}, on_open=lambda: opened.append(True),
                                 on_data=take)
        finally:
            await api.close()
    assert (b"".join(got), opened) == (b"ab\ncd\ne", [True])


async def test_a_watch_refused_raises_its_status() -> None:
    forgotten: list[bool] = []
    async with scripted(ok(status_body(410, "Expired", "too old"), "410 Gone")) as server:
        api = transport(server.port, forgotten=forgotten)
        try:
            with pytest.raises(ApiStatusError) as refused:
                await api.stream("/w", {}, on_open=lambda: None, on_data=lambda _: None)
        finally:
            await api.close()
    assert describe_failure(refused.value) == "HTTP 410 Expired: too old"
    assert forgotten == []


# TLS ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path]:
    bundle = write_bundle(tmp_path_factory.mktemp("pki") / "bundle")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(bundle.extender, bundle.extender_key)
    return server, bundle.ca


async def test_calls_go_over_tls_checked_against_the_ca(
        tls: tuple[ssl.SSLContext, Path]) -> None:
    server_context, ca = tls
    async with scripted(ok(b"{}"), ok(b"[]"), tls=server_context) as server:
        api = transport(server.port, scheme="https",
                        context=ssl.create_default_context(cafile=ca))
        try:
            assert await api.call("GET", "/x") == b"{}"
            assert await api.call("GET", "/y") == b"[]"
        finally:
            await api.close()
    assert server.connections == 1


async def test_a_certificate_for_another_name_is_refused(
        tls: tuple[ssl.SSLContext, Path]) -> None:
    server_context, ca = tls
    async with scripted(ok(b"{}"), tls=server_context) as server:
        api = transport(server.port, scheme="https", server_name="not-the-server.example",
                        context=ssl.create_default_context(cafile=ca))
        try:
            with pytest.raises(API_FAILURES) as refused:
                await api.call("GET", "/x")
        finally:
            await api.close()
    assert isinstance(refused.value, ssl.SSLCertVerificationError)
    assert describe_failure(refused.value).startswith("SSLCertVerificationError: ")


def test_the_transport_speaks_aiohttp_only_through_a_proxy() -> None:
    direct = Endpoint("https://127.0.0.1:1", None, None, None, lambda: None)
    proxied = Endpoint("https://127.0.0.1:1", None, None, "http://proxy:3128", lambda: None)
    assert isinstance(ApiTransport(direct)._http, _lean.LeanClient)
    assert not isinstance(ApiTransport(proxied)._http, _lean.LeanClient)
    assert _http.WATCH_DEADLINE_S > _transport.WATCH_TIMEOUT_SECONDS
