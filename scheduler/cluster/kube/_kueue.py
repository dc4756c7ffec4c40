"""``KueueWorkloads``: the ``KueueApi`` port on Kubernetes: Kueue's Workloads and
AdmissionChecks listed and watched, and the check's state written on a Workload's status
by server-side apply (the check's own entry, nothing else)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import UTC, datetime

from common.core.workloads import Workload
from scheduler.cluster.kube import _client
from scheduler.cluster.kube._client import ADMISSION_CHECKS, WORKLOADS
from scheduler.cluster.kube._requests import check_active_body, check_state_body
from scheduler.cluster.kube._transport import API_FAILURES, ApiTransport, describe_failure
from scheduler.cluster.kube._watch import UnreadableLog, follow
from scheduler.cluster.port import AdmissionCheckChange, CheckUpdate, ClusterError, WorkloadChange


class KueueWorkloads:
    """Kueue's objects on a Kubernetes API server. Every write raises ``ClusterError``
    when the API fails."""

    def __init__(self, api: ApiTransport, *, unreadable: UnreadableLog | None = None) -> None:
        self._api = api
        self.unreadable = unreadable or UnreadableLog(("Workload", "AdmissionCheck"))

    async def workload_changes(self) -> AsyncIterator[WorkloadChange]:
        async with aclosing(follow(self._api, WORKLOADS, None, self.unreadable)) as changes:
            async for change in changes:
                yield change

    async def admission_check_changes(self) -> AsyncIterator[AdmissionCheckChange]:
        async with aclosing(follow(self._api, ADMISSION_CHECKS, None,
                                   self.unreadable)) as changes:
            async for change in changes:
                yield change

    async def set_check(self, workload: Workload, check: str, update: CheckUpdate) -> None:
        body = check_state_body(workload, check, update, _now())
        try:
            await _client.apply_workload_status(self._api, workload.metadata.namespace,
                                                workload.metadata.name, body)
        except API_FAILURES as error:
            raise ClusterError(f"Workload {workload.key}: check {check} could not be set "
                               f"{update.state.value}: {describe_failure(error)}") from error

    async def activate_check(self, name: str, message: str) -> None:
        try:
            await _client.apply_admission_check_status(self._api, name,
                                                       check_active_body(name, message, _now()))
        except API_FAILURES as error:
            raise ClusterError(f"AdmissionCheck {name} could not be marked Active: "
                               f"{describe_failure(error)}") from error


def _now() -> datetime:
    return datetime.fromtimestamp(time.time(), UTC)
