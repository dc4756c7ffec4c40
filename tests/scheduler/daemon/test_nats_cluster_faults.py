"""A burst of pods through a NATS cluster of three while its servers are killed with
SIGKILL, on real processes (issue 29, docs/reliability.md).

On loopback: three routed nats-servers with JetStream (``LocalNatsCluster``), two
``pyhami scheduler --standalone`` processes sharing the R3 pod bucket and the leader
lease, and three ``pyhami agent --device-plugin`` processes, each registered with a fake
kubelet of its own (``tests.fakes.kubelet``). Sixteen clients play kube-scheduler: each
submits a pod to whichever daemon takes it, sends /filter and /bind to the one deciding,
has the pod's node admit it (the kubelet's Allocate, answered by the device plugin from
what the daemon says is pending), and deletes its older pods once they were served.

``PODS`` pods in all go through while each server in turn is killed and restarted, and
once two of them at different times (the second killed just after the first is back, its
streams perhaps not caught up). After each fault the load is paused and checked: no pod
acknowledged and not deleted is gone, every acknowledged bind is in the store on its
node, the invariants of ``tests.invariants`` hold (no card over its slots, memory or
cores: nothing double-booked; the ledger equal to the store), every Allocate succeeded
and every pod served has ``bind-phase: success``. The time to recover (the first bind
asked and acknowledged after the kill; the cluster formed again) is measured per fault,
written to ``nats-cluster-faults.json`` under the test's tmp dir and printed.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from agent.vendors.nvidia.simulated import uuid_for
from common.core.annotations import BIND_PHASE_ANNOTATION
from pyhami.natsserver import LocalNatsCluster, free_port
from tests.fakes.kubelet import FakeKubelet
from tests.invariants import settled_violations
from tests.processes import Process
from tests.scheduler.daemon.test_faults import pod

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PODS = 500
WORKERS = 16
LIVE_PER_WORKER = 3
NODES = ("node-a", "node-b", "node-c")
DAEMONS = ("daemon-a", "daemon-b")
LIMITS = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 10}
FAULTS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("server 0", (0,)), ("server 1", (1,)), ("server 2", (2,)),
    ("server 0, then server 1", (0, 1)))
"""Each fault's name and the servers it kills, one after the other."""
CHUNK = 100
"""The clients take pods in chunks of this many: the first at once, one more at each
fault's first kill, so every fault lands mid-burst (``BEFORE_FAULT`` pods of the chunk
still to go) and the next chunk flows through its recovery."""
BEFORE_FAULT = 30
OUTAGE_S = 1.0
"""A killed server stays down this long."""
RECOVERY_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 5.0
POD_TIMEOUT_S = 90.0
"""One pod's submission, /filter and /bind are tried again this long (503 while the lease
or the buckets' stream leaders move), then the pod counts as not bound. On two cores shared
by eight processes the lease can change hands several times in a row, a new holder handing
it on when its store does not answer its reads in time: 40 s was once too short."""
BURST_STALL_S = 90.0
"""The burst reaches the next fault, or its end, within this: else the test fails."""
ADMIT_TIMEOUT_S = 30.0
"""The device plugin asks the daemon for up to 20 s (ASK_PATIENCE_S); this covers it."""


@dataclass
class Stand:
    cluster: LocalNatsCluster
    daemons: dict[str, Process]
    urls: dict[str, str]
    kubelets: dict[str, FakeKubelet]
    logs: Path


