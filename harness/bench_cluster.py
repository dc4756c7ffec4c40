"""``scripts/bench-cluster``: kube-scheduler with pyhami against kube-scheduler alone, end to end.

A command of the repository's harness (``python -m harness.bench_cluster``), not of the
installed ``pyhami``: it needs ``k8s/``, ``charts/`` and ``scripts/build-control-plane.sh``'s
binaries. ``pyhami bench cluster`` on an installed product names this command and stops.

One control plane of the end-to-end suite's kind (etcd, kube-apiserver, nats-server and the
``pyhami scheduler`` daemon in Kubernetes mode, as processes of their own), N Node objects
with 8 cards each and N simulated inventories published from this process. Then the same
number of pods goes through kube-scheduler with the shipped configuration (k8s/'s: the
extender on plain HTTP over loopback; ``--extender-tls``: the chart's mutual TLS, as the
end-to-end suite runs it) and through the same kube-scheduler binary with a
default profile and no extender, each with kube-scheduler's default client limits and with
them raised. One kube-scheduler runs at a time, without leader election; the daemon follows
no Lease (``--leader-lease none``) and NATS runs without authentication. The bench
namespace opts out of pyhami's webhook, which no Service reaches here.

Latency of a pod: from the moment its create POST is sent to the moment one pod watch of the
namespace, opened before the first create, sees its ``spec.nodeName``. Throughput: pods over
the time from the first create sent to the last binding seen. Cluster CPU: utime+stime of
every process of the plane (from /proc) over the phase, per pod bound; of it, each process's
stime (``kernel_ms_per_pod``).

``--peer hami=BINARY`` (HAMi's scheduler, built from a checkout of the user's with
``scripts/build-hami-scheduler.sh``; nothing of HAMi is shipped): HAMi's scheduler runs as a
process of the plane, and its phases alternate with pyhami's and kube-scheduler alone's on
the same nodes with the same pods, its kube-scheduler configured as HAMi's chart configures
it, the nodes annotated as HAMi's device plugin and scheduler annotate them, and the bench
playing HAMi's device plugin at Allocate (``harness/hami_peer.py`` says what, from HAMi's
source). HAMi's own client limits: its defaults (qps 5, burst 10; the chart passes none)
with kube-scheduler's defaults, and raised with kube-scheduler's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import ssl
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import nats
import yaml

from agent.report import Report
from agent.vendors.nvidia.simulated import profile_cards
from common.arguments import positive_int
from common.certificates import Bundle, write_bundle
from harness import hami_peer
from harness.controlplane import (
    SCHEDULER_NAME,
    START_TIMEOUT_S,
    SYSTEM_NAMESPACE,
    ApiServerPlane,
    Process,
    binaries_dir,
    chart_scheduler_config,
    create_ready_node,
    insecure_context,
    missing_binaries,
    render_scheduler_config,
    shipped_scheduler_config,
    wait_for,
)
from pyhami.bench import extender as bench_extender
from pyhami.bench.loopback import direct_opener, http_get
from pyhami.natsserver import free_port, nats_server_binary
from pyhami.output import READER_GONE_EXIT, silence_stdout, stdout_reader_gone

PROG = "bench-cluster"

NAMESPACE = "pyhami-bench"
DAEMON = "pyhami-scheduler"
KUBE_SCHEDULER = "kube-scheduler"
NEEDED_BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "helm")
COMPONENTS = ("etcd", "kube-apiserver", KUBE_SCHEDULER, DAEMON, "nats-server",
              hami_peer.PROCESS)
# The processes each phase's cluster is made of: what its ``total`` counts. pyhami's daemon
# and nats-server idle through the other phases (their figures are still reported).
OWN_COMPONENTS = {"pyhami": ("etcd", "kube-apiserver", KUBE_SCHEDULER, DAEMON, "nats-server"),
                  hami_peer.PEER_NAME: ("etcd", "kube-apiserver", KUBE_SCHEDULER,
                                        hami_peer.PROCESS),
                  "default": ("etcd", "kube-apiserver", KUBE_SCHEDULER)}
# The simulated inventories of a node, by its number of cards.
CARD_PROFILES = {4: ("t4x4",), 8: bench_extender.PROFILES}
# kube-scheduler's clientConnection (qps, burst): its defaults, and out of the way.
LIMITS = {"default": (50, 100), "raised": (5000, 5000)}
# Slots a card offers as the node's allocatable nvidia.com/gpu: HAMi's device plugin
# advertises each card deviceSplitCount times (its chart's device configuration: 10).
# pyhami and HAMi leave the count to their extenders (ignoredByScheduler); kube-scheduler
# alone counts it, so its pods can fill a node as the others' can.
SLOTS_PER_CARD = 10
ALLOCATED = "hami.io/vgpu-devices-allocated"
NODE_PREFIX = "bench-node-"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MAX_REWATCHES = 100  # the bench's pod watch ended early this often: give up


def build_parser() -> argparse.ArgumentParser:
    """The flags ``pyhami bench cluster`` had when it shipped in the package, unchanged."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="kube-scheduler with pyhami against kube-scheduler alone, on a "
                               "real control plane (needs scripts/build-control-plane.sh's "
                               "binaries)")
    parser.add_argument("--nodes", type=positive_int, default=100,
                        help="Node objects (default 100)")
    parser.add_argument("--pods", type=positive_int, default=500,
                        help="pods of each phase (default 500)")
    parser.add_argument("--cards", type=int, choices=sorted(CARD_PROFILES), default=8,
                        help="cards of each node (default 8)")
    parser.add_argument("--concurrency", type=positive_int, default=32,
                        help="pod creations in flight (default 32)")
    parser.add_argument("--idle-pods", type=positive_int, default=20,
                        help="single pods, one at a time, through each scheduler on an idle "
                             "cluster (default 20)")
    parser.add_argument("--extender-tls", action="store_true",
                        help="kube-scheduler calls the extender over mutual TLS, as the chart "
                             "does with scheduler.extender.tls (default: plain HTTP on "
                             "loopback, as k8s/ ships it)")
    parser.add_argument("--no-success-events", action="store_true",
                        help="run the daemon with --no-success-events: no FilteringSucceed "
                             "and BindingSucceed Events, to measure what they cost (default: "
                             "written, as the daemon's default)")
    parser.add_argument("--peer", metavar="hami=BINARY",
                        help="also run HAMi's scheduler (BINARY, built from your checkout "
                             "with scripts/build-hami-scheduler.sh), alternating with "
                             "pyhami on the same nodes and pods")
    parser.add_argument("--peer-timeout", type=positive_int, default=300, metavar="S",
                        help="with --peer: seconds the peer's pods may take to be bound in a "
                             "phase; those still unbound then are reported as such (default "
                             "300)")
    parser.add_argument("--runs", type=positive_int, default=1, metavar="N",
                        help="alternate the phases N times on the same nodes and report the "
                             "median of each figure, with every run's own (default 1)")
    parser.add_argument("--limits", choices=(*LIMITS, "both"), default="both",
                        help="the client limits to run the phases under: kube-scheduler's "
                             "defaults (with the peer's own), raised, or both (default)")
    parser.add_argument("--profile-daemon", type=Path, metavar="FILE",
                        help="run the daemon under cProfile and write its profile to FILE "
                             "(the profiler slows the daemon: keep such a run's figures apart)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        if not stdout_reader_gone():
            raise
        # The reader of stdout has gone (`| head -1`): end as pyhami's commands do.
        silence_stdout()
        return READER_GONE_EXIT
    return code


def requirements_problem() -> str | None:
    """Why the bench cannot run here, in one line; None when it can."""
    directory = binaries_dir()
    missing = missing_binaries(directory, NEEDED_BINARIES)
    if missing:
        return (f"{PROG}: no {', '.join(missing)} in {directory}; "
                "build them with scripts/build-control-plane.sh")
    return None


def run(args: argparse.Namespace) -> int:
    problem = requirements_problem()
    if problem is None and args.pods > args.nodes * args.cards * SLOTS_PER_CARD:
        problem = (f"{PROG}: --pods {args.pods} do not fit on --nodes {args.nodes} x --cards "
                   f"{args.cards} x {SLOTS_PER_CARD} slots")
    peer: hami_peer.Peer | None = None
    if problem is None and args.peer is not None:
        parsed = hami_peer.parse_peer(args.peer)
        if isinstance(parsed, str):
            problem = f"{PROG}: {parsed}"
        else:
            peer = parsed
    profile = args.profile_daemon
    if problem is None and profile is not None and not profile.resolve().parent.is_dir():
        # The daemon writes its profile only as it stops: refused before any work.
        problem = (f"{PROG}: --profile-daemon {profile}: no directory "
                   f"{profile.resolve().parent} to write it in")
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    logs = Path(tempfile.mkdtemp(prefix="pyhami-bench-cluster-"))
    (logs / "data").mkdir()
    plane = BenchPlane(bin_dir=binaries_dir(), logs=logs, data=logs / "data",
                       daemon_profile=args.profile_daemon, extender_tls=args.extender_tls,
                       success_events=not args.no_success_events, peer=peer)
    try:
        result = bench(plane, args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; logs in {logs}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away: main ends quietly
        raise
    except Exception as error:
        print(f"{PROG} failed: {error!r}\nlogs in {logs}", file=sys.stderr)
        return 1
    finally:
        plane.stop()
    shutil.rmtree(logs, ignore_errors=True)
    print(json.dumps(result))
    return 0


# The plane -------------------------------------------------------------------------------


@dataclass
class BenchPlane(ApiServerPlane):
    nats_url: str = ""
    daemon_port: int = 0
    metrics_port: int = 0
    pki: Bundle | None = None
    chart_config: str = ""
    daemon_profile: Path | None = None
    extender_tls: bool = False
    kube_scheduler_port: int = 0
    success_events: bool = True
    peer: hami_peer.Peer | None = None
    hami_port: int = 0
    hami_metrics_port: int = 0
    hami_pki: Bundle | None = None

    def kube_scheduler_timings(self) -> dict[str, float | None]:
        """Means in ms of kube-scheduler's own histograms since it started (one phase):
        its scheduling algorithm (filters, the extender's /filter, scores), the Bind
        extension point (its own Binding; None when the extender binds, which that
        histogram does not time), a whole attempt."""
        request = urllib.request.Request(
            f"https://127.0.0.1:{self.kube_scheduler_port}/metrics",
            headers={"Authorization": f"Bearer {self.api.token}"})
        with direct_opener(insecure_context()).open(request, timeout=10) as response:
            exposition = response.read().decode()
        return {
            "algorithm_ms": histogram_mean_ms(
                exposition, "scheduler_scheduling_algorithm_duration_seconds"),
            "bind_ms": histogram_mean_ms(
                exposition, "scheduler_framework_extension_point_duration_seconds",
                'extension_point="Bind"'),
            "attempt_ms": histogram_mean_ms(
                exposition, "scheduler_scheduling_attempt_duration_seconds",
                'result="scheduled"'),
        }

    @property
    def as_kube_scheduler(self) -> ssl.SSLContext:
        """A client of the daemon's extender as kube-scheduler is: with its certificate."""
        assert self.pki is not None
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        context.load_cert_chain(str(self.pki.kube_scheduler), str(self.pki.kube_scheduler_key))
        return context

    def start(self) -> None:
        self.start_etcd()
        self.start_apiserver()
        self.install_manifests()
        self.create_namespace(NAMESPACE, labels={"hami.io/webhook": "ignore"})
        self.issue_scheduler_kubeconfig()
        self.start_nats()
        self.start_daemon()

    def start_nats(self) -> None:
        port = free_port()
        self.nats_url = f"nats://127.0.0.1:{port}"
        server = self.run("nats-server", [str(nats_server_binary()), "-a", "127.0.0.1",
                                          "-p", str(port)])

        def listening() -> bool:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True

        wait_for(listening, "nats-server to listen", START_TIMEOUT_S, watch=[server])

    def start_daemon(self) -> None:
        tls: list[str] = []
        if self.extender_tls:
            self.pki = write_bundle(self.data / "extender-tls", dns=("localhost",),
                                    ips=("127.0.0.1",), days=1)
            tls = ["--extender-cert-file", str(self.pki.extender),
                   "--extender-key-file", str(self.pki.extender_key),
                   "--extender-client-ca-file", str(self.pki.ca)]
        self.daemon_port, self.metrics_port = free_port(), free_port()
        profiler = ([] if self.daemon_profile is None
                    else ["-m", "cProfile", "-o", str(self.daemon_profile.resolve())])
        daemon = self.run(DAEMON, [
            sys.executable, *profiler, "-m", "pyhami.cli", "scheduler",
            "--kubeconfig", str(self.scheduler_kubeconfig), "--nats", self.nats_url,
            "--namespace", SYSTEM_NAMESPACE, "--leader-lease", "none",
            "--listen", f"127.0.0.1:{self.daemon_port}",
            "--metrics", f"127.0.0.1:{self.metrics_port}", "--resync-wait", "1",
            "--node-timeout", "3600", "--node-retention", "7200", "--log-level", "warning",
            *tls, *([] if self.success_events else ["--no-success-events"]),
            # HAMi's device plugin's hami.io/node-nvidia-register is the bench's to write.
            *([] if self.peer is None else ["--no-node-registration"])])
        wait_for(lambda: http_get(f"http://127.0.0.1:{self.metrics_port}/readyz")[0] == 200,
                 "the daemon's /readyz", START_TIMEOUT_S, watch=[daemon])

    @property
    def extender_url(self) -> str:
        scheme = "https" if self.extender_tls else "http"
        return f"{scheme}://127.0.0.1:{self.daemon_port}"

    def statusz(self) -> dict[str, Any]:
        status, body = http_get(f"{self.extender_url}/statusz",
                                context=self.as_kube_scheduler if self.extender_tls else None)
        if status != 200:
            raise ValueError(f"/statusz answered {status}")
        document: dict[str, Any] = json.loads(body)
        return document

    def create_nodes(self, count: int, cards: int, concurrency: int) -> list[str]:
        names = [f"{NODE_PREFIX}{number:05d}" for number in range(count)]
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110",
                     "nvidia.com/gpu": str(cards * SLOTS_PER_CARD)}
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda name: create_ready_node(self.api, name, resources), names))
            if self.peer is not None:
                list(pool.map(lambda item: self.annotate_for_hami(item[0], item[1], cards),
                              enumerate(names)))
        return names

    def annotate_for_hami(self, number: int, name: str, cards: int) -> None:
        """The node's annotations as HAMi's device plugin (register) and scheduler
        (handshake) write them, for the cards the node's inventory holds."""
        profiles = CARD_PROFILES[cards]
        annotations = hami_peer.node_annotations(
            profile_cards(profiles[number % len(profiles)], name), datetime.now())
        self.api.merge_patch(f"/api/v1/nodes/{name}",
                             {"metadata": {"annotations": annotations}})

    def start_hami(self, limits: str) -> Process:
        """HAMi's scheduler, with its chart's flags; its client limits its defaults (as
        the chart leaves them) or raised as kube-scheduler's."""
        assert self.peer is not None
        if self.hami_pki is None:
            self.hami_pki = write_bundle(self.data / "hami-tls", dns=("localhost",),
                                         ips=("127.0.0.1",), days=1)
        device_config = self.data / "hami-device-config.yaml"
        device_config.write_text(hami_peer.DEVICE_CONFIG)
        self.hami_port = free_port()
        metrics_port = self.hami_metrics_port = free_port()
        process = self.run(hami_peer.PROCESS, hami_peer.scheduler_args(
            self.peer.binary, port=self.hami_port, metrics_port=metrics_port,
            cert_file=self.hami_pki.extender, key_file=self.hami_pki.extender_key,
            device_config=device_config, namespace=SYSTEM_NAMESPACE,
            limits=None if limits == "default" else LIMITS[limits]),
            env=hami_peer.scheduler_env(self.admin_kubeconfig, SYSTEM_NAMESPACE))
        wait_for(lambda: http_get(f"https://127.0.0.1:{self.hami_port}/healthz",
                                  context=insecure_context())[0] == 200,
                 "HAMi's scheduler /healthz", START_TIMEOUT_S, watch=[process])
        return process

    def hami_devices(self) -> int:
        """The cards HAMi's scheduler holds (its hami_gpu_memory_limit_bytes series,
        from the node snapshot its register pass rebuilds)."""
        status, body = http_get(f"http://127.0.0.1:{self.hami_metrics_port}/metrics")
        if status != 200:
            return 0
        return sum(line.startswith("hami_gpu_memory_limit_bytes{")
                   for line in body.decode().splitlines())

    def kube_scheduler_config(self, scheduler: str, limits: str) -> dict[str, Any]:
        """pyhami's: k8s/'s configuration, or the chart's with the extender's mutual TLS;
        hami: HAMi's chart's; default: a default profile, no extender."""
        if scheduler == hami_peer.PEER_NAME:
            qps, burst = LIMITS[limits]
            return hami_peer.scheduler_config(
                f"https://127.0.0.1:{self.hami_port}", str(self.scheduler_kubeconfig),
                SYSTEM_NAMESPACE, qps, burst)
        if scheduler == "pyhami" and self.pki is not None:
            if not self.chart_config:
                self.chart_config = chart_scheduler_config(self.bin_dir)
            config = render_scheduler_config(
                self.chart_config, extender_url=self.extender_url,
                kubeconfig=str(self.scheduler_kubeconfig), ca_file=self.pki.ca,
                cert_file=self.pki.kube_scheduler, key_file=self.pki.kube_scheduler_key)
        elif scheduler == "pyhami":
            config = yaml.safe_load(shipped_scheduler_config())
            config["clientConnection"]["kubeconfig"] = str(self.scheduler_kubeconfig)
            (extender,) = config["extenders"]
            extender["urlPrefix"] = self.extender_url
        else:
            config = {"apiVersion": "kubescheduler.config.k8s.io/v1",
                      "kind": "KubeSchedulerConfiguration",
                      "clientConnection": {"kubeconfig": str(self.scheduler_kubeconfig)},
                      "profiles": [{"schedulerName": "default-scheduler"}]}
        qps, burst = LIMITS[limits]
        config["clientConnection"].update(qps=qps, burst=burst)
        config["leaderElection"] = {"leaderElect": False}
        return config

    def start_kube_scheduler(self, scheduler: str, limits: str) -> Process:
        port = self.kube_scheduler_port = free_port()
        process = self.launch_kube_scheduler(
            KUBE_SCHEDULER, self.kube_scheduler_config(scheduler, limits), port)
        # Ready once its informers are synced: pods created earlier would wait for that.
        wait_for(lambda: http_get(f"https://127.0.0.1:{port}/readyz",
                                  context=insecure_context())[0] == 200,
                 "kube-scheduler /readyz", START_TIMEOUT_S, watch=[process])
        return process

    def delete_pods(self) -> None:
        """Every pod of the bench, at once (no kubelet confirms a graceful deletion), and
        until pyhami's ledger holds none."""
        pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
        self.api.delete(pods, gracePeriodSeconds="0")
        wait_for(lambda: not self.api.get(pods)["items"], "the bench's pods to be gone",
                 START_TIMEOUT_S)

        def ledger_empty() -> bool:
            status = self.statusz()
            return bool(status["pods_bound"] == 0 and status["reservations"] == 0)

        wait_for(ledger_empty, "pyhami's ledger to release every pod", START_TIMEOUT_S,
                 watch=[self.processes[DAEMON]])

    def cpu_seconds(self) -> dict[str, tuple[float, float]]:
        """(utime, stime) of each running component so far."""
        seconds = {}
        for name in COMPONENTS:
            process = self.processes.get(name)
            if process is not None and process.popen is not None:
                seconds[name] = process_cpu_seconds(process.popen.pid)
        return seconds


