"""``NatsLease``, the standalone daemons' election, on a real nats-server with JetStream:
one holder at a time, a handover on resigning, a restarted daemon taking its own lease
back, and a holder that stops deciding at its deadline by its own clock alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client

from pyhami.natsserver import LocalNatsServer
from scheduler.leadership import (
    LEASE_BUCKET,
    LEASE_KEY,
    Hook,
    LeaseSettingsError,
    NatsLease,
    TakeOverFailed,
)
from tests.fakes.clock import Clock

TTL, RENEW, DEADLINE = 4.0, 1.0, 2.5


@pytest.fixture
async def client(jetstream_server: LocalNatsServer) -> AsyncIterator[Client]:
    connection = await nats.connect(jetstream_server.url)
    yield connection
    await connection.close()


def lease(identity: str, elected: list[str], clock: Clock | None = None,
          ttl: float = TTL, on_elected: Hook | None = None) -> NatsLease:
    async def elected_now() -> None:
        elected.append(identity)

    async def on_demoted() -> None:
        elected.append(f"{identity} stood down")

    hook = on_elected or elected_now
    if clock is None:
        return NatsLease(identity, ttl=ttl, renew_period=RENEW, renew_deadline=DEADLINE,
                         on_elected=hook, on_demoted=on_demoted)
    return NatsLease(identity, ttl=ttl, renew_period=RENEW, renew_deadline=DEADLINE,
                     on_elected=hook, on_demoted=on_demoted, clock=clock)


async def test_one_holder_and_a_standby_that_names_it(client: Client) -> None:
    elected: list[str] = []
    first, second = lease("a", elected), lease("b", elected)
    await first.open(client)
    await second.open(client)
    await first.start()
    await second.start()
    assert (first.role, second.role) == ("leader", "standby")
    assert second.refusal() == "standby: a holds the lease"
    assert first.refusal() is None
    assert elected == ["a"]
    await first.renew_or_take()
    await second.renew_or_take()
    assert (first.leading(), second.leading()) == (True, False)


async def test_resigning_hands_the_lease_on_at_once(client: Client) -> None:
    elected: list[str] = []
    first, second = lease("a", elected), lease("b", elected)
    for one in (first, second):
        await one.open(client)
        await one.start()
    await first.resign()
    assert not first.leading()
    await second.renew_or_take()
    assert second.leading()
    assert elected == ["a", "b"]


async def test_a_daemon_restarted_with_its_identity_takes_its_lease_back(
        client: Client) -> None:
    elected: list[str] = []
    before = lease("a", elected)
    await before.open(client)
    await before.start()  # then it dies without resigning: its entry lives on
    after, other = lease("a", elected), lease("b", elected)
    for one in (other, after):
        await one.open(client)
        await one.start()
    assert (after.leading(), other.leading()) == (True, False)
    assert elected == ["a", "a"]


async def test_the_holder_stops_deciding_at_its_deadline_without_hearing_anything(
        client: Client) -> None:
    clock = Clock(1000.0)  # the monotonic clock the lease reads
    elected: list[str] = []
    holder = lease("a", elected, clock)
    await holder.open(client)
    await holder.start()
    assert holder.leading()
    clock.now += DEADLINE - 0.01
    assert holder.leading()
    clock.now += 0.02  # past the deadline: its last renewal went out 2.5 s ago
    assert not holder.leading()
    assert (holder.refusal() or "").startswith("standby")


async def test_a_holder_whose_lease_was_taken_over_stands_down(client: Client) -> None:
    elected: list[str] = []
    holder, other = lease("a", elected), lease("b", elected)
    for one in (holder, other):
        await one.open(client)
        await one.start()
    # The entry expired (here: deleted, as the server would) and b took it meanwhile.
    bucket = await client.jetstream().key_value("pyhami-leader")
    await bucket.delete("leader")
    await other.renew_or_take()
    assert other.leading()
    await holder.renew_or_take()
    assert not holder.leading()
    assert elected == ["a", "b", "a stood down"]


async def test_a_bucket_made_with_another_ttl_is_refused_by_name(client: Client) -> None:
    first = lease("a", [])
    await first.open(client)
    with pytest.raises(LeaseSettingsError, match=r"expires entries after 4s but --lease-ttl "
                                                 r"is 6s"):
        await lease("b", [], ttl=6.0).open(client)


async def test_a_daemon_that_cannot_get_ready_hands_the_lease_on_without_crashing(
        client: Client, caplog: pytest.LogCaptureFixture) -> None:
    """Its store did not answer while it read every pod: it stands by and the other
    daemon takes the lease at once, with one warning and no traceback."""
    elected: list[str] = []

    async def store_times_out() -> None:
        elected.append("a tried")
        raise TakeOverFailed("the pod store could not be read (nats: timeout)")

    async def stood_down() -> None:
        elected.append("a stood down")

    failing = NatsLease("a", ttl=TTL, renew_period=RENEW, renew_deadline=DEADLINE,
                        on_elected=store_times_out, on_demoted=stood_down)
    other = lease("b", elected)
    for one in (failing, other):
        await one.open(client)
    await failing.start()
    assert not failing.leading()
    await other.start()
    assert other.leading()
    assert elected == ["a tried", "b"]
    handed = [r for r in caplog.records if "handed on" in r.getMessage()]
    assert [r.getMessage() for r in handed] == [
        "standing by: the lease is handed on (term 1): the pod store could not be read "
        "(nats: timeout)"]
    assert handed[0].exc_info is None


async def test_a_takeover_longer_than_the_lease_keeps_it_renewed(client: Client) -> None:
    """The pod store read at 5,000 nodes and pods outlasted the lease's 4 s: the lease is
    renewed while the takeover works, and the daemon leads once it is done."""
    elected: list[str] = []

    async def slow_takeover() -> None:
        await asyncio.sleep(TTL + 1.5)
        elected.append("a")

    slow = lease("a", elected, on_elected=slow_takeover)
    other = lease("b", elected)
    for one in (slow, other):
        await one.open(client)
    await slow.start()
    assert slow.leading()
    await other.start()
    assert not other.leading() and other.refusal() == "standby: a holds the lease"
    await slow.renew_or_take()
    assert slow.leading()
    assert elected == ["a"]


async def test_a_lease_lost_during_the_takeover_leaves_the_daemon_standing_by(
        client: Client, caplog: pytest.LogCaptureFixture) -> None:
    elected: list[str] = []
    other = lease("b", elected)
    await other.open(client)

    async def overtaken() -> None:
        # Another daemon writes the lease meanwhile (as after an expiry nobody renewed).
        bucket = await client.jetstream().key_value(LEASE_BUCKET)
        await bucket.delete(LEASE_KEY)
        await other.start()
        await asyncio.sleep(RENEW * 1.5)

    losing = lease("a", elected, on_elected=overtaken)
    await losing.open(client)
    await losing.start()
    assert not losing.leading()
    assert other.leading()
    assert any("standing by: the lease was taken over" in r.getMessage()
               and "during the takeover (term" in r.getMessage() for r in caplog.records)
