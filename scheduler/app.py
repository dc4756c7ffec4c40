"""Running the daemon: NATS in, HTTP in and out, the cluster port chosen at start-up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from aiohttp import web
from nats.aio.client import Client
from nats.aio.msg import Msg

from common import telemetry
from common.messaging import NatsSettings, connect
from common.wire import INVENTORY_SUBJECTS, RESYNC_SUBJECT, ResyncRequest, encode
from scheduler.cluster import Cluster
from scheduler.http import extender_app, metrics_app
from scheduler.service import SchedulerService, ServiceSettings
from scheduler.standalone import PendingLoop, StandaloneCluster, pod_api

logger = logging.getLogger(__name__)

ClusterMode = Literal["kubeconfig", "in-cluster", "standalone"]


@dataclass(frozen=True)
class DaemonConfig:
    nats: NatsSettings
    mode: ClusterMode
    service: ServiceSettings
    listen: tuple[str, int]
    metrics: tuple[str, int] | None
    kubeconfig: str | None = None
    url_prefix: str = ""
    resync_wait: float = 2.0
    retry_period: float = 5.0
    noop_endpoint: bool = False
    # Standalone: place submitted pods ourselves (off when an outside driver calls the verbs).
    drive_pending: bool = True


def telemetry_publisher(client: Client) -> Callable[
        [telemetry.DecisionEvent | telemetry.UsageEvent], Awaitable[None]]:
    async def publish(event: telemetry.DecisionEvent | telemetry.UsageEvent) -> None:
        subject = (telemetry.DECISIONS_SUBJECT if isinstance(event, telemetry.DecisionEvent)
                   else telemetry.usage_subject(event.node))
        await client.publish(subject, telemetry.encode(event))

    return publish


async def _kubernetes(config: DaemonConfig) -> Cluster:
    from scheduler.kube import KubernetesCluster  # noqa: PLC0415 (heavy; loaded only when used)

    if config.mode == "in-cluster":
        return KubernetesCluster.in_cluster()
    assert config.kubeconfig is not None
    return KubernetesCluster.from_kubeconfig(config.kubeconfig)


async def _serve(app: web.Application, address: tuple[str, int]) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, address[0], address[1]).start()
    return runner


async def run_daemon(config: DaemonConfig, stop: asyncio.Event,
                     started: Callable[[SchedulerService], None] | None = None) -> None:
    """Run until ``stop`` is set; ``started`` is told once the daemon answers /filter."""
    client = await connect(config.nats, "pyhami-scheduler")
    runners: list[web.AppRunner] = []
    tasks: list[asyncio.Task[None]] = []
    service: SchedulerService | None = None
    try:
        standalone: StandaloneCluster | None = None
        cluster: Cluster
        if config.mode == "standalone":
            standalone = await StandaloneCluster.open(client)
            cluster = standalone
        else:
            cluster = await _kubernetes(config)
        service = SchedulerService(config.service, cluster, telemetry_publisher(client))
        app = extender_app(service, url_prefix=config.url_prefix, noop=config.noop_endpoint)
        loop: PendingLoop | None = None
        if standalone is not None:
            loop = PendingLoop(service, standalone, config.retry_period)
            app.add_routes(pod_api(standalone, loop))
        runners.append(await _serve(app, config.listen))
        if config.metrics is not None:
            runners.append(await _serve(metrics_app(service), config.metrics))

        async def on_inventory(message: Msg) -> None:
            await service.receive_inventory(message.data)

        await client.subscribe(INVENTORY_SUBJECTS, cb=on_inventory)
        await client.publish(RESYNC_SUBJECT, encode(ResyncRequest(requested_by="pyhami-scheduler")))
        await asyncio.sleep(config.resync_wait)
        await service.rebuild()
        tasks.append(asyncio.create_task(service.follow_cluster()))
        tasks.append(asyncio.create_task(service.expire_reservations()))
        tasks.append(asyncio.create_task(service.follow_cordons()))
        if standalone is not None:
            tasks.append(asyncio.create_task(standalone.keep_settled()))
        if loop is not None and config.drive_pending:
            tasks.append(asyncio.create_task(loop.run()))
        logger.info("pyhami scheduler ready on %s:%d", *config.listen)
        if started is not None:
            started(service)
        await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for runner in runners:
            await runner.cleanup()
        if service is not None:
            await service.settle()
        with contextlib.suppress(Exception):
            await client.drain()
