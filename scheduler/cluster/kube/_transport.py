"""HTTP to the API server on the event loop: one aiohttp session with its connection pool,
raw bytes in and out, an error status raised as ``ApiStatusError``.

What a failed call raises is one of ``API_FAILURES``; ``describe_failure`` puts it in one
line, ``answered_with`` tells an HTTP status the caller expects.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import msgspec

from common.core.errors import PyhamiError
from scheduler.cluster.kube._wire import Status

REQUEST_TIMEOUT = aiohttp.ClientTimeout(sock_connect=10.0, sock_read=30.0)
WATCH_TIMEOUT_SECONDS = 60
# The server ends a watch after WATCH_TIMEOUT_SECONDS; the total timeout only catches a
# connection that died silently. One timer for the whole watch: a read timeout is set
# again at every chunk, 2.6 % of the daemon's CPU at 1,000 nodes (docs/performance.md).
WATCH_REQUEST_TIMEOUT = aiohttp.ClientTimeout(sock_connect=10.0,
                                              total=WATCH_TIMEOUT_SECONDS + 30.0)
POOL_SIZE = 16  # connections open to the API server at most, the watch's included

GONE = 410
NOT_FOUND = 404
CONFLICT = 409
UNAUTHORIZED = 401
TOKEN_READ_INTERVAL_S = 1.0

Query = Mapping[str, str]


class ApiStatusError(PyhamiError):
    """The API server answered with an HTTP error status; ``body`` is its answer, a
    ``Status`` as a rule."""

    def __init__(self, status: int, reason: str, body: bytes) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body


# What a failed API call raises: an HTTP error status, a transport failure, or an answer
# that does not decode.
API_FAILURES = (ApiStatusError, aiohttp.ClientError, asyncio.TimeoutError, OSError,
                msgspec.DecodeError)


def answered_with(error: BaseException, status: int) -> bool:
    """Whether the API server answered the failed call with this HTTP status."""
    return isinstance(error, ApiStatusError) and error.status == status


def describe_failure(error: BaseException) -> str:
    """One line for a failed API call: the HTTP status with the API's reason and message."""
    if isinstance(error, ApiStatusError):
        if not error.body:
            return f"HTTP {error.status} {error.reason}"
        try:
            status = msgspec.json.decode(error.body, type=Status)
        except msgspec.DecodeError:
            text = error.body[:200].decode(errors="replace")
            return f"HTTP {error.status} {error.reason}: {text}"
        return f"HTTP {error.status} {status.reason or error.reason}: {status.message}"
    detail = str(error)
    return f"{type(error).__name__}: {detail}" if detail else type(error).__name__


class CachedAuthorization:
    """The Authorization header asked of ``read`` at most once every ``interval`` seconds.

    ``read`` runs the kubernetes package's refresh hook: in a pod it reads the rotated
    token file again, from a kubeconfig it rewrites the whole Configuration (0.38 ms a
    call, measured), and it ran before every API call. A token rotates in minutes, and a
    401 makes the transport ``forget`` the header and ask once more, so a second's reuse
    costs at most one refused call at a rotation.
    """

    def __init__(self, read: Callable[[], str | None],
                 interval: float = TOKEN_READ_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._interval = interval
        self._clock = clock
        self._header: str | None = None
        self._read_at: float | None = None

    def __call__(self) -> str | None:
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self._interval:
            self._header = self._read()
            self._read_at = now
        return self._header

    def forget(self) -> None:
        """The next call reads the header again (the API server refused the last one)."""
        self._read_at = None


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the API server is and how to be let in."""

    base_url: str  # scheme, host and port, no trailing slash
    ssl_context: ssl.SSLContext | None  # None for plain HTTP
    server_name: str | None  # the name its certificate must bear, when not the host's
    proxy: str | None
    authorization: Callable[[], str | None]
    """The Authorization header, asked before every request: a token can rotate."""
    forget_authorization: Callable[[], None] = lambda: None
    """Called on a 401 before the one retry: a cached header is read again."""


class ApiTransport:
    """Requests to one API server over a pool of connections kept for the daemon's life;
    ``close()`` ends them. The session is made on the first request, in the running loop."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=POOL_SIZE),
                headers={"Accept": "application/json", "User-Agent": "pyhami-scheduler"},
                # Uncompressed, as the kubernetes client asks: on the usual short hop,
                # gzip only costs the API server and the daemon CPU.
                skip_auto_headers=("Content-Type", "Accept-Encoding"))
        return self._session

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {}
        authorization = self._endpoint.authorization()
        if authorization:
            headers["Authorization"] = authorization
        if content_type is not None:
            headers["Content-Type"] = content_type
        return headers

    @asynccontextmanager
    async def _response(self, method: str, path: str, *, query: Query | None,
                        body: bytes | None, content_type: str | None,
                        timeout: aiohttp.ClientTimeout,
                        ) -> AsyncIterator[aiohttp.ClientResponse]:
        endpoint = self._endpoint
        async with self._open().request(
                method, endpoint.base_url + path, params=query, data=body,
                headers=self._headers(content_type), timeout=timeout,
                ssl=endpoint.ssl_context if endpoint.ssl_context is not None else True,
                server_hostname=endpoint.server_name, proxy=endpoint.proxy) as response:
            if response.status >= 400:  # an HTTP error status
                raise ApiStatusError(response.status, response.reason or "",
                                     await response.read())
            yield response

    async def call(self, method: str, path: str, *, query: Query | None = None,
                   body: bytes | None = None, content_type: str | None = None) -> bytes:
        """The answer's body; raises one of ``API_FAILURES``. A 401 is tried once more
        with the Authorization header read again (a token rotated since it was read)."""
        try:
            return await self._call(method, path, query, body, content_type)
        except ApiStatusError as error:
            if error.status != UNAUTHORIZED:
                raise
            self._endpoint.forget_authorization()
        return await self._call(method, path, query, body, content_type)

    async def _call(self, method: str, path: str, query: Query | None, body: bytes | None,
                    content_type: str | None) -> bytes:
        async with self._response(method, path, query=query, body=body,
                                  content_type=content_type,
                                  timeout=REQUEST_TIMEOUT) as response:
            return await response.read()

    @asynccontextmanager
    async def stream(self, path: str, query: Query) -> AsyncIterator[AsyncIterator[bytes]]:
        """The body of a GET as it arrives, in chunks; raises one of ``API_FAILURES``.
        The connection is dropped on leaving: an unfinished stream must not be reused."""
        try:
            async with self._response("GET", path, query=query, body=None, content_type=None,
                                      timeout=WATCH_REQUEST_TIMEOUT) as response:
                try:
                    yield response.content.iter_any()
                finally:
                    response.close()
        except ApiStatusError as error:
            if error.status == UNAUTHORIZED:  # the watch's next start reads the token again
                self._endpoint.forget_authorization()
            raise
