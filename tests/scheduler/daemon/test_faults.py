"""Faults on real processes: nats-server, the daemon and an agent killed under load
(docs/reliability.md).

Everything runs as its own process on loopback: nats-server with JetStream on disk,
``pyhami scheduler --standalone`` and three ``pyhami agent`` processes. Sixteen clients
keep submitting and deleting pods (the daemon's pending loop filters and binds them)
and calling /filter and /bind directly. In each round nats-server, then the daemon, then
an agent is killed with SIGKILL and started again; after each, the test measures the
seconds until the daemon is ready again and a fresh pod is scheduled (for the agent:
a pod pinned to its node's cards), pauses the load and checks the invariants
(``tests.invariants``). At the end nothing may be lost: every pod the API acknowledged
and nobody deleted is still there, bound or pending, and no pod whose submission was
answered with an error appears. The figures are written to ``faults-report.json`` under
the test's tmp dir and printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.vendors.nvidia.simulated import uuid_for
from pyhami.natsserver import LocalNatsServer, free_port
from tests.invariants import settled_violations
from tests.processes import Process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ROUNDS = int(os.environ.get("PYHAMI_FAULT_ROUNDS", "3"))
WORKERS = 16
DIRECT_WORKERS = 4  # of the 16: /filter + /bind by hand; the others submit and delete
OUTSTANDING_PER_WORKER = 5
LOAD_BEFORE_FAULT_S = 3.0
OUTAGE_S = 1.0
RECOVERY_TIMEOUT_S = 60.0
NODES = ("node-a", "node-b", "node-c")
VICTIM_NODE = "node-b"


@dataclass
class Stand:
    nats: LocalNatsServer
    daemon: Process
    agents: dict[str, Process]
    url: str


@pytest.fixture
def stand(tmp_path: Path) -> Iterator[Stand]:
    nats = LocalNatsServer(extra_args=["-js", "-sd", str(tmp_path / "jetstream")])
    nats.start()
    port, metrics = free_port(), free_port()
    daemon = Process(["scheduler", "--standalone", "--nats", nats.url,
                      "--listen", f"127.0.0.1:{port}", "--metrics", f"127.0.0.1:{metrics}",
                      "--resync-wait", "0.5", "--retry-period", "0.5",
                      "--reservation-ttl", "10", "--node-timeout", "5",
                      "--log-level", "warning"], tmp_path / "daemon.log")
    agents = {name: Process(["agent", "--node", name, "--nats", nats.url,
                             "--inventory", "sim:t4x4", "--poll-interval", "0.5",
                             "--heartbeat-interval", "1", "--log-level", "warning"],
                            tmp_path / f"agent-{name}.log") for name in NODES}
    for agent in agents.values():
        agent.start()
    daemon.start()
    yield Stand(nats, daemon, agents, f"http://127.0.0.1:{port}")
    daemon.stop()
    for agent in agents.values():
        agent.stop()
    nats.kill()


def pod(name: str, limits: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[
        str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
            "spec": {"containers": [{"name": "app", "image": "ubuntu:22.04",
                                     "resources": {"limits": limits}}]}}


@dataclass
class Ledger:
    """What the clients know for sure about the pods, from the answers they got."""

    acknowledged: set[str] = field(default_factory=set)
    """Submissions answered 201."""
    refused: set[str] = field(default_factory=set)
    """Submissions answered with an error: never applied."""
    uncertain: set[str] = field(default_factory=set)
    """No answer (connection lost, timeout): either outcome is allowed."""
    deleted: set[str] = field(default_factory=set)
    """Deletions answered 204 or 404."""
    requests: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    direct_bind_errors: Counter[str] = field(default_factory=Counter)


class Load:
    """Sixteen clients: twelve submit and delete pods, four call /filter and /bind."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url
        self.book = Ledger()
        self.running = asyncio.Event()
        self.stopping = False
        self.busy = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._random = random.Random(9)
        self._limits: dict[str, dict[str, Any]] = {}

    def start(self) -> None:
        self.running.set()
        self._tasks = [asyncio.create_task(self._submitter(i))
                       for i in range(WORKERS - DIRECT_WORKERS)]
        self._tasks += [asyncio.create_task(self._direct(i)) for i in range(DIRECT_WORKERS)]

    async def pause(self) -> None:
        self.running.clear()
        while self.busy:
            await asyncio.sleep(0.02)

    def resume(self) -> None:
        self.running.set()

    async def stop(self) -> None:
        self.stopping = True
        await self.pause()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _call(self, verb: str, method: str, path: str,
                    body: Any = None) -> tuple[int, Any] | None:
        """One request, counted; None when no answer came."""
        self.book.requests[verb] += 1
        try:
            async with self.session.request(method, f"{self.url}{path}", json=body,
                                            timeout=aiohttp.ClientTimeout(total=10)) as answer:
                text = await answer.read()
                self.book.statuses[f"{verb} {answer.status}"] += 1
                try:
                    return answer.status, json.loads(text) if text else None
                except ValueError:
                    return answer.status, text.decode(errors="replace")
        except (aiohttp.ClientError, TimeoutError, OSError):
            self.book.statuses[f"{verb} no answer"] += 1
            return None

    async def _submitter(self, worker: int) -> None:
        mine: list[str] = []
        serial = 0
        while not self.stopping:
            await self.running.wait()
            self.busy += 1
            try:
                if len(mine) >= OUTSTANDING_PER_WORKER or (mine and self._random.random() < 0.3):
                    name = mine.pop(0)
                    if not await self._delete(name):
                        mine.append(name)  # not deleted: try again later
                else:
                    serial += 1
                    name = f"load-{worker}-{serial}"
                    await self._submit(name, self._random.choice([500, 1000, 2000]),
                                       self._random.choice([0, 10, 20]))
                    if name in self.book.acknowledged or name in self.book.uncertain:
                        mine.append(name)  # a submit without an answer may have landed
            finally:
                self.busy -= 1
            await asyncio.sleep(0.02)

    async def _submit(self, name: str, memory: int, cores: int) -> None:
        self._limits[name] = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory,
                              "nvidia.com/gpucores": cores}
        answer = await self._call("submit", "POST", "/api/pods", pod(name, self._limits[name]))
        if answer is None:
            self.book.uncertain.add(name)
        elif answer[0] == 201:
            self.book.acknowledged.add(name)
        else:
            self.book.refused.add(name)

    async def _delete(self, name: str) -> bool:
        """True when the pod is gone for sure (204, or 404)."""
        answer = await self._call("delete", "DELETE", f"/api/pods/default/{name}")
        if answer is None:
            self.book.uncertain.add(name)
            return False
        if answer[0] in (204, 404):
            self.book.deleted.add(name)
            return True
        return False

    async def _direct(self, worker: int) -> None:
        """Plays kube-scheduler on pods the submitters made: /filter, then /bind, and at
        times a second /bind of the same pod, as a retrying scheduler would."""
        while not self.stopping:
            await self.running.wait()
            self.busy += 1
            try:
                candidates = sorted(self.book.acknowledged - self.book.deleted)
                if candidates:
                    await self._filter_and_bind(self._random.choice(candidates[-40:]))
            finally:
                self.busy -= 1
            await asyncio.sleep(0.02)

    async def _filter_and_bind(self, name: str) -> None:
        """As kube-scheduler: only a pod still pending is filtered and bound."""
        found = await self._call("get", "GET", f"/api/pods/default/{name}")
        if found is None or found[0] != 200 or not isinstance(found[1], dict) or \
                found[1].get("node") is not None:
            return
        manifest = pod(name, self._limits[name])
        answer = await self._call("filter", "POST", "/filter",
                                  {"Pod": manifest, "NodeNames": list(NODES)})
        node = self._random.choice(NODES)
        if answer is not None and isinstance(answer[1], dict) and answer[1].get("NodeNames"):
            node = answer[1]["NodeNames"][0]
        for _ in range(self._random.choice([1, 1, 2])):
            bound = await self._call("bind", "POST", "/bind", {
                "PodName": name, "PodNamespace": "default", "Node": node})
            if bound is not None and isinstance(bound[1], dict) and bound[1].get("Error"):
                kind = re.sub(r"load-\d+-\d+", "POD", str(bound[1]["Error"]))
                self.book.direct_bind_errors[re.sub(r"[0-9a-f-]{36}", "UID", kind)[:90]] += 1


