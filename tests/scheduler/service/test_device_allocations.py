"""The device plugins' side of the bus against the live standalone daemon: a node's agent
asks which pods wait for their cards and reports how the kubelet's Allocate went."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.client import Client

from common.core import decode_devices
from common.wire import (
    AllocationOutcome,
    HoldingContainer,
    HoldingPod,
    PendingAllocations,
    allocated_subject,
    allocations_subject,
    decode_pending,
    encode,
)
from pyhami.demo import lab_pod
from scheduler.cluster import AllocationPhase, StoreUnavailable
from tests.harness import Lab, card_of, eventually

NODE = "gpu-node-1"


@pytest.fixture
async def bus(lab: Lab) -> AsyncIterator[Client]:
    client = await nats.connect(lab.nats.url)
    yield client
    await client.close()


async def pending(bus: Client, node: str = NODE) -> PendingAllocations:
    reply = await bus.request(allocations_subject(node), b"", timeout=5)
    return decode_pending(reply.data)


async def report(bus: Client, pod: dict[str, Any], ok: bool, reason: str = "",
                 node: str = NODE) -> None:
    outcome = AllocationOutcome(namespace=pod["namespace"], name=pod["name"], uid=pod["uid"],
                                ok=ok, reason=reason)
    await bus.publish(allocated_subject(node), encode(outcome))
    await bus.flush()


def allocations_counted(lab: Lab, result: str) -> float:
    assert lab.daemon.service is not None
    value = lab.daemon.service.metrics.registry.get_sample_value(
        "pyhami_device_allocations_total", {"result": result})
    assert value is not None
    return value


async def test_a_placed_pod_is_listed_for_its_node_with_its_cards(lab: Lab, bus: Client) -> None:
    await lab.pods.submit_and_place(lab_pod("first", limits={"nvidia.com/gpu": 1,
                                                             "nvidia.com/gpumem": 2000}))
    await lab.pods.submit_and_place(lab_pod("second"))
    first, second = await lab.pods.get("first"), await lab.pods.get("second")
    answer = await pending(bus)
    assert answer.node == NODE
    assert [(p.name, p.uid) for p in answer.pods] == [("first", first["uid"]),
                                                      ("second", second["uid"])]
    listed = answer.pods[0]
    notes = first["annotations"]
    assert listed.devices == notes["hami.io/vgpu-devices-to-allocate"]
    assert listed.bind_time == int(notes["hami.io/bind-time"])
    assert decode_devices(listed.devices)[0][0].memory == 2000
    assert (await pending(bus, "gpu-node-2")).pods == []


async def test_success_sets_the_bind_phase_and_the_pod_is_no_longer_listed(
        lab: Lab, bus: Client) -> None:
    await lab.pods.submit_and_place(lab_pod("served"))
    pod = await lab.pods.get("served")
    await report(bus, pod, ok=True)

    async def succeeded() -> bool:
        return (await lab.pods.get("served"))["annotations"]["hami.io/bind-phase"] == "success"

    await eventually(succeeded, "bind-phase success")
    assert (await pending(bus)).pods == []
    assert allocations_counted(lab, "success") == 1


async def test_every_pod_holding_cards_on_the_node_is_listed_until_it_is_gone(
        lab: Lab, bus: Client) -> None:
    await lab.pods.submit_and_place(lab_pod("served"))
    await lab.pods.submit_and_place(lab_pod("waiting"))
    served, waiting = await lab.pods.get("served"), await lab.pods.get("waiting")
    await report(bus, served, ok=True)
    await eventually(lambda: _phase_is(lab, "served", "success"), "bind-phase success")
    answer = await pending(bus)
    assert [pod.name for pod in answer.pods] == ["waiting"]
    assert answer.holding == [
        HoldingPod(namespace="default", name=name, uid=pod["uid"], containers=(
            HoldingContainer(name="app", cards=(card_of(pod["annotations"][
                "hami.io/vgpu-devices-allocated"]),)),))
        for name, pod in (("served", served), ("waiting", waiting))]
    assert (await pending(bus, "gpu-node-2")).holding == []
    await lab.pods.delete("served")

    async def released() -> bool:
        return [pod.name for pod in (await pending(bus)).holding or ()] == ["waiting"]

    await eventually(released, "the deleted pod no longer holding cards")


async def test_an_outcome_sent_again_is_taken_once(lab: Lab, bus: Client) -> None:
    """A device plugin that had not yet seen its outcome written sends it again; the
    daemon neither counts it twice nor overturns the first answer."""
    await lab.pods.submit_and_place(lab_pod("twice"))
    await lab.pods.submit_and_place(lab_pod("marker"))
    pod = await lab.pods.get("twice")
    await report(bus, pod, ok=True)
    await eventually(lambda: _phase_is(lab, "twice", "success"), "bind-phase success")
    await report(bus, pod, ok=True)
    await report(bus, pod, ok=False, reason="a later, contrary report")
    # One subscription handles outcomes in order: once the marker's is written, both
    # repeated ones were handled.
    await report(bus, await lab.pods.get("marker"), ok=True)
    await eventually(lambda: _phase_is(lab, "marker", "success"), "the marker's outcome")
    assert await _phase_is(lab, "twice", "success")
    assert allocations_counted(lab, "success") == 2
    assert allocations_counted(lab, "failed") == 0
    assert [e["reason"] for e in (await lab.pods.get("twice"))["events"]
            if e["reason"] == "AllocationFailed"] == []


async def _phase_is(lab: Lab, name: str, phase: str) -> bool:
    return bool((await lab.pods.get(name))["annotations"]["hami.io/bind-phase"] == phase)


async def test_failure_sets_failed_with_an_event_saying_why(lab: Lab, bus: Client) -> None:
    await lab.pods.submit_and_place(lab_pod("refused"))
    await report(bus, await lab.pods.get("refused"), ok=False,
                 reason="the kubelet asked for 2 devices, the pod holds 1 card")

    async def failed() -> bool:
        return (await lab.pods.get("refused"))["annotations"]["hami.io/bind-phase"] == "failed"

    await eventually(failed, "bind-phase failed")
    events = [(e["type"], e["reason"], e["message"])
              for e in (await lab.pods.get("refused"))["events"]]
    assert ("Warning", "AllocationFailed",
            f"node {NODE} could not hand the pod its cards: the kubelet asked for 2 devices, "
            "the pod holds 1 card") in events
    assert allocations_counted(lab, "failed") == 1


async def test_an_outcome_on_another_nodes_subject_is_refused_and_changes_nothing(
        lab: Lab, bus: Client) -> None:
    await lab.pods.submit_and_place(lab_pod("elsewhere"))
    pod = await lab.pods.get("elsewhere")
    await report(bus, pod, ok=True, node="gpu-node-2")
    await report(bus, {**pod, "uid": "not-the-pods-uid"}, ok=True)
    await report(bus, {**pod, "namespace": "Not_A_Namespace"}, ok=True)

    async def all_refused() -> bool:
        return allocations_counted(lab, "refused") == 3

    await eventually(all_refused, "three refusals")
    assert (await lab.pods.get("elsewhere"))["annotations"]["hami.io/bind-phase"] == "allocating"
    assert [p.name for p in (await pending(bus)).pods] == ["elsewhere"]


async def test_a_request_naming_no_valid_node_gets_no_answer(lab: Lab, bus: Client) -> None:
    with pytest.raises(nats.errors.TimeoutError):
        await bus.request(allocations_subject("Not_A_Node"), b"", timeout=1)
    assert allocations_counted(lab, "refused") == 1


async def test_the_listed_pod_names_its_containers_and_their_control_switch(
        lab: Lab, bus: Client) -> None:
    manifest = lab_pod("named")
    manifest["spec"]["initContainers"] = [{"name": "warmup", "image": "busybox"}]
    manifest["spec"]["containers"][0]["env"] = [
        {"name": "CUDA_DISABLE_CONTROL", "value": "True"}]
    manifest["spec"]["containers"].append({"name": "sidecar", "image": "busybox", "env": [
        {"name": "CUDA_DISABLE_CONTROL", "value": "no"}]})
    await lab.pods.submit_and_place(manifest)
    answer = await pending(bus)
    (listed,) = answer.pods
    assert [(c.name, c.control_disabled) for c in listed.containers] == [
        ("warmup", False), ("app", True), ("sidecar", False)]
    (holding,) = answer.holding or ()
    assert [(c.name, c.init, len(c.cards)) for c in holding.containers] == [
        ("warmup", True, 0), ("app", False, 1), ("sidecar", False, 0)]


async def test_a_pod_whose_bind_is_under_way_is_listed_and_its_outcome_taken(
        lab: Lab, bus: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kubelet sees the Binding before the daemon has the API server's answer: its
    device plugin asks then, and reports, while the daemon's bind is still under way."""
    assert lab.daemon.service is not None
    cluster = lab.daemon.service.cluster
    bind = cluster.bind
    written, answer = asyncio.Event(), asyncio.Event()

    async def bind_answered_late(*args: Any, **kwargs: Any) -> None:
        await bind(*args, **kwargs)
        written.set()
        await answer.wait()

    monkeypatch.setattr(cluster, "bind", bind_answered_late)
    await lab.pods.submit(lab_pod("in-flight"))
    await asyncio.wait_for(written.wait(), 10)
    try:
        pod = await lab.pods.get("in-flight")
        assert pod["node"] == NODE
        assert [p.name for p in (await pending(bus)).pods] == ["in-flight"]
        await report(bus, pod, ok=True)

        async def succeeded() -> bool:
            notes = (await lab.pods.get("in-flight"))["annotations"]
            return notes["hami.io/bind-phase"] == "success"

        await eventually(succeeded, "bind-phase success while the bind is under way")
    finally:
        answer.set()
    assert allocations_counted(lab, "success") == 1