def histogram_mean_ms(exposition: str, name: str, label: str = "") -> float | None:
    """The mean of a histogram over its series holding ``label``, in ms; None if empty."""
    totals = {"_sum": 0.0, "_count": 0.0}
    for line in exposition.splitlines():
        for suffix in totals:
            if line.startswith(f"{name}{suffix}") and label in line:
                totals[suffix] += float(line.rsplit(" ", 1)[1])
    if not totals["_count"]:
        return None
    return round(totals["_sum"] / totals["_count"] * 1e3, 3)


def process_cpu_seconds(pid: int) -> tuple[float, float]:
    """(utime, stime): the time in the kernel is mostly the sockets', paid per write and
    read (on loopback the sender's write runs the receiver's side too)."""
    # The command name (field 2) may hold spaces: the fields after it count from its ")".
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS


async def publish_inventories(nats_url: str, nodes: Sequence[str], cards: int) -> None:
    """What the agents of ``nodes`` would publish when they start."""
    client = await nats.connect(nats_url)
    profiles = CARD_PROFILES[cards]
    for number, node in enumerate(nodes):
        report = Report(node, "bench", 3600.0)
        report.observe(profile_cards(profiles[number % len(profiles)], node))
        await bench_extender.publish(client, report, "start")
    await client.flush()
    await client.close()