async def _ready(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(f"{url}/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False


async def recover(session: aiohttp.ClientSession, url: str, probe: str,
                  limits: dict[str, Any], annotations: dict[str, str] | None = None) -> float:
    """Seconds until /readyz answers 200 and the probe pod is submitted and bound; inf when
    that does not happen within ``RECOVERY_TIMEOUT_S``."""
    started = time.monotonic()
    deadline = started + RECOVERY_TIMEOUT_S
    submitted = False
    while time.monotonic() < deadline:
        if not await _ready(session, url):
            await asyncio.sleep(0.1)
            continue
        try:
            if not submitted:
                async with session.post(f"{url}/api/pods", json=pod(probe, limits, annotations),
                                        timeout=aiohttp.ClientTimeout(total=5)) as answer:
                    submitted = answer.status in (201, 409)
            if submitted:
                async with session.get(f"{url}/api/pods/default/{probe}",
                                       timeout=aiohttp.ClientTimeout(total=5)) as answer:
                    if answer.status == 200 and (await answer.json())["node"] is not None:
                        return time.monotonic() - started
        except (aiohttp.ClientError, TimeoutError, OSError):
            pass
        await asyncio.sleep(0.1)
    return float("inf")


async def test_kills_of_nats_the_daemon_and_an_agent_under_load_lose_nothing_and_recover(
        stand: Stand, tmp_path: Path) -> None:
    figures: dict[str, Any] = {"rounds": ROUNDS, "workers": WORKERS,
                               "faults": Counter(), "recovery_s": {}, "problems": []}
    problems: list[str] = figures["problems"]
    recovery: dict[str, list[float]] = {"nats-server": [], "daemon": [], "agent": []}
    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        first = await recover(session, stand.url, "probe-start",
                              {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100})
        assert first != float("inf"), "the stand did not come up"
        await _delete(session, stand.url, "probe-start")
        load = Load(session, stand.url)
        load.start()
        for round_number in range(1, ROUNDS + 1):
            for kind in ("nats-server", "daemon", "agent"):
                await asyncio.sleep(LOAD_BEFORE_FAULT_S)
                probe = f"probe-{round_number}-{kind}"
                limits: dict[str, Any] = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100}
                annotations = None
                if kind == "nats-server":
                    stand.nats.kill()
                    await asyncio.sleep(OUTAGE_S)
                    stand.nats.start()
                elif kind == "daemon":
                    stand.daemon.kill()
                    await asyncio.sleep(OUTAGE_S)
                    stand.daemon.start()
                else:
                    stand.agents[VICTIM_NODE].kill()
                    await asyncio.sleep(OUTAGE_S)
                    stand.agents[VICTIM_NODE].start()
                    annotations = {"nvidia.com/use-gpuuuid": ",".join(
                        uuid_for(VICTIM_NODE, i) for i in range(4))}
                figures["faults"][kind] += 1
                seconds = await recover(session, stand.url, probe, limits, annotations)
                recovery[kind].append(round(seconds, 2))
                if seconds == float("inf"):
                    problems.append(f"round {round_number}: no recovery within "
                                    f"{RECOVERY_TIMEOUT_S:g} s after killing the {kind}: "
                                    f"{await _why_not(session, stand.url, probe)}")
                await load.pause()
                try:
                    found = await settled_violations(session, stand.url, settle_s=10.0)
                except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as error:
                    found = [f"invariants not readable: {error}"]
                problems += [f"round {round_number}, after the {kind}: {p}" for p in found]
                await _delete(session, stand.url, probe)
                load.resume()
                if seconds == float("inf"):
                    break
            if any("no recovery" in p for p in problems):
                break
        await load.stop()
        try:
            lost, ghosts = await _losses(session, stand.url, load.book)
        except (aiohttp.ClientError, TimeoutError, OSError, AssertionError) as error:
            lost, ghosts = [f"the pods could not be listed at the end: {error}"], []
        problems += lost + ghosts
        figures.update({
            "inputs": dict(load.book.requests), "inputs_total": sum(load.book.requests.values()),
            "answers": dict(load.book.statuses), "direct_bind_errors":
                dict(load.book.direct_bind_errors),
            "acknowledged": len(load.book.acknowledged), "refused": len(load.book.refused),
            "unanswered": len(load.book.uncertain), "lost": len(lost), "ghosts": len(ghosts),
            "daemon_alive": stand.daemon.alive(), "seconds": round(time.monotonic() - started, 1),
            "daemon_log_tracebacks": (tmp_path / "daemon.log").read_text(
                errors="replace").count("Traceback")})
    figures["recovery_s"] = {kind: {"each": values, "max": max(values, default=None)}
                             for kind, values in recovery.items()}
    figures["faults"] = dict(figures["faults"])
    report = json.dumps(figures, indent=2, default=str)
    (tmp_path / "faults-report.json").write_text(report)
    print(report)
    assert stand.daemon.alive(), f"the daemon exited; see {tmp_path / 'daemon.log'}"
    assert not problems, "\n".join(problems[:20])


async def _why_not(session: aiohttp.ClientSession, url: str, probe: str) -> str:
    """What the daemon says about a probe that was not scheduled."""
    parts = []
    for path in ("/readyz", "/statusz", f"/api/pods/default/{probe}"):
        try:
            async with session.get(f"{url}{path}",
                                   timeout=aiohttp.ClientTimeout(total=5)) as answer:
                parts.append(f"{path}: HTTP {answer.status} {(await answer.text())[-400:]}")
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            parts.append(f"{path}: no answer ({error!r})")
    return "; ".join(parts)


async def _delete(session: aiohttp.ClientSession, url: str, name: str) -> None:
    async with session.delete(f"{url}/api/pods/default/{name}") as answer:
        assert answer.status in (204, 404), await answer.text()


async def _losses(session: aiohttp.ClientSession, url: str, book: Ledger) -> tuple[
        list[str], list[str]]:
    """Pods acknowledged and never deleted that are gone; pods refused that exist."""
    async with session.get(f"{url}/api/pods") as answer:
        assert answer.status == 200, await answer.text()
        stored = {p["name"] for p in await answer.json()}
    kept = book.acknowledged - book.deleted - book.uncertain
    lost = [f"pod {name} was acknowledged and never deleted, but is gone"
            for name in sorted(kept - stored)]
    ghosts = [f"pod {name} was refused when submitted, but exists"
              for name in sorted((book.refused - book.uncertain) & stored)]
    return lost, ghosts
