"""A cluster port that only lists Nodes, and agent inventories, for daemon tests without
Kubernetes or NATS."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import msgspec

from agent.vendors.nvidia.simulated import profile_cards
from common.wire import SCHEMA_VERSION, Inventory, inventory_subject
from scheduler.cluster import ClusterPod, EventType, PodChange


def inventory(node: str, sequence: int, instance: str = "a") -> Inventory:
    return Inventory(schema=SCHEMA_VERSION, node=node, agent_version="t", instance=instance,
                     sequence=sequence, timestamp=0.0, reason="change",
                     heartbeat_interval=10.0, cards=profile_cards("t4x4", node))


def inventory_message(node: str, sequence: int) -> tuple[str, bytes]:
    """The subject and body of ``inventory(node, sequence)``, as the daemon receives them."""
    return inventory_subject(node), msgspec.msgpack.encode(inventory(node, sequence))


class NodeList:
    """A cluster that lists the Nodes it is given, and nothing else."""

    def __init__(self, nodes: set[str]) -> None:
        self.nodes = nodes

    async def list_pods(self) -> list[ClusterPod]:
        return []

    async def get_pod(self, namespace: str, name: str) -> ClusterPod | None:
        return None

    async def device_cordons(self) -> dict[str, frozenset[str]]:
        return {name: frozenset() for name in self.nodes}

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: Mapping[str, str]) -> None:
        raise AssertionError("not used")

    async def record_event(self, namespace: str, name: str, kind: EventType, reason: str,
                           message: str) -> None:
        pass

    async def retry_pod(self, namespace: str, name: str, stamp: str) -> None:
        pass

    async def changes(self) -> AsyncIterator[PodChange]:
        raise AssertionError("not used")
        yield  # pragma: no cover


async def silent(_: object) -> None:
    pass
