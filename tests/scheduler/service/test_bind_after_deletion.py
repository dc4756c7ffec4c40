"""A pod deleted while its bind is under way: the watch frees its cards, and the bind's
end books nothing (before, it booked them again for a pod that no longer existed, and the
ledger kept them until a restart)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from common.core import parse_pod
from pyhami.sandbox import DEFAULTS
from scheduler.cluster import ClusterPod, PodChange
from scheduler.service import SchedulerService, ServiceSettings
from tests.builders import manifest
from tests.fakes.clock import Clock
from tests.fakes.node_list import NodeList, inventory, silent


class SlowBinding(NodeList):
    """Binds once ``release`` is set, as an API server slow to answer."""

    def __init__(self, nodes: set[str]) -> None:
        super().__init__(nodes)
        self.release = asyncio.Event()
        self.binding = asyncio.Event()

    async def bind(self, namespace: str, name: str, uid: str, node: str,  # type: ignore[override]
                   annotations: Mapping[str, str | None], *,
                   labels: Mapping[str, str] | None = None) -> None:
        self.binding.set()
        await self.release.wait()


async def test_a_pod_deleted_during_its_bind_keeps_no_card() -> None:
    cluster = SlowBinding({"a"})
    service = SchedulerService(ServiceSettings(DEFAULTS), cluster, silent, clock=Clock(0.0))
    service.state.nodes.ingest(inventory("a", 1), now=0.0)
    service.shared.ready = True
    pod = manifest("p")
    filtered = await service.verbs.filter(pod, ["a"])
    assert filtered.passing == ["a"]
    binding = asyncio.create_task(service.verbs.bind(namespace="default", name="p",
                                                     uid="u", node="a"))
    await cluster.binding.wait()
    # The watch sees the pod deleted while the binding is under way.
    await service.handlers.pods.on_pod_change(PodChange(
        ClusterPod(pod, "u", "a", "Running", {}), deleted=True))
    cluster.release.set()
    assert await binding is None
    assert service.state.cache.bound == set()
    assert service.state.cache.reservation_count == 0
    assert service.state.fleet.allocation("default/p") is None


async def test_a_pod_bound_as_usual_keeps_its_cards() -> None:
    cluster = SlowBinding({"a"})
    cluster.release.set()
    service = SchedulerService(ServiceSettings(DEFAULTS), cluster, silent, clock=Clock(0.0))
    service.state.nodes.ingest(inventory("a", 1), now=0.0)
    service.shared.ready = True
    pod = manifest("p")
    await service.verbs.filter(pod, ["a"])
    assert await service.verbs.bind(namespace="default", name="p", uid="u", node="a") is None
    assert service.state.cache.bound == {"default/p"}
    assert parse_pod(pod, DEFAULTS).key == "default/p"
