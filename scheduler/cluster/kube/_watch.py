"""The list-and-watch loop of a collection (the pods, the ResourceQuotas), an asyncio task
on the daemon's loop.

One watch request is read in steps of their own, each called by the one before as the
stream's bytes arrive: the stream's lines, the watch event each line is, the change that
makes. An object the API sends that does not decode is logged and
counted (``UnreadableLog``), and the watch goes on past it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass
from typing import Generic

import msgspec

from scheduler.cluster.kube import _client
from scheduler.cluster.kube._client import Change, Collection, Item, Snapshot
from scheduler.cluster.kube._transport import (
    API_FAILURES,
    GONE,
    ApiTransport,
    answered_with,
    describe_failure,
)
from scheduler.cluster.kube._wire import Node, Status, Unreadable, WatchEvent
from scheduler.cluster.port import ClusterError

# The package's name: log lines name the package, not its private modules.
logger = logging.getLogger("scheduler.cluster.kube")

RETRY_FIRST_DELAY = 1.0
RETRY_MAX_DELAY = 30.0
UNREADABLE_REMEMBERED = 1024  # object versions whose failure was logged, not logged again


class Expired(ClusterError):
    """The watch's resourceVersion is gone from the API server's history: list again."""


class WatchFailed(ClusterError):
    """An ERROR event other than 410 in the watch stream."""


@dataclass(frozen=True, slots=True)
class Seen(Generic[Item]):
    """One watch event, decoded: the resourceVersion it moves the watch on to, and the
    object it adds, changes or deletes (none for a bookmark, nor for an object that does
    not decode: then ``unreadable`` says what is known of it)."""

    kind: str
    resource_version: str | None
    item: Item | None
    unreadable: Unreadable | None = None


class UnreadableLog:
    """Objects the API sent that do not decode: each version logged once, all counted."""

    def __init__(self, nouns: Iterable[str] = ()) -> None:
        """``nouns``: the kinds counted from zero (metrics show them before any)."""
        self.counts: Counter[str] = Counter(dict.fromkeys(nouns, 0))
        """Per noun (``pod``, ``ResourceQuota``), how many object versions did not decode."""
        self._logged: OrderedDict[tuple[str, str, str], None] = OrderedDict()

    def report(self, noun: str, objects: Iterable[Unreadable]) -> None:
        for unreadable in objects:
            version = (noun, unreadable.uid or unreadable.key, unreadable.resource_version)
            if version in self._logged:
                continue
            self._logged[version] = None
            if len(self._logged) > UNREADABLE_REMEMBERED:
                self._logged.popitem(last=False)
            self.counts[noun] += 1
            logger.warning("%s %s (resourceVersion %s) does not decode, left out until it "
                           "changes: %s", noun, unreadable.key,
                           unreadable.resource_version or "?", unreadable.error)


class LineSplitter:
    """The lines of a stream that arrives in chunks cut anywhere, blank ones left out,
    each handed to ``on_line`` as soon as it is whole (in the transport's callback: no
    task or generator between the socket and the watch)."""

    __slots__ = ("_on_line", "_pending")

    def __init__(self, on_line: Callable[[bytes], None]) -> None:
        self._on_line = on_line
        self._pending: list[bytes] = []  # the start of a line whose end has not come yet

    def feed(self, chunk: bytes) -> None:
        *complete, tail = chunk.split(b"\n")
        if complete:
            pending = self._pending
            if pending:
                complete[0] = b"".join((*pending, complete[0]))
                pending.clear()
            on_line = self._on_line
            for line in complete:
                if line and not line.isspace():
                    on_line(line)
        if tail:
            self._pending.append(tail)

    def end(self) -> None:
        """The stream ended: its last line, if it had no newline."""
        last = b"".join(self._pending)
        self._pending.clear()
        if last.strip():
            self._on_line(last)


_events = msgspec.json.Decoder(WatchEvent)


_CHANGES = frozenset({"ADDED", "MODIFIED", "DELETED"})


def seen(line: bytes, collection: Collection[Item, Change]) -> Seen[Item]:
    """The watch event a line is. Raises ``Expired`` or ``WatchFailed`` on an ERROR event,
    ``msgspec.DecodeError`` on a line that is none.

    A change whose object decodes, nearly every line, is read in one pass, its type and
    object together; anything else (a bookmark, an error, an object that does not decode)
    is read again in steps, the object apart, so that it costs that object alone."""
    try:
        kind, item, version = collection.read_event(line)
    except msgspec.DecodeError:
        pass
    else:
        if kind in _CHANGES:
            return Seen(kind, version, item)
    return _seen_in_steps(line, collection)


def _seen_in_steps(line: bytes, collection: Collection[Item, Change]) -> Seen[Item]:
    event = _events.decode(line)
    if event.type == "ERROR":
        status = msgspec.json.decode(event.object, type=Status)
        if status.code == GONE:
            raise Expired
        raise WatchFailed(f"ERROR event {status.code} {status.reason}: {status.message}")
    if event.type == "BOOKMARK":
        # Only moves the resourceVersion on; its object is a skeleton (a pod's has
        # ``spec.containers: null``) that need not decode as the kind.
        bookmark = msgspec.json.decode(event.object, type=Node)
        return Seen(event.type, bookmark.metadata.resource_version, None)
    try:
        item, version = collection.read(event.object)
    except msgspec.DecodeError as error:
        unreadable = Unreadable.of(event.object, error)
        return Seen(event.type, unreadable.resource_version or None, None, unreadable)
    return Seen(event.type, version, item if event.type in _CHANGES else None)


class ListWatcher(Generic[Item, Change]):
    """The list-and-watch loop of a collection, a task from ``start()`` until ``stop()``;
    every change goes to ``deliver``, on the loop.

    It watches on from ``start`` (a list taken before) or lists first; whenever the
    watch's resourceVersion has expired (410 Gone) it lists again and delivers the list
    as changes, the objects gone since as deletions; other failures are retried with
    backoff.
    """

    def __init__(self, api: ApiTransport, collection: Collection[Item, Change],
                 deliver: Callable[[Change], None], start: Snapshot[Item] | None,
                 unreadable: UnreadableLog) -> None:
        self._api = api
        self._collection = collection
        self._deliver = deliver
        self._unreadable = unreadable
        self._task: asyncio.Task[None] | None = None
        self._version: str | None = start.resource_version if start else None
        uid = collection.uid
        self._known: dict[str, Item] = {uid(item): item for item in start.items} if start else {}
        self._delay = RETRY_FIRST_DELAY

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=self._collection.watch_task)

    async def stop(self) -> None:
        """End the task, a watch waiting on the socket included, and wait for it."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])

    async def run(self) -> None:
        noun = self._collection.noun
        while True:
            try:
                if self._version is None:
                    await self._relist()
                await self._watch()
            except Expired:
                logger.info("%s watch: resourceVersion %s expired; listing %ss again", noun,
                            self._version, noun)
                self._version = None
            except Exception as error:
                logger.warning("%s watch failed, retrying in %.0f s: %s", noun, self._delay,
                               describe_failure(error),
                               exc_info=not isinstance(error, (*API_FAILURES, WatchFailed)))
                await asyncio.sleep(self._delay)
                self._delay = min(self._delay * 2, RETRY_MAX_DELAY)

    async def _relist(self) -> None:
        collection = self._collection
        snapshot = await _client.list_all(self._api, collection)
        self._unreadable.report(collection.noun, snapshot.unreadable)
        current = {collection.uid(item): item for item in snapshot.items}
        # Still there but unreadable now: the version read last stands, as it does when
        # the watch brings such a change.
        for unreadable in snapshot.unreadable:
            if (known := self._known.get(unreadable.uid)) is not None:
                current[unreadable.uid] = known
        # Deletions first: an object re-created under the same name must not be dropped after.
        for uid, item in self._known.items():
            if uid not in current:
                self._deliver(collection.change(item, True))
        for item in snapshot.items:
            self._deliver(collection.change(item, False))
        self._known = current
        self._version = snapshot.resource_version

    async def _watch(self) -> None:
        """One watch request, until the server ends it (``timeoutSeconds``)."""
        collection = self._collection
        take = self._take

        def on_line(line: bytes) -> None:
            take(seen(line, collection))

        lines = LineSplitter(on_line)
        try:
            await self._api.stream(collection.path, _client.watch_query(self._version),
                                   on_open=self._opened, on_data=lines.feed)
            lines.end()
        except API_FAILURES as error:
            if answered_with(error, GONE):
                raise Expired from error
            raise

    def _opened(self) -> None:
        self._delay = RETRY_FIRST_DELAY

    def _take(self, event: Seen[Item]) -> None:
        """Deliver the change this watch event makes; the watch moves on with it."""
        if event.resource_version:
            self._version = event.resource_version
        collection = self._collection
        if event.unreadable is not None:
            self._unreadable.report(collection.noun, [event.unreadable])
            # A deletion still deletes what was read of it before.
            if event.kind == "DELETED" and (
                    gone := self._known.pop(event.unreadable.uid, None)) is not None:
                self._deliver(collection.change(gone, True))
            return
        if event.item is None:
            return
        uid = collection.uid(event.item)
        if event.kind == "DELETED":
            self._known.pop(uid, None)
            self._deliver(collection.change(event.item, True))
        else:
            self._known[uid] = event.item
            self._deliver(collection.change(event.item, False))


async def follow(api: ApiTransport, collection: Collection[Item, Change],
                 start: Snapshot[Item] | None, unreadable: UnreadableLog,
                 ) -> AsyncGenerator[Change, None]:
    """The collection's changes, from ``start`` on (else from a list), for as long as they
    are iterated; the watch task ends when the iteration does."""
    queue: asyncio.Queue[Change] = asyncio.Queue()
    watcher = ListWatcher(api, collection, queue.put_nowait, start, unreadable)
    watcher.start()
    try:
        while True:
            yield await queue.get()
    finally:
        await watcher.stop()