@pytest.fixture
async def stand(tmp_path: Path) -> AsyncIterator[Stand]:
    cluster = LocalNatsCluster(tmp_path / "nats")
    await asyncio.to_thread(cluster.start)
    # Short: a unix socket path must fit in 108 bytes, and tmp_path may not.
    sockets = Path(tempfile.mkdtemp(prefix="nf-", dir="/tmp"))
    kubelets: dict[str, FakeKubelet] = {}
    agents: list[Process] = []
    ports = {name: free_port() for name in DAEMONS}
    daemons = {name: Process(
        ["scheduler", "--standalone", "--nats", cluster.url, "--identity", name,
         "--listen", f"127.0.0.1:{ports[name]}", "--metrics", f"127.0.0.1:{free_port()}",
         "--resync-wait", "0.5", "--no-pending-loop", "--reservation-ttl", "10",
         "--log-level", "warning"], tmp_path / f"{name}.log") for name in DAEMONS}
    try:
        for node in NODES:
            kubelet_dir, hami_dir = sockets / node / "kubelet", sockets / node / "vgpu"
            kubelet_dir.mkdir(parents=True)
            hami_dir.mkdir()
            kubelets[node] = FakeKubelet(kubelet_dir, [uuid_for(node, i) for i in range(4)])
            await kubelets[node].start()
            agents.append(Process(
                ["agent", "--node", node, "--nats", cluster.url, "--inventory", "sim:t4x4",
                 "--poll-interval", "0.5", "--heartbeat-interval", "1", "--device-plugin",
                 "--kubelet-dir", str(kubelet_dir), "--hami-core-dir", str(hami_dir),
                 "--log-level", "warning"], tmp_path / f"agent-{node}.log"))
            agents[-1].start()
        for kubelet in kubelets.values():
            await asyncio.wait_for(kubelet.registrations.get(), 60)
        yield Stand(cluster, daemons, {name: f"http://127.0.0.1:{port}"
                                       for name, port in ports.items()}, kubelets, tmp_path)
    finally:
        for process in [*daemons.values(), *agents]:
            process.stop()
        for kubelet in kubelets.values():
            await kubelet.stop()
        cluster.stop()
        shutil.rmtree(sockets, ignore_errors=True)


@dataclass
class Book:
    """What the clients know for sure, from the answers they got."""

    acknowledged: set[str] = field(default_factory=set)
    """Submissions answered 201 (or 409 to a second try: the first landed)."""
    deleted: set[str] = field(default_factory=set)
    """Deletions answered 204 or 404."""
    bound: dict[str, str] = field(default_factory=dict)
    """Binds answered without an error: the pod's node."""
    found_bound: set[str] = field(default_factory=set)
    """Pods found bound in the store whose bind got no answer (it landed)."""
    binds: list[tuple[float, float]] = field(default_factory=list)
    """Each acknowledged bind: when asked and when answered (time.monotonic)."""
    served: set[str] = field(default_factory=set)
    """Pods seen with bind-phase success (their Allocate answered and reported)."""
    admissions: Counter[str] = field(default_factory=Counter)
    """The kubelet's Allocate calls, by node."""
    allocate_errors: list[str] = field(default_factory=list)
    unbound: list[str] = field(default_factory=list)
    """Pods not bound within POD_TIMEOUT_S."""
    statuses: Counter[str] = field(default_factory=Counter)


