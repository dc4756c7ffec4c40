"""HTTP to the API server on the event loop: raw bytes in and out over one ``HttpClient``
(the lean HTTP/1.1 client, or aiohttp's through a proxy), an error status raised as
``ApiStatusError``, a 401 tried once more with the token read again.

What a failed call raises is one of ``API_FAILURES``; ``describe_failure`` puts it in one
line, ``answered_with`` tells an HTTP status the caller expects.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from urllib.parse import quote, urlencode

import aiohttp
import msgspec

from common.core.errors import PyhamiError
from scheduler.cluster.kube._aiohttp import AiohttpClient
from scheduler.cluster.kube._http import (
    WATCH_TIMEOUT_SECONDS,
    Endpoint,
    HttpClient,
    HttpFailure,
)
from scheduler.cluster.kube._lean import LeanClient
from scheduler.cluster.kube._wire import Status

__all__ = ["WATCH_TIMEOUT_SECONDS", "Endpoint"]  # re-exported for the API calls

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
API_FAILURES = (ApiStatusError, HttpFailure, aiohttp.ClientError, asyncio.TimeoutError,
                OSError, msgspec.DecodeError)


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


class ApiTransport:
    """Requests to one API server over connections kept for the daemon's life; ``close()``
    ends them. Its HTTP client is chosen once, when it is built: the lean one, or
    aiohttp's where the API server is reached through a proxy."""

    def __init__(self, endpoint: Endpoint, client: HttpClient | None = None) -> None:
        self._endpoint = endpoint
        self._http: HttpClient = client if client is not None else (
            LeanClient(endpoint) if endpoint.proxy is None else AiohttpClient(endpoint))

    async def close(self) -> None:
        await self._http.close()

    async def call(self, method: str, path: str, *, query: Query | None = None,
                   body: bytes | None = None, content_type: str | None = None) -> bytes:
        """The answer's body; raises one of ``API_FAILURES``. A 401 is tried once more
        with the Authorization header read again (a token rotated since it was read)."""
        target = _target(path, query)
        endpoint = self._endpoint
        answer = await self._http.request(method, target,
                                          authorization=endpoint.authorization(), body=body,
                                          content_type=content_type)
        if answer.status == UNAUTHORIZED:
            endpoint.forget_authorization()
            answer = await self._http.request(method, target,
                                              authorization=endpoint.authorization(),
                                              body=body, content_type=content_type)
        if answer.status >= 400:  # an HTTP error status
            raise ApiStatusError(answer.status, answer.reason, answer.body)
        return answer.body

    async def stream(self, path: str, query: Query, *, on_open: Callable[[], None],
                     on_data: Callable[[bytes], None]) -> None:
        """A GET's body handed to ``on_data`` as it arrives, until the server ends it;
        ``on_open`` is called once the server has accepted the request. Raises one of
        ``API_FAILURES``, or what ``on_data`` raised (the stream then ends)."""
        answer = await self._http.stream(_target(path, query),
                                         authorization=self._endpoint.authorization(),
                                         on_open=on_open, on_data=on_data)
        if answer is not None:
            if answer.status == UNAUTHORIZED:  # the watch's next start reads the token again
                self._endpoint.forget_authorization()
            raise ApiStatusError(answer.status, answer.reason, answer.body)


def _target(path: str, query: Query | None) -> str:
    return f"{path}?{urlencode(query, quote_via=quote)}" if query else path