# The pods --------------------------------------------------------------------------------


def pod(name: str, scheduler: str) -> dict[str, Any]:
    """A lab-sized pod for pyhami and HAMi; for kube-scheduler alone, one of the slots the
    node counts (``SLOTS_PER_CARD`` a card)."""
    limits = ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"} if scheduler == "pyhami"
              else hami_peer.pod_limits() if scheduler == hami_peer.PEER_NAME
              else {"nvidia.com/gpu": "1"})
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "app", "image": "busybox", "command": ["sleep", "infinity"],
                        "resources": {"limits": limits}}]}
    if scheduler == "pyhami":
        spec["schedulerName"] = SCHEDULER_NAME
    elif scheduler == hami_peer.PEER_NAME:
        spec["schedulerName"] = hami_peer.SCHEDULER_NAME
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


@dataclass
class Binding:
    seen: float
    node: str
    annotated: bool


@dataclass
class PodWatch:
    """One watch of the bench namespace: when each pod is first seen with a node."""

    bound: dict[str, Binding] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    ended: BaseException | None = None
    version: str = ""  # of the last event read: a watch ended early goes on from it
    # Shown every pod the watch reads (HAMi's Allocate stand-in).
    on_pod: Callable[[dict[str, Any]], None] | None = None

    async def follow(self, response: aiohttp.ClientResponse,
                     reopen: Callable[[str], Awaitable[aiohttp.ClientResponse]]) -> None:
        try:
            for _ in range(MAX_REWATCHES):
                async with response:
                    await self._read(response)
                # The API server drops a watch that falls behind (this loop is busy
                # creating pods): go on from the last event read, as an informer does.
                response = await reopen(self.version)
            self.ended = RuntimeError(f"the API server ended the pod watch "
                                      f"{MAX_REWATCHES} times")
        except Exception as error:
            self.ended = error
        self.changed.set()

    async def _read(self, response: aiohttp.ClientResponse) -> None:
        async for line in response.content:
            event = json.loads(line)
            if event["type"] == "ERROR":
                raise RuntimeError(f"the pod watch failed: {event['object']}")
            item = event["object"]
            self.version = item["metadata"]["resourceVersion"]
            if self.on_pod is not None and event["type"] in ("ADDED", "MODIFIED"):
                self.on_pod(item)
            node = item.get("spec", {}).get("nodeName")
            name = item["metadata"]["name"]
            if event["type"] in ("ADDED", "MODIFIED") and node and name not in self.bound:
                annotations = item["metadata"].get("annotations") or {}
                self.bound[name] = Binding(time.perf_counter(), node, ALLOCATED in annotations)
                self.changed.set()

    async def wait_bound(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.changed.clear()
            if len(self.bound) >= count:
                return
            if self.ended is not None:
                raise RuntimeError(f"{len(self.bound)} of {count} pods seen bound when the "
                                   f"watch stopped: {self.ended!r}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(self.bound)} of {count} pods bound after "
                                   f"{timeout:g} s")
            await asyncio.wait_for(self.changed.wait(), left)


class PodClient:
    """Pods of the bench namespace as the administrator, over kept-alive connections."""

    def __init__(self, plane: ApiServerPlane, concurrency: int) -> None:
        self.plane = plane
        self.allocations: list[hami_peer.AllocateStandIn] = []
        self.concurrency = concurrency
        self.pods_url = f"{plane.server}/api/v1/namespaces/{NAMESPACE}/pods"
        self.headers = {"Authorization": f"Bearer {plane.api.token}"}
        self.context = ssl.create_default_context(cafile=str(plane.ca_file))

    def session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=self.concurrency + 1, ssl=self.context)
        return aiohttp.ClientSession(connector=connector, headers=self.headers)

    async def watch(self, http: aiohttp.ClientSession,
                    on_pod: Callable[[dict[str, Any]], None] | None = None,
                    ) -> tuple[PodWatch, asyncio.Task[None]]:
        """A watch from the namespace's current state on; returns once it is open."""
        async with http.get(self.pods_url) as listed:
            listed.raise_for_status()
            version = (await listed.json())["metadata"]["resourceVersion"]

        async def open_watch(version: str) -> aiohttp.ClientResponse:
            response = await http.get(self.pods_url, params={
                "watch": "1", "resourceVersion": version, "timeoutSeconds": "3600"},
                timeout=aiohttp.ClientTimeout(total=None, sock_read=None))
            response.raise_for_status()
            return response

        first = await open_watch(version)
        watch = PodWatch(version=version, on_pod=on_pod)
        return watch, asyncio.create_task(watch.follow(first, open_watch))

    def stand_in(self, scheduler: str, http: aiohttp.ClientSession,
                 ) -> tuple[hami_peer.AllocateStandIn | None,
                            Callable[[dict[str, Any]], None] | None]:
        """For HAMi's pods, the device plugin's part at Allocate, fed by the pod watch."""
        if scheduler != hami_peer.PEER_NAME:
            return None, None
        standin = hami_peer.AllocateStandIn(self.plane.server)
        self.allocations.append(standin)
        return standin, lambda pod: standin.offer(http, pod)

    async def create(self, http: aiohttp.ClientSession, body: dict[str, Any]) -> None:
        async with http.post(self.pods_url, json=body) as response:
            if response.status >= 300:
                raise RuntimeError(f"creating pod {body['metadata']['name']}: HTTP "
                                   f"{response.status}: {(await response.text())[:300]}")


