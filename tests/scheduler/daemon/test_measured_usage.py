"""Measured usage against the live standalone daemon: the node's agent sends what it
measured with its inventory; the daemon shows it beside what it booked (``/statusz``,
``pyhami_card_memory_used_bytes``) and tells a pod, once per window, of a container using
more memory than its slice on a node where nothing enforces the slices."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import nats
import pytest
from nats.aio.client import Client

from common.wire import (
    SCHEMA_VERSION,
    Inventory,
    Measured,
    MeasuredCard,
    MeasuredContainer,
    encode,
    inventory_subject,
)
from pyhami.demo import lab_pod
from scheduler.service import SchedulerService
from tests.harness import Lab, card_of, eventually, metric_sample

NODE = "gpu-node-1"
MIB = 1024 * 1024


class Agent:
    """Speaks for the lab's node once its simulated agent is halted: the same cards, with
    measured usage and the device plugin's word on HAMi-core."""

    def __init__(self, bus: Client, lab: Lab) -> None:
        self._bus = bus
        self._cards = lab.node.source.read()
        self._sequence = 0
        self._service = _service(lab)
        self._last: Measured | None = None

    async def send(self, measured: Measured | None, *, enforced: bool) -> None:
        self._sequence += 1
        self._last = measured
        await self._bus.publish(inventory_subject(NODE), encode(Inventory(
            schema=SCHEMA_VERSION, node=NODE, agent_version="test", instance="measuring",
            sequence=self._sequence, timestamp=time.time(), reason="change",
            heartbeat_interval=10.0, cards=self._cards, slices_enforced=enforced,
            measured=measured)))
        await self._bus.flush()

    async def taken(self) -> None:
        """Until the daemon has taken the last message sent (each measurement differs)."""
        async def last_taken() -> bool:
            return self._service.state.nodes.measured.get(NODE) == self._last

        await eventually(last_taken, f"the daemon taking inventory #{self._sequence}")


@pytest.fixture
async def bus(lab: Lab) -> AsyncIterator[Client]:
    client = await nats.connect(lab.nats.url)
    yield client
    await client.close()


def _service(lab: Lab) -> SchedulerService:
    assert lab.daemon.service is not None
    return lab.daemon.service


async def _placed_and_known(lab: Lab, name: str, mib: int) -> tuple[dict[str, Any], str]:
    """A pod given a ``mib`` slice of one card, once the daemon knows it bound: the pod and
    its card."""
    await lab.pods.submit_and_place(lab_pod(name, limits={"nvidia.com/gpu": 1,
                                                          "nvidia.com/gpumem": mib}))
    pod = await lab.pods.get(name)
    pods = _service(lab).shared.pods

    async def known() -> bool:
        return pods.bound_by_uid(pod["uid"]) is not None

    await eventually(known, f"the daemon knowing {name} bound")
    return pod, card_of(pod["annotations"]["hami.io/vgpu-devices-allocated"])


def _use(pod: dict[str, Any], uuid: str, mib: int, *, card_mib: int = 9000,
         stranger: bool = False) -> Measured:
    containers = [MeasuredContainer(pod_uid=pod["uid"], container="app", device_uuid=uuid,
                                    memory_used=mib, utilization=80, source="nvml")]
    if stranger:  # a pod this daemon never bound
        containers.append(MeasuredContainer(pod_uid="uid-of-no-pod", container="app",
                                            device_uuid=uuid, memory_used=1, utilization=0,
                                            source="nvml"))
    return Measured(at=time.time(), cards=[MeasuredCard(uuid=uuid, memory_used=card_mib,
                                                        utilization=55)],
                    containers=containers)


def _sample(lab: Lab, name: str, labels: dict[str, str] | None = None) -> float | None:
    return _service(lab).metrics.registry.get_sample_value(name, labels or {})


async def _exceeded(lab: Lab, name: str) -> list[str]:
    pod = await lab.pods.get(name)
    return [event["message"] for event in pod["events"] if event["reason"] == "SliceExceeded"]


async def test_a_container_beyond_its_slice_without_hami_core_gets_one_event_per_window(
        lab: Lab, bus: Client, http: aiohttp.ClientSession) -> None:
    pod, uuid = await _placed_and_known(lab, "greedy", 2000)
    await lab.node.halt()
    agent = Agent(bus, lab)
    await agent.send(_use(pod, uuid, 2600, stranger=True), enforced=False)

    async def told() -> bool:
        return bool(await _exceeded(lab, "greedy"))

    await eventually(told, "a SliceExceeded Event on the pod")
    [message] = await _exceeded(lab, "greedy")
    assert message.startswith(f"container app uses 2600 MiB of card {uuid}, more than its "
                              "slice of 2000 MiB")
    # Still over, a moment later: the same window, no second Event.
    await agent.send(_use(pod, uuid, 2700), enforced=False)
    await agent.taken()
    assert len(await _exceeded(lab, "greedy")) == 1
    assert _sample(lab, "pyhami_slice_exceeded_total") == 1
    assert _sample(lab, "pyhami_containers_over_slice", {"node": NODE}) == 1
    assert _sample(lab, "pyhami_measured_usage_unmatched_total") == 1

    # Booked against used, on /statusz and /metrics.
    async with http.get(f"{lab.daemon.url}/statusz") as response:
        status = await response.json()
    [node] = status["usage"]
    assert node["node"] == NODE and node["containers"] == 1
    card = next(card for card in node["cards"] if card["uuid"] == uuid)
    assert (card["booked_mib"], card["used_mib"], card["utilization"]) == (2000, 9000, 55)
    others = [card for card in node["cards"] if card["uuid"] != uuid]
    assert {(card["booked_mib"], card["used_mib"]) for card in others} == {(0, None)}
    assert status["over_slice"] == [{"pod": "default/greedy", "container": "app", "uuid": uuid,
                                     "used_mib": 2700, "slice_mib": 2000}]
    exposition = _service(lab).metrics.exposition().decode()
    index = card["index"]
    assert metric_sample(exposition, (
        f'pyhami_card_memory_used_bytes{{device_index="{index}",device_type="NVIDIA-Tesla T4",'
        f'device_uuid="{uuid}",node="{NODE}"}}')) == 9000 * MIB
    assert metric_sample(exposition, (
        f'pyhami_card_utilization_ratio{{device_index="{index}",device_type="NVIDIA-Tesla T4",'
        f'device_uuid="{uuid}",node="{NODE}"}}')) == 0.55

    # Back within its slice: none over now.
    await agent.send(_use(pod, uuid, 1500), enforced=False)
    await agent.taken()
    assert _sample(lab, "pyhami_containers_over_slice", {"node": NODE}) == 0


@pytest.mark.parametrize(("enforced", "used"), [
    (True, 2600),
    (False, 2000),
], ids=["hami-core-enforces", "within-the-slice"])
async def test_no_event_where_hami_core_enforces_the_slice_or_the_container_keeps_within_it(
        lab: Lab, bus: Client, enforced: bool, used: int) -> None:
    pod, uuid = await _placed_and_known(lab, "tenant", 2000)
    await lab.node.halt()
    agent = Agent(bus, lab)
    await agent.send(_use(pod, uuid, used), enforced=enforced)
    await agent.taken()
    assert _service(lab).state.nodes.measured[NODE].containers[0].memory_used == used
    assert await _exceeded(lab, "tenant") == []
    assert _sample(lab, "pyhami_slice_exceeded_total") == 0
    over = _sample(lab, "pyhami_containers_over_slice", {"node": NODE})
    assert over == (None if enforced else 0)
