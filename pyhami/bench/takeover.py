"""``pyhami bench fleet --pods N --standby``: pods in the store, the restart and the takeover.

Pods are submitted to the leading daemon's pod API and placed with /filter and /bind, as
``bench extender`` does (kube-scheduler's share of the node names in each /filter), so the
store and the ledger hold them when the daemon restarts and when a standby takes over.

The lease is watched from the bench itself (its key in the ``pyhami-leader`` bucket), so
the moment a standby took it is known apart from the daemons: a takeover is then split into
the wait for the lease (the old holder's hand-on, or its entry expiring after a SIGKILL) and
the standby's own work (the pod store read again, fenced, the ledger rebuilt) until its
/readyz answers 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import nats
import nats.errors
import nats.js.errors

from pyhami.bench.extender import Bench, namespaces_of
from pyhami.bench.load import BenchError, nodes_to_score
from scheduler.leadership.lease import LEASE_BUCKET, LEASE_KEY

PLACING_AT_ONCE = 8  # filter+bind pairs in flight while the pods are placed
FIRST_FILTER_TIMEOUT_S = 60.0
FIRST_FILTER_RETRY_S = 0.05
POD_PREFIX = "fleet-pod-"
LEASE_WATCH_START_S = 30.0


def pod_names(count: int, prefix: str = POD_PREFIX) -> list[str]:
    return [f"{prefix}{number:06d}" for number in range(count)]


async def _place(url: str, node_names: Sequence[str], pods: Sequence[str]) -> float:
    """Submit ``pods`` and place each with /filter and /bind, ``PLACING_AT_ONCE`` in flight;
    the wall seconds of the whole."""
    started = time.monotonic()
    timings: dict[str, list[float]] = {"filter": [], "bind": []}
    queue = list(reversed(pods))
    async with aiohttp.ClientSession() as http:
        bench = Bench(http, url, list(node_names), namespaces_of(pods, None),
                      nodes_to_score(len(node_names)))

        async def place_next() -> None:
            while queue:
                name = queue.pop()
                uids = await bench.submit([name])
                await bench.filter_and_bind(name, uids[name], timings)

        await asyncio.gather(*(place_next() for _ in range(PLACING_AT_ONCE)))
    return time.monotonic() - started


def place_pods(url: str, node_names: Sequence[str], pods: Sequence[str]) -> float:
    """Submit and place ``pods`` on the daemon at ``url``; the wall seconds it took."""
    return asyncio.run(_place(url, node_names, pods))


def place_one(url: str, node_names: Sequence[str], name: str) -> float:
    """One new pod submitted and placed; ``time.monotonic()`` when its /filter answered
    with a node."""

    async def one() -> float:
        async with aiohttp.ClientSession() as http:
            bench = Bench(http, url, list(node_names), namespaces_of([name], None),
                          nodes_to_score(len(node_names)))
            uids = await bench.submit([name])
            body = bench.filter_body(name)
            # Asked again until a node is found: the first /filter that places the pod is
            # the figure (a daemon ready may still refuse one while it catches up).
            deadline = time.monotonic() + FIRST_FILTER_TIMEOUT_S
            while True:
                result = await bench.post("filter", body)
                answered = time.monotonic()
                if result["NodeNames"]:
                    break
                if answered > deadline:
                    raise BenchError(f"pod {name} found no node in {FIRST_FILTER_TIMEOUT_S:g} "
                                     f"s: {result.get('Error') or result['FailedNodes']}")
                await asyncio.sleep(FIRST_FILTER_RETRY_S)
            bound = await bench.post("bind", bench.bind_body(name, uids[name],
                                                             result["NodeNames"][0]))
            if bound["Error"]:
                raise BenchError(f"bind {name}: {bound['Error']}")
            return answered

    return asyncio.run(one())


@dataclass(frozen=True)
class LeaseWrite:
    """One change of the lease's entry, as the bench's watcher received it."""

    at: float  # time.monotonic()
    holder: str  # empty for a delete or a purge
    revision: int


@dataclass
class LeaseWatch:
    """The lease's entry watched from a thread of its own (an asyncio loop and a NATS
    connection of the bench's), every change kept with the moment it arrived."""

    servers: Sequence[str]
    writes: list[LeaseWrite] = field(default_factory=list)
    _ready: threading.Event = field(default_factory=threading.Event)
    _failure: list[BaseException] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._watch()),
                                        name="pyhami-lease-watch", daemon=True)
        self._thread.start()
        if not self._ready.wait(LEASE_WATCH_START_S):
            raise BenchError(f"the lease {LEASE_BUCKET}/{LEASE_KEY} could not be watched "
                             f"within {LEASE_WATCH_START_S:g} s")
        if self._failure:
            raise BenchError(f"the lease {LEASE_BUCKET}/{LEASE_KEY} could not be watched: "
                             f"{self._failure[0]!r}")

    async def _watch(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            client = await nats.connect(servers=list(self.servers), name="pyhami-bench lease")
            bucket = await client.jetstream().key_value(LEASE_BUCKET)
            watcher = await bucket.watch(LEASE_KEY)
        except (nats.errors.Error, nats.js.errors.Error, OSError) as error:
            self._failure.append(error)
            self._ready.set()
            return
        self._ready.set()
        # The next entry, waited for with asyncio.wait: watcher.updates() (asyncio.wait_for)
        # can lose one on its timeout in Python 3.11 (as the daemon's own watches do).
        coming: asyncio.Task[Any] | None = None
        try:
            while not self._stop.is_set():
                if coming is None:
                    coming = asyncio.ensure_future(anext(watcher))
                done, _ = await asyncio.wait({coming}, timeout=0.5)
                if not done:
                    continue
                arrived, coming = coming, None
                entry = arrived.result()
                if entry is None:  # the marker after the entries held when it began
                    continue
                holder = (entry.value or b"").decode(errors="replace")
                with self._lock:
                    self.writes.append(LeaseWrite(time.monotonic(), holder,
                                                  entry.revision or 0))
        finally:
            if coming is not None:
                coming.cancel()
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]  # nats-py leaves it untyped
            await client.close()

    def taken_by(self, holder: str, since: float) -> float | None:
        """When ``holder`` wrote the entry first at or after ``since`` (``time.monotonic``);
        None if it has not."""
        with self._lock:
            return next((write.at for write in self.writes
                         if write.holder == holder and write.at >= since), None)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(5.0)


def seconds_since(start: float, moment: float | None) -> float | None:
    return None if moment is None else round(moment - start, 3)


def wait_for_lease(watch: LeaseWatch, holder: str, since: float, timeout: float,
                   still_running: Callable[[], None]) -> float:
    """When ``holder`` took the lease after ``since``; raises after ``timeout``."""
    while True:
        taken = watch.taken_by(holder, since)
        if taken is not None:
            return taken
        still_running()
        if time.monotonic() - since > timeout:
            raise BenchError(f"{holder} did not take the lease within {timeout:g} s")
        time.sleep(0.01)
