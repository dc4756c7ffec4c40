"""The pod watch: a blocking list-and-watch loop in a thread of its own.

One watch request is read as stacked generators, each a step of its own: the stream's
lines, the watch events decoded from them, the pod changes those make.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import msgspec
import urllib3

from scheduler.cluster import ClusterError, ClusterPod, PodChange
from scheduler.kube import _client
from scheduler.kube._client import GONE, CoreApi, Snapshot, answered_with, describe_failure
from scheduler.kube._wire import Node, Pod, Status, WatchEvent, cluster_pod

# The package's name: log lines name the room, not its private modules.
logger = logging.getLogger("scheduler.kube")

RETRY_FIRST_DELAY = 1.0
RETRY_MAX_DELAY = 30.0
WATCH_THREAD = "pyhami-pod-watch"


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


def lines(stream: Iterable[bytes], stopping: threading.Event) -> Iterator[bytes]:
    """The stream's lines that are not blank, until it ends or the watch is stopped."""
    for line in stream:
        if stopping.is_set():
            return
        if line.strip():
            yield line


def decoded(stream_lines: Iterable[bytes]) -> Iterator[Seen]:
    """The watch events in these lines. Raises ``Expired`` or ``WatchFailed`` on an ERROR
    event, ``msgspec.DecodeError`` on a line that is none."""
    for line in stream_lines:
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
            yield Seen(event.type, bookmark.metadata.resource_version, None)
            continue
        pod = msgspec.json.decode(event.object, type=Pod)
        changed = event.type in ("ADDED", "MODIFIED", "DELETED")
        yield Seen(event.type, pod.metadata.resource_version,
                   cluster_pod(pod) if changed else None)


class PodWatcher:
    """The blocking list-and-watch loop, run in its own thread from ``start()`` until
    ``stop()``; every change goes to ``deliver``, from that thread."""

    def __init__(self, core: CoreApi, deliver: Callable[[PodChange], None],
                 start: Snapshot | None) -> None:
        self._core = core
        self._deliver = deliver
        self._stopping = threading.Event()
        self._response: urllib3.BaseHTTPResponse | None = None
        self._version: str | None = start.resource_version if start else None
        self._known: dict[str, ClusterPod] = {p.uid: p for p in start.pods} if start else {}
        self._delay = RETRY_FIRST_DELAY

    def start(self) -> None:
        threading.Thread(target=self.run, name=WATCH_THREAD, daemon=True).start()

    def stop(self) -> None:
        """Ask the thread to end; a watch blocked on the socket is woken at once."""
        self._stopping.set()
        response = self._response
        if response is not None:
            # Already closed, or urllib3 older than 2.3 (no shutdown): the watch then ends
            # at its timeout.
            with contextlib.suppress(AttributeError, OSError, RuntimeError, ValueError):
                response.shutdown()

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                if self._version is None:
                    self._relist()
                self._watch()
            except Expired:
                logger.info("pod watch: resourceVersion %s expired; listing pods again",
                            self._version)
                self._version = None
            except Exception as error:
                if self._stopping.is_set():
                    break
                logger.warning("pod watch failed, retrying in %.0f s: %s", self._delay,
                               describe_failure(error),
                               exc_info=not isinstance(error,
                                                       (*_client.API_FAILURES, WatchFailed)))
                self._stopping.wait(self._delay)
                self._delay = min(self._delay * 2, RETRY_MAX_DELAY)

    def _emit(self, change: PodChange) -> None:
        if self._stopping.is_set():
            return
        try:
            self._deliver(change)
        except RuntimeError:  # the consumer's event loop is closed
            self._stopping.set()

    def _relist(self) -> None:
        snapshot = _client.list_all_pods(self._core)
        current = {pod.uid: pod for pod in snapshot.pods}
        # Deletions first: a pod re-created under the same name must not be dropped after.
        for uid, pod in self._known.items():
            if uid not in current:
                self._emit(PodChange(pod, deleted=True))
        for pod in snapshot.pods:
            self._emit(PodChange(pod, deleted=False))
        self._known = current
        self._version = snapshot.resource_version

    def _watch(self) -> None:
        """One watch request, until the server ends it (``timeout_seconds``) or ``stop()``."""
        try:
            response = _client.watch_pods(self._core, self._version)
        except _client.API_FAILURES as error:
            if answered_with(error, GONE):
                raise Expired from error
            raise
        self._response = response
        self._delay = RETRY_FIRST_DELAY
        try:
            if self._stopping.is_set():  # stop() came before there was a response to shut
                return
            for change in self._changes(decoded(lines(response, self._stopping))):
                self._emit(change)
        finally:
            self._response = None
            response.close()  # an unfinished stream must not go back to the pool
            response.release_conn()

    def _changes(self, seen: Iterable[Seen]) -> Iterator[PodChange]:
        """The pod changes these watch events make; the watch moves on with each."""
        for event in seen:
            if event.resource_version:
                self._version = event.resource_version
            if event.pod is None:
                continue
            if event.kind == "DELETED":
                self._known.pop(event.pod.uid, None)
                yield PodChange(event.pod, deleted=True)
            else:
                self._known[event.pod.uid] = event.pod
                yield PodChange(event.pod, deleted=False)
