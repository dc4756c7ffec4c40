"""``pyhami bench fleet``: many simulated agents over a NATS cluster of three, and the daemon.

Three routed nats-servers with JetStream (``pyhami.natsserver.LocalNatsCluster``, unless
``--nats`` names running servers) and one ``pyhami scheduler --standalone`` daemon, each a
process of its own on loopback. ``--agents`` simulated agents, spread over ``--processes``
worker processes with one asyncio loop each, hold one NATS connection apiece and behave as
the real agent does on the bus: an inventory on their node's subject when they connect
(``start``), after a reconnection (``reconnect``), every ``--heartbeat`` seconds
(``heartbeat``, spread evenly over the period) and when the daemon asks (``resync``), built
by the agent's own ``Report`` from a simulated card profile and encoded with the wire types.

Measured over ``--duration`` once the daemon has seen every node: what the daemon accepts per
second, its CPU, RSS and peak RSS, each server's memory and CPU, the simulator's own CPU.
Then the daemon is stopped (SIGTERM) and started again: the time from the new process's start
to its /readyz and to every node seen.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import multiprocessing.synchronize
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from agent.report import Report
from agent.vendors.nvidia.simulated import PROFILES, profile_cards
from common.arguments import Subcommands, positive_int, positive_seconds
from common.wire import (
    RESYNC_SUBJECT,
    Reason,
    WireError,
    decode_resync,
    encode,
    inventory_subject,
)
from pyhami.bench.extender import cpu_seconds
from pyhami.bench.loopback import http_get
from pyhami.natsserver import LocalNatsCluster, free_port

AGENTS_PER_PROCESS = 5000
"""The default share of one worker process (see docs/performance.md for the measurement)."""
CONNECTING_AT_ONCE = 50  # connection handshakes in flight in one worker
START_TIMEOUT_S = 120.0
SEEN_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0
POLL_S = 0.05
NODE_PREFIX = "fleet-"


def register(benches: Subcommands) -> None:
    parser = benches.add_parser(
        "fleet", help="simulated agents over a NATS cluster of three: the daemon's ingestion, "
                      "CPU and memory, each server's memory, the daemon's restart")
    parser.add_argument("--agents", type=positive_int, default=5000,
                        help="simulated agents, one NATS connection each (default 5000)")
    parser.add_argument("--heartbeat", type=positive_seconds, default=2.0, metavar="SECONDS",
                        help="each agent's heartbeat period (default 2)")
    parser.add_argument("--duration", type=positive_seconds, default=30.0, metavar="SECONDS",
                        help="the measured window once every node is seen (default 30)")
    parser.add_argument("--cards", choices=sorted(PROFILES), default="t4x4", metavar="PROFILE",
                        help="the simulated card profile of every node: "
                             f"{', '.join(sorted(PROFILES))} (default t4x4)")
    parser.add_argument("--processes", type=positive_int, default=None, metavar="K",
                        help="worker processes the agents are spread over (default: one per "
                             f"{AGENTS_PER_PROCESS} agents)")
    parser.add_argument("--nats", metavar="URL[,URL...]", default=None,
                        help="running nats-servers (a cluster's, with JetStream) instead of "
                             "three started here; their memory is then not reported")
    parser.add_argument("--resync-wait", type=positive_seconds, default=2.0, metavar="SECONDS",
                        help="the daemon's --resync-wait (default 2, the daemon's own)")
    parser.set_defaults(handler=run)


# The simulated agents (in the worker processes) ------------------------------------------


@dataclass(frozen=True)
class Share:
    """The agents one worker process plays: every ``step``-th of ``total`` from ``first``.

    Interleaved shares keep each worker's heartbeats spread over the whole period."""

    servers: tuple[str, ...]
    first: int
    step: int
    total: int
    heartbeat: float
    profile: str

    @property
    def numbers(self) -> range:
        return range(self.first, self.total, self.step)


def node_name(number: int) -> str:
    return f"{NODE_PREFIX}{number:05d}"


