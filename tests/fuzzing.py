"""The fuzz suite's stand: a real standalone stack in a background thread, and its checks.

``FuzzStack`` runs nats-server (JetStream on disk), three simulated agents and
the standalone daemon (``pyhami.sandbox``) on an event loop of its own thread,
so that hypothesis can drive it from the test's thread with plain blocking
HTTP requests and NATS publishes. Every request or message sent is counted in
a ``Tally``; ``after_batch`` is the check run after each batch of inputs.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from aiohttp.http_exceptions import HttpProcessingError
from nats.aio.client import Client

from agent.vendors.nvidia.simulated import uuid_for
from common.messaging import NatsSettings, connect
from pyhami.natsserver import LocalNatsServer, free_port
from pyhami.sandbox import RunningDaemon, SimulatedAgent, standalone_config
from tests.invariants import settled_violations_sync

T = TypeVar("T")

NODES = (("node-a", "t4x4"), ("node-b", "t4x4"), ("node-c", "a100x8-nvswitch"))
NODE_NAMES = tuple(name for name, _ in NODES)
REAL_UUIDS = tuple(uuid_for(name, i) for name, profile in NODES
                   for i in range(4 if profile == "t4x4" else 8))
REQUEST_TIMEOUT_S = 30.0
PLACE_TIMEOUT_S = 20.0
RESERVATION_TTL_S = 5.0

# Examples per target and per batch: modest in CI, a campaign with PYHAMI_FUZZ_EXAMPLES.
CI_EXAMPLES_PER_TARGET = 2000
CI_BATCH = 500
LONG_BATCH = 1000


def examples_per_target() -> int:
    return int(os.environ.get("PYHAMI_FUZZ_EXAMPLES", CI_EXAMPLES_PER_TARGET))


def batch_size() -> int:
    return CI_BATCH if "PYHAMI_FUZZ_EXAMPLES" not in os.environ else LONG_BATCH


def long_campaign() -> bool:
    return "PYHAMI_FUZZ_EXAMPLES" in os.environ


@dataclass
class Tally:
    """What one target sent and what came back: every count is of inputs actually sent."""

    target: str
    inputs: int = 0
    batches: int = 0
    server_errors: int = 0
    no_answer: int = 0
    invariant_violations: int = 0
    failed_batch_checks: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    offending: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """What the check after the last batch found."""
    seconds: float = 0.0

    def answered(self, status: int, what: str) -> None:
        self.inputs += 1
        self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1
        if status >= 500:
            self.server_errors += 1
            self._offend(f"HTTP {status} for {what}")

    def unanswered(self, error: Exception, what: str) -> None:
        self.inputs += 1
        self.no_answer += 1
        self._offend(f"no answer ({type(error).__name__}: {error}) for {what}")

    def _offend(self, text: str) -> None:
        if len(self.offending) < 10:
            self.offending.append(text[:1000])

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "inputs": self.inputs, "batches": self.batches,
                "server_errors": self.server_errors, "no_answer": self.no_answer,
                "invariant_violations": self.invariant_violations,
                "failed_batch_checks": self.failed_batch_checks, "statuses": self.statuses,
                "seconds": round(self.seconds, 1), "offending": self.offending,
                "problems": [p[:600] for p in self.problems[:20]]}


class CrashLog(logging.Handler):
    """Keeps every log record that carries a traceback: an exception nobody handled."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError) and (error.code or 500) < 500:
            return  # aiohttp refusing a malformed request (a request line too long) with a 4xx
        if record.exc_info and len(self.records) < 20:
            self.records.append(f"{record.name}: {record.getMessage()[:300]}: "
                                f"{record.exc_info[1]!r}"[:600])


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes


