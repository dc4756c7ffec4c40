"""MIG through the standalone daemon: a node of A100s in MIG mode (a simulated agent over
the simulated NVML), the reservation written with the allocation, listed for the node's
device plugin, completed with the instances the node made, and read back after a restart."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import nats
import pytest
from nats.aio.client import Client

from common.core.mig import MIG_ALLOCATIONS_ANNOTATION, decode_reservations
from common.wire import (
    AllocationOutcome,
    MigRuntime,
    PendingAllocations,
    allocated_subject,
    allocations_subject,
    decode_pending,
    encode,
)
from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsServer
from pyhami.sandbox import RunningDaemon, SimulatedAgent, standalone_config
from tests.harness import Lab, PodClient, eventually

NODE = "gpu-mig-1"
MIG_POD = {"nvidia.com/vgpu-mode": "mig"}


@pytest.fixture
async def mig_lab(jetstream_server: LocalNatsServer,
                  http: aiohttp.ClientSession) -> AsyncIterator[Lab]:
    node = SimulatedAgent.start(NODE, jetstream_server.url, profile="a100x8-mig")
    daemon = await RunningDaemon(standalone_config(jetstream_server.url)).start()
    lab = Lab(jetstream_server, node, daemon, PodClient(http, daemon.url))
    yield lab
    await lab.daemon.stop()
    await node.halt()


@pytest.fixture
async def bus(mig_lab: Lab) -> AsyncIterator[Client]:
    client = await nats.connect(mig_lab.nats.url)
    yield client
    await client.close()


async def pending(bus: Client) -> PendingAllocations:
    return decode_pending((await bus.request(allocations_subject(NODE), b"", timeout=5)).data)


def small(name: str) -> dict[str, object]:
    return lab_pod(name, MIG_POD, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000})


async def test_the_reservation_is_written_listed_and_completed_by_the_nodes_outcome(
        mig_lab: Lab, bus: Client) -> None:
    allocated = await mig_lab.pods.submit_and_place(small("first"))
    pod = await mig_lab.pods.get("first")
    (reserved,) = decode_reservations(pod["annotations"][MIG_ALLOCATIONS_ANNOTATION])
    assert (reserved.profile, reserved.placement.start, reserved.placement.size) == (
        "1g.10gb", 6, 1)
    assert allocated == f"{reserved.gpu_uuid},NVIDIA,9728,15:;"
    answer = await pending(bus)
    assert [p.mig_allocations for p in answer.pods] == [
        pod["annotations"][MIG_ALLOCATIONS_ANNOTATION]]
    assert [p.mig_allocations for p in answer.holding or ()] == [
        pod["annotations"][MIG_ALLOCATIONS_ANNOTATION]]
    await bus.publish(allocated_subject(NODE), encode(AllocationOutcome(
        namespace="default", name="first", uid=pod["uid"], ok=True, mig_instances=(
            MigRuntime(container_index=0, device_index=0, mig_uuid="MIG-one",
                       gpu_instance_id=13, compute_instance_id=0),))))

    async def recorded() -> bool:
        notes = (await mig_lab.pods.get("first"))["annotations"]
        return notes.get("hami.io/bind-phase") == "success" and "MIG-one" in notes.get(
            MIG_ALLOCATIONS_ANNOTATION, "")

    await eventually(recorded, "the runtime identity written with the bind-phase")
    assert mig_lab.daemon.service is not None
    registry = mig_lab.daemon.service.metrics.registry
    labels = {"node": NODE, "device_uuid": reserved.gpu_uuid, "device_index": "0",
              "mig_uuid": "MIG-one", "profile": "1g.10gb", "gpu_instance_id": "13",
              "compute_instance_id": "0", "placement_start": "6", "placement_size": "1"}

    async def exported() -> bool:
        return registry.get_sample_value("hami_node_gpu_mig_instance_info", labels) == 1

    await eventually(exported, "hami_node_gpu_mig_instance_info for the instance")
    notes = (await mig_lab.pods.get("first"))["annotations"]
    assert json.loads(notes[MIG_ALLOCATIONS_ANNOTATION]) == [{
        "containerIndex": 0, "deviceIndex": 0, "gpuUUID": reserved.gpu_uuid,
        "profile": "1g.10gb", "placement": {"start": 6, "size": 1}, "migUUID": "MIG-one",
        "gpuInstanceID": 13, "computeInstanceID": 0}]


async def test_an_instance_no_reservation_names_is_refused_and_the_phase_still_written(
        mig_lab: Lab, bus: Client) -> None:
    await mig_lab.pods.submit_and_place(small("odd"))
    pod = await mig_lab.pods.get("odd")
    await bus.publish(allocated_subject(NODE), encode(AllocationOutcome(
        namespace="default", name="odd", uid=pod["uid"], ok=True, mig_instances=(
            MigRuntime(container_index=0, device_index=5, mig_uuid="MIG-x",
                       gpu_instance_id=1, compute_instance_id=0),))))

    async def succeeded() -> bool:
        notes = (await mig_lab.pods.get("odd"))["annotations"]
        return notes.get("hami.io/bind-phase") == "success"

    await eventually(succeeded, "the bind-phase written")
    notes = (await mig_lab.pods.get("odd"))["annotations"]
    assert "MIG-x" not in notes[MIG_ALLOCATIONS_ANNOTATION]


async def test_a_restarted_daemon_reads_the_reservations_back(mig_lab: Lab) -> None:
    await mig_lab.pods.submit_and_place(small("before"))
    await mig_lab.restart_daemon()
    # Binpack takes the busiest card, the one "before" holds: its slice 6 must be known
    # taken, from the annotation alone.
    after = small("after")
    after["metadata"]["annotations"]["hami.io/gpu-scheduler-policy"] = "binpack"  # type: ignore[index]
    await mig_lab.pods.submit_and_place(after)
    (first,) = decode_reservations(
        (await mig_lab.pods.get("before"))["annotations"][MIG_ALLOCATIONS_ANNOTATION])
    (second,) = decode_reservations(
        (await mig_lab.pods.get("after"))["annotations"][MIG_ALLOCATIONS_ANNOTATION])
    assert (second.gpu_uuid, second.placement.start) == (first.gpu_uuid, 5)


async def test_a_shared_card_pod_is_refused_on_the_mig_node(mig_lab: Lab) -> None:
    await mig_lab.pods.submit(lab_pod("shared", {"nvidia.com/vgpu-mode": "hami-core"}))

    async def reasoned() -> bool:
        pod = await mig_lab.pods.get("shared")
        return "CardTypeMismatch" in json.dumps(pod)

    await eventually(reasoned, "the pod refused with CardTypeMismatch")