def home_first(servers: Sequence[str], number: int) -> list[str]:
    """Every server, agent ``number``'s own first: round-robin over the servers, the others
    kept to fail over to."""
    home = number % len(servers)
    return [*servers[home:], *servers[:home]]


class SimulatedAgent:
    """One node's agent on the bus: its own connection, its inventory from a simulated
    profile, published as the real agent publishes it."""

    def __init__(self, number: int, share: Share) -> None:
        self.node = node_name(number)
        self.servers = home_first(share.servers, number)
        # The heartbeat's moment within the period: the fleet's agents evenly spread.
        self.offset = share.heartbeat * number / share.total
        self.report = Report(self.node, secrets.token_hex(8), share.heartbeat)
        self.report.observe(profile_cards(share.profile, self.node))
        self.subject = inventory_subject(self.node)
        self.client: Client | None = None
        self.published = 0
        self.failed = 0
        # As in the real agent: a resync answered while a heartbeat is going out must not
        # reuse its sequence number.
        self._publishing = asyncio.Lock()

    async def connect(self) -> None:
        self.client = await nats.connect(
            servers=self.servers, dont_randomize=True, name=f"pyhami-agent {self.node}",
            max_reconnect_attempts=-1, reconnect_time_wait=1, connect_timeout=10,
            reconnected_cb=self._reconnected, error_cb=self._error)
        await self.client.subscribe(RESYNC_SUBJECT, cb=self._on_resync)
        await self.publish("start")

    async def publish(self, reason: Reason) -> None:
        async with self._publishing:
            if self.client is None:
                return
            message = self.report.message(reason, time.time())
            try:
                await self.client.publish(self.subject, encode(message))
            except NatsError:
                self.failed += 1
                return
            self.report.confirm(message)
            self.published += 1

    async def _reconnected(self) -> None:
        await self.publish("reconnect")

    async def _error(self, error: Exception) -> None:
        # Counted through failed publishes; a line per connection would flood the output.
        del error

    async def _on_resync(self, message: Msg) -> None:
        try:
            request = decode_resync(message.data)
            asked = request.includes(self.node)
        except WireError:
            asked = True  # as the real agent: answered as a request to every agent
        if asked:
            await self.publish("resync")

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()


async def heartbeats(agents: Sequence[SimulatedAgent], period: float) -> None:
    """Each agent's heartbeat every ``period`` at its own offset, forever: one timer for the
    whole worker rather than a task per agent."""
    ordered = sorted(agents, key=lambda agent: agent.offset)
    loop = asyncio.get_running_loop()
    origin = loop.time()
    cycle = 0
    while True:
        cycle += 1
        for agent in ordered:
            delay = origin + cycle * period + agent.offset - loop.time()
            if delay > 0.001:
                await asyncio.sleep(delay)
            await agent.publish("heartbeat")


async def play(share: Share, connected: multiprocessing.synchronize.Event,
               stop: multiprocessing.synchronize.Event, published: Synchronized[int],
               failed: Synchronized[int]) -> None:
    agents = [SimulatedAgent(number, share) for number in share.numbers]
    gate = asyncio.Semaphore(CONNECTING_AT_ONCE)

    async def connect(agent: SimulatedAgent) -> None:
        async with gate:
            await agent.connect()

    try:
        await asyncio.gather(*(connect(agent) for agent in agents))
        connected.set()
        beating = asyncio.create_task(heartbeats(agents, share.heartbeat))
        while not stop.is_set():
            await asyncio.sleep(0.2)
            # Only this worker writes its counters: no lock needed.
            published.value = sum(agent.published for agent in agents)
            failed.value = sum(agent.failed for agent in agents)
        beating.cancel()
    finally:
        await asyncio.gather(*(agent.close() for agent in agents), return_exceptions=True)


