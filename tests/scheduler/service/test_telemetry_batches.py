"""Decisions and usage go out in batches: the decisions in order, then one usage message
per node changed, at most ``TELEMETRY_BATCH_S`` after the first; settling sends at once."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from common.telemetry import DecisionEvent, UsageEvent
from common.wire import Reason, inventory_subject
from pyhami.sandbox import DEFAULTS
from scheduler.service import SchedulerService, ServiceSettings
from scheduler.service.reporting import RECENT_DECISIONS, TELEMETRY_BATCH_S
from tests.builders import manifest
from tests.fakes.node_list import NodeList, inventory, inventory_message

NODES = ("n1", "n2")


async def service_recording(published: list[DecisionEvent | UsageEvent]) -> SchedulerService:
    async def publish(event: DecisionEvent | UsageEvent) -> None:
        published.append(event)

    service = SchedulerService(ServiceSettings(DEFAULTS), NodeList(set(NODES)), publish)
    service.shared.ready = True
    for node in NODES:
        await service.handlers.inventories.receive_inventory(*inventory_message(node, 1))
    await service.shared.settle()
    published.clear()
    return service


async def filter_pods(service: SchedulerService, names: list[str], node: str) -> None:
    for name in names:
        answer = await service.verbs.filter(manifest(name, policy="binpack"), (node,))
        assert answer.passing == [node]


async def test_decisions_of_one_burst_go_out_in_order_with_one_usage_message_a_node() -> None:
    published: list[DecisionEvent | UsageEvent] = []
    service = await service_recording(published)
    await filter_pods(service, ["a", "b"], "n1")
    await filter_pods(service, ["c"], "n2")
    await asyncio.sleep(0)
    assert published == []  # held for the batch
    await asyncio.sleep(TELEMETRY_BATCH_S * 3)
    decisions = [event for event in published if isinstance(event, DecisionEvent)]
    usage = [event for event in published if isinstance(event, UsageEvent)]
    assert [event.pod for event in decisions] == ["default/a", "default/b", "default/c"]
    assert published[:3] == decisions  # the decisions first, the usage after them
    assert sorted(event.node for event in usage) == ["n1", "n2"]
    n1 = next(event for event in usage if event.node == "n1")
    assert sum(card.tenants for card in n1.cards) == 2  # both pods, in one message


async def test_settling_sends_what_is_held_at_once() -> None:
    published: list[DecisionEvent | UsageEvent] = []
    service = await service_recording(published)
    await filter_pods(service, ["a"], "n1")
    await service.shared.settle()
    # The usage may lead: the filter marks the node at once, its decision's report follows.
    assert sorted(type(event).__name__ for event in published) == ["DecisionEvent",
                                                                    "UsageEvent"]


async def test_a_later_burst_is_a_batch_of_its_own() -> None:
    published: list[DecisionEvent | UsageEvent] = []
    service = await service_recording(published)
    await filter_pods(service, ["a"], "n1")
    await asyncio.sleep(TELEMETRY_BATCH_S * 3)
    await filter_pods(service, ["b"], "n1")
    await asyncio.sleep(TELEMETRY_BATCH_S * 3)
    assert [(type(event).__name__, getattr(event, "pod", None)) for event in published] == [
        ("DecisionEvent", "default/a"), ("UsageEvent", None),
        ("DecisionEvent", "default/b"), ("UsageEvent", None)]


@pytest.mark.parametrize(("names", "gpumem"), [
    pytest.param(("n1", "ghost"), 1000, id="placed-one-node-unknown"),
    pytest.param(NODES, 10**9, id="placed-nowhere"),
])
async def test_the_decision_event_names_the_failed_nodes_the_answer_does(
        names: tuple[str, ...], gpumem: int) -> None:
    published: list[DecisionEvent | UsageEvent] = []
    service = await service_recording(published)
    answer = await service.verbs.filter(manifest("a", gpumem=gpumem), names)
    await service.shared.settle()
    (event,) = [event for event in published if isinstance(event, DecisionEvent)]
    assert answer.failed  # some node failed, with its reasons
    assert event.failed_nodes == answer.failed


@pytest.mark.parametrize(("reason", "republished"), [
    ("resync", ["n2"]),  # an agent answering a resync (a watcher connecting): usage again
    ("heartbeat", []),  # nothing changed and nobody asked: nothing
])
async def test_an_agent_answering_a_resync_gets_its_node_s_usage_published_unchanged(
        reason: Reason, republished: list[str]) -> None:
    published: list[DecisionEvent | UsageEvent] = []
    service = await service_recording(published)
    await filter_pods(service, ["a"], "n2")
    await service.shared.settle()
    published.clear()
    answer = msgspec.structs.replace(inventory("n2", 2), reason=reason)
    await service.handlers.inventories.receive_inventory(inventory_subject("n2"),
                                              msgspec.msgpack.encode(answer))
    await asyncio.sleep(TELEMETRY_BATCH_S * 3)
    assert [event.node for event in published if isinstance(event, UsageEvent)] == republished
    assert all(sum(card.tenants for card in event.cards) == 1 for event in published
               if isinstance(event, UsageEvent))


async def test_the_recent_decisions_are_replayed_in_order_marked_replayed() -> None:
    published: list[DecisionEvent | UsageEvent] = []
    service = await service_recording(published)
    await filter_pods(service, ["a", "b"], "n1")
    await service.shared.settle()
    sent = [event for event in published if isinstance(event, DecisionEvent)]
    published.clear()
    service.reporting.replay_decisions()
    await service.shared.settle()
    assert published == [msgspec.structs.replace(event, replayed=True) for event in sent]
    assert [event.pod for event in sent] == ["default/a", "default/b"]
    assert not any(event.replayed for event in sent)


async def test_only_the_last_recent_decisions_are_kept() -> None:
    published: list[DecisionEvent | UsageEvent] = []
    service = await service_recording(published)
    names = [f"p{i}" for i in range(RECENT_DECISIONS + 5)]
    for name in names:  # refused (too big for a T4), and published all the same
        answer = await service.verbs.filter(manifest(name, gpumem=100_000), NODES)
        assert answer.passing == []
    await service.shared.settle()
    published.clear()
    service.reporting.replay_decisions()
    await service.shared.settle()
    assert [event.pod for event in published if isinstance(event, DecisionEvent)] == [
        f"default/{name}" for name in names[5:]]
