"""Serving an aiohttp application on a listener, and what the listeners answer while the
daemon starts: alive (``/healthz``), not ready (``/readyz`` and ``/statusz`` say why),
503 for everything else."""

from __future__ import annotations

import ssl
from collections.abc import Callable

import msgspec
from aiohttp import web

# Stopping must end within 10 s: the HTTP shutdown has this share.
HTTP_SHUTDOWN_S = 2.0
# After a 413, aiohttp reads and drops the rest of the body for this long, so the client
# can still read the answer; its default of 10 s held a stopping daemon that long.
LINGER_S = 1.0


async def set_up(app: web.Application) -> web.AppRunner:
    """``app``'s runner, set up, with no listener yet: how every listener of the daemon
    serves aiohttp (no access log, the bounded shutdown and linger)."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=HTTP_SHUTDOWN_S,
                           lingering_time=LINGER_S)
    await runner.setup()
    return runner


async def serve(app: web.Application, address: tuple[str, int],
                tls: ssl.SSLContext | None = None) -> web.AppRunner:
    """``app`` listening on ``address`` (over TLS with ``tls``); ``cleanup()`` stops it."""
    runner = await set_up(app)
    await web.TCPSite(runner, address[0], address[1], ssl_context=tls).start()
    return runner


def starting_app(why: Callable[[], list[str]]) -> web.Application:
    """What the extender's and the metrics' ports answer until the daemon is up: alive,
    not ready, ``why()`` saying what it is doing."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(status=503, text="; ".join(why()) + "\n")

    async def statusz(_: web.Request) -> web.Response:
        return web.Response(body=msgspec.json.encode({"ready": False,
                                                       "not_ready_because": why()}),
                            content_type="application/json")

    async def starting(_: web.Request) -> web.Response:
        return web.Response(status=503, text="pyhami is starting: " + "; ".join(why()) + "\n")

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz),
                    web.get("/statusz", statusz), web.route("*", "/{path:.*}", starting)])
    return app


class StartupPhase:
    """What the daemon is doing while it starts, as ``/readyz`` and ``/statusz`` say it."""

    def __init__(self, first: str) -> None:
        self._now = first

    def enter(self, what: str) -> None:
        self._now = what

    def not_ready_because(self) -> list[str]:
        return [self._now]