class Clients:
    """Sixteen clients playing kube-scheduler against both daemons."""

    def __init__(self, session: aiohttp.ClientSession, stand: Stand) -> None:
        self.book = Book()
        self.taken = 0
        """Pods taken from the burst so far."""
        self.allowed = CHUNK
        """Pods the clients may take so far."""
        self._session = session
        self._stand = stand
        self._leader = DAEMONS[0]
        self._names = iter(f"burst-{n}" for n in range(PODS))
        self._running = asyncio.Event()
        self._busy = 0
        self._admitting = {node: asyncio.Lock() for node in NODES}
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._running.set()
        self._tasks = [asyncio.create_task(self._client(n)) for n in range(WORKERS)]

    async def pause(self) -> None:
        self._running.clear()
        while self._busy:
            await asyncio.sleep(0.02)

    def resume(self) -> None:
        self._running.set()

    async def finish(self) -> None:
        """Wait until every client has run out of pods (the burst is through)."""
        await asyncio.gather(*self._tasks)

    async def _call(self, daemon: str, method: str, path: str,
                    body: Any = None) -> tuple[int, Any] | None:
        verb = f"{method} {path.split('/')[1]}"
        try:
            async with self._session.request(
                    method, f"{self._stand.urls[daemon]}{path}", json=body,
                    timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)) as answer:
                text = await answer.read()
                self.book.statuses[f"{verb} {answer.status}"] += 1
                try:
                    return answer.status, json.loads(text) if text else None
                except ValueError:
                    return answer.status, text.decode(errors="replace")
        except (aiohttp.ClientError, TimeoutError, OSError):
            self.book.statuses[f"{verb} no answer"] += 1
            return None

    async def _decider(self, method: str, path: str, body: Any = None,
                       deadline: float | None = None) -> tuple[int, Any] | None:
        """The answer of the daemon deciding now: a standby's 503, or no answer, sends the
        call to the other, and again until ``deadline``; None when none came."""
        deadline = deadline or time.monotonic() + POD_TIMEOUT_S
        others = itertools.cycle(DAEMONS)
        daemon = self._leader
        while time.monotonic() < deadline:
            answer = await self._call(daemon, method, path, body)
            if answer is not None and answer[0] != 503:
                self._leader = daemon
                return answer
            daemon = next(d for d in others if d != daemon)
            await asyncio.sleep(0.05)
        return None

    async def _client(self, number: int) -> None:
        live: list[str] = []
        while True:
            await self._running.wait()
            if self.taken >= PODS:
                return
            if self.taken >= self.allowed:
                await asyncio.sleep(0.05)
                continue
            name = next(self._names, None)
            if name is None:
                return
            self.taken += 1
            self._busy += 1
            try:
                await self._one_pod(name)
                live.append(name)
                # The oldest first; one still waiting for its cards does not hold up the
                # deletion of those served after it (pods end independently).
                for older in list(live):
                    if len(live) <= LIVE_PER_WORKER:
                        break
                    if await self._delete_served(older):
                        live.remove(older)
            finally:
                self._busy -= 1
            await asyncio.sleep(0.01)

    async def _one_pod(self, name: str) -> None:
        deadline = time.monotonic() + POD_TIMEOUT_S
        manifest = pod(name, dict(LIMITS))
        submitted = await self._decider("POST", "/api/pods", manifest, deadline)
        if submitted is None or submitted[0] not in (201, 409):
            self.book.unbound.append(f"{name}: not submitted ({submitted})")
            return
        self.book.acknowledged.add(name)
        last_filter: object = None  # said when the pod is not bound: why no node came
        for attempt in itertools.count():
            if time.monotonic() > deadline:
                break
            # Tried before: its bind may have landed unanswered.
            found = await self._decider("GET", f"/api/pods/default/{name}", None, deadline) \
                if attempt else None
            if found is not None and found[0] == 200 and found[1].get("node") is not None:
                self.book.found_bound.add(name)
                return await self._admit(name, str(found[1]["node"]))
            answer = await self._decider("POST", "/filter",
                                         {"Pod": manifest, "NodeNames": list(NODES)}, deadline)
            if answer is None or not isinstance(answer[1], dict) or \
                    not answer[1].get("NodeNames"):
                last_filter = answer if answer is None or not isinstance(answer[1], dict) \
                    else {key: answer[1].get(key) for key in ("Error", "FailedNodes")}
                await asyncio.sleep(0.1)
                continue
            node = str(answer[1]["NodeNames"][0])
            asked = time.monotonic()
            bound = await self._call(self._leader, "POST", "/bind", {
                "PodName": name, "PodNamespace": "default", "Node": node})
            if bound is not None and bound[0] == 200 and isinstance(bound[1], dict) \
                    and not bound[1].get("Error"):
                self.book.bound[name] = node
                self.book.binds.append((asked, time.monotonic()))
                return await self._admit(name, node)
        self.book.unbound.append(f"{name}: not bound within {POD_TIMEOUT_S:g} s; "
                                 f"the last /filter: {str(last_filter)[:300]}")

    async def _admit(self, name: str, node: str) -> None:
        """The kubelet starting the pod's container: one Allocate on its node, as the
        kubelet admits one pod at a time."""
        async with self._admitting[node]:
            self.book.admissions[node] += 1
            try:
                response = await asyncio.wait_for(self._stand.kubelets[node].admit(1),
                                                  ADMIT_TIMEOUT_S)
            except (grpc.aio.AioRpcError, TimeoutError) as error:
                self.book.allocate_errors.append(f"{name} on {node}: {error!r}"[:300])
                return
        visible = response.envs.get("NVIDIA_VISIBLE_DEVICES", "")
        if not visible.startswith(f"GPU-{node}-"):
            self.book.allocate_errors.append(f"{name} on {node}: given {visible!r}")

    async def _delete_served(self, name: str) -> bool:
        """Delete the pod once its Allocate was reported (bind-phase success): a pod still
        waiting for its cards is left for its node's next Allocate. True when gone."""
        found = await self._decider("GET", f"/api/pods/default/{name}")
        if found is not None and found[0] == 200:
            phase = (found[1].get("annotations") or {}).get(BIND_PHASE_ANNOTATION)
            if found[1].get("node") is not None and phase != "success":
                return False
            if phase == "success":
                self.book.served.add(name)
        answer = await self._decider("DELETE", f"/api/pods/default/{name}")
        if answer is not None and answer[0] in (204, 404):
            self.book.deleted.add(name)
            return True
        return False


