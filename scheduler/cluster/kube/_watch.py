"""The pod watch: a list-and-watch loop, an asyncio task on the daemon's loop.

One watch request is read in steps of their own: the stream's lines, the watch event each
line is, the pod change that makes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass

import msgspec

from scheduler.cluster.kube import _client
from scheduler.cluster.kube._client import PODS, Snapshot
from scheduler.cluster.kube._transport import (
    API_FAILURES,
    GONE,
    ApiTransport,
    answered_with,
    describe_failure,
)
from scheduler.cluster.kube._wire import Node, Pod, Status, WatchEvent, cluster_pod
from scheduler.cluster.port import ClusterError, ClusterPod, PodChange

# The package's name: log lines name the package, not its private modules.
logger = logging.getLogger("scheduler.cluster.kube")

RETRY_FIRST_DELAY = 1.0
RETRY_MAX_DELAY = 30.0
WATCH_TASK = "pyhami-pod-watch"


class Expired(ClusterError):
    """The watch's resourceVersion is gone from the API server's history: list again."""


class WatchFailed(ClusterError):
    """An ERROR event other than 410 in the watch stream."""


@dataclass(frozen=True, slots=True)
class Seen:
    """One watch event, decoded: the resourceVersion it moves the watch on to, and the pod
    it adds, changes or deletes (none for a bookmark)."""

    kind: str
    resource_version: str | None
    pod: ClusterPod | None


async def lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The lines of a stream that arrives in chunks cut anywhere, blank ones left out."""
    pending: list[bytes] = []  # the start of a line whose end has not come yet
    async for chunk in chunks:
        *complete, tail = chunk.split(b"\n")
        if complete:
            complete[0] = b"".join((*pending, complete[0]))
            pending.clear()
            for line in complete:
                if line.strip():
                    yield line
        if tail:
            pending.append(tail)
    last = b"".join(pending)
    if last.strip():
        yield last


def seen(line: bytes) -> Seen:
    """The watch event a line is. Raises ``Expired`` or ``WatchFailed`` on an ERROR event,
    ``msgspec.DecodeError`` on a line that is none."""
    event = msgspec.json.decode(line, type=WatchEvent)
    if event.type == "ERROR":
        status = msgspec.json.decode(event.object, type=Status)
        if status.code == GONE:
            raise Expired
        raise WatchFailed(f"ERROR event {status.code} {status.reason}: {status.message}")
    if event.type == "BOOKMARK":
        # Only moves the resourceVersion on; its object is a pod skeleton
        # (``spec.containers: null``) that does not decode as a pod.
        bookmark = msgspec.json.decode(event.object, type=Node)
        return Seen(event.type, bookmark.metadata.resource_version, None)
    pod = msgspec.json.decode(event.object, type=Pod)
    changed = event.type in ("ADDED", "MODIFIED", "DELETED")
    return Seen(event.type, pod.metadata.resource_version,
                cluster_pod(pod) if changed else None)


class PodWatcher:
    """The list-and-watch loop, a task from ``start()`` until ``stop()``; every change goes
    to ``deliver``, on the loop."""

    def __init__(self, api: ApiTransport, deliver: Callable[[PodChange], None],
                 start: Snapshot | None) -> None:
        self._api = api
        self._deliver = deliver
        self._task: asyncio.Task[None] | None = None
        self._version: str | None = start.resource_version if start else None
        self._known: dict[str, ClusterPod] = {p.uid: p for p in start.pods} if start else {}
        self._delay = RETRY_FIRST_DELAY

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=WATCH_TASK)

    async def stop(self) -> None:
        """End the task, a watch waiting on the socket included, and wait for it."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])

    async def run(self) -> None:
        while True:
            try:
                if self._version is None:
                    await self._relist()
                await self._watch()
            except Expired:
                logger.info("pod watch: resourceVersion %s expired; listing pods again",
                            self._version)
                self._version = None
            except Exception as error:
                logger.warning("pod watch failed, retrying in %.0f s: %s", self._delay,
                               describe_failure(error),
                               exc_info=not isinstance(error, (*API_FAILURES, WatchFailed)))
                await asyncio.sleep(self._delay)
                self._delay = min(self._delay * 2, RETRY_MAX_DELAY)

    async def _relist(self) -> None:
        snapshot = await _client.list_all_pods(self._api)
        current = {pod.uid: pod for pod in snapshot.pods}
        # Deletions first: a pod re-created under the same name must not be dropped after.
        for uid, pod in self._known.items():
            if uid not in current:
                self._deliver(PodChange(pod, deleted=True))
        for pod in snapshot.pods:
            self._deliver(PodChange(pod, deleted=False))
        self._known = current
        self._version = snapshot.resource_version

    async def _watch(self) -> None:
        """One watch request, until the server ends it (``timeoutSeconds``)."""
        try:
            async with self._api.stream(PODS, _client.watch_query(self._version)) as chunks:
                self._delay = RETRY_FIRST_DELAY
                async for line in lines(chunks):
                    self._take(seen(line))
        except API_FAILURES as error:
            if answered_with(error, GONE):
                raise Expired from error
            raise

    def _take(self, event: Seen) -> None:
        """Deliver the pod change this watch event makes; the watch moves on with it."""
        if event.resource_version:
            self._version = event.resource_version
        if event.pod is None:
            return
        if event.kind == "DELETED":
            self._known.pop(event.pod.uid, None)
            self._deliver(PodChange(event.pod, deleted=True))
        else:
            self._known[event.pod.uid] = event.pod
            self._deliver(PodChange(event.pod, deleted=False))
