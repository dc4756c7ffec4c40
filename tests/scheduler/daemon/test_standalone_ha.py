"""Two standalone daemons, one decider (docs/ha.md), on real processes.

nats-server with JetStream, two ``pyhami agent`` processes and two ``pyhami scheduler
--standalone`` processes, ``daemon-a`` and ``daemon-b``, run on loopback. Clients play
kube-scheduler: they submit pods to whichever daemon takes them and send every /filter
to both daemons at once, then /bind to the one that chose a node. The holder of the
lease is killed with SIGKILL under that load; later the new holder is frozen with
SIGSTOP longer than the lease lives and thawed with SIGCONT, as a pause of the whole
machine or a partition from NATS would leave it.

A test that would catch two deciders: every decision on ``pyhami.decisions`` names its
decider, and sorted by the time each was made the deciders must run in one block each,
in the order of the faults; every /filter answered with a node by one daemon must have
been sent after the other's last one was answered. The figures (takeover times) are
written to ``ha-report.json`` under the test's tmp dir and printed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest

from common.telemetry import DECISIONS_SUBJECT, decode_decision
from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsServer, free_port
from tests.invariants import settled_violations
from tests.partition import Partition
from tests.processes import Process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NODES = ("node-a", "node-b")
DAEMONS = ("daemon-a", "daemon-b")
WORKERS = 6
LIVE_PODS_PER_WORKER = 4
LEASE_TTL_S = 4.0  # the daemons' default --lease-ttl
LOAD_BEFORE_FAULT_S = 3.0
TAKEOVER_TIMEOUT_S = 30.0
# A frozen daemon answers nothing: the clients give up on it soon, as the takeover times
# measured from their decisions would otherwise include their wait.
CALL_TIMEOUT_S = 1.0


@dataclass
class Stand:
    nats: LocalNatsServer
    daemons: dict[str, Process]
    urls: dict[str, str]
    agents: list[Process]
    logs: Path


def _daemon(name: str, nats_url: str, port: int, logs: Path) -> Process:
    return Process(["scheduler", "--standalone", "--nats", nats_url, "--identity", name,
                    "--listen", f"127.0.0.1:{port}", "--metrics", f"127.0.0.1:{free_port()}",
                    "--resync-wait", "0.5", "--no-pending-loop", "--reservation-ttl", "10",
                    "--log-level", "info"], logs / f"{name}.log")


@pytest.fixture
def stand(tmp_path: Path) -> Iterator[Stand]:
    server = LocalNatsServer(extra_args=["-js", "-sd", str(tmp_path / "jetstream")])
    server.start()
    agents = [Process(["agent", "--node", node, "--nats", server.url, "--inventory",
                       "sim:t4x4", "--heartbeat-interval", "1", "--log-level", "warning"],
                      tmp_path / f"agent-{node}.log") for node in NODES]
    ports = {name: free_port() for name in DAEMONS}
    daemons = {name: _daemon(name, server.url, ports[name], tmp_path) for name in DAEMONS}
    for agent in agents:
        agent.start()
    yield Stand(server, daemons, {name: f"http://127.0.0.1:{port}"
                                  for name, port in ports.items()}, agents, tmp_path)
    for process in [*daemons.values(), *agents]:
        if process.alive():
            process.send(signal.SIGCONT)  # a test that failed may leave one frozen
        process.stop()
    server.kill()


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as answer:
            return answer.status, await answer.text()
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        return 0, str(error)


async def _wait(what: str, check: Any, timeout: float = TAKEOVER_TIMEOUT_S) -> float:
    """Seconds until ``await check()`` is true; fails naming ``what`` after ``timeout``."""
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > timeout:
            pytest.fail(f"{what}: not within {timeout:g}s")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def readiness(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    return await _get(session, f"{url}/readyz")


@dataclass
class Answer:
    daemon: str
    sent: float
    received: float


@dataclass
class Load:
    """Clients playing kube-scheduler against both daemons, recording who decided when."""

    session: aiohttp.ClientSession
    urls: dict[str, str]
    chose: list[Answer] = field(default_factory=list)
    """Every /filter answered with a node, by daemon, with when it was sent and answered."""
    bound: dict[str, str] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _numbers: Iterator[int] = field(default_factory=itertools.count)

    async def _call(self, daemon: str, method: str, path: str,
                    body: object = None) -> tuple[int, Any]:
        try:
            async with self.session.request(
                    method, f"{self.urls[daemon]}{path}", json=body,
                    timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)) as answer:
                text = await answer.text()
                status = answer.status
        except (aiohttp.ClientError, TimeoutError, OSError):
            return 0, None
        if status >= 500:
            self.refused[f"{daemon} {path.split('/')[1]} {status}"] = self.refused.get(
                f"{daemon} {path.split('/')[1]} {status}", 0) + 1
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    async def _submit(self, name: str) -> str | None:
        """The pod submitted to whichever daemon takes it (the other answers 503)."""
        for daemon in DAEMONS:
            status, _ = await self._call(daemon, "POST", "/api/pods", lab_pod(name))
            if status == 201:
                return daemon
        return None

    async def _filter_both(self, name: str) -> tuple[str, str] | None:
        body = {"Pod": lab_pod(name), "NodeNames": list(NODES)}

        async def one(daemon: str) -> tuple[str, str] | None:
            sent = time.time()
            status, answer = await self._call(daemon, "POST", "/filter", body)
            if status == 200 and isinstance(answer, dict) and answer.get("NodeNames"):
                self.chose.append(Answer(daemon, sent, time.time()))
                return daemon, str(answer["NodeNames"][0])
            return None

        chosen = [c for c in await asyncio.gather(*(one(d) for d in DAEMONS)) if c]
        return chosen[0] if chosen else None

    async def worker(self) -> None:
        live: list[tuple[str, str]] = []
        while not self.stop.is_set():
            name = f"ha-{next(self._numbers)}"
            holder = await self._submit(name)
            if holder is None:
                await asyncio.sleep(0.05)
                continue
            chosen = await self._filter_both(name)
            if chosen is not None:
                daemon, node = chosen
                status, answer = await self._call(daemon, "POST", "/bind", {
                    "PodName": name, "PodNamespace": "default", "Node": node})
                if status == 200 and isinstance(answer, dict) and not answer.get("Error"):
                    self.bound[name] = daemon
            live.append((holder, name))
            while len(live) > LIVE_PODS_PER_WORKER:
                _, old = live.pop(0)
                for daemon in DAEMONS:
                    status, _ = await self._call(daemon, "DELETE", f"/api/pods/default/{old}")
                    if status in (204, 404):
                        break

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Load]:
        workers = [asyncio.create_task(self.worker()) for _ in range(WORKERS)]
        try:
            yield self
        finally:
            self.stop.set()
            await asyncio.gather(*workers)


@dataclass
class Decisions:
    """Every decision published on ``pyhami.decisions``: (when made, decider), and each
    term of leadership's first and last decision."""

    made: list[tuple[float, str]] = field(default_factory=list)
    terms: dict[tuple[int, str], list[float]] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def following(self, url: str) -> AsyncIterator[Decisions]:
        client = await nats.connect(url)

        async def record(message: Any) -> None:
            event = decode_decision(message.data)
            if event.scheduled:
                self.made.append((event.timestamp, event.decider))
                span = self.terms.setdefault((event.term, event.decider), [event.timestamp] * 2)
                span[0], span[1] = min(span[0], event.timestamp), max(span[1], event.timestamp)

        await client.subscribe(DECISIONS_SUBJECT, cb=record)
        try:
            yield self
        finally:
            await client.drain()

    def overlapping_terms(self) -> list[str]:
        """Terms, in the order the lease was taken, whose decisions did not all come before
        the next term's first: two deciders at once. A term names its decider."""
        found = []
        ordered = sorted(self.terms.items())
        for (term, decider), (_, last) in ordered[:-1]:
            for (later, other), (first, _) in ordered:
                if later > term and first < last:
                    found.append(f"{decider}'s term {term} decided until {last:.3f}, after "
                                 f"{other}'s term {later} began at {first:.3f}")
        return found

    def switches(self) -> list[str]:
        """Each change of decider: the last decision before it and the first after."""
        ordered = sorted(self.made)
        return [f"{before[1]} at {before[0]:.3f}, then {after[1]} at {after[0]:.3f}"
                for before, after in itertools.pairwise(ordered) if before[1] != after[1]]

    def first_after(self, moment: float, decider: str) -> float | None:
        return min((t for t, d in self.made if d == decider and t > moment), default=None)