async def burst(client: PodClient, scheduler: str, limits: str,
                count: int, peer_timeout: float | None = None) -> dict[str, Any]:
    """``count`` pods created at once, through one scheduler. With ``peer_timeout``, the
    pods still unbound after it are counted (``unbound``) instead of failing the bench;
    the figures are then those of the pods bound."""
    names = [f"{scheduler}-{limits}-{number:05d}" for number in range(count)]
    sent: dict[str, float] = {}
    gate = asyncio.Semaphore(client.concurrency)
    async with client.session() as http:
        standin, on_pod = client.stand_in(scheduler, http)
        watch, following = await client.watch(http, on_pod)

        async def create(name: str) -> float:
            body = pod(name, scheduler)
            async with gate:
                sent[name] = time.perf_counter()
                await client.create(http, body)
                return time.perf_counter()

        started = time.perf_counter()
        returned = await asyncio.gather(*(create(name) for name in names))
        created = max(returned) - started
        try:
            await watch.wait_bound(count, timeout=max(60 + count * 0.5, peer_timeout or 0))
        except TimeoutError:
            if peer_timeout is None:
                raise
        following.cancel()
        if standin is not None:
            await standin.drain()
    names = [name for name in names if name in watch.bound]
    if not names:
        raise RuntimeError(f"no pod of {scheduler}'s bound in {peer_timeout} s")
    bound = [watch.bound[name] for name in names]
    latencies = [binding.seen - sent[name] for name, binding in zip(names, bound, strict=True)]
    return {
        "scheduler": scheduler, "limits": limits, "bound": len(bound),
        "unbound": count - len(bound),
        "annotated": sum(binding.annotated for binding in bound),
        "on_bench_nodes": sum(binding.node.startswith(NODE_PREFIX) for binding in bound),
        "pods_per_s": round(len(bound) / (max(binding.seen for binding in bound) - started),
                            1),
        "created_per_s": round(count / created, 1),
        "p50_ms": round(statistics.median(latencies) * 1e3, 1),
        "p99_ms": round(bench_extender.percentile(latencies, 0.99) * 1e3, 1),
    }


