"""``FencedBucket``: entries of one kind in a NATS JetStream key-value bucket, written under
a fence so that an answered error means nothing changed and two daemons never both win;
``PodBucket``, the standalone pods kept that way."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Generic, TypeVar

import msgspec
from nats.aio.client import Client
from nats.errors import (
    BadSubjectError,
    ConnectionClosedError,
    ConnectionDrainingError,
    MaxPayloadError,
    NoRespondersError,
    OutboundBufferLimitError,
)
from nats.js.errors import (
    APIError,
    InvalidKeyError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue

from common.buckets import open_key_value
from common.locks import KeyedLocks
from common.messaging import describe_error
from scheduler.cluster.port import ClusterError, PodChange, StoreUnavailable
from scheduler.cluster.standalone._wire import StoredPod, holds_pod

# The package's name: log lines name the package, not its private modules.
logger = logging.getLogger("scheduler.cluster.standalone")

BUCKET = "pyhami-pods"
SETTLE_ATTEMPTS = 3
SETTLE_PERIOD_S = 1.0
FENCE_AT_ONCE = 32
"""Entries fenced at once when a daemon takes the lease (``fence``)."""
READS_IN_FLIGHT = 64
"""Entries read at once when the whole bucket is read (at start-up, on a takeover)."""
LISTING_ATTEMPTS = 5
LISTING_TIMEOUT_S = 10.0
# Failures after which the write surely did not reach the bucket: the server answered
# (APIError, no responders), or nats-py refused it before sending.
_NOT_SENT = (APIError, NoRespondersError, OutboundBufferLimitError, ConnectionClosedError,
             ConnectionDrainingError, MaxPayloadError, BadSubjectError, InvalidKeyError)

T = TypeVar("T")
V = TypeVar("V")

_encoder = msgspec.msgpack.Encoder()
# Room left beside a value in one NATS message: the subject and the compare-and-set header.
_MESSAGE_OVERHEAD = 1024


class EntryTooLarge(ClusterError):
    """A value the bucket cannot hold: its encoding exceeds the largest message the NATS
    server takes. Nothing was written."""


async def open_bucket(connection: Client, name: str = BUCKET, replicas: int = 1) -> KeyValue:
    """The key-value bucket ``name`` on ``replicas`` servers, made or raised to them when
    needed; ``common.buckets.BucketReplicasError`` when the servers cannot hold that many."""
    return await open_key_value(connection.jetstream(), name, replicas=replicas)


class FencedBucket(abc.ABC, Generic[V]):
    """Entries of one kind (a subclass says which keys are its) in a JetStream key-value
    bucket, and in memory as this daemon last answered.

    Every write goes to the bucket first and to memory once the bucket confirmed it, so an
    answered error means nothing changed. Writes are compare-and-set on the revision last
    read, so a second writer (another daemon) cannot have two binds of one pod succeed.
    While the NATS connection is down a write is refused at once: nats-py would otherwise
    buffer it and send it on reconnecting, after its caller was told it failed. A write that
    got no answer may still land; it is undone (``keep_settled``) once the bucket answers again.
    A write is refused too while ``refusal`` names a reason (a standby writes nothing).

    Writers hold an entry with ``writing`` and, within it, call ``create``, ``replace`` or
    ``delete``. Each entry replaced or deleted, by this daemon or, as found on writing, by
    another, is told to ``_told``; each one this daemon created to ``_created``.
    """

    noun = "entry"
    """What an entry is, in the messages: "pod"."""

    def __init__(self, kv: KeyValue, connection: Client, name: str,
                 refusal: Callable[[], str | None], decoder: msgspec.msgpack.Decoder[V]) -> None:
        self._kv = kv  # the JetStream key-value bucket itself
        self._connection = connection
        self._name = name
        self._refusal = refusal
        self._decoder = decoder
        self._values: dict[str, V] = {}
        self._revisions: dict[str, int] = {}  # the bucket revision of each entry in _values
        # Writes that got no answer: the value sent (None for a delete), to be undone.
        self._unsettled: dict[str, bytes | None] = {}
        self._writing = KeyedLocks()  # one write of an entry at a time, settling included

    @abc.abstractmethod
    def _owns(self, key: str) -> bool:
        """Whether the key holds an entry of this bucket's kind."""

    def _told(self, key: str, before: V | None, after: V | None) -> None:
        """An entry replaced (``before`` None when it was not known) or deleted (``after``
        None)."""

    def _created(self, key: str, value: V) -> None:
        """An entry this daemon created."""

    def _removed(self, key: str, revision: int) -> None:
        """Forget the entry, gone from the bucket after ``revision``."""
        self._values.pop(key, None)
        self._revisions.pop(key, None)

    def refusal(self) -> str | None:
        """Why this daemon may not write the bucket now (a standby); None when it may."""
        return self._refusal()

    async def reattach(self, connection: Client) -> None:
        """Use the bucket through a new NATS client (the old one was closed for good)."""
        self._kv = await connection.jetstream().key_value(self._name)
        self._connection = connection

    async def load(self) -> None:
        """Read every entry of the bucket's kind (once, on opening)."""
        await self._load()

    async def reload(self) -> None:
        """Read every entry afresh (this daemon was elected: another may have written).

        This daemon's own writes that got no answer are settled first, against what it
        answered; one that cannot be settled yet keeps its answered version in memory,
        for ``keep_settled`` to finish. A read that fails part way (the bucket's stream
        electing its leader) changes nothing: the entries are replaced only once all are
        read.
        """
        for key in list(self._unsettled):
            with contextlib.suppress(StoreUnavailable):
                async with self._writing.hold(key):
                    await self._settle(key)
        answered = {key: (self._values.get(key), self._revisions.get(key, 0))
                    for key in self._unsettled}
        values, revisions = await self._read_all()
        for key, (value, revision) in answered.items():
            if value is None:
                values.pop(key, None)
                revisions.pop(key, None)
            else:
                values[key], revisions[key] = value, revision
        self._values, self._revisions = values, revisions

    async def catch_up(self) -> int:
        """Take every entry the bucket holds in a newer version than this daemon knows,
        telling each (``_told``); returns how many. For a daemon that has just taken the
        lease: a write its predecessor sent while it still decided may land after this
        daemon's ``reload`` (it waited in a NATS server during a stream election); its
        compare-and-set succeeds, as nobody else wrote the entry."""
        keys = await self._all_keys()
        taken = 0
        for key in keys:
            if not self._owns(key) or key in self._unsettled:
                continue
            async with self._writing.hold(key):
                try:
                    stored, revision = await self._read(key)
                except KeyNotFoundError:
                    continue
                if stored is not None and revision > self._revisions.get(key, 0):
                    self._adopt(key, stored, revision)
                    taken += 1
        return taken

    async def fence(self, which: Callable[[V], bool]) -> int:
        """Write every entry ``which`` keeps again, unchanged, over the revision this daemon
        read; returns how many had changed meanwhile (those are read instead).

        For a daemon that has just taken the lease, before it decides: its predecessor's
        writes are compare-and-sets over the revisions it read, so one it sent while it
        still decided and that lands after this (it waited in a NATS server during a
        stream election) now fails, instead of binding a pod on cards this daemon may
        give another; one that landed first is read and booked. Raises what the bucket
        raises when it does not answer (the daemon then does not lead)."""
        keys = [key for key, value in self._values.items()
                if key not in self._unsettled and which(value)]
        changed = 0

        async def one(key: str) -> None:
            nonlocal changed
            async with self._writing.hold(key):
                value = self._values.get(key)
                if value is None or not which(value):
                    return
                try:
                    self._revisions[key] = await self._kv.update(
                        key, _encoder.encode(value), last=self._revisions.get(key, 0))
                except KeyWrongLastSequenceError:
                    self._adopt(key, *await self._read(key))
                    changed += 1

        for start in range(0, len(keys), FENCE_AT_ONCE):
            await asyncio.gather(*(one(key) for key in keys[start:start + FENCE_AT_ONCE]))
        return changed

    async def keep_settled(self, period: float = SETTLE_PERIOD_S) -> None:
        """Undo the writes that got no answer, once the bucket answers; runs forever."""
        while True:
            await asyncio.sleep(period)
            if self._refusal() is not None:
                continue  # a standby writes nothing; it reads every entry again if elected
            for key in list(self._unsettled):
                try:
                    async with self._writing.hold(key):
                        await self._settle(key)
                except StoreUnavailable as error:
                    logger.debug("%s %s not settled yet: %s", self.noun, key, error)

    # Reading -----------------------------------------------------------------

    def get(self, key: str) -> V | None:
        """The entry under ``key`` as this daemon last answered; None when there is none."""
        return self._values.get(key)

    def values(self) -> list[V]:
        """Every entry as this daemon last answered."""
        return list(self._values.values())

    async def _load(self) -> None:
        self._values, self._revisions = await self._read_all()

    async def _all_keys(self) -> list[str]:
        """Every key the bucket holds now, checked whole: a listing can come back short
        while the stream's leader changes (seen in the NATS cluster fault test: a daemon
        that took the lease read 101 pods fewer than the bucket held, and gave their cards
        again). The bucket keeps one message per key (history 1, a deleted key's marker
        included), so a listing of every key, deleted ones too, that saw fewer than the
        stream held before it started is read again. Raises ``TimeoutError`` when it stays
        short or the listing does not end."""
        for _ in range(LISTING_ATTEMPTS):
            held = (await self._kv.status()).stream_info.state.messages
            live, seen = await asyncio.wait_for(self._listing(), LISTING_TIMEOUT_S)
            if seen >= held:
                return live
            logger.warning("bucket %s: a listing saw %d keys of the %d held; read again",
                           self._name, seen, held)
        raise TimeoutError(f"bucket {self._name}: every listing came back short")

    async def _listing(self) -> tuple[list[str], int]:
        """The live keys, and how many keys the listing saw, deleted ones included."""
        watcher = await self._kv.watchall(meta_only=True)
        live: list[str] = []
        seen = 0
        try:
            async for entry in watcher:
                if entry is None:  # the marker: every key delivered
                    break
                seen += 1
                if entry.operation is None:  # a value, not a deletion's marker
                    live.append(entry.key)
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]  # nats-py leaves it untyped
        return live, seen

    async def _read_all(self) -> tuple[dict[str, V], dict[str, int]]:
        """Every entry of the bucket's kind and its revision, as the bucket holds them now."""
        values: dict[str, V] = {}
        revisions: dict[str, int] = {}
        keys = [key for key in await self._all_keys() if self._owns(key)]
        gate = asyncio.Semaphore(READS_IN_FLIGHT)

        async def read(key: str) -> KeyValue.Entry | None:
            async with gate:
                try:
                    return await self._kv.get(key)
                except KeyNotFoundError:
                    return None

        # Many reads in flight: one after the other, each waited for behind whatever else
        # the connection carries, 5,000 pods outlasted a takeover's lease.
        entries = await asyncio.gather(*(read(key) for key in keys))
        for key, entry in zip(keys, entries, strict=True):
            if entry is None:
                continue
            revision = entry.revision or 0
            if entry.value and revision > revisions.get(key, 0):
                try:
                    values[key] = self._decoder.decode(entry.value)
                except msgspec.DecodeError as error:
                    logger.error("bucket %s: entry %s is unreadable (%s); skipped", self._name,
                                 key, error)
                    continue
                revisions[key] = revision
        return values, revisions

    # Writing -----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def writing(self, key: str) -> AsyncIterator[V | None]:
        """Hold the entry under ``key`` for one write, and give it as this daemon answered
        (None when there is none) once its writes that got no answer are settled.

        Raises ``StoreUnavailable`` while they cannot be settled."""
        async with self._writing.hold(key):
            await self._settle(key)
            yield self._values.get(key)

    async def create(self, key: str, value: V, what: str) -> bool:
        """Write ``value`` under ``key``, within ``writing``; False when another writer made
        an entry there first (it is read, and nothing is written).

        Raises ``StoreUnavailable`` when the write was not applied, or may have been, and
        ``EntryTooLarge``."""
        data = _encoder.encode(value)
        try:
            revision = await self._write(key, data, what, lambda: self._kv.create(key, data))
        except KeyWrongLastSequenceError:
            await self._read_again(key)
            return False
        self._values[key] = value
        self._revisions[key] = revision
        self._created(key, value)
        return True

    async def replace(self, key: str, value: V, what: str) -> None:
        """Write ``value`` over the revision last read (compare-and-set), within ``writing``.

        Raises ``StoreUnavailable`` when the write was not applied, or may have been,
        ``EntryTooLarge``, and ``ClusterError`` when another writer changed the entry (its
        version is read)."""
        data = _encoder.encode(value)
        last = self._revisions.get(key, 0)
        before = self._values.get(key)
        try:
            revision = await self._write(key, data, what,
                                         lambda: self._kv.update(key, data, last=last))
        except KeyWrongLastSequenceError:
            await self._read_again(key)
            raise ClusterError(f"{what}: the {self.noun} changed meanwhile; try again") from None
        self._values[key] = value
        self._revisions[key] = revision
        self._told(key, before, value)

    async def delete(self, key: str, what: str) -> bool:
        """Delete the entry under ``key`` at the revision last read, within ``writing``;
        False when there is none (nothing is written).

        Raises as ``replace`` does."""
        value = self._values.get(key)
        if value is None:
            return False
        last = self._revisions.get(key, 0)
        try:
            await self._write(key, None, what, lambda: self._kv.delete(key, last=last))
        except KeyWrongLastSequenceError:
            await self._read_again(key)
            raise ClusterError(f"{what}: the {self.noun} changed meanwhile; try again") from None
        self._removed(key, last)
        self._told(key, value, None)
        return True

    async def _write(self, key: str, sent: bytes | None, what: str,
                     write: Callable[[], Awaitable[T]]) -> T:
        """One bucket write (``sent``: the value, None for a delete).

        Raises ``StoreUnavailable`` when it was not applied, or may have been (then it is
        undone by ``keep_settled``), ``EntryTooLarge`` when the value is more than a NATS
        message holds, and ``KeyWrongLastSequenceError`` when the entry changed.
        """
        if (standby := self._refusal()) is not None:
            raise StoreUnavailable(f"{what}: {standby}; nothing was written")
        if not self._connection.is_connected:
            raise StoreUnavailable(f"{what}: the NATS connection is down; nothing was written")
        largest = self._connection.max_payload - _MESSAGE_OVERHEAD
        if sent is not None and len(sent) > largest:
            raise EntryTooLarge(f"{what}: the {self.noun} takes {len(sent)} bytes stored, more "
                                f"than the {largest} the NATS server takes in one message; "
                                "nothing was written")
        try:
            return await write()
        except KeyWrongLastSequenceError:
            raise
        except _NOT_SENT as error:
            raise StoreUnavailable(f"{what}: the pod store refused the write: "
                                   f"{describe_error(error)}") from None
        except (Exception, asyncio.CancelledError) as error:
            self._unsettled[key] = sent
            if isinstance(error, asyncio.CancelledError):
                raise
            raise StoreUnavailable(f"{what}: no answer from the pod store "
                                   f"({describe_error(error)}); the write is undone should it "
                                   "arrive") from None

    async def _settle(self, key: str) -> None:
        """Bring the bucket back to what was answered for ``key`` (memory), should a write
        of unknown outcome have landed; raises ``StoreUnavailable`` while it cannot."""
        if key not in self._unsettled:
            return
        sent = self._unsettled[key]
        answered = self._values.get(key)
        wanted = _encoder.encode(answered) if answered is not None else None
        what = f"settling {self.noun} {key}"
        if not self._connection.is_connected:
            raise StoreUnavailable(f"{what}: the NATS connection is down")
        for _ in range(SETTLE_ATTEMPTS):
            try:
                stored, revision = await self._read(key)
                if stored not in (wanted, sent):
                    self._adopt(key, stored, revision)  # another writer's: it stands
                    break
                # The unanswered write landed (stored == sent), or not yet: writing what
                # was answered, on the revision just read, undoes it or fences it off.
                if wanted is None:
                    await self._kv.delete(key, last=revision)
                    self._removed(key, revision)
                else:
                    self._revisions[key] = await self._kv.update(key, wanted, last=revision)
                break
            except KeyWrongLastSequenceError:
                continue  # it landed between the read and the write: read again
            except Exception as error:
                raise StoreUnavailable(f"{what}: {describe_error(error)}") from None
        else:
            raise StoreUnavailable(f"{what}: the {self.noun} kept changing")
        del self._unsettled[key]
        if stored == sent:
            logger.warning("%s %s: a write reported failed had reached the store; undone",
                           self.noun, key)

    async def _read(self, key: str) -> tuple[bytes | None, int]:
        """The entry's bytes in the bucket (None when absent) and the key's last revision."""
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError as gone:
            deleted = gone.entry
            return None, (deleted.revision or 0) if deleted is not None else 0
        return entry.value or None, entry.revision or 0

    async def _read_again(self, key: str) -> None:
        """A compare-and-set write lost: take the bucket's version of the entry, should the
        bucket answer."""
        with contextlib.suppress(Exception):
            self._adopt(key, *await self._read(key))

    def _adopt(self, key: str, stored: bytes | None, revision: int) -> None:
        """Take the bucket's version of an entry that someone else changed."""
        before = self._values.get(key)
        if stored is None:
            self._removed(key, revision)
            if before is not None:
                self._told(key, before, None)
            return
        try:
            value = self._decoder.decode(stored)
        except msgspec.DecodeError as error:
            logger.error("bucket %s: entry %s is unreadable (%s); skipped", self._name, key,
                         error)
            return
        self._values[key] = value
        self._revisions[key] = revision
        self._told(key, before, value)