async def _ready(session: aiohttp.ClientSession, url: str) -> int:
    try:
        async with session.get(f"{url}/readyz",
                               timeout=aiohttp.ClientTimeout(total=2)) as answer:
            return answer.status
    except (aiohttp.ClientError, TimeoutError, OSError):
        return 0


async def _standing_by(session: aiohttp.ClientSession, url: str) -> None:
    """Wait until the daemon at ``url`` is up and standing by (its /readyz says 503)."""
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while await _ready(session, url) != 503:
        if time.monotonic() > deadline:
            pytest.fail(f"the second daemon not standing by within {RECOVERY_TIMEOUT_S:g} s")
        await asyncio.sleep(0.1)


async def _deciding(session: aiohttp.ClientSession, stand: Stand) -> str:
    """The URL of the daemon deciding now (its /readyz says 200)."""
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while time.monotonic() < deadline:
        for url in stand.urls.values():
            if await _ready(session, url) == 200:
                return url
        await asyncio.sleep(0.1)
    pytest.fail(f"no daemon ready within {RECOVERY_TIMEOUT_S:g} s")


async def _problems(session: aiohttp.ClientSession, stand: Stand, clients: Clients,
                    when: str) -> list[str]:
    """Everything the burst must not break, read from the deciding daemon."""
    url = await _deciding(session, stand)
    book = clients.book
    problems = [f"{when}: {p}" for p in await settled_violations(session, url, settle_s=10.0)]
    problems += [f"{when}: Allocate failed: {e}" for e in book.allocate_errors]
    book.allocate_errors.clear()
    deadline = time.monotonic() + 10.0
    while True:
        async with session.get(f"{url}/api/pods") as answer:
            stored = {p["name"]: p for p in await answer.json()}
        kept = book.acknowledged - book.deleted
        lost = sorted(kept - stored.keys())
        moved = sorted(name for name, node in book.bound.items()
                       if name in kept and name in stored and stored[name]["node"] != node)
        waiting = sorted(name for name in kept & stored.keys() if stored[name]["node"]
                         and (stored[name]["annotations"] or {}).get(
                             BIND_PHASE_ANNOTATION) != "success")
        if not waiting or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    problems += [f"{when}: pod {name} was acknowledged and never deleted, but is gone"
                 for name in lost]
    problems += [f"{when}: pod {name} was bound to {book.bound[name]} (acknowledged), the "
                 f"store says {stored[name]['node']}" for name in moved]
    problems += [f"{when}: pod {name} is bound but its Allocate was never reported (bind-phase "
                 f"{(stored[name]['annotations'] or {}).get(BIND_PHASE_ANNOTATION)})"
                 for name in waiting]
    book.served |= {name for name in kept & stored.keys()
                    if (stored[name]["annotations"] or {}).get(BIND_PHASE_ANNOTATION)
                    == "success"}
    return problems


