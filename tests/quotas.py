"""ResourceQuota manifests, pods of the quota's namespace and the daemon's quota book, for
the standalone tests of ``/api/resourcequotas``."""

from __future__ import annotations

from typing import Any

import aiohttp

from common.core.quota import QuotaStanding
from pyhami.demo import lab_pod
from pyhami.sandbox import RunningDaemon

NAMESPACE = "team-a"
QUOTAS = "/api/resourcequotas"


def quota(name: str, memory: int | None = None, cores: int | None = None,
          namespace: str = NAMESPACE, **spec: Any) -> dict[str, Any]:
    """A ResourceQuota as ``kubectl get resourcequota -o json`` prints one."""
    hard: dict[str, Any] = {"pods": "100"}
    if memory is not None:
        hard["limits.nvidia.com/gpumem"] = str(memory)
    if cores is not None:
        hard["limits.nvidia.com/gpucores"] = str(cores)
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"hard": hard, **spec}, "status": {}}


def team_pod(name: str, memory: int, priority_class: str | None = None,
             namespace: str = NAMESPACE) -> dict[str, Any]:
    """A one-card pod of ``memory`` MiB in the quota's namespace."""
    pod = lab_pod(name, limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory})
    pod["metadata"]["namespace"] = namespace
    if priority_class is not None:
        pod["spec"]["priorityClassName"] = priority_class
    return pod


def sentence(used_after: int, limit: int, quota_name: str, asked: int,
             namespace: str = NAMESPACE) -> str:
    """The refusal sentence for GPU memory."""
    return (f"{namespace} would use {used_after} of {limit} MiB nvidia.com/gpumem under "
            f"ResourceQuota {quota_name} (asked {asked})")


async def call(http: aiohttp.ClientSession, method: str, url: str, *,
               json_body: object = None, data: str | bytes | None = None) -> tuple[int, str]:
    """One request: its status and its text."""
    async with http.request(method, url, json=json_body, data=data) as response:
        return response.status, await response.text()


def standings(daemon: RunningDaemon) -> list[QuotaStanding]:
    """The daemon's quotas, each with what it charges and its limit."""
    assert daemon.service is not None
    return daemon.service.state.fleet.quotas.standings()