async def singles(client: PodClient, scheduler: str, count: int) -> float:
    """Median milliseconds from create sent to binding seen of ``count`` pods created one
    at a time, each once the one before is bound."""
    latencies = []
    async with client.session() as http:
        standin, on_pod = client.stand_in(scheduler, http)
        watch, following = await client.watch(http, on_pod)
        for number in range(count):
            name = f"{scheduler}-idle-{number:03d}"
            began = time.perf_counter()
            await client.create(http, pod(name, scheduler))
            await watch.wait_bound(number + 1, timeout=60)
            latencies.append(watch.bound[name].seen - began)
        following.cancel()
        if standin is not None:
            await standin.drain()
    return round(statistics.median(latencies) * 1e3, 1)


def phase(plane: BenchPlane, client: PodClient, scheduler: str, limits: str,
          args: argparse.Namespace) -> dict[str, Any]:
    hami = None
    if scheduler == hami_peer.PEER_NAME:
        hami = plane.start_hami(limits)
        expected = args.nodes * args.cards
        # Its first pass on a node also writes the handshake of each other backend that has
        # one (hygon, biren, vastai: a GET and a PATCH each), 5 requests/s at its defaults.
        wait_for(lambda: plane.hami_devices() == expected,
                 f"HAMi's scheduler to hold {expected} cards",
                 START_TIMEOUT_S + 2 * args.nodes, watch=[hami])
    kube_scheduler = plane.start_kube_scheduler(scheduler, limits)
    client.allocations.clear()
    try:
        before = plane.cpu_seconds()
        result = asyncio.run(burst(client, scheduler, limits, args.pods,
                                   args.peer_timeout if hami is not None else None))
        # What the phase left in flight (Events, the daemon's bookkeeping) is its cost too.
        time.sleep(1.0)
        after = plane.cpu_seconds()
        result["kube_scheduler"] = plane.kube_scheduler_timings()
        # Not after a burst that left pods unbound: they would be bound among the singles
        # (counted as theirs) and hold HAMi's node locks with no stand-in watching.
        result["idle_median_ms"] = (asyncio.run(singles(client, scheduler, args.idle_pods))
                                    if limits == "raised" and not result["unbound"] else None)
    finally:
        kube_scheduler.stop()
    if hami is not None:
        qps, burst_limit = LIMITS[limits]
        result["hami_limits"] = ("chart (its defaults, qps 5, burst 10)" if limits == "default"
                                 else f"raised (--kube-qps {qps} --kube-burst {burst_limit})")
        result["allocate_stand_in_errors"] = [error for standin in client.allocations
                                              for error in standin.errors][:10]

    def per_pod(seconds: float) -> float:
        # A peer's phase that left pods unbound spent its CPU on those it bound.
        return round(seconds * 1e3 / int(result["bound"]), 2)

    cpu = {name: per_pod(sum(after[name]) - sum(before[name])) for name in after}
    cpu["total"] = round(sum(cpu[name] for name in OWN_COMPONENTS[scheduler] if name in cpu), 2)
    result["cpu_ms_per_pod"] = cpu
    result["kernel_ms_per_pod"] = {name: per_pod(after[name][1] - before[name][1])
                                   for name in after}
    plane.delete_pods()
    if hami is not None:
        hami.stop()
    return result


