"""The measured usage the agent sends: the monitor's model converted to the wire, the
inventory's size with it, and when an agent on a real nats-server sends it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import nats
import pytest
from nats.aio.subscription import Subscription

from agent.monitor.model import ContainerUsage, DeviceUsage, HostCard
from agent.service import Agent, AgentSettings
from agent.usage import LatestUsage, measured_from
from agent.vendors.nvidia.simulated import SimulatedSource, profile_cards
from common.messaging import NatsSettings
from common.wire import (
    INVENTORY_SUBJECTS,
    SCHEMA_VERSION,
    Inventory,
    Measured,
    MeasuredCard,
    MeasuredContainer,
    decode_inventory,
    encode,
)
from pyhami.natsserver import LocalNatsServer

NODE = "gpu-node-1"
MIB = 1024 * 1024
DELIVERY_SLACK_S = 0.3


def _container(uid: str, name: str, *devices: DeviceUsage,
               source: str = "hami-core") -> ContainerUsage:
    return ContainerUsage(pod_uid=uid, container=name, devices=devices,
                          source="nvml" if source == "nvml" else "hami-core")


def _device(uuid: str, used: int, utilization: int = 0, limit: int | None = None) -> DeviceUsage:
    return DeviceUsage(vdevice_index=0, device_uuid=uuid, memory_used=used,
                       utilization=utilization, memory_limit=limit)


def test_the_monitors_model_becomes_the_wires_measured_in_mib() -> None:
    cards = [HostCard(index=0, uuid="GPU-0", name="A100", memory_used=3 * MIB + 5,
                      utilization=42, memory_utilization=7),
             HostCard(index=1, uuid="GPU-1", name="A100", memory_used=None, utilization=None,
                      memory_utilization=None)]
    containers = [
        _container("uid-1", "train", _device("GPU-0", 2 * MIB - 1, 250, 8000 * MIB),
                   _device("GPU-1", 10 * MIB, 5, 8000 * MIB)),
        _container("uid-2", "", _device("GPU-0", 1 * MIB, 3), source="nvml")]
    measured = measured_from(cards, containers, at=1700000000.0)
    assert measured == Measured(at=1700000000.0, cards=[
        MeasuredCard(uuid="GPU-0", memory_used=3, utilization=42),
        MeasuredCard(uuid="GPU-1", memory_used=None, utilization=None)], containers=[
        MeasuredContainer(pod_uid="uid-1", container="train", device_uuid="GPU-1",
                          memory_used=10, utilization=5, memory_limit=8000, source="hami-core"),
        MeasuredContainer(pod_uid="uid-1", container="train", device_uuid="GPU-0",
                          memory_used=1, utilization=250, memory_limit=8000, source="hami-core"),
        MeasuredContainer(pod_uid="uid-2", container="", device_uuid="GPU-0", memory_used=1,
                          utilization=3, source="nvml")], dropped=0)


@pytest.mark.parametrize(("usage", "sent", "dropped"), [
    (_container("u", "c", _device("GPU-0", 2**60, 10**6)), [(2**24, 10000)], 0),
    (_container("u", "c", _device("GPU-0", -5, -1)), [(0, 0)], 0),
    (_container("u" * 129, "c", _device("GPU-0", MIB)), [], 1),
    (_container("", "c", _device("GPU-0", MIB)), [], 1),
    (_container("u", "c" * 254, _device("GPU-0", MIB)), [], 1),
    (_container("u", "c", _device("GPU 0", MIB), _device("GPU-1", MIB)), [(1, 0)], 1),
    (_container("u", "c", _device("GPU-1", MIB), _device("GPU-1", 5 * MIB)), [(1, 0)], 1),
], ids=["figures-clamped", "negative-figures", "pod-uid-too-long", "pod-uid-empty",
        "container-name-too-long", "card-uuid-unsendable", "card-twice"])
def test_what_no_message_may_carry_is_clamped_or_left_out_and_counted(
        usage: ContainerUsage, sent: list[tuple[int, int]], dropped: int) -> None:
    measured = measured_from([], [usage], at=1.0)
    assert [(entry.memory_used, entry.utilization) for entry in measured.containers] == sent
    assert measured.dropped == dropped
    # Whatever the monitor measured, the message goes through the daemon's decoder.
    decode_inventory(encode(_inventory(measured)))


def test_beyond_the_bound_the_entries_using_the_least_memory_are_dropped_and_counted() -> None:
    containers = [_container(f"uid-{i}", "c", _device("GPU-0", i * MIB)) for i in range(10)]
    measured = measured_from([], containers, at=1.0, limit=4)
    assert [entry.pod_uid for entry in measured.containers] == [
        "uid-9", "uid-8", "uid-7", "uid-6"]
    assert measured.dropped == 6


def test_latest_usage_keeps_the_last_measurement() -> None:
    latest = LatestUsage()
    assert latest.measured() is None
    first = latest.record([], [_container("u", "c", _device("GPU-0", MIB))], at=1.0)
    assert latest.measured() is first
    latest.record([], [], at=2.0)
    assert latest.measured() == Measured(at=2.0)


def _inventory(measured: Measured | None, cards_profile: str = "t4x4") -> Inventory:
    return Inventory(schema=SCHEMA_VERSION, node=NODE, agent_version="0.1.0",
                     instance="0123456789abcdef", sequence=123456, timestamp=1700000000.123,
                     reason="change", heartbeat_interval=10.0,
                     cards=profile_cards(cards_profile, NODE), slices_enforced=True,
                     measured=measured)


# The inventory of the largest profile (8 cards, each listing its 7 NVLink peers; the
# profile's card UUIDs are 16 characters) with the usage of 80 containers, 10 on each card,
# with Kubernetes' 36-character uids. Measured: 2,766 bytes without usage, 15,782 with it
# (docs/agent.md, "Measured usage").
INVENTORY_WITH_USAGE_MAX_BYTES = 16 * 1024


def test_an_inventory_with_the_usage_of_8_cards_and_80_containers_stays_under_its_bound(
        ) -> None:
    cards = profile_cards("a100x8-nvswitch", NODE)
    host = [HostCard(index=card.index, uuid=card.uuid, name=card.type,
                     memory_used=70000 * MIB, utilization=100, memory_utilization=80)
            for card in cards]
    containers = [
        _container(f"6b1c8f1e-{i:04d}-4000-8000-{i:012d}", f"worker-{i}",
                   _device(cards[i % 8].uuid, 7000 * MIB + i, 100, 8192 * MIB))
        for i in range(80)]
    measured = measured_from(host, containers, at=1700000000.123)
    assert (len(measured.cards), len(measured.containers), measured.dropped) == (8, 80, 0)
    with_usage = len(encode(_inventory(measured, "a100x8-nvswitch")))
    without = len(encode(_inventory(None, "a100x8-nvswitch")))
    assert with_usage <= INVENTORY_WITH_USAGE_MAX_BYTES, with_usage
    assert with_usage - without <= 13 * 1024, (with_usage, without)


# The agent on a real nats-server.


class Inbox:
    def __init__(self, subscription: Subscription) -> None:
        self._subscription = subscription

    async def next(self, timeout: float) -> tuple[float, Inventory]:
        message = await self._subscription.next_msg(timeout=timeout)
        return time.monotonic(), decode_inventory(message.data)

    async def none_within(self, seconds: float) -> None:
        with pytest.raises(nats.errors.TimeoutError):
            await self._subscription.next_msg(timeout=seconds)


@asynccontextmanager
async def agent_and_inbox(url: str, usage: LatestUsage,
                          usage_interval: float) -> AsyncIterator[Inbox]:
    client = await nats.connect(url)
    subscription = await client.subscribe(INVENTORY_SUBJECTS)
    await client.flush()
    settings = AgentSettings(NODE, poll_interval=0.2, heartbeat_interval=30.0,
                             usage_interval=usage_interval)
    stop = asyncio.Event()
    source = SimulatedSource(profile_cards("t4x4", NODE))
    task = asyncio.create_task(Agent(settings, source, NatsSettings(servers=(url,)),
                                     usage=usage).run(stop))
    try:
        yield Inbox(subscription)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await client.close()


def _use(latest: LatestUsage, mib: int, at: float) -> Measured:
    return latest.record(
        [HostCard(index=0, uuid=f"GPU-{NODE}-0", name="T4", memory_used=mib * MIB,
                  utilization=50, memory_utilization=10)],
        [_container("uid-1", "app", _device(f"GPU-{NODE}-0", mib * MIB, 50))], at=at)


async def test_usage_goes_with_every_message_and_its_changes_at_most_every_interval(
        nats_server: LocalNatsServer) -> None:
    interval = 1.0
    latest = LatestUsage()
    first = _use(latest, 100, at=1.0)
    async with agent_and_inbox(nats_server.url, latest, interval) as inbox:
        started, start = await inbox.next(timeout=5.0)
        assert (start.reason, start.measured) == ("start", first)
        second = _use(latest, 200, at=2.0)
        arrived, usage = await inbox.next(timeout=interval + DELIVERY_SLACK_S)
        assert (usage.reason, usage.measured) == ("change", second)
        assert arrived - started >= interval * 0.9  # not sooner than the interval
        # Changes in quick succession: the latest goes out, an interval after the last.
        _use(latest, 300, at=3.0)
        third = _use(latest, 400, at=4.0)
        then, usage = await inbox.next(timeout=interval + DELIVERY_SLACK_S)
        assert usage.measured == third
        assert then - arrived >= interval * 0.9
        # A new moment of the same figures is no change: nothing goes out for it.
        _use(latest, 400, at=5.0)
        await inbox.none_within(interval * 2)


async def test_a_usage_interval_of_0_sends_no_usage(nats_server: LocalNatsServer) -> None:
    latest = LatestUsage()
    _use(latest, 100, at=1.0)
    async with agent_and_inbox(nats_server.url, latest, usage_interval=0) as inbox:
        _, start = await inbox.next(timeout=5.0)
        assert start.measured is None
        _use(latest, 200, at=2.0)
        await inbox.none_within(1.0)
