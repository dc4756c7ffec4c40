"""``AiohttpClient``: the ``HttpClient`` port on aiohttp's client, for an API server
reached through an HTTP proxy (``Endpoint.proxy``), which the lean client does not speak."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
from yarl import URL

from scheduler.cluster.kube._http import (
    CONNECT_TIMEOUT_S,
    POOL_SIZE,
    READ_TIMEOUT_S,
    USER_AGENT,
    WATCH_DEADLINE_S,
    Answer,
    Endpoint,
)

REQUEST_TIMEOUT = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_S,
                                        sock_read=READ_TIMEOUT_S)
# One timer for the whole watch: a read timeout is set again at every chunk.
WATCH_REQUEST_TIMEOUT = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_S,
                                              total=WATCH_DEADLINE_S)


class AiohttpClient:
    """One aiohttp session and its pool, made on the first request, in the running loop."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=POOL_SIZE),
                headers={"Accept": "application/json", "User-Agent": USER_AGENT},
                # Uncompressed, as the kubernetes client asks: on the usual short hop,
                # gzip only costs the API server and the daemon CPU.
                skip_auto_headers=("Content-Type", "Accept-Encoding"))
        return self._session

    def _send(self, method: str, target: str, authorization: str | None, body: bytes | None,
              content_type: str | None, *,
              timeout: aiohttp.ClientTimeout) -> aiohttp.client._RequestContextManager:
        endpoint = self._endpoint
        headers = {}
        if authorization:
            headers["Authorization"] = authorization
        if content_type is not None:
            headers["Content-Type"] = content_type
        return self._open().request(
            method, URL(endpoint.base_url + target, encoded=True), data=body, headers=headers,
            timeout=timeout,
            ssl=endpoint.ssl_context if endpoint.ssl_context is not None else True,
            server_hostname=endpoint.server_name, proxy=endpoint.proxy)

    async def request(self, method: str, target: str, *, authorization: str | None,
                      body: bytes | None, content_type: str | None) -> Answer:
        async with self._send(method, target, authorization, body, content_type,
                              timeout=REQUEST_TIMEOUT) as response:
            return Answer(response.status, response.reason or "", await response.read())

    async def stream(self, target: str, *, authorization: str | None,
                     on_open: Callable[[], None],
                     on_data: Callable[[bytes], None]) -> Answer | None:
        async with self._send("GET", target, authorization, None, None,
                              timeout=WATCH_REQUEST_TIMEOUT) as response:
            try:
                if response.status >= 400:
                    return Answer(response.status, response.reason or "",
                                  await response.read())
                on_open()
                async for chunk in response.content.iter_any():
                    on_data(chunk)
                return None
            finally:
                response.close()  # an unfinished stream must not be reused

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
