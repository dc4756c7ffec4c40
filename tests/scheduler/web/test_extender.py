"""The extender verbs as kube-scheduler calls them, over HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import pytest

from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsServer
from pyhami.sandbox import RunningDaemon, SimulatedAgent, standalone_config
from scheduler.web.protocol import ExtenderBindingArgs, ExtenderFilterResult, HostPriority
from tests.harness import PodClient, eventually


@dataclass
class Extender:
    daemon: RunningDaemon
    pods: PodClient
    http: aiohttp.ClientSession
    nodes: list[SimulatedAgent]

    async def post(self, verb: str, body: object) -> Any:
        async with self.http.post(f"{self.daemon.url}/{verb}", json=body) as response:
            assert response.status == 200, await response.text()
            return await response.json()


@pytest.fixture
async def extender(jetstream_server: LocalNatsServer,
                   http: aiohttp.ClientSession) -> AsyncIterator[Extender]:
    """Two simulated nodes and a daemon that only answers: the test plays kube-scheduler."""
    nodes = [SimulatedAgent.start(name, jetstream_server.url) for name in ("node-a", "node-b")]
    config = standalone_config(jetstream_server.url, drive_pending=False)
    daemon = await RunningDaemon(config).start()

    async def both_known() -> bool:
        assert daemon.service is not None
        return all(daemon.service.state.fleet.node(n.name) for n in nodes)

    await eventually(both_known, "both nodes' inventories")
    yield Extender(daemon, PodClient(http, daemon.url), http, nodes)
    await daemon.stop()
    for node in nodes:
        await node.halt()


def node_object(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"gpu": "yes"}},
            "status": {"capacity": {"nvidia.com/gpu": "40"}}}


async def test_filter_with_node_names_returns_the_one_chosen_node(extender: Extender) -> None:
    pod = lab_pod("p")
    result = await extender.post("filter", {"Pod": pod, "Nodes": None,
                                            "NodeNames": ["node-a", "node-b", "node-x"]})
    assert result["NodeNames"] == ["node-a"]
    assert result["FailedNodes"] == {
        "node-x": "NodeUnknown: pyhami has no GPU inventory for this node"}
    assert result["Error"] == ""


async def test_a_lease_lost_while_deciding_answers_standby_and_books_nothing(
        extender: Extender, monkeypatch: pytest.MonkeyPatch) -> None:
    service = extender.daemon.service
    assert service is not None
    leadership, decide = service.shared.leadership, service.state.cache.filter
    lost = []

    class LostWhileDeciding:
        """The daemon's leadership, gone the moment the decision is taken (as for a
        daemon paused by the kernel in the middle of it)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(leadership, name)

        def refusal(self) -> str | None:
            return "standby: daemon-b holds the lease" if lost else leadership.refusal()

    def deciding(*args: Any, **kwargs: Any) -> Any:
        decision = decide(*args, **kwargs)
        lost.append(True)
        return decision

    monkeypatch.setattr(service.shared, "leadership", LostWhileDeciding())
    monkeypatch.setattr(service.state.cache, "filter", deciding)
    result = await extender.post("filter", {"Pod": lab_pod("p"), "Nodes": None,
                                            "NodeNames": ["node-a", "node-b"]})
    assert lost == [True]
    assert result["Error"] == "standby: daemon-b holds the lease"
    assert not result["NodeNames"]
    assert service.state.cache.reservation_count == 0
    assert service.state.fleet.allocation("default/p") is None


async def test_filter_with_full_nodes_echoes_the_chosen_node_object(extender: Extender) -> None:
    pod = lab_pod("p", {"hami.io/node-scheduler-policy": "spread"})
    nodes = {"metadata": {}, "items": [node_object("node-a"), node_object("node-b")]}
    result = await extender.post("filter", {"Pod": pod, "Nodes": nodes, "NodeNames": None})
    assert result["Nodes"]["items"] == [node_object("node-a")]
    assert result["NodeNames"] is None


async def test_the_nodes_returned_are_a_subset_of_those_sent(extender: Extender) -> None:
    result = await extender.post("filter", {"Pod": lab_pod("p"), "NodeNames": ["node-b"]})
    assert result["NodeNames"] == ["node-b"]


async def test_a_pod_without_gpu_passes_through_unchanged(extender: Extender) -> None:
    pod = lab_pod("cpu-only", limits={"cpu": 1})
    result = await extender.post("filter", {"Pod": pod, "NodeNames": ["node-a", "node-z"]})
    assert result["NodeNames"] == ["node-a", "node-z"]
    assert result["FailedNodes"] == {}
    nodes = {"items": [node_object("node-z")]}
    result = await extender.post("filter", {"Pod": pod, "Nodes": nodes})
    assert result["Nodes"]["items"] == [node_object("node-z")]


async def test_a_malformed_pod_fails_every_node_with_the_reason(extender: Extender) -> None:
    pod = lab_pod("bad", {"hami.io/device-scoring-weights": "slot=x"})
    result = await extender.post("filter", {"Pod": pod, "NodeNames": ["node-a", "node-b"]})
    assert result["NodeNames"] in (None, [])
    reason = result["FailedAndUnresolvableNodes"]["node-a"]
    assert reason.startswith("PodRejected: hami.io/device-scoring-weights: ")
    assert set(result["FailedAndUnresolvableNodes"]) == {"node-a", "node-b"}