def bench(plane: BenchPlane, args: argparse.Namespace) -> dict[str, Any]:
    plane.start()
    nodes = plane.create_nodes(args.nodes, args.cards, args.concurrency)
    asyncio.run(publish_inventories(plane.nats_url, nodes, args.cards))
    wait_for(lambda: plane.statusz()["nodes"] == args.nodes,
             f"the daemon to hold {args.nodes} inventories", START_TIMEOUT_S,
             watch=[plane.processes[DAEMON]])
    client = PodClient(plane, args.concurrency)
    reports = []
    for number in range(args.runs):
        phases = {}
        for limits in limit_settings(args.limits):
            for scheduler in schedulers(plane.peer):
                result = phase(plane, client, scheduler, limits, args)
                phases[f"{scheduler}_{limits}_limits"] = result
                print(f"run {number + 1} of {args.runs}: {summary(result)}", flush=True)
        reports.append(report(args, phases))
    return reports[0] if args.runs == 1 else medians(reports)


def limit_settings(chosen: str) -> tuple[str, ...]:
    """The settings of client limits a run goes through, in order."""
    return tuple(LIMITS) if chosen == "both" else (chosen,)


def medians(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One report of several runs: each number the median of the runs' (a ratio the median
    of the runs' ratios, each taken within its run), each run's report under ``runs``."""
    def merged(values: Sequence[Any]) -> Any:
        first = values[0]
        if isinstance(first, dict):
            return {key: merged([value[key] for value in values]) for key in first}
        if isinstance(first, bool) or not all(isinstance(value, int | float)
                                              for value in values):
            return first
        middle = statistics.median(values)
        return round(middle, 3) if isinstance(middle, float) else middle

    figures = {key: value for key, value in reports[0].items() if key != "phases"}
    result: dict[str, Any] = merged([{key: report[key] for key in figures}
                                     for report in reports])
    result["median_of_runs"] = len(reports)
    result["runs"] = reports
    return result


def schedulers(peer: hami_peer.Peer | None) -> tuple[str, ...]:
    """The phases of one setting of limits, in order: the peer's between pyhami's and
    kube-scheduler alone's."""
    return ("pyhami", "default") if peer is None else ("pyhami", peer.name, "default")


def summary(result: dict[str, Any]) -> str:
    qps, burst_limit = LIMITS[result["limits"]]
    kernel = result["kernel_ms_per_pod"]
    cpu = ", ".join(f"{name} {ms:g}" + (f" ({kernel[name]:g} in the kernel)"
                                        if name in kernel else "")
                    for name, ms in result["cpu_ms_per_pod"].items())
    idle = (f"; one pod on an idle cluster {result['idle_median_ms']:g} ms"
            if result["idle_median_ms"] is not None else "")
    own = ", ".join(f"{name.removesuffix('_ms')} {ms}"
                    for name, ms in result["kube_scheduler"].items())
    own_client = (f"; HAMi's client: {result['hami_limits']}" if "hami_limits" in result
                  else "")
    return (f"{result['scheduler']:>7} (qps {qps}, burst {burst_limit}"
            f"{own_client}): "
            f"{result['bound']} bound"
            f"{f' ({unbound} not in time)' if (unbound := result['unbound']) else ''}, "
            f"{result['pods_per_s']:g} pods/s, "
            f"p50 {result['p50_ms']:g} ms, p99 {result['p99_ms']:g} ms, "
            f"created {result['created_per_s']:g} pods/s{idle}; CPU ms per pod: {cpu}; "
            f"kube-scheduler's mean ms: {own}")


def report(args: argparse.Namespace, phases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The figures of one run. Keys without a suffix are of the raised limits; those
    ending ``_default_limits`` of kube-scheduler's defaults (and the peer's own); a
    ``ratio`` is pods/s against kube-scheduler alone's, a ``cpu_ratio`` cluster CPU per pod
    against kube-scheduler alone's, both within the run."""
    def of(scheduler: str, limits: str) -> dict[str, Any]:
        return phases[f"{scheduler}_{limits}_limits"]

    names = tuple(dict.fromkeys(phase["scheduler"] for phase in phases.values()))
    settings = tuple(dict.fromkeys(phase["limits"] for phase in phases.values()))

    result: dict[str, Any] = {"nodes": args.nodes, "pods": args.pods, "cards": args.cards,
                              "concurrency": args.concurrency,
                              "success_events": not args.no_success_events}
    for limits in settings:
        suffix = "" if limits == "raised" else f"_{limits}_limits"
        alone = of("default", limits)
        for scheduler in names:
            figures = of(scheduler, limits)
            for key in ("pods_per_s", "p50_ms", "p99_ms"):
                result[f"{scheduler}_{key}{suffix}"] = figures[key]
            result[f"{scheduler}_cpu_ms_per_pod{suffix}"] = figures["cpu_ms_per_pod"]["total"]
            if limits == "raised":
                result[f"{scheduler}_idle_ms"] = figures["idle_median_ms"]
            if scheduler == hami_peer.PEER_NAME:
                result[f"hami_unbound{suffix}"] = figures["unbound"]
            if scheduler == "default":
                continue
            prefix = "" if scheduler == "pyhami" else f"{scheduler}_"
            result[f"{prefix}ratio{suffix}"] = round(
                float(figures["pods_per_s"] / alone["pods_per_s"]), 3)
            result[f"{prefix}cpu_ratio{suffix}"] = round(
                float(figures["cpu_ms_per_pod"]["total"] / alone["cpu_ms_per_pod"]["total"]),
                3)
    result["created_per_s"] = min(phase["created_per_s"] for phase in phases.values())
    result["cpu_ms_per_pod"] = {name: phase["cpu_ms_per_pod"] for name, phase in phases.items()}
    result["kernel_ms_per_pod"] = {name: phase["kernel_ms_per_pod"]
                                   for name, phase in phases.items()}
    result["phases"] = {name: {key: value for key, value in phase.items()
                               if key not in ("cpu_ms_per_pod", "kernel_ms_per_pod")}
                        for name, phase in phases.items()}
    return result


if __name__ == "__main__":
    sys.exit(main())
