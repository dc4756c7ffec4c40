"""The node monitor's ``/metrics`` listener (``--metrics``), as HAMi's vGPUmonitor serves
it on :9394: the classic text format, each scrape answered by the monitor within its bound.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from agent.monitor.monitor import NodeMonitor

SHUTDOWN_S = 2.0


def monitor_app(monitor: NodeMonitor) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        body = await monitor.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz)])
    return app


async def serve_monitor(monitor: NodeMonitor, address: tuple[str, int]) -> web.AppRunner:
    """The listener started on ``address``; ``cleanup()`` stops it."""
    runner = web.AppRunner(monitor_app(monitor), access_log=None, shutdown_timeout=SHUTDOWN_S)
    await runner.setup()
    await web.TCPSite(runner, address[0], address[1]).start()
    return runner