def overlapping(answers: list[Answer]) -> list[str]:
    """Answers with a node from one daemon sent before the other daemon's previous answer
    with a node came back, when the other decided again later (two deciders at once)."""
    found = []
    ordered = sorted(answers, key=lambda a: a.sent)
    for before, after in itertools.pairwise(ordered):
        if before.daemon != after.daemon and after.sent < before.received:
            found.append(f"{after.daemon} was asked at {after.sent:.3f} while {before.daemon}'s "
                         f"answer from {before.sent:.3f} came back at {before.received:.3f}")
    return found


async def holder_then_standby(stand: Stand, session: aiohttp.ClientSession) -> None:
    """daemon-a started and ready (it takes the lease), then daemon-b standing by."""
    a, b = DAEMONS
    stand.daemons[a].start()
    await _wait("daemon-a ready", lambda: _ready_says(session, stand.urls[a], 200, "ready"))
    stand.daemons[b].start()
    await _wait("daemon-b standing by", lambda: _ready_says(
        session, stand.urls[b], 503, f"standby: {a} holds the lease"))


async def test_two_daemons_never_decide_at_once_and_the_standby_takes_over(
        stand: Stand) -> None:
    a, b = DAEMONS
    report: dict[str, object] = {}
    async with aiohttp.ClientSession() as session:
        await holder_then_standby(stand, session)
        async with session.post(f"{stand.urls[b]}/filter", json={
                "Pod": lab_pod("asked-of-the-standby"), "NodeNames": list(NODES)}) as answer:
            assert (answer.status, await answer.text()) == (
                503, f"standby: {a} holds the lease\n")
        async with Decisions().following(stand.nats.url) as decisions, \
                Load(session, stand.urls).running() as load:
            await asyncio.sleep(LOAD_BEFORE_FAULT_S)
            assert load.chose and {c.daemon for c in load.chose} == {a}
            # SIGKILL of the holder under load: the standby decides once the lease expires.
            killed = time.time()
            stand.daemons[a].kill()
            report["sigkill_to_ready_s"] = await _wait(
                "daemon-b taking over", lambda: _ready_says(session, stand.urls[b], 200,
                                                            "ready"))
            await _wait("daemon-b deciding", lambda: _true(
                decisions.first_after(killed, b) is not None))
            first_b = decisions.first_after(killed, b)
            assert first_b is not None
            report["sigkill_to_first_decision_s"] = round(first_b - killed, 3)
            # daemon-a again, with its identity: it stands by, as daemon-b holds the lease.
            stand.daemons[a].start()
            await _wait("daemon-a back, standing by", lambda: _ready_says(
                session, stand.urls[a], 503, f"standby: {b} holds the lease"))
            await asyncio.sleep(LOAD_BEFORE_FAULT_S)
            # daemon-b frozen longer than its lease lives: daemon-a takes over; thawed,
            # daemon-b must not decide on the lease it held before.
            frozen = time.time()
            stand.daemons[b].send(signal.SIGSTOP)
            report["sigstop_to_ready_s"] = await _wait(
                "daemon-a ready", lambda: _ready_says(session, stand.urls[a], 200, "ready"))
            await _wait("daemon-a taking over from the frozen daemon-b", lambda: _true(
                decisions.first_after(frozen, a) is not None))
            first_a = decisions.first_after(frozen, a)
            assert first_a is not None
            report["sigstop_to_first_decision_s"] = round(first_a - frozen, 3)
            stand.daemons[b].send(signal.SIGCONT)
            await _wait("daemon-b, thawed, standing by", lambda: _ready_says(
                session, stand.urls[b], 503, f"standby: {a} holds the lease"))
            await asyncio.sleep(LOAD_BEFORE_FAULT_S)
        violations = await settled_violations(session, stand.urls[a])
    report["decisions"] = dict(collections.Counter(d for _, d in decisions.made))
    report["filters_with_a_node"] = len(load.chose)
    report["bound"] = len(load.bound)
    report["refused_5xx"] = load.refused
    (stand.logs / "ha-report.json").write_text(json.dumps(report, indent=2))
    print("standalone HA:", json.dumps(report))
    assert decisions.overlapping_terms() == [], decisions.switches()
    assert 0 not in {term for term, _ in decisions.terms}
    assert overlapping(load.chose) == []
    # Each fault handed the lease on: the terms, in order, begin with a, b, a.
    assert [decider for _, decider in sorted(decisions.terms)][:3] == [a, b, a], (
        decisions.switches())
    assert violations == []
    assert load.bound and {load.bound[n] for n in load.bound} == {a, b}


