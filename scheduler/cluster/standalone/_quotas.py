"""``QuotaBucket``: the standalone ResourceQuotas, in the pods' bucket under keys of their own
(``quota_key``), written under the pods' fence and watched, so that every daemon, leader or
standby, applies what the leader wrote."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from common.messaging import describe_error
from scheduler.cluster.port import QuotaChange
from scheduler.cluster.standalone._bucket import FencedBucket
from scheduler.cluster.standalone._wire import QUOTA_PREFIX, StoredQuota

logger = logging.getLogger("scheduler.cluster.standalone")

WATCH_RETRY_S = 1.0
"""The wait before opening again a watch that could not be opened or was lost."""
WATCH_POLL_S = 1.0
"""How often a watch with nothing to tell looks whether it must be opened again."""
# The subject filter of the quota keys: every key under the prefix.
_QUOTA_KEYS = QUOTA_PREFIX + ">"


class QuotaBucket(FencedBucket[StoredQuota]):
    """The ResourceQuotas, fenced as the pods are (``FencedBucket``), and watched.

    This daemon's writes are in memory once the bucket confirmed them; ``follow`` brings the
    others' (on a standby: every one) through a watch of the quota keys. What the watch
    brings never overrides what this daemon knows to be newer (by revision: its own writes,
    the deletions it made), nor a key whose write is in progress (it waits for it) or got no
    answer (settling decides what stands). ``changes`` tells of every quota added, changed
    or deleted, whoever wrote it, and runs the watch while it is read.
    """

    noun = "ResourceQuota"

    def __init__(self, kv: KeyValue, connection: Client, name: str,
                 refusal: Callable[[], str | None]) -> None:
        super().__init__(kv, connection, name, refusal, msgspec.msgpack.Decoder(StoredQuota))
        self._changes: asyncio.Queue[QuotaChange] = asyncio.Queue()
        # Keys deleted: the revision after which each was gone, so that a watch that lags
        # brings no older version back; dropped once the watch has brought the deletion.
        self._gone_after: dict[str, int] = {}
        self._watch_replaced = False  # the client was replaced: the watch is opened again
        self._watch_failing = False  # a failure to open the watch was logged

    def _owns(self, key: str) -> bool:
        return key.startswith(QUOTA_PREFIX)

    def _told(self, key: str, before: StoredQuota | None, after: StoredQuota | None) -> None:
        if before == after:
            return
        if after is not None:
            self._changes.put_nowait(QuotaChange(after.manifest, deleted=False))
        elif before is not None:
            self._changes.put_nowait(QuotaChange(before.manifest, deleted=True))

    def _created(self, key: str, value: StoredQuota) -> None:
        self._told(key, None, value)

    def _removed(self, key: str, revision: int) -> None:
        super()._removed(key, revision)
        self._gone_after[key] = revision

    def quotas(self) -> list[StoredQuota]:
        """Every quota as this daemon last knew it."""
        return self.values()

    async def applied(self) -> None:
        """Return once every change told so far was applied (``changes`` was read past it)."""
        await self._changes.join()

    async def reattach(self, connection: Client) -> None:
        await super().reattach(connection)
        self._watch_replaced = True

    async def reload(self) -> None:
        """Read every quota afresh, telling of those that differ from what was known."""
        before = dict(self._values)
        await super().reload()
        for key in before.keys() | self._values.keys():
            self._told(key, before.get(key), self._values.get(key))

    async def changes(self) -> AsyncIterator[QuotaChange]:
        """Every quota added, changed or deleted, in order, from the quotas last read on;
        the watch (``follow``) runs for as long as this is read."""
        watch = asyncio.create_task(self.follow(), name="watch-resource-quotas")
        try:
            while True:
                yield await self._changes.get()
                self._changes.task_done()  # the reader has applied it: asked for the next
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch

    # The watch -----------------------------------------------------------------------

    async def follow(self) -> None:
        """Apply what the watch of the quota keys brings; a watch that cannot be opened,
        is lost, or was on a replaced client is opened again, and reads every quota."""
        while True:
            self._watch_replaced = False
            try:
                await self._watch_once()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if not self._watch_failing:
                    logger.warning("ResourceQuota watch of bucket %s lost: %s; opened again "
                                   "every %gs", self._name, describe_error(error),
                                   WATCH_RETRY_S)
                self._watch_failing = True
                await asyncio.sleep(WATCH_RETRY_S)

    async def _watch_once(self) -> None:
        kv = self._kv
        # Every key written up to here is in the watch's first delivery, unless it is gone.
        last = (await kv.status()).stream_info.state.last_seq
        _raise_if_cancelled()
        watcher = await kv.watch(_QUOTA_KEYS)
        listed: set[str] | None = set()  # the keys of the first delivery, until its end
        # The next entry, waited for with asyncio.wait, which passes a cancellation on:
        # watcher.updates() (asyncio.wait_for) can lose one in Python 3.11.
        coming: asyncio.Task[object] | None = None
        try:
            _raise_if_cancelled()
            if self._watch_failing:
                logger.info("ResourceQuota watch of bucket %s open again", self._name)
                self._watch_failing = False
            while not self._watch_replaced:
                if coming is None:
                    coming = asyncio.ensure_future(anext(watcher))
                done, _ = await asyncio.wait({coming}, timeout=WATCH_POLL_S)
                if not done:
                    continue
                arrived, coming = coming, None
                try:
                    entry: Any = arrived.result()
                except StopAsyncIteration:
                    return  # the watcher was stopped
                if entry is None:  # the first delivery is over
                    if listed is not None:
                        for key in list(self._values):
                            if key not in listed:
                                await self._vanished(key, last)
                    listed = None
                    continue
                if listed is not None:
                    listed.add(entry.key)
                deleted = entry.operation in (KV_DEL, KV_PURGE)
                await self._watched(entry.key, None if deleted else entry.value or None,
                                    entry.revision or 0)
        finally:
            if coming is not None:
                coming.cancel()
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]

    async def _watched(self, key: str, stored: bytes | None, revision: int) -> None:
        """Apply one watched entry (``stored`` None: a deletion) unless this daemon knows
        better."""
        if not self._owns(key):
            return
        async with self._writing.hold(key):
            if key in self._unsettled:
                return  # settling decides which version stands
            known = self._revisions.get(key, self._gone_after.get(key, 0))
            # A deletion at the revision known gone is one this daemon made: the watch has
            # caught up with it. Anything else up to the revision known is as old or older.
            if revision < known or (revision == known and stored is not None):
                return
            self._adopt(key, stored, revision)
            if stored is None:
                self._gone_after.pop(key, None)  # the watch is past the deletion

    async def _vanished(self, key: str, last: int) -> None:
        """Forget a quota the bucket no longer holds at all (purged), known at a revision
        up to ``last``."""
        async with self._writing.hold(key):
            if key not in self._unsettled and self._revisions.get(key, last + 1) <= last:
                self._adopt(key, None, 0)
                self._gone_after.pop(key, None)


def _raise_if_cancelled() -> None:
    """Raise the cancellation of this task that a NATS call swallowed: nats-py waits for
    its answers with asyncio.wait_for, which in Python 3.11 can return the answer and drop
    a cancellation that came with it, and the watch would go on after the daemon stopped."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