def worker(share: Share, connected: multiprocessing.synchronize.Event,
           stop: multiprocessing.synchronize.Event, published: Synchronized[int],
           failed: Synchronized[int]) -> None:
    """A worker process's whole life: its share of the fleet, until ``stop``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench stops it by ``stop``
    asyncio.run(play(share, connected, stop, published, failed))


@dataclass
class Worker:
    process: multiprocessing.process.BaseProcess
    connected: multiprocessing.synchronize.Event
    published: Synchronized[int]
    failed: Synchronized[int]

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid


@dataclass
class Fleet:
    """The worker processes playing the agents."""

    shares: list[Share]
    context: multiprocessing.context.SpawnContext = field(
        default_factory=lambda: multiprocessing.get_context("spawn"))
    workers: list[Worker] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stop_event = self.context.Event()

    def start(self) -> None:
        for share in self.shares:
            connected = self.context.Event()
            published = self.context.Value("q", 0, lock=False)
            failed = self.context.Value("q", 0, lock=False)
            process = self.context.Process(
                target=worker, args=(share, connected, self.stop_event, published, failed),
                name=f"pyhami-fleet-{share.first}", daemon=True)
            process.start()
            self.workers.append(Worker(process, connected, published, failed))

    def wait_connected(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for fleet_worker in self.workers:
            while not fleet_worker.connected.wait(POLL_S):
                if not fleet_worker.process.is_alive():
                    raise RuntimeError(f"a fleet worker exited with code "
                                       f"{fleet_worker.process.exitcode} while connecting")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the agents did not connect within {timeout:g} s")

    def check_running(self) -> None:
        for fleet_worker in self.workers:
            if not fleet_worker.process.is_alive():
                raise RuntimeError(f"a fleet worker exited with code "
                                   f"{fleet_worker.process.exitcode}")

    def published(self) -> int:
        return sum(int(fleet_worker.published.value) for fleet_worker in self.workers)

    def failed(self) -> int:
        return sum(int(fleet_worker.failed.value) for fleet_worker in self.workers)

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(fleet_worker.pid) or 0.0 for fleet_worker in self.workers)

    def rss_mb(self) -> float:
        return round(sum(resident_mb(fleet_worker.pid)[0] or 0.0
                         for fleet_worker in self.workers), 1)

    def stop(self) -> None:
        self.stop_event.set()
        for fleet_worker in self.workers:
            fleet_worker.process.join(STOP_TIMEOUT_S)
            if fleet_worker.process.is_alive():
                fleet_worker.process.kill()
                fleet_worker.process.join()


# The daemon and the servers (in the bench's own process) ---------------------------------


def resident_mb(pid: int | None) -> tuple[float | None, float | None]:
    """A process's resident memory now and at its peak (VmRSS, VmHWM) in MiB; None where
    /proc cannot tell."""
    figures: dict[str, float] = {}
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        key, *value = line.split()
        if key in ("VmRSS:", "VmHWM:"):
            figures[key] = round(int(value[0]) / 1024, 1)  # reported in kB
    return figures.get("VmRSS:"), figures.get("VmHWM:")


class Daemon:
    """``pyhami scheduler --standalone`` as its own process, restartable on the same ports."""

    def __init__(self, nats_url: str, resync_wait: float, log: Path) -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [
            sys.executable, "-m", "pyhami.cli", "scheduler", "--standalone", "--nats", nats_url,
            "--listen", f"127.0.0.1:{self.port}", "--metrics", f"127.0.0.1:{self.metrics_port}",
            # The agents are all alive: none may turn stale while the machine is loaded.
            "--node-timeout", "3600", "--node-retention", "7200",
            "--resync-wait", f"{resync_wait:g}", "--log-level", "warning"]
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.started = time.monotonic()
            self.process = subprocess.Popen(self.command, stdout=log, stderr=log)

    def stop(self) -> float:
        """SIGTERM, then wait: how long it took to exit."""
        if self.process is None:
            return 0.0
        started = time.monotonic()
        self.process.terminate()
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
        return time.monotonic() - started

    def check_running(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the daemon exited with code {self.process.returncode}:\n{tail}")

    def ready(self) -> bool:
        try:
            return http_get(f"{self.url}/readyz", timeout=2)[0] == 200
        except (OSError, urllib.error.URLError):
            return False

    def status(self) -> dict[str, object] | None:
        """``/statusz``, or None while it does not answer."""
        try:
            code, body = http_get(f"{self.url}/statusz", timeout=10)
        except (OSError, urllib.error.URLError):
            return None
        document = json.loads(body) if code == 200 else None
        return document if isinstance(document, dict) else None

    def nodes_seen(self) -> int:
        status = self.status()
        nodes = None if status is None else status.get("nodes")
        return nodes if isinstance(nodes, int) else 0

    def accepted(self) -> int:
        status = self.status()
        accepted = None if status is None else status.get("inventory_accepted")
        if not isinstance(accepted, int):
            raise RuntimeError("the daemon's /statusz has no inventory_accepted")
        return accepted


def wait_until(check: Callable[[], bool], what: str, timeout: float,
               watch: Sequence[Callable[[], None]] = (), interval: float = POLL_S) -> float:
    """Poll ``check`` until true; the seconds it took. ``watch`` raise if a process died."""
    started = time.monotonic()
    while not check():
        for still_running in watch:
            still_running()
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - started


@dataclass
class Servers:
    """The nats-servers the bench started (None: running ones given by ``--nats``)."""

    cluster: LocalNatsCluster | None

    def cpu_seconds(self) -> list[float | None]:
        if self.cluster is None:
            return []
        return [None if server.pid is None else cpu_seconds(server.pid)
                for server in self.cluster.servers]

    def figures(self, cpu_before: list[float | None], seconds: float) -> list[dict[str, object]]:
        """Each server's memory (its own /varz ``mem``, and RSS from /proc), its CPU over
        the window, and how many clients it holds."""
        if self.cluster is None:
            return []
        figures: list[dict[str, object]] = []
        for index, (server, before) in enumerate(
                zip(self.cluster.servers, cpu_before, strict=True)):
            varz = self.cluster.varz(index)
            mem = varz.get("mem")
            rss, peak = resident_mb(server.pid)
            after = None if server.pid is None else cpu_seconds(server.pid)
            figures.append({
                "url": server.url, "clients": varz.get("connections"),
                "varz_mem_mb": round(mem / 2**20, 1) if isinstance(mem, int) else None,
                "rss_mb": rss, "peak_rss_mb": peak,
                "cpu_s_per_s": None if before is None or after is None
                else round((after - before) / seconds, 3)})
        return figures


def refusal(args: argparse.Namespace) -> str | None:
    if args.processes is not None and args.processes > args.agents:
        return f"--processes {args.processes} is more than --agents {args.agents}"
    if args.nats is not None and not all(url.strip() for url in args.nats.split(",")):
        return f"--nats {args.nats!r} names an empty server"
    return None


def run(args: argparse.Namespace) -> int:
    problem = refusal(args)
    if problem is not None:
        print(f"pyhami bench fleet: {problem}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="pyhami-bench-fleet-") as scratch:
        cluster = None if args.nats is not None else LocalNatsCluster(
            Path(scratch) / "nats", name="pyhami-bench")
        try:
            if cluster is not None:
                cluster.start()
            nats_url = args.nats if cluster is None else cluster.url
            result = bench(args, nats_url, Servers(cluster), Path(scratch) / "daemon.log")
        except KeyboardInterrupt:
            print("pyhami bench fleet: interrupted", file=sys.stderr)
            return 130
        except Exception as error:
            print(f"pyhami bench fleet failed: {error}", file=sys.stderr)
            return 1
        finally:
            if cluster is not None:
                cluster.stop()
    print(json.dumps(result))
    return 0


def bench(args: argparse.Namespace, nats_url: str, servers: Servers,
          log: Path) -> dict[str, object]:
    urls = tuple(url.strip() for url in nats_url.split(","))
    count: int = args.agents
    processes: int = args.processes or math.ceil(count / AGENTS_PER_PROCESS)
    cards = len(profile_cards(args.cards, node_name(0)))
    fleet = Fleet([Share(urls, first, processes, count, args.heartbeat, args.cards)
                   for first in range(processes)])
    daemon = Daemon(nats_url, args.resync_wait, log)
    watch = (daemon.check_running, fleet.check_running)
    try:
        daemon.start()
        wait_until(daemon.ready, "the daemon's /readyz", START_TIMEOUT_S, watch)
        started = time.monotonic()
        fleet.start()
        fleet.wait_connected(START_TIMEOUT_S + count / 100)
        connect_s = time.monotonic() - started
        wait_until(lambda: daemon.nodes_seen() >= count, f"the daemon to see {count} nodes",
                   SEEN_TIMEOUT_S, watch, interval=0.5)
        seen_s = time.monotonic() - started
        # A period of heartbeats before the window: the connection burst is behind.
        time.sleep(args.heartbeat)
        window = measure(args, daemon, fleet, servers, cards)
        restart = restart_daemon(daemon, count, watch)
    finally:
        daemon.stop()
        fleet.stop()
    return {
        "agents": count, "processes": processes, "heartbeat_s": args.heartbeat,
        "profile": args.cards, "cards_per_node": cards, "servers": len(urls),
        "duration_s": args.duration, "resync_wait_s": args.resync_wait,
        "connect_s": round(connect_s, 2), "all_nodes_seen_s": round(seen_s, 2),
        "expected_inventories_per_s": round(count / args.heartbeat, 1),
        **window,
        "restart": restart,
    }


def measure(args: argparse.Namespace, daemon: Daemon, fleet: Fleet, servers: Servers,
            cards: int) -> dict[str, object]:
    """The window: rates from counters read at its two ends, memory at its end."""
    accepted_before = daemon.accepted()
    published_before = fleet.published()
    failed_before = fleet.failed()
    daemon_cpu_before = cpu_seconds(daemon.pid)
    fleet_cpu_before = fleet.cpu_seconds()
    servers_cpu_before = servers.cpu_seconds()
    started = time.monotonic()
    deadline = started + args.duration
    while time.monotonic() < deadline:
        daemon.check_running()
        fleet.check_running()
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    seconds = time.monotonic() - started
    daemon_cpu_after = cpu_seconds(daemon.pid)
    fleet_cpu_after = fleet.cpu_seconds()
    accepted = daemon.accepted() - accepted_before
    rss, peak = resident_mb(daemon.pid)
    return {
        "ingest_inventories_per_s": round(accepted / seconds, 1),
        "ingest_cards_per_s": round(accepted * cards / seconds, 1),
        "published_per_s": round((fleet.published() - published_before) / seconds, 1),
        "failed_publishes": fleet.failed() - failed_before,
        "daemon_cpu_s_per_s": None if daemon_cpu_before is None or daemon_cpu_after is None
        else round((daemon_cpu_after - daemon_cpu_before) / seconds, 3),
        "daemon_rss_mb": rss, "daemon_peak_rss_mb": peak,
        "simulator_cpu_s_per_s": round((fleet_cpu_after - fleet_cpu_before) / seconds, 3),
        "simulator_rss_mb": fleet.rss_mb(),
        "nats_servers": servers.figures(servers_cpu_before, seconds),
    }


def restart_daemon(daemon: Daemon, count: int,
                   watch: Sequence[Callable[[], None]]) -> dict[str, object]:
    """Stop the daemon with SIGTERM and start it again: how long until it is ready, and
    until it has seen every node again (from the new process's start)."""
    stop_s = daemon.stop()
    daemon.start()
    wait_until(daemon.ready, "the restarted daemon's /readyz", START_TIMEOUT_S, watch,
               interval=0.02)
    ready_s = time.monotonic() - daemon.started
    nodes_at_ready = daemon.nodes_seen()
    wait_until(lambda: daemon.nodes_seen() >= count,
               f"the restarted daemon to see {count} nodes", SEEN_TIMEOUT_S, watch,
               interval=0.1)
    all_nodes_s = time.monotonic() - daemon.started
    return {"stop_s": round(stop_s, 2), "ready_s": round(ready_s, 2),
            "nodes_at_ready": nodes_at_ready, "all_nodes_s": round(all_nodes_s, 2),
            "daemon_cpu_s_to_all_nodes": cpu_seconds(daemon.pid)}
