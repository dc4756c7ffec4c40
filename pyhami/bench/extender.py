"""``pyhami bench extender``: the daemon's /filter and /bind under load, beside its HTTP floor.

A nats-server and ``pyhami scheduler --standalone`` run as their own processes;
this process publishes simulated inventories (as the agents would), submits the
pods, and then plays kube-scheduler: /filter with every node name, then /bind.

The client is ``pyhami.bench.load``'s raw sockets, from processes of its own
(``--client socket``), or aiohttp's in this process as before (``--client aiohttp``);
the no-op floor (``pyhami.bench.floor``: the daemon's listener and decoding, no decision,
a process of its own) is measured with both, each under its own key.

With ``--quota-namespaces N`` the pods are spread over N namespaces, each under a
ResourceQuota of GPU memory and cores posted to the pod API as a user would
(``/api/resourcequotas``), so every /filter checks its namespace's quota.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import aiohttp
import msgspec
import nats
import nats.aio.client
from prometheus_client.parser import text_string_to_metric_families

from agent.report import Report
from agent.vendors.nvidia.simulated import profile_cards
from common.arguments import Subcommands, positive_int
from common.wire import Reason, encode, inventory_subject
from pyhami.bench.floor import HOST
from pyhami.bench.floor import PATH as FLOOR_PATH
from pyhami.bench.load import (
    BenchError,
    BenchPod,
    Job,
    OfferedNames,
    Phase,
    Timings,
    filter_body,
    nodes_to_score,
)
from pyhami.natsserver import LocalNatsServer, free_port

PROFILES = ("a100x8-nvswitch", "h100x8-islands")
WAIT_S = 60.0
POD_MEMORY_MIB = 1000
NAMESPACE = "bench"
QUOTA_NAME = "gpu-quota"
FULL_EVERY = 10
"""Under quotas, every tenth namespace's memory limit is exactly what its pods take, so
its last pods pass with the quota nearly or exactly spent; the others leave half free."""
CORES_LIMIT = 800
"""The bench's pods ask no cores: the cores limit (8 cards' worth) is checked, never hit."""
CLIENTS = ("socket", "aiohttp")


def register(benches: Subcommands) -> None:
    parser = benches.add_parser("extender", help="time /filter and /bind of a running daemon")
    parser.add_argument("--nodes", type=positive_int, default=1000,
                        help="simulated 8-card nodes (default 1000)")
    parser.add_argument("--requests", type=positive_int, default=2000,
                        help="sequential /filter, /bind and no-op calls timed for latency "
                             "(default 2000)")
    parser.add_argument("--pods", type=positive_int, default=2000,
                        help="filter+bind pairs for the throughput figure (default 2000)")
    parser.add_argument("--concurrency", type=positive_int, default=16,
                        help="filter+bind pairs in flight for the throughput figure "
                             "(default 16)")
    parser.add_argument("--updates", type=positive_int, default=20000,
                        help="inventory messages published for the ingestion figure "
                             "(default 20000)")
    parser.add_argument("--client", choices=CLIENTS, default="socket",
                        help="the load generator: raw HTTP/1.1 sockets from processes of "
                             "their own (socket, the default), or aiohttp's client in the "
                             "bench's process (aiohttp, the client of the older figures in "
                             "docs/performance.md); the no-op "
                             "floor is measured with both either way")
    parser.add_argument("--client-processes", type=positive_int, default=4, metavar="P",
                        help="with --client socket: the throughput phase's connections "
                             "spread over P processes (default 4)")
    parser.add_argument("--node-names", choices=("all", "kube-scheduler"), default="all",
                        help="the NodeNames of each /filter: every node (all, the default), "
                             "or as many as kube-scheduler sends at that size with its "
                             "adaptive percentageOfNodesToScore, in its rotation "
                             "(kube-scheduler: 420 of 1,000 nodes, 500 of 5,000, 750 of "
                             "15,000)")
    parser.add_argument("--quota-namespaces", type=positive_int, default=None, metavar="N",
                        help="spread the pods over N namespaces, each under a ResourceQuota "
                             "of GPU memory and cores that still lets them all in (default: "
                             "one namespace, no quota)")
    parser.add_argument("--half-without-quota", action="store_true",
                        help="with --quota-namespaces: every other pod in namespace bench, "
                             "under no quota, so that one run times /filter with and without "
                             "a quota at the same moments (filter_p50_ms_quota, "
                             "filter_p50_ms_no_quota)")
    parser.add_argument("--profile-daemon", type=Path, metavar="FILE",
                        help="run the daemon under cProfile and write its profile to FILE "
                             "(the profiler slows the daemon: keep such a run's figures apart)")
    parser.set_defaults(handler=lambda args: asyncio.run(run(args)))


def ms(seconds: Sequence[float]) -> dict[str, float]:
    """The p50 and p99 of ``seconds``, in milliseconds."""
    return {"p50": round(statistics.median(seconds) * 1e3, 3),
            "p99": round(percentile(seconds, 0.99) * 1e3, 3)}


def percentile(samples: Sequence[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


async def publish(client: nats.aio.client.Client, report: Report, reason: Reason) -> None:
    """The report's inventory now, as its agent would publish it."""
    message = report.message(reason, time.time())
    await client.publish(inventory_subject(report.node), encode(message))
    report.confirm(message)


