"""A whole pyhami on this machine: nats-server, simulated agents and the standalone daemon.

The demo runs in one; so do the daemon's tests.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from agent.mig.setup import simulated_mig_node
from agent.service import Agent, AgentSettings
from agent.vendors.nvidia.simulated import MIG_PROFILES, SimulatedSource, profile_cards
from common.core import Defaults, NodePolicy, parse_default_chain
from common.messaging import NatsSettings
from pyhami.natsserver import LocalNatsServer, free_port
from scheduler.config import DaemonConfig
from scheduler.daemon import run_daemon
from scheduler.service import SchedulerService, ServiceSettings

START_TIMEOUT_S = 30.0
DEFAULTS = Defaults(parse_default_chain("spread"), NodePolicy.BINPACK)


def servers_of(nats_url: str) -> tuple[str, ...]:
    """The servers of a ``--nats`` value: one URL, or several separated by commas (a
    cluster's)."""
    return tuple(nats_url.split(","))


def standalone_config(nats_url: str, **overrides: Any) -> DaemonConfig:
    """A standalone daemon on a free loopback port, quick to start and to retry;
    ``nats_url`` may name a cluster's servers, separated by commas."""
    config = DaemonConfig(
        nats=NatsSettings(servers=servers_of(nats_url)), mode="standalone",
        service=ServiceSettings(DEFAULTS), listen=("127.0.0.1", free_port()), metrics=None,
        resync_wait=0.3, retry_period=0.5)
    return replace(config, **overrides)


class RunningDaemon:
    """``pyhami scheduler`` inside this event loop."""

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.url = f"http://127.0.0.1:{config.listen[1]}"
        self.service: SchedulerService | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> RunningDaemon:
        ready = asyncio.Event()

        def started(service: SchedulerService) -> None:
            self.service = service
            ready.set()

        self._stop = asyncio.Event()
        self._task = asyncio.create_task(run_daemon(self.config, self._stop, started))
        waiter = asyncio.create_task(ready.wait())
        try:
            done, _ = await asyncio.wait({waiter, self._task}, timeout=START_TIMEOUT_S,
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # Interrupted while starting: the daemon must not outlive its caller.
            waiter.cancel()
            await self.stop()
            raise
        if waiter not in done:
            waiter.cancel()
            if self._task in done:
                self._task.result()  # raises what stopped the daemon
            raise TimeoutError(f"the daemon did not become ready in {START_TIMEOUT_S:g} s")
        return self

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, START_TIMEOUT_S)
            self._task = None


@dataclass
class SimulatedAgent:
    """A real agent over a simulated inventory; ``source`` changes processes and health."""

    name: str
    source: SimulatedSource
    agent: Agent
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    @classmethod
    def start(cls, name: str, nats_url: str, profile: str = "t4x4",
              poll_interval: float = 0.2) -> SimulatedAgent:
        source = SimulatedSource(profile_cards(profile, name))
        settings = AgentSettings(name, poll_interval=poll_interval, heartbeat_interval=0.5)
        nats = NatsSettings(servers=servers_of(nats_url))
        table = MIG_PROFILES.get(profile)
        if table is None:
            agent = Agent(settings, source, nats)
        else:
            # A node in MIG mode: its cards report their profiles (the chart's allowlist).
            mig = simulated_mig_node(source, table,
                                     settings.device.device.mig_profile_allowlist)
            agent = Agent(settings, mig.source, nats, mig=mig.manager)
        node = cls(name, source, agent)
        node.task = asyncio.create_task(agent.run(node.stop))
        return node

    async def halt(self) -> None:
        self.stop.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, START_TIMEOUT_S)
            self.task = None


class Sandbox:
    """nats-server (JetStream in a temporary folder), agents, and a standalone daemon.

    Used as ``async with``: everything it started is stopped on the way out,
    whatever ends the block.
    """

    def __init__(self, nodes: list[tuple[str, str]], *, port: int | None = None,
                 nats_port: int | None = None, defaults: Defaults = DEFAULTS,
                 drive_pending: bool = False) -> None:
        self._nodes = nodes
        self._port = port
        self._nats_port = nats_port
        self._defaults = defaults
        self._drive_pending = drive_pending
        self._scratch = tempfile.TemporaryDirectory(prefix="pyhami-")
        self.nats: LocalNatsServer | None = None
        self.agents: list[SimulatedAgent] = []
        self.daemon: RunningDaemon | None = None

    @property
    def url(self) -> str:
        assert self.daemon is not None
        return self.daemon.url

    async def __aenter__(self) -> Sandbox:
        try:
            await self._start()
        except BaseException:
            await self._stop()
            raise
        return self

    async def _start(self) -> None:
        self.nats = LocalNatsServer(port=self._nats_port, extra_args=[
            "-js", "-sd", str(Path(self._scratch.name) / "jetstream")])
        await asyncio.to_thread(self.nats.start)
        self.agents = [SimulatedAgent.start(name, self.nats.url, profile)
                       for name, profile in self._nodes]
        listen = ("127.0.0.1", self._port if self._port is not None else free_port())
        config = standalone_config(self.nats.url, listen=listen,
                                   service=ServiceSettings(self._defaults),
                                   drive_pending=self._drive_pending)
        self.daemon = await RunningDaemon(config).start()
        service = self.daemon.service
        assert service is not None
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        while any(service.state.fleet.node(name) is None for name, _ in self._nodes):
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("the simulated nodes did not report in time")
            await asyncio.sleep(0.05)

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self._stop()

    async def _stop(self) -> None:
        if self.daemon is not None:
            await self.daemon.stop()
            self.daemon = None
        for agent in self.agents:
            await agent.halt()
        self.agents = []
        if self.nats is not None:
            self.nats.kill()
            self.nats = None
        self._scratch.cleanup()