class PodBucket(FencedBucket[StoredPod]):
    """The standalone pods, fenced (``FencedBucket``); ``changes`` tells of every pod
    replaced or deleted, by this daemon or, as found on writing, by another."""

    noun = "pod"

    def __init__(self, kv: KeyValue, connection: Client, name: str,
                 refusal: Callable[[], str | None]) -> None:
        super().__init__(kv, connection, name, refusal, msgspec.msgpack.Decoder(StoredPod))
        self._changes: asyncio.Queue[PodChange] = asyncio.Queue()

    def _owns(self, key: str) -> bool:
        return holds_pod(key)

    def _told(self, key: str, before: StoredPod | None, after: StoredPod | None) -> None:
        if after is not None:
            self._changes.put_nowait(PodChange(after.cluster_pod(), deleted=False))
        elif before is not None:
            self._changes.put_nowait(PodChange(before.cluster_pod(), deleted=True))

    def _created(self, key: str, value: StoredPod) -> None:
        # Told too: a pod group counts its members from the moment they exist.
        self._changes.put_nowait(PodChange(value.cluster_pod(), deleted=False))

    def pods(self) -> list[StoredPod]:
        """Every pod as this daemon last answered."""
        return self.values()

    async def changes(self) -> AsyncIterator[PodChange]:
        """Every pod created, replaced or deleted, in order (a pod created is also tried
        by the pending loop, which the pod API asks)."""
        while True:
            yield await self._changes.get()