async def test_unschedulable_lists_each_node_reason(extender: Extender) -> None:
    pod = lab_pod("huge", limits={"nvidia.com/gpu": 5})
    result = await extender.post("filter", {"Pod": pod, "NodeNames": ["node-a", "node-b"]})
    assert result["NodeNames"] == []
    assert result["FailedNodes"] == {"node-a": "4/4 NodeInsufficientDevice",
                                     "node-b": "4/4 NodeInsufficientDevice"}


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind"])
async def test_malformed_json_gets_400_with_a_message(extender: Extender, verb: str) -> None:
    async with extender.http.post(f"{extender.daemon.url}/{verb}", data=b"{not json") as response:
        assert response.status == 400
        assert "malformed Extender" in await response.text()


async def test_filter_reserves_and_bind_writes_the_pod(extender: Extender) -> None:
    created = await extender.pods.submit(lab_pod("p", {"hami.io/gpu-scheduler-policy": "binpack"}))
    chosen = await extender.post("filter", {"Pod": lab_pod("p"), "NodeNames": ["node-a"]})
    assert chosen["NodeNames"] == ["node-a"]
    bound = await extender.post("bind", {"PodName": "p", "PodNamespace": "default",
                                         "PodUID": created["uid"], "Node": "node-a"})
    assert bound == {"Error": ""}
    pod = await extender.pods.get("p")
    assert pod["node"] == "node-a"
    assert pod["annotations"]["hami.io/vgpu-devices-allocated"] == (
        "GPU-node-a-0,NVIDIA,1000,0:;")


async def test_bind_on_another_node_decides_again_there(extender: Extender) -> None:
    created = await extender.pods.submit(lab_pod("p"))
    chosen = await extender.post("filter", {"Pod": lab_pod("p"), "NodeNames": ["node-a"]})
    assert chosen["NodeNames"] == ["node-a"]
    bound = await extender.post("bind", {"PodName": "p", "PodNamespace": "default",
                                         "PodUID": created["uid"], "Node": "node-b"})
    assert bound == {"Error": ""}
    pod = await extender.pods.get("p")
    assert pod["annotations"]["hami.io/vgpu-node"] == "node-b"
    assert extender.daemon.service is not None
    state = extender.daemon.service.state
    assert state.fleet.allocation("default/p") is not None
    assert state.fleet.allocation("default/p").node == "node-b"  # type: ignore[union-attr]
    assert all(state.fleet.usage("node-a", f"GPU-node-a-{i}").tenants == 0 for i in range(4))


async def test_a_failed_bind_releases_the_reservation(extender: Extender) -> None:
    chosen = await extender.post("filter", {"Pod": lab_pod("ghost", {
        "hami.io/gpu-scheduler-policy": "mutex"}), "NodeNames": ["node-a"]})
    assert chosen["NodeNames"] == ["node-a"]
    assert extender.daemon.service is not None
    state = extender.daemon.service.state
    assert state.cache.reservation("default/ghost") is not None
    # The pod was never submitted, so the cluster refuses the binding.
    result = await extender.post("bind", {"PodName": "ghost", "PodNamespace": "default",
                                          "PodUID": "u", "Node": "node-a"})
    assert "no longer exists" in result["Error"]
    assert state.cache.reservation("default/ghost") is None
    assert state.fleet.usage("node-a", "GPU-node-a-0").tenants == 0


async def test_prioritize_scores_0_to_10_by_node_policy(extender: Extender) -> None:
    created = await extender.pods.submit(lab_pod("big", limits={"nvidia.com/gpu": 4}))
    await extender.post("filter", {"Pod": lab_pod("big", limits={"nvidia.com/gpu": 4}),
                                   "NodeNames": ["node-b"]})
    await extender.post("bind", {"PodName": "big", "PodNamespace": "default",
                                 "PodUID": created["uid"], "Node": "node-b"})
    binpack = await extender.post("prioritize", {"Pod": lab_pod("q"),
                                                 "NodeNames": ["node-a", "node-b"]})
    scores = {entry["Host"]: entry["Score"] for entry in binpack}
    assert scores["node-b"] > scores["node-a"] == 0
    assert all(0 <= s <= 10 for s in scores.values())
    spread = await extender.post("prioritize", {"Pod": lab_pod("q", {
        "hami.io/node-scheduler-policy": "spread"}), "NodeNames": ["node-a", "node-b"]})
    scores = {entry["Host"]: entry["Score"] for entry in spread}
    assert scores["node-a"] == 10 and scores["node-b"] < 10


async def test_health_and_readiness(extender: Extender) -> None:
    for path in ("healthz", "readyz"):
        async with extender.http.get(f"{extender.daemon.url}/{path}") as response:
            assert response.status == 200


def test_json_keys_are_go_field_names() -> None:
    assert json.loads(msgspec.json.encode(ExtenderFilterResult())) == {
        "Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
        "Error": ""}
    assert json.loads(msgspec.json.encode(HostPriority("n", 3))) == {"Host": "n", "Score": 3}
    assert set(json.loads(msgspec.json.encode(ExtenderBindingArgs("p", "ns", "u", "n")))) == {
        "PodName", "PodNamespace", "PodUID", "Node"}
