"""``pyhami bench extender``: the daemon's /filter and /bind under load, beside its HTTP floor.

A nats-server and ``pyhami scheduler --standalone`` run as their own processes;
this process publishes simulated inventories (as the agents would), submits the
pods, and then plays kube-scheduler: /filter with every node name, then /bind.

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
from typing import Any

import aiohttp
import msgspec
import nats
import nats.aio.client
from prometheus_client.parser import text_string_to_metric_families

from agent.report import Report
from agent.simulated import profile_cards
from common.arguments import Subcommands, positive_int
from common.natsserver import LocalNatsServer, free_port
from common.wire import Reason, encode, inventory_subject

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


def register(benches: Subcommands) -> None:
    parser = benches.add_parser("extender", help="time /filter and /bind of a running daemon")
    parser.add_argument("--nodes", type=positive_int, default=1000, help="simulated 8-card nodes")
    parser.add_argument("--requests", type=positive_int, default=2000,
                        help="sequential /filter, /bind and no-op calls timed for latency")
    parser.add_argument("--pods", type=positive_int, default=2000,
                        help="filter+bind pairs for the throughput figure")
    parser.add_argument("--concurrency", type=positive_int, default=16,
                        help="filter+bind pairs in flight for the throughput figure")
    parser.add_argument("--updates", type=positive_int, default=20000,
                        help="inventory messages published for the ingestion figure")
    parser.add_argument("--quota-namespaces", type=positive_int, default=None, metavar="N",
                        help="spread the pods over N namespaces, each under a ResourceQuota "
                             "of GPU memory and cores that still lets them all in (default: "
                             "one namespace, no quota)")
    parser.add_argument("--half-without-quota", action="store_true",
                        help="with --quota-namespaces: every other pod in namespace bench, "
                             "under no quota, so that one run times /filter with and without "
                             "a quota at the same moments (filter_p50_ms_quota, "
                             "filter_p50_ms_no_quota)")
    parser.set_defaults(handler=lambda args: asyncio.run(run(args)))


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
                 namespaces: dict[str, str]) -> None:
        self.http = http
        self.url = url
        self.names = names
        self.namespaces = namespaces

    async def post(self, verb: str, body: bytes) -> Any:
        async with self.http.post(f"{self.url}/{verb}", data=body,
                                  headers={"Content-Type": "application/json"}) as response:
            response.raise_for_status()
            return await response.json()

    async def submit(self, names: list[str]) -> dict[str, str]:
        uids = {}
        for name in names:
            body = pod(name, self.namespaces[name])
            async with self.http.post(f"{self.url}/api/pods", json=body) as response:
                response.raise_for_status()
                uids[name] = (await response.json())["uid"]
        return uids

    async def set_quotas(self, manifests: list[dict[str, Any]]) -> None:
        """Post the ResourceQuotas to the pod API, as a user of standalone mode would."""
        for manifest in manifests:
            async with self.http.post(f"{self.url}/api/resourcequotas",
                                      json=manifest) as response:
                if response.status >= 300:
                    where = manifest["metadata"]
                    raise RuntimeError(f"ResourceQuota {where['namespace']}/{where['name']}: "
                                       f"{response.status} {(await response.text()).strip()}")

    def filter_body(self, name: str) -> bytes:
        return json.dumps({"Pod": pod(name, self.namespaces[name]), "Nodes": None,
                           "NodeNames": self.names}).encode()

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
            raise RuntimeError(f"pod {name} found no node: {result['FailedNodes']}")
        body = self.bind_body(name, uid, result["NodeNames"][0])
        started = time.perf_counter()
        bound = await self.post("bind", body)
        timings["bind"].append(time.perf_counter() - started)
        if bound["Error"]:
            raise RuntimeError(f"bind {name}: {bound['Error']}")


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
            raise RuntimeError(f"timed out waiting for {what}")
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
    with tempfile.TemporaryDirectory() as scratch:
        server = LocalNatsServer(extra_args=["-js", "-sd", str(Path(scratch) / "js")])
        server.start()
        port, metrics_port = free_port(), free_port()
        daemon = subprocess.Popen(
            [sys.executable, "-m", "pyhami.cli", "scheduler", "--standalone", "--nats",
             server.url, "--listen", f"127.0.0.1:{port}", "--metrics",
             f"127.0.0.1:{metrics_port}", "--node-timeout", "3600", "--node-retention", "7200",
             "--resync-wait", "0.1",
             "--log-level", "warning", "--noop-endpoint", "--no-pending-loop"])
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        try:
            result = await measure(args, f"http://127.0.0.1:{port}", server.url, daemon.pid,
                                   metrics_url)
            result.update(await server_side(metrics_url))
            result.update(daemon_memory(daemon.pid))
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
            server.stop()
    print(json.dumps(result))
    return 0


async def measure(args: argparse.Namespace, url: str, nats_url: str,
                  daemon_pid: int, metrics_url: str) -> dict[str, Any]:
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
        bench = Bench(http, url, list(reports), namespaces)
        quotas = quota_manifests(namespaces.values()) if args.quota_namespaces else []
        await bench.set_quotas(quotas)

        async def quotas_applied() -> bool:
            # Two limits a quota, each a series of the daemon's own gauge.
            return quota_standing(await scrape(metrics_url))["quota_limits"] >= 2 * len(quotas)

        await wait_for(quotas_applied, "every ResourceQuota to apply")
        uids = await bench.submit(names)

        noop = []
        for name in names[:args.requests]:
            body = bench.filter_body(name)
            started = time.perf_counter()
            await bench.post("noop", body)
            noop.append(time.perf_counter() - started)

        timings: dict[str, list[float]] = {"filter": [], "bind": []}
        pairs_cpu_before = cpu_seconds(daemon_pid)
        for name in names[:args.requests]:
            await bench.filter_and_bind(name, uids[name], timings)
        pairs_cpu_after = cpu_seconds(daemon_pid)
        # The daemon's own CPU for each sequential pair, apart from the client's and
        # nats-server's (other load on the machine moves it too).
        pair_cpu_ms = None if pairs_cpu_before is None or pairs_cpu_after is None else round(
            (pairs_cpu_after - pairs_cpu_before) / args.requests * 1e3, 3)
        split = by_quota(names[:args.requests], timings["filter"], namespaces) \
            if args.half_without_quota and quotas else {}

        gate = asyncio.Semaphore(args.concurrency)
        throughput: dict[str, list[float]] = {"filter": [], "bind": []}

        async def pair(name: str) -> None:
            async with gate:
                await bench.filter_and_bind(name, uids[name], throughput)

        started = time.perf_counter()
        await asyncio.gather(*(pair(name) for name in names[args.requests:]))
        pods_per_s = args.pods / (time.perf_counter() - started)

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
    return {
        "nodes": args.nodes, "cards": args.nodes * 8,
        "quota_namespaces": len(quotas), **standing, **split,
        "filter_p50_ms": round(statistics.median(timings["filter"]) * 1e3, 3),
        "filter_p99_ms": round(percentile(timings["filter"], 0.99) * 1e3, 3),
        "bind_p50_ms": round(statistics.median(timings["bind"]) * 1e3, 3),
        "bind_p99_ms": round(percentile(timings["bind"], 0.99) * 1e3, 3),
        "daemon_cpu_ms_per_pair": pair_cpu_ms,
        "pods_per_s": round(pods_per_s, 1),
        "noop_p50_ms": round(statistics.median(noop) * 1e3, 3),
        "noop_p99_ms": round(percentile(noop, 0.99) * 1e3, 3),
        "ingest_messages_per_s": round(args.updates / ingest_s, 1),
        "ingest_cards_per_s": round(args.updates * 8 / ingest_s, 1),
        # The daemon's own cost, apart from the publisher and nats-server beside it.
        "ingest_cards_per_daemon_cpu_s": None if cpu_before is None or cpu_after is None
        or cpu_after <= cpu_before else round(args.updates * 8 / (cpu_after - cpu_before), 1),
    }