class FuzzStack:
    """nats-server, three simulated agents and the standalone daemon, in their own thread."""

    def __init__(self) -> None:
        self._scratch = tempfile.TemporaryDirectory(prefix="pyhami-fuzz-")
        self.nats = LocalNatsServer(extra_args=[
            "-js", "-sd", str(Path(self._scratch.name) / "jetstream")])
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fuzz-stack",
                                        daemon=True)
        self.agents: list[SimulatedAgent] = []
        self.daemon: RunningDaemon | None = None
        self.publisher: Client | None = None
        self.port = free_port()
        self.metrics_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.crashes = CrashLog()
        self._sanity = 0
        self.invariant_violations = 0
        """Lines of the invariant check after the last batch."""

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def start(self) -> FuzzStack:
        self.nats.start()
        self._thread.start()
        logging.getLogger().addHandler(self.crashes)
        self.run(self._start())
        return self

    async def _start(self) -> None:
        assert self.nats is not None
        self.agents = [SimulatedAgent.start(name, self.nats.url, profile)
                       for name, profile in NODES]
        config = standalone_config(self.nats.url, listen=("127.0.0.1", self.port),
                                   metrics=("127.0.0.1", self.metrics_port))
        config = replace(config, service=replace(config.service,
                                                 reservation_ttl=RESERVATION_TTL_S))
        self.daemon = await RunningDaemon(config).start()
        self.publisher = await connect(NatsSettings(servers=(self.nats.url,)), "pyhami-fuzz")
        deadline = time.monotonic() + 30
        service = self.daemon.service
        assert service is not None
        while any(service.state.fleet.node(name) is None for name in NODE_NAMES):
            if time.monotonic() > deadline:
                raise TimeoutError("the simulated nodes did not report in time")
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        logging.getLogger().removeHandler(self.crashes)
        try:
            self.run(self._stop(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            self.nats.kill()
            self._scratch.cleanup()

    async def _stop(self) -> None:
        """Stop everything; what fails to stop is printed, not raised: the test's verdict
        was given already."""
        stoppers: list[Coroutine[Any, Any, None]] = []
        if self.publisher is not None:
            stoppers.append(self.publisher.close())
        if self.daemon is not None:
            stoppers.append(self.daemon.stop())
        stoppers += [agent.halt() for agent in self.agents]
        for stopper in stoppers:
            try:
                await asyncio.wait_for(stopper, 30)
            except Exception as error:
                print(f"fuzz stand: stopping raised {error!r}")
        current = asyncio.current_task()
        left = [task for task in asyncio.all_tasks() if task is not current]
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    # Sending -----------------------------------------------------------------

    def request(self, method: str, path: str, body: bytes | None = None,
                port: int | None = None, timeout: float = REQUEST_TIMEOUT_S) -> Answer:
        """One HTTP request on a connection of its own; the path is sent as given."""
        connection = http.client.HTTPConnection("127.0.0.1", port or self.port, timeout=timeout)
        try:
            connection.putrequest(method, path, skip_accept_encoding=True)
            if body is not None:
                connection.putheader("Content-Type", "application/json")
                connection.putheader("Content-Length", str(len(body)))
            connection.endheaders()
            if body is not None:
                connection.send(body)
            response = connection.getresponse()
            return Answer(response.status, response.read())
        finally:
            connection.close()

    def send(self, tally: Tally, method: str, path: str,
             body: bytes | None = None) -> Answer | None:
        """A fuzz input: counted, its status recorded; None when no answer came."""
        data = body or b""
        excerpt = repr(data) if len(data) <= 700 else f"{data[:350]!r} ... {data[-250:]!r}"
        what = f"{method} {path[:200]} body {excerpt} ({len(data)} bytes)"
        try:
            answer = self.request(method, path, body)
        except (OSError, http.client.HTTPException) as error:
            tally.unanswered(error, what)
            return None
        tally.answered(answer.status, what)
        return answer

    def publish(self, tally: Tally, subject: str, data: bytes) -> None:
        """A fuzz message on NATS, flushed so that it has reached the server when counted."""

        async def publish() -> None:
            assert self.publisher is not None
            await self.publisher.publish(subject, data)
            await self.publisher.flush(timeout=10)

        what = f"message on {subject[:120]} ({len(data)} bytes) {data[:200]!r}"
        try:
            self.run(publish(), timeout=30)
        except Exception as error:
            tally.unanswered(error, what)
            return
        tally.inputs += 1

    # Checking ----------------------------------------------------------------

    def problems_after_batch(self) -> list[str]:
        """Health, readiness, metrics, a normal pod scheduled, a GPU-less pod not stuck,
        nothing logged with a traceback, and the invariants: one line per problem."""
        problems: list[str] = []
        for path, port in (("/healthz", self.port), ("/readyz", self.port),
                           ("/metrics", self.metrics_port)):
            try:
                status = self.request("GET", path, port=port).status
            except (OSError, http.client.HTTPException) as error:
                problems.append(f"GET {path}: no answer ({error})")
                continue
            if status != 200:
                problems.append(f"GET {path}: HTTP {status}")
        if not problems:
            try:
                problems += self._normal_pod_problems()
            except (OSError, ValueError, KeyError, http.client.HTTPException) as error:
                problems.append(f"a normal pod could not be checked: {error!r}")
        try:
            violations = settled_violations_sync(self.url)
        except (OSError, ValueError, http.client.HTTPException) as error:
            violations = [f"invariants not readable: {error}"]
        self.invariant_violations = len(violations)
        problems += violations
        problems += [f"logged with a traceback: {record}" for record in self.crashes.records]
        return problems

    def _normal_pod_problems(self) -> list[str]:
        """A one-card pod is placed and then deleted; a pod asking no GPU never ends up in
        BindingFailed: it is bound without cards, or refused when submitted."""
        self._sanity += 1
        gpu_pod = f"sanity-{self._sanity}"
        plain_pod = f"sanity-plain-{self._sanity}"
        problems: list[str] = []
        submitted = self.request("POST", "/api/pods", json.dumps(
            sanity_pod(gpu_pod, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})).encode())
        if submitted.status != 201:
            return [f"a normal pod was not accepted: HTTP {submitted.status} "
                    f"{submitted.body[:300]!r}"]
        plain = self.request("POST", "/api/pods", json.dumps(
            sanity_pod(plain_pod, {"cpu": 1})).encode())
        if plain.status >= 500:
            problems.append(f"a pod asking no GPU: HTTP {plain.status} {plain.body[:300]!r}")
        placed = self._wait_bound(gpu_pod)
        if placed is None:
            problems.append(f"a normal pod {gpu_pod} was not scheduled within "
                            f"{PLACE_TIMEOUT_S:g} s")
        if plain.status == 201:
            pod = self._wait_bound(plain_pod)
            events = [] if pod is None else pod["events"]
            if pod is None:
                pod = json.loads(self.request("GET", f"/api/pods/default/{plain_pod}").body)
                events = pod.get("events", [])
            failed = [e["message"] for e in events if e["reason"] == "BindingFailed"]
            if pod.get("node") is None or failed:
                problems.append(f"a pod asking no GPU was not bound: node {pod.get('node')}, "
                                f"BindingFailed: {failed[:1]}")
        problems += settled_violations_sync(self.url)
        for name in (gpu_pod, plain_pod):
            deleted = self.request("DELETE", f"/api/pods/default/{name}")
            if deleted.status >= 500:
                problems.append(f"DELETE of {name}: HTTP {deleted.status}")
        return problems

    def _wait_bound(self, name: str) -> dict[str, Any] | None:
        deadline = time.monotonic() + PLACE_TIMEOUT_S
        while time.monotonic() < deadline:
            answer = self.request("GET", f"/api/pods/default/{name}")
            if answer.status == 200:
                pod: dict[str, Any] = json.loads(answer.body)
                if pod["node"] is not None:
                    return pod
            time.sleep(0.1)
        return None

    def delete_every_pod(self) -> list[str]:
        """Remove what a batch submitted (through the API, each name quoted)."""
        problems = []
        pods = json.loads(self.request("GET", "/api/pods").body)
        for pod in pods:
            path = (f"/api/pods/{urllib.parse.quote(pod['namespace'] or 'default', safe='')}/"
                    f"{urllib.parse.quote(pod['name'], safe='')}")
            status = self.request("DELETE", path).status
            if status >= 500:
                problems.append(f"DELETE {path[:200]}: HTTP {status}")
        return problems


def sanity_pod(name: str, limits: dict[str, int]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "app", "image": "ubuntu:22.04",
                                     "resources": {"limits": limits}}]}}


def write_report(tallies: list[Tally], directory: Path) -> Path:
    """The figures as JSON, in ``directory`` and, when set, at ``$PYHAMI_FUZZ_REPORT``."""
    report = {"examples_per_target": examples_per_target(), "batch": batch_size(),
              "targets": [t.as_dict() for t in tallies],
              "total_inputs": sum(t.inputs for t in tallies)}
    text = json.dumps(report, indent=2)
    path = directory / "fuzz-report.json"
    path.write_text(text)
    extra = os.environ.get("PYHAMI_FUZZ_REPORT")
    if extra:
        with open(extra, "a") as out:
            out.write(json.dumps(report) + "\n")
    print(text)
    return path
