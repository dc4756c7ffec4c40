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
to its /readyz, to every node seen and to every pod back in its ledger.

With ``--pods N``, N pods are submitted to the daemon's pod API and placed with /filter and
/bind before the window, so the store and the ledger hold them through the restart. With
``--standby``, a second daemon stands by on the same lease; the leader is stopped with
SIGTERM (it hands the lease on), then, once it is back as the standby, the new leader is
killed with SIGKILL (its lease expires): each time, how long until the standby took the
lease, until it was ready to decide, held every pod and answered a new pod's /filter
(``pyhami.bench.takeover``).
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
from pyhami.bench.extender import POD_MEMORY_MIB, cpu_seconds
from pyhami.bench.loopback import http_get
from pyhami.bench.takeover import (
    LeaseWatch,
    place_one,
    place_pods,
    pod_names,
    seconds_since,
    wait_for_lease,
)
from pyhami.natsserver import LocalNatsCluster, free_port

AGENTS_PER_PROCESS = 5000
"""The default share of one worker process (see docs/performance.md for the measurement)."""
CONNECTING_AT_ONCE = 50  # connection handshakes in flight in one worker
START_TIMEOUT_S = 120.0
SEEN_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0
POLL_S = 0.05
NODE_PREFIX = "fleet-"
LEADER_IDENTITY = "fleet-daemon-a"
STANDBY_IDENTITY = "fleet-daemon-b"
TAKEOVER_TIMEOUT_S = 120.0
FROM_STORE_TIMEOUT_S = 900.0
"""A daemon starting with pods in the store: at 15,000 nodes and 15,000 pods it was not
ready within 120 s (docs/performance.md, "Start-up from the store")."""


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
    parser.add_argument("--pods", type=int, default=0, metavar="N",
                        help="pods of one card and 1000 MiB submitted to the daemon's pod "
                             "API and placed with /filter and /bind before the window, so "
                             "that the restart (and --standby's takeovers) read them back "
                             "(default 0)")
    parser.add_argument("--standby", action="store_true",
                        help="after the restart, a second daemon on the same lease: the "
                             "leader stopped with SIGTERM, then the new one killed with "
                             "SIGKILL; how long until the standby leads, holds every pod "
                             "and places a new one")
    parser.add_argument("--profile-daemon", type=Path, metavar="FILE",
                        help="run the first daemon under cProfile and write the profile of "
                             "its last process to FILE as it exits: the restarted one, or "
                             "with --standby the one that stood by and took over after the "
                             "SIGKILL (the profiler slows it: keep such a run's figures "
                             "apart)")
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

    def __init__(self, nats_url: str, resync_wait: float, log: Path,
                 identity: str = LEADER_IDENTITY, profile: Path | None = None) -> None:
        """``profile``: run under cProfile, the profile written there as it exits
        (each start of the process writes over the last one's)."""
        self.identity = identity
        self.port = free_port()
        self.metrics_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        profiler = [] if profile is None else ["-m", "cProfile", "-o", str(profile.resolve())]
        self.command = [
            sys.executable, *profiler, "-m", "pyhami.cli", "scheduler", "--standalone",
            "--nats", nats_url,
            "--listen", f"127.0.0.1:{self.port}", "--metrics", f"127.0.0.1:{self.metrics_port}",
            # The agents are all alive: none may turn stale while the machine is loaded.
            "--node-timeout", "3600", "--node-retention", "7200",
            "--resync-wait", f"{resync_wait:g}", "--identity", identity,
            # The bench places its pods itself with /filter and /bind, as kube-scheduler
            # would: the daemon's own pending loop would race it to them.
            "--no-pending-loop", "--log-level", "warning"]
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

    def send(self, number: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(number)

    def exited(self) -> bool:
        """Whether the process has exited (it is then forgotten: nothing left to stop)."""
        if self.process is None or self.process.poll() is None:
            return self.process is None
        self.process = None
        return True

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

    def pods_bound(self) -> int:
        status = self.status()
        bound = None if status is None else status.get("pods_bound")
        return bound if isinstance(bound, int) else 0

    def leadership(self) -> dict[str, object]:
        """``/statusz``'s ``leadership`` (role, holder, ttl_s); empty while it does not
        answer or is still starting."""
        status = self.status()
        leadership = None if status is None else status.get("leadership")
        return leadership if isinstance(leadership, dict) else {}

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
    if args.pods < 0:
        return f"--pods {args.pods} is below 0"
    room = pods_room(args.agents, args.cards)
    if args.pods > room:
        return (f"--pods {args.pods} is more than {args.agents} nodes of {args.cards} hold "
                f"({room} pods of {POD_MEMORY_MIB} MiB)")
    return None


def pods_room(agents: int, profile: str) -> int:
    """How many of the bench's pods (one card, ``POD_MEMORY_MIB``) the fleet holds: on each
    card as many as its memory and its slots allow."""
    cards = profile_cards(profile, node_name(0))
    return agents * sum(min(card.count, card.memory // POD_MEMORY_MIB) for card in cards)


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
    daemon = Daemon(nats_url, args.resync_wait, log, profile=args.profile_daemon)
    watch = (daemon.check_running, fleet.check_running)
    pods = pod_names(args.pods)
    placing: dict[str, object] = {}
    takeovers: dict[str, object] = {}
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
        nodes = [node_name(number) for number in range(count)]
        if pods:
            placing = place(daemon, nodes, pods, watch)
        # A period of heartbeats before the window: the connection burst is behind.
        time.sleep(args.heartbeat)
        window = measure(args, daemon, fleet, servers, cards)
        restart = restart_daemon(daemon, count, len(pods), watch)
        if args.standby:
            takeovers = take_over(args, nats_url, daemon, fleet, nodes=nodes,
                                  pods=len(pods), log=log)
    finally:
        daemon.stop()
        fleet.stop()
    return {
        "agents": count, "processes": processes, "heartbeat_s": args.heartbeat,
        "profile": args.cards, "cards_per_node": cards, "servers": len(urls),
        "duration_s": args.duration, "resync_wait_s": args.resync_wait,
        "connect_s": round(connect_s, 2), "all_nodes_seen_s": round(seen_s, 2),
        "expected_inventories_per_s": round(count / args.heartbeat, 1),
        "pods": len(pods), **placing,
        **window,
        "restart": restart,
        **({"standby": takeovers} if args.standby else {}),
    }


def place(daemon: Daemon, nodes: Sequence[str], pods: Sequence[str],
          watch: Sequence[Callable[[], None]]) -> dict[str, object]:
    """The pods submitted and placed; how long it took, and until the ledger held them."""
    placed_s = place_pods(daemon.url, nodes, pods)
    wait_until(lambda: daemon.pods_bound() >= len(pods),
               f"the daemon's ledger to hold {len(pods)} pods", SEEN_TIMEOUT_S, watch,
               interval=0.5)
    return {"pods_placed_s": round(placed_s, 2),
            "pods_placed_per_s": round(len(pods) / placed_s, 1)}


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


def restart_daemon(daemon: Daemon, count: int, pods: int,
                   watch: Sequence[Callable[[], None]]) -> dict[str, object]:
    """Stop the daemon with SIGTERM and start it again: how long until it is ready, until
    it has seen every node again and until its ledger holds every pod again (from the new
    process's start)."""
    stop_s = daemon.stop()
    daemon.start()
    wait_until(daemon.ready, "the restarted daemon's /readyz", FROM_STORE_TIMEOUT_S, watch,
               interval=0.02)
    ready_s = time.monotonic() - daemon.started
    status = daemon.status() or {}
    nodes_at_ready, pods_at_ready = status.get("nodes"), status.get("pods_bound")
    wait_until(lambda: daemon.nodes_seen() >= count,
               f"the restarted daemon to see {count} nodes", SEEN_TIMEOUT_S, watch,
               interval=0.1)
    all_nodes_s = time.monotonic() - daemon.started
    wait_until(lambda: daemon.pods_bound() >= pods,
               f"the restarted daemon's ledger to hold {pods} pods", SEEN_TIMEOUT_S, watch,
               interval=0.1)
    all_pods_s = time.monotonic() - daemon.started
    return {"stop_s": round(stop_s, 2), "ready_s": round(ready_s, 2),
            "nodes_at_ready": nodes_at_ready, "all_nodes_s": round(all_nodes_s, 2),
            "pods_at_ready": pods_at_ready, "all_pods_s": round(all_pods_s, 2),
            "daemon_cpu_s_to_all_nodes": cpu_seconds(daemon.pid)}


# The standby and its takeovers (--standby) -----------------------------------------------


def take_over(args: argparse.Namespace, nats_url: str, leader: Daemon, fleet: Fleet, *,
              nodes: Sequence[str], pods: int, log: Path) -> dict[str, object]:
    """A standby started beside ``leader``; the leader stopped with SIGTERM and the standby
    measured taking over; the old leader started again as the standby, and the new leader
    killed with SIGKILL, measured the same way."""
    lease = LeaseWatch(tuple(url.strip() for url in nats_url.split(",")))
    lease.start()
    standby = Daemon(nats_url, args.resync_wait, log.with_name("standby.log"),
                     identity=STANDBY_IDENTITY)
    try:
        standby_s = start_standby(standby, leader, len(nodes), fleet)
        ttl = standby.leadership().get("ttl_s")
        after_sigterm = hand_over(leader, standby, signal.SIGTERM, lease=lease,
                                  nodes=nodes, pods=pods, fleet=fleet)
        # Each takeover placed one pod more.
        restarted_standby_s = start_standby(leader, standby, len(nodes), fleet)
        after_sigkill = hand_over(standby, leader, signal.SIGKILL, lease=lease,
                                  nodes=nodes, pods=pods + 1, fleet=fleet)
    finally:
        standby.stop()
        lease.stop()
    return {"lease_ttl_s": ttl, "standby_start_s": standby_s,
            "old_leader_back_as_standby_s": restarted_standby_s,
            "sigterm": after_sigterm, "sigkill": after_sigkill}


def start_standby(standby: Daemon, leader: Daemon, count: int, fleet: Fleet) -> float:
    """Start ``standby`` while ``leader`` leads: the seconds until it stands by with every
    node seen."""

    def standing_by() -> bool:
        status = standby.status() or {}
        leadership = status.get("leadership")
        return (isinstance(leadership, dict) and leadership.get("role") == "standby"
                and leadership.get("holder") == leader.identity
                and status.get("nodes") == count)

    standby.start()
    wait_until(standing_by, f"{standby.identity} to stand by with {count} nodes seen",
               FROM_STORE_TIMEOUT_S,
               (standby.check_running, leader.check_running, fleet.check_running),
               interval=0.2)
    return round(time.monotonic() - standby.started, 2)


def hand_over(leader: Daemon, standby: Daemon, how: signal.Signals, *, lease: LeaseWatch,
              nodes: Sequence[str], pods: int, fleet: Fleet) -> dict[str, object]:
    """Stop ``leader`` with ``how``; every figure is in seconds from the signal.

    ``lease_taken_s``: the standby wrote the lease (the bench's own watch of its entry);
    ``ready_s``: the standby's /readyz answered 200 (polled every 20 ms), which it does
    once it decides; ``takeover_s``: the one less the other, the standby's own work
    (the pod store read, fenced, the ledger rebuilt); ``all_pods_s``: its ``pods_bound``
    counted every pod; ``first_filter_s``: a new pod, submitted once it was ready,
    answered by /filter with a node."""
    watch = (standby.check_running, fleet.check_running)
    cpu_before = cpu_seconds(standby.pid)
    signalled = time.monotonic()
    leader.send(how)
    exited_at: float | None = None
    ready_at: float | None = None
    cpu_after: float | None = None
    # Both ends watched together: a leader stopped with SIGTERM may still be exiting when
    # the standby is ready (it hands the lease on first).
    while ready_at is None or exited_at is None:
        if exited_at is None and leader.exited():
            exited_at = time.monotonic()
        if ready_at is None and standby.ready():
            ready_at = time.monotonic()
            cpu_after = cpu_seconds(standby.pid)
        for still_running in watch:
            still_running()
        if time.monotonic() - signalled > TAKEOVER_TIMEOUT_S:
            waited_for = "ready" if ready_at is None else "the leader's exit"
            raise RuntimeError(f"{standby.identity}: {waited_for} not within "
                               f"{TAKEOVER_TIMEOUT_S:g} s of the leader's {how.name}")
        time.sleep(0.02)
    taken_at = wait_for_lease(lease, standby.identity, signalled, TAKEOVER_TIMEOUT_S,
                              standby.check_running)
    status = standby.status() or {}
    wait_until(lambda: standby.pods_bound() >= pods,
               f"{standby.identity}'s ledger to hold {pods} pods", TAKEOVER_TIMEOUT_S, watch,
               interval=0.05)
    all_pods_at = time.monotonic()
    filtered_at = place_one(standby.url, nodes, f"fleet-after-{how.name.lower()}")
    return {"leader_exit_s": seconds_since(signalled, exited_at),
            "lease_taken_s": seconds_since(signalled, taken_at),
            "ready_s": seconds_since(signalled, ready_at),
            "takeover_s": round(ready_at - taken_at, 3),
            "standby_cpu_s": None if cpu_before is None or cpu_after is None
            else round(cpu_after - cpu_before, 3),
            "pods_at_ready": status.get("pods_bound"),
            "all_pods_s": seconds_since(signalled, all_pods_at),
            "first_filter_s": seconds_since(signalled, filtered_at)}
