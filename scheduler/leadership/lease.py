"""``NatsLease`` (standalone): the daemons elect one among themselves with a JetStream
key-value entry that expires ``ttl`` seconds after it was last written."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.kv import KeyValue

from common.buckets import open_key_value
from common.core.errors import SettingsError
from common.messaging import describe_error
from scheduler.errors import SchedulerError
from scheduler.leadership.port import Hook, Role

logger = logging.getLogger(__name__)

LEASE_BUCKET = "pyhami-leader"
LEASE_KEY = "leader"


class LeaseSettingsError(SettingsError):
    """The lease's settings cannot keep one decider at a time."""


class TakeOverFailed(SchedulerError):
    """The daemon that took the lease could not get ready to decide (its store did not
    answer in time); it hands the lease on and stands by, as after a lapse."""


def check_lease_timing(ttl: float, renew_period: float, renew_deadline: float) -> None:
    if not renew_deadline < ttl:
        raise LeaseSettingsError(
            f"--lease-renew-deadline ({renew_deadline:g}s) must be shorter than --lease-ttl "
            f"({ttl:g}s): the holder must stop deciding before its lease can expire")
    if not renew_period < renew_deadline:
        raise LeaseSettingsError(
            f"--lease-renew-period ({renew_period:g}s) must be shorter than "
            f"--lease-renew-deadline ({renew_deadline:g}s): a holder that renews less often "
            "than its deadline stops deciding between renewals")


# What a lease operation raises when NATS did not answer it or refused it.
_NOT_DONE = (nats.errors.Error, TimeoutError, OSError)


