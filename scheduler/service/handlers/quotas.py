"""The namespaces' ResourceQuotas as they change: applied, replaced or dropped in the
fleet's quota book; one that cannot be applied is refused once for each reason, keeping
its last valid limits."""

from __future__ import annotations

import logging

from common.core.quota import Quota, QuotaRejected, ResourceQuotaManifest, parse_quota
from scheduler.cluster import QuotaChange
from scheduler.metrics import Metrics
from scheduler.service.shared import Reports, ServicePart, Shared

logger = logging.getLogger(__name__)


class Quotas(ServicePart):
    """What the daemon does as the namespaces' ResourceQuotas change."""

    def __init__(self, shared: Shared, metrics: Metrics, reports: Reports) -> None:
        super().__init__(shared, metrics, reports)
        # ResourceQuota -> why it was refused, so each refusal is logged and told once,
        # not at every status update the quota controller writes.
        self._refused_quotas: dict[str, str] = {}

    async def follow_quotas(self) -> None:
        """Apply the namespaces' ResourceQuotas as they change, for as long as it runs."""
        async for change in self.cluster.quota_changes():
            await self.on_quota_change(change)

    async def on_quota_change(self, change: QuotaChange) -> None:
        """Apply, replace or drop one quota; pods waiting may fit under the new limits."""
        manifest = change.quota
        namespace, name = manifest.namespace, manifest.metadata.name
        book = self.state.fleet.quotas
        if change.deleted:
            self._refused_quotas.pop(manifest.key, None)
            if book.remove_quota(namespace, name) is not None:
                logger.info("ResourceQuota %s deleted: its GPU limits no longer apply",
                            manifest.key)
                self.reports.retry_waiting()
            return
        quota = await self.read_quota(manifest)
        if quota is None or book.quota(namespace, name) == quota:
            return  # refused, or only its status changed
        if not quota.limits_gpu:  # Kubernetes' own resources only
            if book.remove_quota(namespace, name) is not None:
                logger.info("ResourceQuota %s no longer limits GPUs", manifest.key)
                self.reports.retry_waiting()
            return
        book.set_quota(quota)
        logger.info("ResourceQuota %s applies: %s", manifest.key, _limits(quota))
        self.reports.retry_waiting()

    async def read_quota(self, manifest: ResourceQuotaManifest) -> Quota | None:
        """The quota, or None when it cannot be applied: then logged, counted and told in
        a Warning Event on it, once for each reason. A quota refused after a valid version
        keeps that version's limits (a typo must not lift a namespace's cap)."""
        try:
            quota = parse_quota(manifest, self.settings.defaults.device)
        except QuotaRejected as error:
            why = str(error)
            if self._refused_quotas.get(manifest.key) != why:
                self._refused_quotas[manifest.key] = why
                kept = self.state.fleet.quotas.quota(manifest.namespace,
                                                     manifest.metadata.name)
                outcome = ("its last valid limits stay applied" if kept is not None
                           else "it is not applied")
                logger.error("%s; %s", why, outcome)
                self.metrics.quotas_refused.inc()
                await self.cluster.record_quota_event(
                    manifest.namespace, manifest.metadata.name, "Warning", "QuotaRefused",
                    f"pyhami cannot apply this quota: {why}; {outcome}")
            return None
        self._refused_quotas.pop(manifest.key, None)
        return quota


def _limits(quota: Quota) -> str:
    parts = []
    if quota.memory is not None:
        parts.append(f"{quota.memory} MiB of GPU memory")
    if quota.cores is not None:
        parts.append(f"{quota.cores}% of a card's cores")
    scoped = f", to pods matching {len(quota.rules)} scopes" if quota.rules else ""
    return " and ".join(parts) + scoped
