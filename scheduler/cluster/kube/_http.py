"""The port the transport speaks HTTP through, ``HttpClient``, and what both of its
implementations share: where the API server is (``Endpoint``), an answer (``Answer``),
the failures of reading one (``HttpFailure``), the timeouts.

Two clients implement it, one chosen when the transport is built: the lean HTTP/1.1
client (``_lean``) for an API server reached directly, aiohttp (``_aiohttp``) through an
HTTP proxy, which the lean client does not speak.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from common.core.errors import PyhamiError

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 30.0
"""A call's answer may pause this long between two reads (aiohttp's ``sock_read``)."""
WATCH_TIMEOUT_SECONDS = 60
WATCH_DEADLINE_S = WATCH_TIMEOUT_SECONDS + 30.0
"""The server ends a watch after ``WATCH_TIMEOUT_SECONDS``; this deadline only catches a
connection that died silently. One timer for the whole watch: a read timeout set again at
every chunk was 2.6 % of the daemon's CPU at 1,000 nodes (docs/performance.md)."""
POOL_SIZE = 16  # connections open to the API server at most, the watches' included
USER_AGENT = "pyhami-scheduler"


class HttpFailure(PyhamiError):
    """The API server's answer could not be read: the connection closed before it was
    whole, or it is no HTTP/1.1 answer this client reads."""


class MalformedResponse(HttpFailure):
    """An answer that breaks HTTP/1.1's framing: its status line, a header, a chunk."""


class ConnectionClosed(HttpFailure):
    """The connection ended before the answer was whole."""


class Answer(NamedTuple):
    status: int
    reason: str
    body: bytes


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


class HttpClient(Protocol):
    """Requests to one API server over connections kept open between them.

    ``target`` is the path with its query, already encoded. What a failed request raises
    is ``HttpFailure``, ``OSError`` (``ssl.SSLError`` among them) or ``TimeoutError`` for
    the lean client, aiohttp's ``ClientError`` as well for aiohttp's.
    """

    async def request(self, method: str, target: str, *, authorization: str | None,
                      body: bytes | None, content_type: str | None) -> Answer:
        """The whole answer, whatever its status."""
        ...

    async def stream(self, target: str, *, authorization: str | None,
                     on_open: Callable[[], None],
                     on_data: Callable[[bytes], None]) -> Answer | None:
        """A GET whose body is handed to ``on_data`` as it arrives, until the server ends
        it; returns None then. An error status (400 or over) is not streamed: its whole
        answer is returned. ``on_open`` is called once a status under 400 has come, before
        the body. What ``on_data`` raises ends the stream and is raised here."""
        ...

    async def close(self) -> None:
        """Close every connection."""
        ...