def pod(name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "annotations": {"hami.io/gpu-scheduler-policy": "binpack"}},
            "spec": {"containers": [{"name": "app", "image": "busybox", "resources": {
                "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": POD_MEMORY_MIB}}}]}}


def namespaces_of(names: Sequence[str], count: int | None,
                  half_without: bool = False) -> dict[str, str]:
    """Pod name -> its namespace: ``bench`` for all without quotas, else the N namespaces
    in turn (``bench-00`` to ``bench-99`` for 100); with ``half_without``, only every other
    pod goes to them, the rest to ``bench``."""
    if count is None:
        return dict.fromkeys(names, NAMESPACE)
    width = len(str(count - 1))
    step = 2 if half_without else 1
    spread = {name: f"{NAMESPACE}-{i % count:0{width}d}"
              for i, name in enumerate(names[step - 1::step])}
    return {name: spread.get(name, NAMESPACE) for name in names}


def quota_manifests(namespaces: Iterable[str]) -> list[dict[str, Any]]:
    """One ResourceQuota per namespace but ``bench``, given each pod's namespace: a memory
    limit every pod fits under, exactly their total in every ``FULL_EVERY``-th namespace
    and twice it elsewhere, and ``CORES_LIMIT``."""
    pods = Counter(namespace for namespace in namespaces if namespace != NAMESPACE)
    manifests = []
    for position, (namespace, count) in enumerate(sorted(pods.items())):
        share = 1 if position % FULL_EVERY == 0 else 2
        manifests.append({
            "apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"namespace": namespace, "name": QUOTA_NAME},
            "spec": {"hard": {"limits.nvidia.com/gpumem": str(share * count * POD_MEMORY_MIB),
                              "limits.nvidia.com/gpucores": str(CORES_LIMIT)}}})
    return manifests


class Bench:
    def __init__(self, http: aiohttp.ClientSession, url: str, names: list[str],
                 namespaces: dict[str, str], share: int) -> None:
        """``share``: how many of ``names`` each /filter is sent (``offered_windows``)."""
        self.http = http
        self.url = url
        self.names = names
        self.namespaces = namespaces
        self.share = share
        self._offered = OfferedNames(names, share)

    async def post(self, verb: str, body: bytes) -> Any:
        return await self.post_to(f"{self.url}/{verb}", body)

    async def post_to(self, url: str, body: bytes) -> Any:
        async with self.http.post(url, data=body,
                                  headers={"Content-Type": "application/json"}) as response:
            await refuse_unless_2xx(urlsplit(url).path, response)
            return await response.json()

    async def submit(self, names: list[str]) -> dict[str, str]:
        uids = {}
        for name in names:
            body = pod(name, self.namespaces[name])
            async with self.http.post(f"{self.url}/api/pods", json=body) as response:
                await refuse_unless_2xx("/api/pods", response)
                uids[name] = (await response.json())["uid"]
        return uids

    async def set_quotas(self, manifests: list[dict[str, Any]]) -> None:
        """Post the ResourceQuotas to the pod API, as a user of standalone mode would."""
        for manifest in manifests:
            async with self.http.post(f"{self.url}/api/resourcequotas",
                                      json=manifest) as response:
                if response.status >= 300:
                    where = manifest["metadata"]
                    raise BenchError(f"ResourceQuota {where['namespace']}/{where['name']}: "
                                       f"{response.status} {(await response.text()).strip()}")

    def filter_body(self, name: str) -> bytes:
        return filter_body(pod(name, self.namespaces[name]), self._offered.next())

    def bind_body(self, name: str, uid: str, node: str) -> bytes:
        return json.dumps({"PodName": name, "PodNamespace": self.namespaces[name],
                           "PodUID": uid, "Node": node}).encode()

    async def filter_and_bind(self, name: str, uid: str, timings: dict[str, list[float]]) -> None:
        # Bodies are built before the clock starts, as for the no-op floor.
        body = self.filter_body(name)
        started = time.perf_counter()
        result = await self.post("filter", body)
        timings["filter"].append(time.perf_counter() - started)
        if not result["NodeNames"]:
            raise BenchError(f"pod {name} found no node: {result['FailedNodes']}")
        body = self.bind_body(name, uid, result["NodeNames"][0])
        started = time.perf_counter()
        bound = await self.post("bind", body)
        timings["bind"].append(time.perf_counter() - started)
        if bound["Error"]:
            raise BenchError(f"bind {name}: {bound['Error']}")


