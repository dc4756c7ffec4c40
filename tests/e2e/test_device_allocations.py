"""The device plugin's questions on the real control plane: a pod kube-scheduler bound
through pyhami waits for its cards on gpu-node-1, and the plugin's outcome reaches the Pod.

The test speaks on NATS as the daemon's user (the password in the daemon's Secret): it
plays the agent's part on the bus, whose permissions ``tests/scheduler`` checks.
"""

from __future__ import annotations

import asyncio

import nats

from common.busaccess import DAEMON_USER
from common.wire import (
    AllocationOutcome,
    PendingAllocations,
    allocated_subject,
    allocations_subject,
    decode_pending,
    encode,
)
from harness.controlplane import wait_for
from tests.e2e.controlplane import NODE, TEST_NAMESPACE, ControlPlane
from tests.e2e.pods import ClusterLab


async def _ask_then_report(plane: ControlPlane, outcome: AllocationOutcome | None,
                           ) -> PendingAllocations:
    password = plane.nats_auth()["daemon.password"].strip()
    client = await nats.connect(plane.nats_urls, user=DAEMON_USER, password=password)
    try:
        reply = await client.request(allocations_subject(NODE), b"", timeout=10)
        if outcome is not None:
            await client.publish(allocated_subject(NODE), encode(outcome))
            await client.flush()
        return decode_pending(reply.data)
    finally:
        await client.close()


def test_a_bound_pod_is_listed_for_its_node_and_its_outcome_reaches_the_pod(
        lab: ClusterLab) -> None:
    placed = lab.place("plugin-served")
    uid = lab.read("plugin-served")["metadata"]["uid"]
    outcome = AllocationOutcome(namespace=TEST_NAMESPACE, name="plugin-served", uid=uid,
                                ok=True)
    pending = asyncio.run(_ask_then_report(lab.plane, outcome))
    assert [(p.namespace, p.name, p.uid) for p in pending.pods] == [
        (TEST_NAMESPACE, "plugin-served", uid)]
    assert pending.pods[0].devices == placed.annotations["hami.io/vgpu-devices-to-allocate"]

    def phase() -> str | None:
        annotations = lab.read("plugin-served")["metadata"].get("annotations", {})
        value: str | None = annotations.get("hami.io/bind-phase")
        return value if value == "success" else None

    wait_for(phase, "hami.io/bind-phase success on the Pod")
    assert asyncio.run(_ask_then_report(lab.plane, None)).pods == []