async def test_an_outcome_the_store_cannot_take_yet_is_written_once_it_can(
        lab: Lab, bus: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream leader's election after a NATS server's loss: the store refuses a write
    (nothing applied) for a while. The outcome is written then, not dropped."""
    await lab.pods.submit_and_place(lab_pod("outage"))
    pod = await lab.pods.get("outage")
    assert lab.daemon.service is not None
    cluster = lab.daemon.service.handlers.allocations.cluster
    write = cluster.set_bind_phase
    refused = 0

    async def away_twice(namespace: str, name: str, uid: str, phase: AllocationPhase,
                         annotations: Mapping[str, str] | None = None) -> None:
        nonlocal refused
        if refused < 2:
            refused += 1
            raise StoreUnavailable("no answer from the pod store (test); nothing was written")
        await write(namespace, name, uid, phase, annotations)

    monkeypatch.setattr(cluster, "set_bind_phase", away_twice)
    await report(bus, pod, ok=True)

    async def succeeded() -> bool:
        return (await lab.pods.get("outage"))["annotations"]["hami.io/bind-phase"] == "success"

    await eventually(succeeded, "bind-phase success once the store answers")
    assert refused == 2
    assert (await pending(bus)).pods == []
    assert allocations_counted(lab, "success") == 1


async def test_an_outcome_heard_while_standing_by_is_written_once_this_daemon_decides(
        lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease moving just as an outcome arrives: the daemon that takes it over heard the
    outcome as a standby (``keep_outcome``), and writes it then, the pod still waiting."""
    await lab.pods.submit_and_place(lab_pod("handed-over"))
    pod = await lab.pods.get("handed-over")
    assert lab.daemon.service is not None
    allocations = lab.daemon.service.handlers.allocations
    writes: list[str] = []
    write = allocations.cluster.set_bind_phase

    async def counted(namespace: str, name: str, uid: str, phase: AllocationPhase,
                      annotations: Mapping[str, str] | None = None) -> None:
        writes.append(name)
        await write(namespace, name, uid, phase, annotations)

    monkeypatch.setattr(allocations.cluster, "set_bind_phase", counted)
    monkeypatch.setattr(allocations.shared.leadership, "refusal",
                        lambda: "standby: another daemon decides")
    outcome = AllocationOutcome(namespace=pod["namespace"], name=pod["name"], uid=pod["uid"],
                                ok=True, reason="")
    allocations.keep_outcome(allocated_subject(NODE), encode(outcome))
    await asyncio.sleep(1.5)
    assert writes == []  # kept, not written, while standing by
    monkeypatch.setattr(allocations.shared.leadership, "refusal", lambda: None)

    async def succeeded() -> bool:
        return (await lab.pods.get("handed-over"))["annotations"][
            "hami.io/bind-phase"] == "success"

    await eventually(succeeded, "bind-phase success once this daemon decides")
    assert writes == ["handed-over"]
    # Kept by a standby too, an outcome the decider wrote already is not written again.
    allocations.keep_outcome(allocated_subject(NODE), encode(outcome))
    await asyncio.sleep(1.5)
    assert writes == ["handed-over"]