async def refuse_unless_2xx(path: str, response: aiohttp.ClientResponse) -> None:
    """``BenchError`` naming the status and the first line of the answer, unless 2xx."""
    if response.status >= 300:
        text = (await response.text()).strip().splitlines()
        raise BenchError(f"POST {path} answered {response.status}"
                         + (f": {text[0][:200]}" if text else ""))


def by_quota(names: Sequence[str], filter_s: Sequence[float],
             namespaces: dict[str, str]) -> dict[str, float]:
    """The sequential /filter p50 of the pods under a quota and of those in ``bench``."""
    under = [t for name, t in zip(names, filter_s, strict=True) if namespaces[name] != NAMESPACE]
    free = [t for name, t in zip(names, filter_s, strict=True) if namespaces[name] == NAMESPACE]
    return {"filter_p50_ms_quota": round(statistics.median(under) * 1e3, 3),
            "filter_p50_ms_no_quota": round(statistics.median(free) * 1e3, 3)}


async def wait_for(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await check():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def accepted_inventories(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(f"{url}/statusz") as response:
        accepted: int = (await response.json())["inventory_accepted"]
        return accepted


async def scrape(metrics_url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(metrics_url) as response:
        response.raise_for_status()
        return await response.text()


def quota_standing(text: str) -> dict[str, int]:
    """How the quotas stand in the daemon's gauges (an exposition): how many limits it
    applies, and in how many namespaces the pods have spent all the memory."""
    # Only the quota families are parsed: the per-card lines are most of the text.
    lines = "\n".join(line for line in text.splitlines() if "pyhami_resource_quota_" in line)
    samples = {metric.name: metric.samples for metric in text_string_to_metric_families(lines)}
    limits = samples.get("pyhami_resource_quota_limit", [])
    memory_limits = {sample.labels["namespace"]: sample.value for sample in limits
                     if sample.labels["resource"] == "nvidia.com/gpumem"}
    full = sum(1 for sample in samples.get("pyhami_resource_quota_used", [])
               if sample.labels["resource"] == "nvidia.com/gpumem"
               and sample.value == memory_limits.get(sample.labels["namespace"]))
    return {"quota_limits": len(limits), "quota_namespaces_full": full}


async def server_side(metrics_url: str) -> dict[str, float]:
    """Mean time inside the daemon per verb, from its own histograms."""
    sums: dict[str, float] = {}
    for line in (await scrape(metrics_url)).splitlines():
        for verb in ("filter", "bind"):
            for part in ("sum", "count"):
                if line.startswith(f"pyhami_{verb}_duration_seconds_{part} "):
                    sums[f"{verb}_{part}"] = float(line.split()[-1])
    return {f"server_{verb}_mean_ms": round(sums[f"{verb}_sum"] / sums[f"{verb}_count"] * 1e3, 3)
            for verb in ("filter", "bind") if sums.get(f"{verb}_count")}


def daemon_memory(pid: int) -> dict[str, float | None]:
    """The daemon's resident memory now and at its peak, from /proc (None elsewhere)."""
    fields = {"VmRSS:": "daemon_rss_mb", "VmHWM:": "daemon_peak_rss_mb"}
    memory: dict[str, float | None] = dict.fromkeys(fields.values())
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return memory
    for line in lines:
        key, *value = line.split()
        if key in fields:
            memory[fields[key]] = round(int(value[0]) / 1024, 1)  # reported in kB
    return memory


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user and system) the process has used so far, from /proc (None elsewhere)."""
    try:
        # The fields after the command's name, which is in parentheses and may hold spaces.
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(args: argparse.Namespace) -> int:
    if args.half_without_quota and args.quota_namespaces is None:
        print("pyhami bench extender: --half-without-quota needs --quota-namespaces",
              file=sys.stderr)
        return 2
    profile = args.profile_daemon
    if profile is not None and not profile.resolve().parent.is_dir():
        # The daemon writes its profile only as it stops: refused before any work.
        print(f"pyhami bench extender: --profile-daemon {profile}: no directory "
              f"{profile.resolve().parent} to write it in", file=sys.stderr)
        return 2
    try:
        result = await run_daemon(args)
    except BenchError as error:
        print(f"pyhami bench extender: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


async def run_daemon(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        server = LocalNatsServer(extra_args=["-js", "-sd", str(Path(scratch) / "js")])
        server.start()
        port, metrics_port, floor_port = free_port(), free_port(), free_port()
        profiler = ([] if args.profile_daemon is None
                    else ["-m", "cProfile", "-o", str(args.profile_daemon.resolve())])
        daemon = subprocess.Popen(
            [sys.executable, *profiler, "-m", "pyhami.cli", "scheduler", "--standalone", "--nats",
             server.url, "--listen", f"127.0.0.1:{port}", "--metrics",
             f"127.0.0.1:{metrics_port}", "--node-timeout", "3600", "--node-retention", "7200",
             "--resync-wait", "0.1",
             "--log-level", "warning", "--no-pending-loop"])
        floor = subprocess.Popen([sys.executable, "-m", "pyhami.bench.floor", str(floor_port)],
                                 stdout=subprocess.PIPE)
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        try:
            await floor_ready(floor)
            result = await measure(args, ("127.0.0.1", port), server.url, daemon.pid,
                                   metrics_url, floor=(HOST, floor_port))
            result.update(await server_side(metrics_url))
            result.update(daemon_memory(daemon.pid))
        finally:
            for process in (daemon, floor):
                process.terminate()
                process.wait(timeout=30)
            if floor.stdout is not None:
                floor.stdout.close()
            server.stop()
    return result


async def floor_ready(floor: subprocess.Popen[bytes]) -> None:
    """Wait for the floor's "ready" (it starts while the daemon does); ``BenchError`` if
    it ends or says something else."""
    assert floor.stdout is not None
    line = await asyncio.to_thread(floor.stdout.readline)
    if line.strip() != b"ready":
        raise BenchError(f"the no-op floor did not start (exit {floor.poll()}, said {line!r})")


class Driven(NamedTuple):
    """What the load generator's workers measured together."""

    timings: Timings
    wall_s: float
    """From the start signal to the last worker's result."""
    daemon_cpu_s: float | None
    """The daemon's CPU time meanwhile (None without /proc)."""


async def _line(worker: asyncio.subprocess.Process) -> bytes:
    """The worker's next line of output; ``BenchError`` with its last line of error
    output (the reason it gives) if it ended instead."""
    assert worker.stdout is not None and worker.stderr is not None
    line = await worker.stdout.readline()
    if line:
        return line
    said = (await worker.stderr.read()).decode(errors="replace").strip().splitlines()
    code = await worker.wait()
    raise BenchError(said[-1] if said else f"the load generator exited with status {code}")


async def drive(jobs: Sequence[Job], daemon_pid: int | None = None) -> Driven:
    """Run each job in a worker process of its own (``python -m pyhami.bench.load``):
    all connect first, then start together; the clock and the daemon's CPU time are read
    around the run alone."""
    workers = [await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pyhami.bench.load", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE) for _ in jobs]
    try:
        for worker, job in zip(workers, jobs, strict=True):
            assert worker.stdin is not None
            worker.stdin.write(msgspec.json.encode(job) + b"\n")
        for worker in workers:
            if (line := await _line(worker)).strip() != b"ready":
                raise BenchError(f"the load generator said {line[:200]!r}, not ready")
        cpu_before = None if daemon_pid is None else cpu_seconds(daemon_pid)
        started = time.perf_counter()
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write(b"go\n")
        results = await asyncio.gather(*(_line(worker) for worker in workers))
        wall_s = time.perf_counter() - started
        cpu_after = None if daemon_pid is None else cpu_seconds(daemon_pid)
    finally:
        for worker in workers:
            if worker.returncode is None:
                worker.kill()
            await worker.wait()
    timings = Timings()
    for result in results:
        each = msgspec.json.decode(result, type=Timings)
        for verb in ("noop", "filter", "bind"):
            getattr(timings, verb).extend(getattr(each, verb))
    daemon_cpu_s = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return Driven(timings, wall_s, daemon_cpu_s)


def seconds(nanoseconds: Sequence[int]) -> list[float]:
    return [ns / 1e9 for ns in nanoseconds]


def spread(names: Sequence[str], concurrency: int, processes: int) -> list[tuple[list[str], int]]:
    """The throughput phase's pods and connections over ``processes`` workers (no more
    than there are connections): each worker the pods in turn, and its share of the
    ``concurrency`` connections, the first ones one more when they do not divide."""
    count = min(processes, concurrency)
    return [(list(names[i::count]), concurrency // count + (i < concurrency % count))
            for i in range(count)]


class Player:
    """Plays kube-scheduler against the daemon with one client (``CLIENTS``): the no-op
    floor (at ``floor``), sequential filter+bind pairs, and pairs with several in flight."""

    def __init__(self, bench: Bench, address: tuple[str, int], uids: dict[str, str],
                 daemon_pid: int, floor: tuple[str, int]) -> None:
        self.bench = bench
        self.address = address
        self.uids = uids
        self.daemon_pid = daemon_pid
        self.floor = floor

    def job(self, phase: Phase, names: Sequence[str], connections: int = 1) -> Job:
        bench = self.bench
        host, port = self.floor if phase == "noop" else self.address
        return Job(host=host, port=port, phase=phase,
                   names=bench.names, connections=connections, share=bench.share,
                   pods=[BenchPod(pod(name, bench.namespaces[name]), self.uids[name])
                         for name in names])

    async def noop(self, client: str, names: Sequence[str]) -> list[float]:
        """Each /noop's time, one after the other."""
        if client == "socket":
            return seconds((await drive([self.job("noop", names)])).timings.noop)
        floor_url = f"http://{self.floor[0]}:{self.floor[1]}{FLOOR_PATH}"
        times = []
        for name in names:
            body = self.bench.filter_body(name)
            started = time.perf_counter()
            await self.bench.post_to(floor_url, body)
            times.append(time.perf_counter() - started)
        return times

    async def pairs(self, client: str,
                    names: Sequence[str]) -> tuple[dict[str, list[float]], float | None]:
        """Each sequential /filter's and /bind's time, and the daemon's CPU seconds over
        them all."""
        if client == "socket":
            driven = await drive([self.job("pairs", names)], self.daemon_pid)
            return ({"filter": seconds(driven.timings.filter),
                     "bind": seconds(driven.timings.bind)}, driven.daemon_cpu_s)
        timings: dict[str, list[float]] = {"filter": [], "bind": []}
        before = cpu_seconds(self.daemon_pid)
        for name in names:
            await self.bench.filter_and_bind(name, self.uids[name], timings)
        after = cpu_seconds(self.daemon_pid)
        return timings, None if before is None or after is None else after - before

    async def pairs_per_s(self, client: str, names: Sequence[str], concurrency: int,
                          processes: int) -> float:
        """Filter+bind pairs a second with ``concurrency`` of them in flight."""
        if client == "socket":
            driven = await drive([self.job("pairs", share, connections)
                                  for share, connections in spread(names, concurrency,
                                                                   processes)])
            return len(names) / driven.wall_s
        gate = asyncio.Semaphore(concurrency)
        throughput: dict[str, list[float]] = {"filter": [], "bind": []}

        async def pair(name: str) -> None:
            async with gate:
                await self.bench.filter_and_bind(name, self.uids[name], throughput)

        started = time.perf_counter()
        await asyncio.gather(*(pair(name) for name in names))
        return len(names) / (time.perf_counter() - started)


async def measure(args: argparse.Namespace, address: tuple[str, int], nats_url: str,
                  daemon_pid: int, metrics_url: str, *,
                  floor: tuple[str, int]) -> dict[str, Any]:
    url = f"http://{address[0]}:{address[1]}"
    client = await nats.connect(nats_url)
    reports = {f"node-{i:05d}": Report(f"node-{i:05d}", "bench", 3600.0)
               for i in range(args.nodes)}
    for i, (name, report) in enumerate(reports.items()):
        report.observe(profile_cards(PROFILES[i % len(PROFILES)], name))
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:
        async def ready() -> bool:
            try:
                async with http.get(f"{url}/readyz") as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await wait_for(ready, "the daemon")
        for report in reports.values():
            await publish(client, report, "start")
        await client.flush()

        async def all_nodes() -> bool:
            return await accepted_inventories(http, url) >= int(args.nodes)

        await wait_for(all_nodes, "every inventory")
        names = [f"p-{i}" for i in range(args.requests + args.pods)]
        namespaces = namespaces_of(names, args.quota_namespaces, args.half_without_quota)
        share = nodes_to_score(args.nodes) if args.node_names == "kube-scheduler" \
            else args.nodes
        bench = Bench(http, url, list(reports), namespaces, share)
        quotas = quota_manifests(namespaces.values()) if args.quota_namespaces else []
        await bench.set_quotas(quotas)

        async def quotas_applied() -> bool:
            # Two limits a quota, each a series of the daemon's own gauge.
            return quota_standing(await scrape(metrics_url))["quota_limits"] >= 2 * len(quotas)

        await wait_for(quotas_applied, "every ResourceQuota to apply")
        uids = await bench.submit(names)
        player = Player(bench, address, uids, daemon_pid, floor)
        sequential = names[:args.requests]

        # The floor with each client, the one the run uses first, so that the two can be
        # set side by side from one run.
        floors = {each: await player.noop(each, sequential)
                  for each in sorted(CLIENTS, key=lambda each: each != args.client)}
        noop = floors[args.client]

        timings, pairs_cpu_s = await player.pairs(args.client, sequential)
        # The daemon's own CPU for each sequential pair, apart from the client's and
        # nats-server's (other load on the machine moves it too).
        pair_cpu_ms = None if pairs_cpu_s is None else round(
            pairs_cpu_s / args.requests * 1e3, 3)
        split = by_quota(sequential, timings["filter"], namespaces) \
            if args.half_without_quota and quotas else {}

        pods_per_s = await player.pairs_per_s(args.client, names[args.requests:],
                                              args.concurrency, args.client_processes)

        ingested_before = await accepted_inventories(http, url)
        cpu_before = cpu_seconds(daemon_pid)
        started = time.perf_counter()
        report_list = list(reports.values())
        for n in range(args.updates):
            report = report_list[n % len(report_list)]
            cards = report.cards
            cards[0] = msgspec.structs.replace(cards[0], processes=n % 3)
            report.observe(cards)
            await publish(client, report, "change")
        await client.flush()

        async def all_updates() -> bool:
            return await accepted_inventories(http, url) >= ingested_before + int(args.updates)

        await wait_for(all_updates, "every inventory update")
        ingest_s = time.perf_counter() - started
        cpu_after = cpu_seconds(daemon_pid)
    await client.close()
    standing = quota_standing(await scrape(metrics_url)) if quotas else {}
    filter_ms, bind_ms, noop_ms = ms(timings["filter"]), ms(timings["bind"]), ms(noop)
    return {
        "nodes": args.nodes, "cards": args.nodes * 8,
        "node_names_per_filter": bench.share,
        "quota_namespaces": len(quotas), **standing, **split,
        "client": args.client,
        "client_processes": min(args.client_processes, args.concurrency)
        if args.client == "socket" else 1,
        "filter_p50_ms": filter_ms["p50"], "filter_p99_ms": filter_ms["p99"],
        "bind_p50_ms": bind_ms["p50"], "bind_p99_ms": bind_ms["p99"],
        "daemon_cpu_ms_per_pair": pair_cpu_ms,
        "pods_per_s": round(pods_per_s, 1),
        "noop_p50_ms": noop_ms["p50"], "noop_p99_ms": noop_ms["p99"],
        **{f"noop_p50_ms_{each}": ms(times)["p50"] for each, times in floors.items()},
        "filter_over_noop": round(filter_ms["p50"] / noop_ms["p50"], 2),
        "ingest_messages_per_s": round(args.updates / ingest_s, 1),
        "ingest_cards_per_s": round(args.updates * 8 / ingest_s, 1),
        # The daemon's own cost, apart from the publisher and nats-server beside it.
        "ingest_cards_per_daemon_cpu_s": None if cpu_before is None or cpu_after is None
        or cpu_after <= cpu_before else round(args.updates * 8 / (cpu_after - cpu_before), 1),
    }
