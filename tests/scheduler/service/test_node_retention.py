"""Nodes are forgotten: deleted from the cluster (Kubernetes) or silent beyond the retention
(standalone), in memory and in metrics; the pods on their cards stay booked."""

from __future__ import annotations

import logging

import pytest

from common.core import parse_pod
from pyhami.sandbox import DEFAULTS
from scheduler.service import SchedulerService, ServiceSettings
from scheduler.state import NODE_UNKNOWN, LiveState
from tests.builders import manifest
from tests.fakes.clock import Clock
from tests.fakes.node_list import NodeList, inventory, inventory_message, silent


def service_with(cluster: NodeList, settings: ServiceSettings, clock: Clock) -> SchedulerService:
    return SchedulerService(settings, cluster, silent, clock=clock, wall_clock=clock)


def exposition(service: SchedulerService) -> str:
    return service.metrics.exposition().decode()


def test_a_forgotten_node_is_unknown_to_the_next_decision_even_with_the_same_names() -> None:
    state = LiveState(node_timeout=30, reservation_ttl=60)
    state.nodes.ingest(inventory("a", 1), now=0)
    state.nodes.ingest(inventory("b", 1), now=0)
    asked = ["a", "b"]
    request = parse_pod(manifest("p"), DEFAULTS)
    assert state.cache.preview(request, asked, now=1).failed_nodes in (None, {})
    state.nodes.forget("b")
    # As many known nodes as before: the old cache hid it.
    state.nodes.ingest(inventory("c", 1), now=2)
    failed = state.cache.preview(request, asked, now=3).failed_nodes or {}
    assert failed["b"].startswith(NODE_UNKNOWN)


def test_allocations_on_a_forgotten_node_stay_booked_and_come_back_with_it() -> None:
    state = LiveState(node_timeout=30, reservation_ttl=60)
    state.nodes.ingest(inventory("a", 5), now=0)
    decision = state.cache.filter(parse_pod(manifest("p"), DEFAULTS), ["a"], now=0)
    assert decision.allocation is not None
    state.cache.confirm("default/p", decision.allocation)
    card = decision.allocation.containers[0][0].uuid
    state.nodes.forget("a")
    assert state.fleet.node("a") is None
    assert state.nodes.silence(now=1) == {}
    assert state.fleet.allocation("default/p") == decision.allocation
    assert list(state.fleet.orphans()) == [("a", card)]
    # The same agent instance, with a lower sequence: a forgotten node starts afresh.
    assert state.nodes.ingest(inventory("a", 1), now=2).changed
    assert state.fleet.orphans() == {}
    assert state.fleet.usage("a", card).tenants == 1


async def test_standalone_forgets_a_node_silent_beyond_the_retention(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    service = service_with(NodeList(set()), ServiceSettings(DEFAULTS, node_timeout=30,
                                                            node_retention=600), clock)
    service.handlers.inventories.ingest(*inventory_message("quiet", 1))
    service.handlers.inventories.ingest(*inventory_message("chatty", 1))
    assert 'node="quiet"' in exposition(service)
    caplog.set_level(logging.INFO, logger="scheduler.service")
    for second in range(31, 700, 10):
        clock.now = second
        service.handlers.inventories.ingest(*inventory_message("chatty", second))
        service.handlers.inventories.check_nodes()
    assert service.state.fleet.node("quiet") is None
    assert service.state.fleet.node("chatty") is not None
    assert "quiet" not in service.reporting.status()["node_names"]  # type: ignore[operator]
    assert 'node="quiet"' not in exposition(service)
    lines = [r.getMessage() for r in caplog.records]
    assert sum(line.startswith("node quiet is stale") for line in lines) == 1
    assert sum(line.startswith("node quiet forgotten: silent for ") for line in lines) == 1
    assert not any("chatty" in line for line in lines)


async def test_kubernetes_forgets_a_node_deleted_from_the_cluster(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    cluster = NodeList({"kept", "deleted"})
    service = service_with(cluster, ServiceSettings(DEFAULTS, node_retention=None,
                                                    nodes_listed=True), clock)
    service.handlers.inventories.ingest(*inventory_message("kept", 1))
    service.handlers.inventories.ingest(*inventory_message("deleted", 1))
    clock.now = 1
    await service.handlers.cordons.refresh_cordons()
    assert service.state.fleet.node("deleted") is not None
    cluster.nodes.discard("deleted")
    caplog.set_level(logging.INFO, logger="scheduler.service")
    await service.handlers.cordons.refresh_cordons()
    assert service.state.fleet.node("deleted") is None
    assert service.state.fleet.node("kept") is not None
    assert 'node="deleted"' not in exposition(service)
    assert [r.getMessage() for r in caplog.records if "forgotten" in r.getMessage()] == [
        "node deleted forgotten: its Node is no longer in the cluster"]
    # Silence alone forgets nothing in Kubernetes mode.
    clock.now = 100_000
    service.handlers.inventories.check_nodes()
    assert service.state.fleet.node("kept") is not None


async def test_a_node_first_heard_while_the_node_list_was_read_is_kept() -> None:
    clock = Clock()
    cluster = NodeList(set())
    service = service_with(cluster, ServiceSettings(DEFAULTS, nodes_listed=True), clock)
    real_list = cluster.device_cordons

    async def list_while_a_node_joins() -> dict[str, frozenset[str]]:
        listed = await real_list()
        clock.now = 5
        service.handlers.inventories.ingest(*inventory_message("new", 1))
        return listed

    cluster.device_cordons = list_while_a_node_joins  # type: ignore[method-assign]
    await service.handlers.cordons.refresh_cordons()
    assert service.state.fleet.node("new") is not None
