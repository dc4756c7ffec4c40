"""``PodBucket``: the standalone pods in a NATS JetStream key-value bucket, written under a
fence so that an answered error means nothing changed and two daemons never both win."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

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
    BucketNotFoundError,
    InvalidKeyError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoKeysError,
)
from nats.js.kv import KeyValue

from common.locks import KeyedLocks
from common.messaging import describe_error
from scheduler.cluster.port import ClusterError, PodChange, StoreUnavailable
from scheduler.cluster.standalone._wire import StoredPod

# The package's name: log lines name the package, not its private modules.
logger = logging.getLogger("scheduler.cluster.standalone")

BUCKET = "pyhami-pods"
SETTLE_ATTEMPTS = 3
SETTLE_PERIOD_S = 1.0
# Failures after which the write surely did not reach the bucket: the server answered
# (APIError, no responders), or nats-py refused it before sending.
_NOT_SENT = (APIError, NoRespondersError, OutboundBufferLimitError, ConnectionClosedError,
             ConnectionDrainingError, MaxPayloadError, BadSubjectError, InvalidKeyError)

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StoredPod)


class PodBucket:
    """Pods in a JetStream key-value bucket, and in memory as this daemon last answered.

    Every write goes to the bucket first and to memory once the bucket confirmed it, so an
    answered error means nothing changed. Writes are compare-and-set on the revision last
    read, so a second writer (another daemon) cannot have two binds of one pod succeed.
    While the NATS connection is down a write is refused at once: nats-py would otherwise
    buffer it and send it on reconnecting, after its caller was told it failed. A write that
    got no answer may still land; it is undone (``keep_settled``) once the bucket answers again.
    A write is refused too while ``refusal`` names a reason (a standby writes nothing).

    Writers hold a pod with ``writing`` and, within it, call ``create``, ``replace`` or
    ``delete``; ``changes`` tells of every pod replaced or deleted, by this daemon or, as
    found on writing, by another.
    """

    def __init__(self, kv: KeyValue, connection: Client, name: str,
                 refusal: Callable[[], str | None]) -> None:
        self._kv = kv  # the JetStream key-value bucket itself
        self._connection = connection
        self._name = name
        self._refusal = refusal
        self._pods: dict[str, StoredPod] = {}
        self._revisions: dict[str, int] = {}  # the bucket revision of each pod in _pods
        # Writes that got no answer: the value sent (None for a delete), to be undone.
        self._unsettled: dict[str, bytes | None] = {}
        self._writing = KeyedLocks()  # one write of a pod at a time, settling included
        self._changes: asyncio.Queue[PodChange] = asyncio.Queue()

    @classmethod
    async def open(cls, connection: Client, refusal: Callable[[], str | None],
                   name: str = BUCKET) -> PodBucket:
        """The bucket ``name`` (made when missing) with every pod read.

        ``refusal`` says why this daemon may not write the bucket now (a standby); None
        when it may."""
        js = connection.jetstream()
        try:
            kv = await js.key_value(name)
        except BucketNotFoundError:
            kv = await js.create_key_value(bucket=name, history=1)
        bucket = cls(kv, connection, name, refusal)
        await bucket._load()
        return bucket

    def refusal(self) -> str | None:
        """Why this daemon may not write the bucket now (a standby); None when it may."""
        return self._refusal()

    async def reattach(self, connection: Client) -> None:
        """Use the bucket through a new NATS client (the old one was closed for good)."""
        self._kv = await connection.jetstream().key_value(self._name)
        self._connection = connection

    async def reload(self) -> None:
        """Read every pod afresh (this daemon was elected: another may have written).

        This daemon's own writes that got no answer are settled first, against what it
        answered; one that cannot be settled yet keeps its answered version in memory,
        for ``keep_settled`` to finish.
        """
        for key in list(self._unsettled):
            with contextlib.suppress(StoreUnavailable):
                async with self._writing.hold(key):
                    await self._settle(key)
        answered = {key: (self._pods.get(key), self._revisions.get(key, 0))
                    for key in self._unsettled}
        self._pods.clear()
        self._revisions.clear()
        await self._load()
        for key, (pod, revision) in answered.items():
            if pod is None:
                self._pods.pop(key, None)
                self._revisions.pop(key, None)
            else:
                self._pods[key], self._revisions[key] = pod, revision

    async def keep_settled(self, period: float = SETTLE_PERIOD_S) -> None:
        """Undo the writes that got no answer, once the bucket answers; runs forever."""
        while True:
            await asyncio.sleep(period)
            if self._refusal() is not None:
                continue  # a standby writes nothing; it reads every pod again if elected
            for key in list(self._unsettled):
                try:
                    async with self._writing.hold(key):
                        await self._settle(key)
                except StoreUnavailable as error:
                    logger.debug("pod %s not settled yet: %s", key, error)

    # Reading -----------------------------------------------------------------

    def get(self, key: str) -> StoredPod | None:
        """The pod under ``key`` as this daemon last answered; None when there is none."""
        return self._pods.get(key)

    def pods(self) -> list[StoredPod]:
        """Every pod as this daemon last answered."""
        return list(self._pods.values())

    async def changes(self) -> AsyncIterator[PodChange]:
        """Every pod replaced or deleted, in order; a pod created is not told of (it is
        pending, and the pod API asks the pending loop to try it)."""
        while True:
            yield await self._changes.get()

    async def _load(self) -> None:
        try:
            keys = await self._kv.keys()
        except NoKeysError:
            keys = []
        for key in keys:
            try:
                entry = await self._kv.get(key)
            except KeyNotFoundError:
                continue
            if entry.value:
                try:
                    self._pods[key] = _decoder.decode(entry.value)
                except msgspec.DecodeError as error:
                    logger.error("bucket %s: entry %s is unreadable (%s); skipped", self._name,
                                 key, error)
                    continue
                self._revisions[key] = entry.revision or 0

    # Writing -----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def writing(self, key: str) -> AsyncIterator[StoredPod | None]:
        """Hold the pod under ``key`` for one write, and give it as this daemon answered
        (None when there is none) once its writes that got no answer are settled.

        Raises ``StoreUnavailable`` while they cannot be settled."""
        async with self._writing.hold(key):
            await self._settle(key)
            yield self._pods.get(key)

    async def create(self, key: str, pod: StoredPod, what: str) -> bool:
        """Write ``pod`` under ``key``, within ``writing``; False when another writer made a
        pod there first (it is read, and nothing is written).

        Raises ``StoreUnavailable`` when the write was not applied, or may have been."""
        value = _encoder.encode(pod)
        try:
            revision = await self._write(key, value, what,
                                         lambda: self._kv.create(key, value))
        except KeyWrongLastSequenceError:
            await self._read_again(key)
            return False
        self._pods[key] = pod
        self._revisions[key] = revision
        return True

    async def replace(self, key: str, pod: StoredPod, what: str) -> None:
        """Write ``pod`` over the revision last read (compare-and-set), within ``writing``.

        Raises ``StoreUnavailable`` when the write was not applied, or may have been, and
        ``ClusterError`` when another writer changed the pod (its version is read)."""
        value = _encoder.encode(pod)
        last = self._revisions.get(key, 0)
        try:
            revision = await self._write(key, value, what,
                                         lambda: self._kv.update(key, value, last=last))
        except KeyWrongLastSequenceError:
            await self._read_again(key)
            raise ClusterError(f"{what}: the pod changed meanwhile; try again") from None
        self._pods[key] = pod
        self._revisions[key] = revision
        self._changes.put_nowait(PodChange(pod.cluster_pod(), deleted=False))

    async def delete(self, key: str, what: str) -> bool:
        """Delete the pod under ``key`` at the revision last read, within ``writing``; False
        when there is none (nothing is written).

        Raises as ``replace`` does."""
        pod = self._pods.get(key)
        if pod is None:
            return False
        last = self._revisions.get(key, 0)
        try:
            await self._write(key, None, what, lambda: self._kv.delete(key, last=last))
        except KeyWrongLastSequenceError:
            await self._read_again(key)
            raise ClusterError(f"{what}: the pod changed meanwhile; try again") from None
        del self._pods[key]
        self._revisions.pop(key, None)
        self._changes.put_nowait(PodChange(pod.cluster_pod(), deleted=True))
        return True

    async def _write(self, key: str, sent: bytes | None, what: str,
                     write: Callable[[], Awaitable[T]]) -> T:
        """One bucket write (``sent``: the value, None for a delete).

        Raises ``StoreUnavailable`` when it was not applied, or may have been (then it is
        undone by ``keep_settled``), and ``KeyWrongLastSequenceError`` when the pod changed.
        """
        if (standby := self._refusal()) is not None:
            raise StoreUnavailable(f"{what}: {standby}; nothing was written")
        if not self._connection.is_connected:
            raise StoreUnavailable(f"{what}: the NATS connection is down; nothing was written")
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
        answered = self._pods.get(key)
        wanted = _encoder.encode(answered) if answered is not None else None
        what = f"settling pod {key}"
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
                    self._revisions.pop(key, None)
                else:
                    self._revisions[key] = await self._kv.update(key, wanted, last=revision)
                break
            except KeyWrongLastSequenceError:
                continue  # it landed between the read and the write: read again
            except Exception as error:
                raise StoreUnavailable(f"{what}: {describe_error(error)}") from None
        else:
            raise StoreUnavailable(f"{what}: the pod kept changing")
        del self._unsettled[key]
        if stored == sent:
            logger.warning("pod %s: a write reported failed had reached the store; undone", key)

    async def _read(self, key: str) -> tuple[bytes | None, int]:
        """The pod's bytes in the bucket (None when absent) and the key's last revision."""
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError as gone:
            deleted = gone.entry
            return None, (deleted.revision or 0) if deleted is not None else 0
        return entry.value or None, entry.revision or 0

    async def _read_again(self, key: str) -> None:
        """A compare-and-set write lost: take the bucket's version of the pod, should the
        bucket answer."""
        with contextlib.suppress(Exception):
            self._adopt(key, *await self._read(key))

    def _adopt(self, key: str, stored: bytes | None, revision: int) -> None:
        """Take the bucket's version of a pod that someone else changed."""
        if stored is None:
            gone = self._pods.pop(key, None)
            self._revisions.pop(key, None)
            if gone is not None:
                self._changes.put_nowait(PodChange(gone.cluster_pod(), deleted=True))
            return
        try:
            pod = _decoder.decode(stored)
        except msgspec.DecodeError as error:
            logger.error("bucket %s: entry %s is unreadable (%s); skipped", self._name, key,
                         error)
            return
        self._pods[key] = pod
        self._revisions[key] = revision
        self._changes.put_nowait(PodChange(pod.cluster_pod(), deleted=False))