async def _fault(stand: Stand, clients: Clients, servers: tuple[int, ...]) -> dict[str, float]:
    """Kill ``servers`` one after the other, each restarted after ``OUTAGE_S`` (the next
    killed as soon as the one before is back); the seconds from the first kill until a
    bind asked after it is acknowledged, and until the cluster formed again."""
    killed = time.monotonic()
    figures: dict[str, float] = {}
    clients.allowed += CHUNK
    for index in servers:
        stand.cluster.kill(index)
        await asyncio.sleep(OUTAGE_S)
        await asyncio.to_thread(stand.cluster.start, index)  # returns once formed again
    figures["cluster_formed_s"] = round(time.monotonic() - killed, 2)
    while True:
        flowing = [answered for asked, answered in clients.book.binds if asked > killed]
        if flowing:
            figures["binds_flowing_s"] = round(min(flowing) - killed, 2)
            return figures
        if time.monotonic() - killed > RECOVERY_TIMEOUT_S:
            figures["binds_flowing_s"] = float("inf")
            return figures
        await asyncio.sleep(0.05)


async def test_a_burst_of_pods_loses_nothing_while_each_nats_server_is_killed(
        stand: Stand) -> None:
    started = time.monotonic()
    report: dict[str, Any] = {"pods": PODS, "clients": WORKERS, "faults": {}}
    problems: list[str] = []
    async with aiohttp.ClientSession() as session:
        stand.daemons[DAEMONS[0]].start()
        await _deciding(session, stand)
        stand.daemons[DAEMONS[1]].start()
        await _standing_by(session, stand.urls[DAEMONS[1]])
        report["stand_up_s"] = round(time.monotonic() - started, 1)
        clients = Clients(session, stand)
        burst = time.monotonic()
        clients.start()
        for name, servers in FAULTS:
            after = clients.allowed - BEFORE_FAULT
            deadline = time.monotonic() + BURST_STALL_S
            while clients.taken < after and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert clients.taken >= after, (
                f"the burst stalled at {clients.taken} pods before {name}: "
                f"{clients.book.unbound[:5]} {clients.book.allocate_errors[:5]}")
            figures = await _fault(stand, clients, servers)
            figures["pods_taken"] = clients.taken
            report["faults"][name] = figures
            print(f"{name}: {figures}", flush=True)
            if figures["binds_flowing_s"] == float("inf"):
                problems.append(f"no bind acknowledged within {RECOVERY_TIMEOUT_S:g} s "
                                f"after {name}")
                break
            await asyncio.sleep(1.0)  # the burst runs on through the recovered cluster
            await clients.pause()
            problems += await _problems(session, stand, clients, f"after {name}")
            clients.resume()
        try:
            await asyncio.wait_for(clients.finish(), BURST_STALL_S)
        except TimeoutError:
            problems.append(f"the burst did not finish within {BURST_STALL_S:g} s of the "
                            f"last fault: {clients.taken} of {PODS} pods taken")
        report["burst_s"] = round(time.monotonic() - burst, 1)
        problems += await _problems(session, stand, clients, "at the end")
    book = clients.book
    problems += book.unbound
    report.update({
        "acknowledged": len(book.acknowledged), "bound": len(book.bound),
        "found_bound": len(book.found_bound), "served": len(book.served),
        "admissions": dict(book.admissions),
        "answers": dict(book.statuses), "seconds": round(time.monotonic() - started, 1),
        "daemons_alive": {name: process.alive() for name, process in stand.daemons.items()}})
    text = json.dumps(report, indent=2)
    (stand.logs / "nats-cluster-faults.json").write_text(text)
    print(text, *problems, sep="\n")
    assert not problems, "\n".join(problems[:20])
    assert all(report["daemons_alive"].values()), report["daemons_alive"]
    assert len(book.acknowledged) == PODS
    assert len(book.bound) + len(book.found_bound) == PODS
    assert sum(book.admissions.values()) == PODS
