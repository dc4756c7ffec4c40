"""Running the real daemon, simulated agents and a kube-scheduler stand-in inside a test."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import nats
from nats.js.errors import KeyNotFoundError, NoKeysError

from common.core.groups import KUEUE_COUNT_ANNOTATION, KUEUE_GROUP_LABEL
from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsServer
from pyhami.sandbox import RunningDaemon, SimulatedAgent, standalone_config
from scheduler.cluster.standalone import BUCKET
from scheduler.service import SchedulerService

WAIT_S = 15.0


def metric_sample(exposition: str, series: str) -> float | None:
    """The value of one series, named with its labels as /metrics writes them, if there."""
    found = re.search(rf"^{re.escape(series)} (\S+)$", exposition, re.MULTILINE)
    return float(found[1]) if found else None


def inventory_count(service: SchedulerService, result: str) -> float | None:
    """``pyhami_inventory_messages_total{result}`` as the daemon's /metrics shows it."""
    return metric_sample(service.metrics.exposition().decode(),
                         f'pyhami_inventory_messages_total{{result="{result}"}}')


async def eventually(check: Callable[[], Awaitable[bool]], what: str,
                     timeout: float = WAIT_S) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


class PodClient:
    """The standalone pod API, as the demo and a user would call it."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url

    async def submit(self, pod: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(f"{self.url}/api/pods", json=pod) as response:
            assert response.status == 201, await response.text()
            created: dict[str, Any] = await response.json()
            return created

    async def get(self, name: str, namespace: str = "default") -> dict[str, Any]:
        async with self.session.get(f"{self.url}/api/pods/{namespace}/{name}") as response:
            assert response.status == 200, await response.text()
            pod: dict[str, Any] = await response.json()
            return pod

    async def delete(self, name: str, namespace: str = "default") -> None:
        async with self.session.delete(f"{self.url}/api/pods/{namespace}/{name}") as response:
            assert response.status == 204, await response.text()

    async def pods(self) -> list[dict[str, Any]]:
        async with self.session.get(f"{self.url}/api/pods") as response:
            pods: list[dict[str, Any]] = await response.json()
            return pods

    async def placed(self, name: str, namespace: str = "default",
                     timeout: float = WAIT_S) -> dict[str, Any]:
        """Wait until the pod is bound; returns it."""
        pod: dict[str, Any] = {}

        async def bound() -> bool:
            nonlocal pod
            pod = await self.get(name, namespace)
            return pod["node"] is not None

        await eventually(bound, f"pod {name} to be placed", timeout)
        return pod

    async def pending_with(self, name: str, reason: str,
                           namespace: str = "default") -> dict[str, Any]:
        """Wait until the pod carries a ``reason`` Event; returns it."""
        pod: dict[str, Any] = {}

        async def failed() -> bool:
            nonlocal pod
            pod = await self.get(name, namespace)
            return any(e["reason"] == reason for e in pod["events"])

        await eventually(failed, f"pod {name} to get a {reason} event")
        return pod

    async def submit_and_place(self, pod: dict[str, Any]) -> str:
        await self.submit(pod)
        placed = await self.placed(pod["metadata"]["name"])
        allocated: str = placed["annotations"]["hami.io/vgpu-devices-allocated"]
        return allocated


def filtering_failed(pod: dict[str, Any]) -> list[str]:
    """The messages of the pod's ``FilteringFailed`` Events, the latest last."""
    return [str(e["message"]) for e in pod["events"] if e["reason"] == "FilteringFailed"]


def refusal_sentence(pod: dict[str, Any], nodes: int = 1) -> str:
    """pyhami's sentence in the pod's one ``FilteringFailed`` summary, after HAMi's
    ``no available node, <nodes> nodes do not meet: ``."""
    opening = f"no available node, {nodes} nodes do not meet: "
    (summary,) = [m for m in filtering_failed(pod) if m.startswith("no available node, ")]
    assert summary.startswith(opening), summary
    return summary.removeprefix(opening)


def card_of(allocated: str) -> str:
    """The one card uuid of a one-container, one-card allocation annotation."""
    return allocated.split(",", 1)[0]


@dataclass
class Lab:
    """The standalone lab (the ``lab`` fixture of tests/conftest.py): a nats-server with
    JetStream, one simulated node, the standalone daemon and its pod API. On the real
    control plane the e2e suite's lab is ``tests.e2e.pods.ClusterLab``."""

    nats: LocalNatsServer
    node: SimulatedAgent
    daemon: RunningDaemon
    pods: PodClient

    async def restart_daemon(self) -> None:
        """Stop the daemon and start a new one on the same NATS, the pod client pointed
        at it."""
        await self.daemon.stop()
        self.daemon = await RunningDaemon(standalone_config(self.nats.url)).start()
        self.pods.url = self.daemon.url


async def stored_entries(nats_url: str, wanted: Callable[[str], bool]) -> dict[str, bytes]:
    """The entries of the standalone pod bucket whose keys ``wanted`` keeps, read with a
    client of our own: key -> stored value."""
    client = await nats.connect(servers=nats_url.split(","))
    try:
        bucket = await client.jetstream().key_value(BUCKET)
        try:
            keys = await bucket.keys()
        except NoKeysError:
            return {}
        found: dict[str, bytes] = {}
        for key in filter(wanted, keys):
            try:
                entry = await bucket.get(key)
            except KeyNotFoundError:
                continue  # deleted since it was listed
            if entry.value is not None:
                found[key] = entry.value
        return found
    finally:
        await client.close()


GROUP_MEMBER_LIMITS = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 12000}
"""One card of 12,000 MiB: one member a T4."""


def group_member(name: str, group: str | None, count: int = 4,
                 namespace: str = "default") -> dict[str, Any]:
    """A lab pod of ``GROUP_MEMBER_LIMITS``, a member of ``group`` of ``count`` by Kueue's
    label and annotation (None: of no group)."""
    pod = lab_pod(name, limits=dict(GROUP_MEMBER_LIMITS))
    pod["metadata"]["namespace"] = namespace
    if group is not None:
        pod["metadata"]["labels"] = {KUEUE_GROUP_LABEL: group}
        pod["metadata"]["annotations"][KUEUE_COUNT_ANNOTATION] = str(count)
    return pod
