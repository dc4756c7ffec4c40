"""The admission webhook on its own HTTPS listener, with its certificate from the files
(followed as they change) or from a Secret (made first if need be, its CA kept in the
webhook configuration's caBundle)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from common.core.deviceconfig import DeviceConfig
from common.supervision import Supervisor
from scheduler.cluster import WebhookCluster
from scheduler.tls.files import CertificateFiles
from scheduler.tls.webhook import CaBundleKeeper, context_for, self_managed_at_start
from scheduler.web.probes import serve
from scheduler.web.webhook import WEBHOOK_PATH, QuotaGate, webhook_app

logger = logging.getLogger(__name__)


class WebhookSettings(Protocol):
    """What the server reads of the webhook's settings (``scheduler.config.WebhookConfig``)."""

    @property
    def listen(self) -> tuple[str, int]: ...

    @property
    def namespace(self) -> str: ...

    @property
    def tls_secret(self) -> str: ...

    @property
    def service(self) -> str: ...

    @property
    def configuration(self) -> str: ...

    @property
    def check_period(self) -> float: ...


@dataclass(frozen=True)
class WebhookServer:
    runner: web.AppRunner
    status: Callable[[], dict[str, object]]
    """``/statusz``'s ``webhook``: its listener, certificate and caBundle."""


async def serve_webhook(settings: WebhookSettings, scheduler_name: str, quota: QuotaGate,
                        device: DeviceConfig, *, files: CertificateFiles | None,
                        secrets: WebhookCluster | None, supervisor: Supervisor,
                        phase: Callable[[str], None]) -> WebhookServer:
    """The webhook on its listener, with its certificate from ``files`` (followed) or from
    the Secret in ``secrets`` (made first if need be, its CA kept in the configuration's
    caBundle); ``phase`` is told what the start waits on."""
    status: dict[str, object] = {"listen": f"{settings.listen[0]}:{settings.listen[1]}",
                                 "scheduler_name": scheduler_name}
    keeper: CaBundleKeeper | None = None
    if files is not None:
        context = files.context
        status["certificate"] = files.describe()
        supervisor.start("webhook-certificate-files", files.follow)
    else:
        assert secrets is not None, "checked by the CLI: standalone needs the files"
        phase(f"reading the webhook certificate from Secret "
              f"{settings.namespace}/{settings.tls_secret}")
        tls = await self_managed_at_start(secrets, settings.namespace, settings.tls_secret,
                                          settings.service)
        context = context_for(tls)
        status["certificate"] = f"Secret {settings.namespace}/{settings.tls_secret}"
        keeper = CaBundleKeeper(secrets, settings.configuration, tls.ca,
                                settings.check_period)
        supervisor.start("webhook-ca-bundle", keeper.run)
    runner = await serve(webhook_app(scheduler_name, quota, device), settings.listen,
                         context)
    logger.info("webhook on https://%s:%d%s", *settings.listen, WEBHOOK_PATH)

    def report() -> dict[str, object]:
        if keeper is None:
            return status
        return {**status, "configuration": settings.configuration,
                "ca_bundle": keeper.state}

    return WebhookServer(runner, report)