class NatsLease:
    """The standalone daemons' election: a key in a JetStream bucket whose entries expire
    ``ttl`` seconds after their last write, written only by compare-and-set."""

    def __init__(self, identity: str, *, ttl: float, renew_period: float,
                 renew_deadline: float, on_elected: Hook, on_demoted: Hook,
                 replicas: int = 1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        check_lease_timing(ttl, renew_period, renew_deadline)
        self.identity = identity
        self._ttl = ttl
        self._replicas = replicas  # servers keeping the lease's bucket
        self._renew_period = renew_period
        self._renew_deadline = renew_deadline
        self._on_elected = on_elected
        self._on_demoted = on_demoted
        self._clock = clock
        self._client: Client | None = None
        self._bucket: KeyValue | None = None
        self._revision: int | None = None
        """The revision of our entry while we hold the lease."""
        self._authority_until = 0.0
        self._deciding = False
        self.holder: str | None = None
        self.term = 0
        """The bucket revision at which this daemon last took the lease: terms of all the
        daemons are ordered by it."""

    async def open(self, client: Client) -> None:
        """Open (or make) the bucket on as many servers as asked; raises
        ``LeaseSettingsError`` when it exists with another time to live than ``ttl`` (the
        daemons must all use the same), ``common.buckets.BucketReplicasError`` when the
        servers cannot hold its replicas."""
        self._client = client
        bucket = await open_key_value(client.jetstream(), LEASE_BUCKET,
                                      replicas=self._replicas, ttl=self._ttl)
        status = await bucket.status()
        if status.ttl is None or abs(status.ttl - self._ttl) > 1e-3:
            raise LeaseSettingsError(
                f"the lease bucket {LEASE_BUCKET} expires entries after "
                f"{status.ttl or 0:g}s but --lease-ttl is {self._ttl:g}s: give every daemon "
                f"the same --lease-ttl, or delete the bucket ({LEASE_BUCKET}) while no daemon "
                "runs")
        self._bucket = bucket

    async def reattach(self, client: Client) -> None:
        """Use the bucket through a new NATS client (the old one was closed for good)."""
        self._client = client
        self._bucket = await client.jetstream().key_value(LEASE_BUCKET)

    @property
    def role(self) -> Role:
        return "leader" if self.leading() else "standby"

    def leading(self) -> bool:
        return self._deciding and self._clock() < self._authority_until

    def authority_left(self) -> float:
        """Seconds this daemon may still decide; 0 when it may not."""
        return max(0.0, self._authority_until - self._clock()) if self._deciding else 0.0

    def refusal(self) -> str | None:
        if self.leading():
            return None
        holder = self.holder if self.holder and self.holder != self.identity else None
        return (f"standby: {holder} holds the lease" if holder else
                "standby: no daemon holds the lease now; it is taken within "
                f"{self._ttl:g}s")

    def describe(self) -> dict[str, object]:
        return {"role": self.role, "identity": self.identity,
                "holder": self.identity if self.leading() else self.holder,
                "lease": f"NATS key-value {LEASE_BUCKET}/{LEASE_KEY}", "ttl_s": self._ttl,
                "term": self.term}

    async def start(self) -> None:
        await self.renew_or_take()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._renew_period if self._revision is not None
                                else self._renew_period / 4)
            await self.renew_or_take()

    async def renew_or_take(self) -> None:
        """One round: renew the lease held, or try to take it."""
        if self._revision is not None:
            await self._renew()
        else:
            await self._try_to_take()

    async def _renew(self) -> None:
        lost = await self._renewal()
        if lost is not None:
            await self._demote(lost)

    async def _renewal(self) -> str | None:
        """Write the lease held again; why it is lost, if it is (a renewal that got no
        answer loses it only past the renew deadline)."""
        assert self._bucket is not None and self._revision is not None
        sent = self._clock()
        try:
            revision = await asyncio.wait_for(
                self._bucket.update(LEASE_KEY, self.identity.encode(), last=self._revision),
                timeout=max(self._authority_until - sent, self._renew_period))
        except nats.js.errors.KeyWrongLastSequenceError:
            return "the lease was taken over (it expired before it was renewed)"
        except _NOT_DONE as error:
            if self._clock() >= self._authority_until:
                return (f"the lease was not renewed for {self._renew_deadline:g}s "
                        f"({describe_error(error)})")
            return None
        self._revision = revision
        self._authority_until = sent + self._renew_deadline
        return None

    async def _try_to_take(self) -> None:
        assert self._bucket is not None
        sent = self._clock()
        try:
            try:
                entry = await asyncio.wait_for(self._bucket.get(LEASE_KEY),
                                               timeout=self._renew_deadline)
            except nats.js.errors.KeyNotFoundError:  # never held, expired, or handed on
                revision = await asyncio.wait_for(
                    self._bucket.create(LEASE_KEY, self.identity.encode()),
                    timeout=self._renew_deadline)
            else:
                holder = (entry.value or b"").decode(errors="replace")
                if holder != self.identity:
                    self.holder = holder
                    return
                # Our own identity: this daemon restarted (the one before it is gone, as an
                # identity is one host's listener); take the lease back at once.
                revision = await asyncio.wait_for(
                    self._bucket.update(LEASE_KEY, self.identity.encode(),
                                        last=entry.revision),
                    timeout=self._renew_deadline)
        except nats.js.errors.KeyWrongLastSequenceError:
            return  # another daemon took it first
        except _NOT_DONE as error:
            logger.debug("lease not taken: %s", describe_error(error))
            return
        self._revision = revision
        self._authority_until = sent + self._renew_deadline
        self.holder = self.identity
        self.term = revision
        logger.info("leading: took the lease %s/%s (term %d)", LEASE_BUCKET, LEASE_KEY,
                    revision)
        # The lease is renewed while the takeover works: one that takes longer than the
        # lease's life (the pod store read at 5,000 nodes and pods) would otherwise lose
        # it, take it again and start over, for ever.
        finished = asyncio.Event()
        keeper = asyncio.create_task(self._keep_while_taking_over(finished))
        try:
            await self._on_elected()
        except TakeOverFailed as error:
            await self._stop_keeping(keeper, finished)
            await self._hand_on(self._revision or revision)
            self._revision = None
            logger.warning("standing by: the lease is handed on (term %d): %s", revision, error)
            return
        except BaseException:
            keeper.cancel()  # going down: its last renewal need not land
            await self._hand_on(self._revision or revision)
            self._revision = None
            raise
        lost = await self._stop_keeping(keeper, finished)
        if lost is not None:
            self._revision = None
            self.holder = None
            logger.warning("standing by: %s during the takeover (term %d)", lost, revision)
            return
        self._deciding = True

    async def _keep_while_taking_over(self, finished: asyncio.Event) -> str | None:
        """Renew the lease every renew period until the takeover has ``finished``; why it
        was lost, if it was (it then stops: the takeover's end is where the daemon stands
        by). A renewal under way is let finish, so that the revision held stays ours."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), self._renew_period)
            if finished.is_set():
                return None
            lost = await self._renewal()
            if lost is not None:
                return lost

    @staticmethod
    async def _stop_keeping(keeper: asyncio.Task[str | None],
                            finished: asyncio.Event) -> str | None:
        """The keeper told the takeover is over and waited for; why the lease was lost
        meanwhile, None if it was kept."""
        finished.set()
        try:
            return await keeper
        except Exception as error:  # a bug of the keeper's: the lease is not known held
            return f"renewing the lease failed ({error!r})"

    async def _demote(self, why: str) -> None:
        was_deciding = self._deciding
        self._revision = None
        self._deciding = False
        self.holder = None
        logger.warning("standing by: %s", why)
        if was_deciding:
            await self._on_demoted()

    async def _hand_on(self, revision: int) -> None:
        """Delete our entry, only if it is still the one we wrote."""
        if self._bucket is None:
            return
        with contextlib.suppress(*_NOT_DONE, nats.js.errors.KeyWrongLastSequenceError):
            await asyncio.wait_for(self._bucket.delete(LEASE_KEY, last=revision), timeout=1.0)
            logger.info("lease %s/%s handed on", LEASE_BUCKET, LEASE_KEY)

    async def resign(self) -> None:
        if self._revision is None or self._client is None or not self._client.is_connected:
            return  # nothing to hand on, or no way to: the lease expires by itself
        revision, self._revision = self._revision, None
        self._deciding = False
        await self._hand_on(revision)