async def _true(value: bool) -> bool:
    return value


async def _ready_says(session: aiohttp.ClientSession, url: str, status: int,
                      text: str) -> bool:
    answered, body = await readiness(session, url)
    return answered == status and body.startswith(text)


async def test_a_holder_cut_off_from_nats_stops_deciding_before_the_standby_starts(
        stand: Stand) -> None:
    """daemon-a reaches NATS through a relay that drops every byte once cut: it cannot
    renew its lease, nor learn that it failed, until its own deadline."""
    a, b = DAEMONS
    partition = Partition("127.0.0.1", int(stand.nats.url.rsplit(":", 1)[1]))
    await partition.start()
    stand.daemons[a] = _daemon(a, partition.url, int(stand.urls[a].rsplit(":", 1)[1]),
                               stand.logs)
    report: dict[str, object] = {}
    async with aiohttp.ClientSession() as session:
        await holder_then_standby(stand, session)
        async with Decisions().following(stand.nats.url) as decisions, \
                Load(session, stand.urls).running() as load:
            await asyncio.sleep(LOAD_BEFORE_FAULT_S)
            cut = time.time()
            partition.cut = True
            report["partition_to_holder_standing_by_s"] = await _wait(
                "daemon-a to stop deciding", lambda: _ready_says(session, stand.urls[a], 503,
                                                                 "standby"))
            await _wait("daemon-b taking over", lambda: _ready_says(
                session, stand.urls[b], 200, "ready"))
            report["partition_to_standby_ready_s"] = round(time.time() - cut, 3)
            await _wait("daemon-b deciding", lambda: _true(
                decisions.first_after(cut, b) is not None))
            first_b = decisions.first_after(cut, b)
            assert first_b is not None
            report["partition_to_first_decision_s"] = round(first_b - cut, 3)
            await partition.heal()
            await _wait("daemon-a, reconnected, standing by", lambda: _ready_says(
                session, stand.urls[a], 503, f"standby: {b} holds the lease"))
            await asyncio.sleep(LOAD_BEFORE_FAULT_S)
        violations = await settled_violations(session, stand.urls[b])
    await partition.close()
    report["decisions"] = dict(collections.Counter(d for _, d in decisions.made))
    (stand.logs / "ha-partition-report.json").write_text(json.dumps(report, indent=2))
    print("standalone HA, partition:", json.dumps(report))
    assert overlapping(load.chose) == []
    assert decisions.overlapping_terms() == [], decisions.switches()
    assert [decider for _, decider in sorted(decisions.terms)][:2] == [a, b], (
        decisions.switches())
    assert violations == []
