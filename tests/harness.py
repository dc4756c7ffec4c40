"""Running the real daemon, simulated agents and a kube-scheduler stand-in inside a test."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from agent.service import Agent, AgentSettings
from agent.simulated import SimulatedSource, profile_cards
from common.core import Defaults, NodePolicy, parse_default_chain
from common.messaging import NatsSettings
from common.natsserver import LocalNatsServer, free_port
from scheduler.app import DaemonConfig, run_daemon
from scheduler.service import SchedulerService, ServiceSettings

DEFAULTS = Defaults(parse_default_chain("spread"), NodePolicy.BINPACK)
WAIT_S = 15.0


def daemon_config(nats_url: str, **overrides: Any) -> DaemonConfig:
    config = DaemonConfig(
        nats=NatsSettings(servers=(nats_url,)), mode="standalone",
        service=ServiceSettings(DEFAULTS), listen=("127.0.0.1", free_port()), metrics=None,
        resync_wait=0.3, retry_period=0.5)
    return replace(config, **overrides)


class Daemon:
    """``pyhami scheduler --standalone`` in this event loop."""

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.url = f"http://127.0.0.1:{config.listen[1]}"
        self.service: SchedulerService | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Daemon:
        ready = asyncio.Event()

        def started(service: SchedulerService) -> None:
            self.service = service
            ready.set()

        self._stop = asyncio.Event()
        self._task = asyncio.create_task(run_daemon(self.config, self._stop, started))
        waiter = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait({waiter, self._task}, timeout=WAIT_S,
                                     return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            waiter.cancel()
            if self._task in done:
                self._task.result()  # raises what stopped the daemon
            raise TimeoutError("the daemon did not become ready")
        return self

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, WAIT_S)
            self._task = None


@dataclass
class SimulatedNode:
    """A real agent over a simulated inventory; ``source`` changes processes and health."""

    name: str
    source: SimulatedSource
    agent: Agent
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    @classmethod
    def start(cls, name: str, nats_url: str, profile: str = "t4x4",
              poll_interval: float = 0.2) -> SimulatedNode:
        source = SimulatedSource(profile_cards(profile, name))
        agent = Agent(AgentSettings(name, poll_interval=poll_interval, heartbeat_interval=0.5),
                      source, NatsSettings(servers=(nats_url,)))
        node = cls(name, source, agent)
        node.task = asyncio.create_task(agent.run(node.stop))
        return node

    async def halt(self) -> None:
        self.stop.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, WAIT_S)
            self.task = None


async def eventually(check: Callable[[], Awaitable[bool]], what: str,
                     timeout: float = WAIT_S) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def lab_pod(name: str, annotations: dict[str, str] | None = None,
            limits: dict[str, int] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
        "spec": {"containers": [{"name": "app", "image": "ubuntu:22.04", "resources": {
            "limits": limits or {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}}}]},
    }


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

    async def placed(self, name: str) -> dict[str, Any]:
        """Wait until the pod is bound; returns it."""
        pod: dict[str, Any] = {}

        async def bound() -> bool:
            nonlocal pod
            pod = await self.get(name)
            return pod["node"] is not None

        await eventually(bound, f"pod {name} to be placed")
        return pod

    async def pending_with(self, name: str, reason: str) -> dict[str, Any]:
        """Wait until the pod carries a FilteringFailed event; returns it, still unbound."""
        pod: dict[str, Any] = {}

        async def failed() -> bool:
            nonlocal pod
            pod = await self.get(name)
            return any(e["reason"] == reason for e in pod["events"])

        await eventually(failed, f"pod {name} to get a {reason} event")
        return pod

    async def submit_and_place(self, pod: dict[str, Any]) -> str:
        await self.submit(pod)
        placed = await self.placed(pod["metadata"]["name"])
        allocated: str = placed["annotations"]["hami.io/vgpu-devices-allocated"]
        return allocated


def card_of(allocated: str) -> str:
    """The one card uuid of a one-container, one-card allocation annotation."""
    return allocated.split(",", 1)[0]


@dataclass
class Lab:
    nats: LocalNatsServer
    node: SimulatedNode
    daemon: Daemon
    pods: PodClient
