"""``scheduler.cluster.kube``'s ``KubernetesCluster``: its pure conversions and bodies, and the
client against a stub of the Kubernetes API.

No kube-apiserver can run here, so ``tests.fakes.apiserver.StubApiServer`` (aiohttp on
127.0.0.1) stands in for one: canned JSON shaped like the API's, every request recorded,
pods that change as on the API server. The cluster reaches it through a kubeconfig written
by the test, with token auth, exactly as it would reach a real server. What only a real API
server can show (its validation of the bodies, the watch's resourceVersion semantics) is
left to the end-to-end tests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kubernetes import client as kubernetes_client

from common.core import CardGrant
from common.core.annotations import (
    ALLOCATED_ANNOTATION,
    BIND_PHASE_ANNOTATION,
    NODE_ANNOTATION,
    TO_ALLOCATE_ANNOTATION,
    VGPU_NODE_LABEL,
)
from common.core.mig import MIG_ALLOCATIONS_ANNOTATION
from common.core.names import check_subdomain
from common.core.vendors import NVIDIA
from scheduler.cluster import SCHEDULER_NAME, ClusterError, PodChange
from scheduler.cluster.kube import (
    ApiStatusError,
    EventSeries,
    Kubernetes,
    KubernetesCluster,
    ObjectEvent,
    PodToBind,
    SeriesCache,
    _client,
    _transport,
    _watch,
    annotation_patch,
    bind_refusal,
    binding_body,
    decode_pod,
    describe_failure,
    recurrence_patch,
)
from tests.fakes.apiserver import (
    TOKEN,
    Recorded,
    StubApiServer,
    pod_json,
    serve,
    status_json,
    write_kubeconfig,
)

REGISTER_ANNOTATION = NVIDIA.register_annotation

ALLOCATED = "GPU-init,NVIDIA,2000,0:;GPU-a,NVIDIA,1000,30:GPU-b,NVIDIA,1000,30:;"


# Pure conversions and bodies --------------------------------------------------------------


def test_a_bound_pod_decodes_with_its_allocation() -> None:
    raw = pod_json("train-1", namespace="ml", uid="u-1", node="n1", phase="Running",
                   annotations={ALLOCATED_ANNOTATION: ALLOCATED, NODE_ANNOTATION: "n1",
                                "team": "vision"})
    pod = decode_pod(json.dumps(raw))

    assert (pod.key, pod.uid, pod.node, pod.phase) == ("ml/train-1", "u-1", "n1", "Running")
    assert pod.annotations["team"] == "vision"
    assert [c.name for c in pod.manifest.spec.init_containers or ()] == ["warmup"]
    assert pod.manifest.spec.containers[0].resources is not None
    allocation = pod.allocation()
    assert allocation is not None
    assert allocation.node == "n1"
    assert allocation.containers == (
        (CardGrant("GPU-init", 2000, 0),),
        (CardGrant("GPU-a", 1000, 30), CardGrant("GPU-b", 1000, 30)),
    )
    assert allocation.init_containers == 1


@pytest.mark.parametrize(("node", "phase"), [(None, "Pending"), ("n1", "Succeeded")])
def test_a_pending_or_finished_pod_holds_no_cards(node: str | None, phase: str) -> None:
    raw = pod_json("p", node=node, phase=phase, annotations={ALLOCATED_ANNOTATION: ALLOCATED})
    assert decode_pod(json.dumps(raw).encode()).allocation() is None


def test_an_allocation_written_on_a_pod_without_gpus_books_nothing() -> None:
    raw = pod_json("p", node="n1", phase="Running", annotations={ALLOCATED_ANNOTATION: ALLOCATED})
    raw["spec"]["initContainers"] = []
    raw["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    assert decode_pod(json.dumps(raw).encode()).allocation() is None
    raw["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpumem": "1000"}}
    assert decode_pod(json.dumps(raw).encode()).allocation() is not None


def test_a_pod_without_status_or_annotations_decodes() -> None:
    pod = decode_pod(b'{"metadata": {"name": "bare", "uid": "u"}, "spec": {"containers": []}}')
    assert (pod.key, pod.phase, pod.node, dict(pod.annotations)) == (
        "default/bare", "Unknown", None, {})


def test_the_annotation_patch_carries_the_uid_and_the_version_read_as_guards() -> None:
    annotations = {ALLOCATED_ANNOTATION: "GPU-a,NVIDIA,1000,30:;", BIND_PHASE_ANNOTATION:
                   "allocating"}
    assert annotation_patch("u-1", "7", annotations) == {
        "metadata": {"annotations": annotations, "uid": "u-1", "resourceVersion": "7"}}
    assert annotation_patch("", None, annotations) == {"metadata": {"annotations": annotations}}


@pytest.mark.parametrize(("pod", "refusal"), [
    (pod_json("p", scheduler=SCHEDULER_NAME), None),
    (pod_json("p", scheduler=SCHEDULER_NAME, uid="other"),
     "the pod is uid other, not uid-p (re-created meanwhile)"),
    (pod_json("p", scheduler=SCHEDULER_NAME, node="n2"), "the pod is already on node n2"),
    (pod_json("p", scheduler=SCHEDULER_NAME, phase="Failed"), "the pod is Failed, not Pending"),
    (pod_json("p"), "the pod is for scheduler 'default-scheduler', not 'pyhami-scheduler'"),
])
def test_bind_takes_only_a_pending_unplaced_pod_of_its_scheduler_name(
        pod: dict[str, Any], refusal: str | None) -> None:
    target = msgspec.json.decode(json.dumps(pod), type=PodToBind)
    assert bind_refusal(target, "uid-p", SCHEDULER_NAME) == refusal


def test_the_binding_targets_the_node_and_carries_the_annotations_and_guards() -> None:
    assert binding_body("ml", "train-1", "u-1", "n2") == {
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "train-1", "namespace": "ml", "uid": "u-1"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n2"},
    }
    notes = {ALLOCATED_ANNOTATION: "GPU-a,NVIDIA,1000,30:;"}
    assert binding_body("ml", "train-1", "u-1", "n2", resource_version="9",
                        annotations=notes)["metadata"] == {
        "name": "train-1", "namespace": "ml", "annotations": notes, "uid": "u-1",
        "resourceVersion": "9"}


def pod_event(message: str = "0/2 nodes fit", *, pod: str = "train-1",
              uid: str | None = "u-1") -> ObjectEvent:
    return ObjectEvent.of("ml", pod, uid=uid, kind="Warning", reason="FilteringFailed",
                       message=message, component="pyhami-scheduler")


def test_the_event_names_the_pod_and_the_scheduler() -> None:
    event = pod_event()
    body = event.body(instance="pyhami-scheduler-host", count=3,
                      first="2025-03-04T05:06:07Z", last="2025-03-04T05:09:00Z")
    assert body == {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event.name, "namespace": "ml"},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": "ml",
                           "name": "train-1", "uid": "u-1"},
        "reason": "FilteringFailed", "message": "0/2 nodes fit", "type": "Warning",
        "source": {"component": "pyhami-scheduler"},
        "firstTimestamp": "2025-03-04T05:06:07Z", "lastTimestamp": "2025-03-04T05:09:00Z",
        "count": 3,
        "reportingComponent": "pyhami-scheduler", "reportingInstance": "pyhami-scheduler-host",
    }
    without_uid = pod_event(uid=None).body(instance="i", count=1, first="t", last="t")
    assert without_uid["involvedObject"] == {"apiVersion": "v1", "kind": "Pod",
                                             "namespace": "ml", "name": "train-1"}
    assert recurrence_patch(4, "2025-03-04T05:10:00Z") == {
        "count": 4, "lastTimestamp": "2025-03-04T05:10:00Z"}


def test_the_event_name_is_the_same_for_the_same_event_only() -> None:
    name = pod_event().name
    assert name == pod_event().name
    assert name.startswith("train-1.") and len(name) == len("train-1.") + 16
    others = {pod_event("another message").name, pod_event(uid="u-2").name,
              pod_event(uid=None).name, pod_event(pod="train-2").name,
              ObjectEvent.of("ml2", "train-1", uid="u-1", kind="Warning",
                          reason="FilteringFailed", message="0/2 nodes fit",
                          component="pyhami-scheduler").name,
              ObjectEvent.of("ml", "train-1", uid="u-1", kind="Normal", reason="FilteringFailed",
                          message="0/2 nodes fit", component="pyhami-scheduler").name,
              ObjectEvent.of("ml", "train-1", uid="u-1", kind="Warning", reason="BindingFailed",
                          message="0/2 nodes fit", component="pyhami-scheduler").name}
    assert name not in others and len(others) == 7


@pytest.mark.parametrize("pod", ["a" * 253, "a" * 230 + "-" + "b" * 22, "a" * 235 + ".b" * 9])
def test_the_event_name_of_a_pod_with_the_longest_name_is_a_valid_name(pod: str) -> None:
    check_subdomain("pod", pod)
    name = pod_event(pod=pod).name
    check_subdomain("event", name)  # raises InvalidName otherwise
    assert name.startswith(pod[:200])


def test_a_long_event_message_is_cut_to_1024_bytes() -> None:
    cut = pod_event("é" * 1000).message  # 2000 bytes of UTF-8
    assert len(cut.encode()) <= 1024
    assert cut.endswith("...")
    assert cut.startswith("é" * 500)
    exact = "x" * 1024
    assert pod_event(exact).message == exact


def test_the_series_cache_forgets_the_least_recently_used() -> None:
    cache = SeriesCache(size=2)
    cache.put("a", EventSeries(1, "t1"))
    cache.put("b", EventSeries(1, "t2"))
    assert cache.get("a") == EventSeries(1, "t1")  # a is now the most recent
    cache.put("c", EventSeries(1, "t3"))
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (
        EventSeries(1, "t1"), None, EventSeries(1, "t3"))
    cache.put("a", EventSeries(2, "t1"))
    assert len(cache) == 2 and cache.get("a") == EventSeries(2, "t1")


def test_a_failure_reads_as_the_api_status_not_a_traceback() -> None:
    conflict = ApiStatusError(409, "Conflict", json.dumps(
        status_json(409, "Conflict", 'pod "p" is already bound')).encode())
    assert describe_failure(conflict) == 'HTTP 409 Conflict: pod "p" is already bound'
    proxy = ApiStatusError(502, "Bad Gateway", b"<html>bad gateway</html>")
    assert describe_failure(proxy) == "HTTP 502 Bad Gateway: <html>bad gateway</html>"
    assert describe_failure(ApiStatusError(503, "Service Unavailable", b"")) == (
        "HTTP 503 Service Unavailable")
    assert describe_failure(ConnectionRefusedError("refused")) == (
        "ConnectionRefusedError: refused")


def split(*chunks: bytes) -> list[bytes]:
    lines: list[bytes] = []
    splitter = _watch.LineSplitter(lines.append)
    for chunk in chunks:
        splitter.feed(chunk)
    splitter.end()
    return lines


def test_the_watch_stream_reads_as_lines_however_it_is_cut() -> None:
    stream = [b'{"a": 1}\n\n{"b"', b": 2", b"}", b'\n  \n{"c": 3}\n{"d"', b": 4}"]
    assert split(*stream) == [b'{"a": 1}', b'{"b": 2}', b'{"c": 3}', b'{"d": 4}']
    assert split(b"\n", b" \n") == []


def test_the_watch_lines_read_as_events() -> None:
    pod = json.dumps(watch_event("ADDED", pod_json("a", uid="u-a", version="7"))).encode()
    bookmark = b'{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}'
    seen = [_watch.seen(pod, _client.PODS), _watch.seen(bookmark, _client.PODS)]
    assert [(s.kind, s.resource_version, s.item.key if s.item else None) for s in seen] == [
        ("ADDED", "7", "default/a"), ("BOOKMARK", "9", None)]


@pytest.mark.parametrize(("code", "raised"), [(410, _watch.Expired),
                                               (500, _watch.WatchFailed)])
def test_an_error_event_ends_the_watch(code: int, raised: type[Exception]) -> None:
    line = json.dumps({"type": "ERROR", "object": {"code": code, "reason": "r"}}).encode()
    with pytest.raises(raised):
        _watch.seen(line, _client.PODS)


# Against the stub API server -----------------------------------------------------------


@dataclass
class Harness:
    api: StubApiServer
    cluster: KubernetesCluster
    kubeconfig: Path
    port: int


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    api = StubApiServer()
    async with serve(api) as port:
        kubeconfig = write_kubeconfig(tmp_path / "kc", port)
        kubernetes = Kubernetes.from_kubeconfig(str(kubeconfig))
        yield Harness(api, kubernetes.cluster, kubeconfig, port)
        await kubernetes.close()


def test_a_missing_kubeconfig_is_a_cluster_error(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="cannot load kubeconfig"):
        Kubernetes.from_kubeconfig(str(tmp_path / "absent"))


# Reads ----------------------------------------------------------------------------------


async def test_list_pods_follows_the_continue_token(harness: Harness) -> None:
    api = harness.api
    api.all_pods.lists = [([pod_json("a", node="n1", phase="Running"),
                            pod_json("b", namespace="ml")], "100")]
    pods = await harness.cluster.list_pods()

    assert [(p.key, p.node, p.phase) for p in pods] == [
        ("default/a", "n1", "Running"), ("ml/b", None, "Pending")]
    lists = api.sent("GET", "/api/v1/pods")
    assert [r.query.get("continue") for r in lists] == [None, "0:1"]
    assert {r.query["limit"] for r in lists} == {"500"}


async def test_get_pod_reads_the_pod_or_none_when_absent(harness: Harness) -> None:
    harness.api.pods["ml/p"] = pod_json("p", namespace="ml", uid="u-p", node="n1")
    pod = await harness.cluster.get_pod("ml", "p")
    assert pod is not None
    assert (pod.uid, pod.node) == ("u-p", "n1")
    assert await harness.cluster.get_pod("ml", "absent") is None


async def test_device_cordons_come_from_the_node_annotation(harness: Harness) -> None:
    harness.api.nodes = [
        {"metadata": {"name": "n1", "annotations": {
            "hami.io/device-cordon": " GPU-a, GPU-b ,", "other": "x"}}},
        {"metadata": {"name": "n2"}},
    ]
    assert await harness.cluster.device_cordons() == {
        "n1": frozenset({"GPU-a", "GPU-b"}), "n2": frozenset()}


async def test_node_registrations_come_from_the_nodes_that_carry_one(
        harness: Harness) -> None:
    harness.api.nodes = [
        {"metadata": {"name": "n1", "annotations": {REGISTER_ANNOTATION: '[{"id":"GPU-a"}]'}}},
        {"metadata": {"name": "n2", "annotations": {"other": "x"}}},
        {"metadata": {"name": "n3"}},
    ]
    assert await harness.cluster.node_registrations() == {"n1": '[{"id":"GPU-a"}]'}


async def test_register_node_merge_patches_the_one_annotation(harness: Harness) -> None:
    api = harness.api
    api.nodes = [{"metadata": {"name": "n1", "annotations": {"kept": "yes"}}}]
    await harness.cluster.register_node("n1", "[{}]")
    [patch] = api.sent("PATCH", "/api/v1/nodes/n1")
    assert patch.content_type == "application/merge-patch+json"
    assert patch.body == {"metadata": {"annotations": {REGISTER_ANNOTATION: "[{}]"}}}
    assert api.nodes[0]["metadata"]["annotations"] == {"kept": "yes",
                                                       REGISTER_ANNOTATION: "[{}]"}
    await harness.cluster.register_node("n1", None)
    assert api.sent("PATCH", "/api/v1/nodes/n1")[-1].body == {
        "metadata": {"annotations": {REGISTER_ANNOTATION: None}}}
    assert api.nodes[0]["metadata"]["annotations"] == {"kept": "yes"}


async def test_a_removal_from_a_node_gone_is_done_a_write_to_it_fails(
        harness: Harness) -> None:
    await harness.cluster.register_node("gone", None)  # no error: the annotation went with it
    with pytest.raises(ClusterError, match=f"writing {REGISTER_ANNOTATION} on node gone "
                                           "failed: HTTP 404 NotFound"):
        await harness.cluster.register_node("gone", "[{}]")
    harness.api.nodes = [{"metadata": {"name": "n1"}}]
    harness.api.node_patch_statuses = [500]
    with pytest.raises(ClusterError, match=r"removing .* on node n1 failed: HTTP 500"):
        await harness.cluster.register_node("n1", None)


async def test_get_pod_reports_other_failures(harness: Harness) -> None:
    harness.api.get_status = 500
    with pytest.raises(ClusterError, match=r"reading pod ml/p failed: HTTP 500 InternalError"):
        await harness.cluster.get_pod("ml", "p")


async def test_the_kubeconfig_token_is_sent(tmp_path: Path) -> None:
    api = StubApiServer()
    async with serve(api) as port:
        path = write_kubeconfig(tmp_path / "kc", port, token="wrong")
        kubernetes = Kubernetes.from_kubeconfig(str(path))
        try:
            with pytest.raises(ClusterError, match="listing pods failed: HTTP 401 Unauthorized"):
                await kubernetes.cluster.list_pods()
        finally:
            await kubernetes.close()


# Writes ---------------------------------------------------------------------------------

ANNOTATIONS = {ALLOCATED_ANNOTATION: "GPU-a,NVIDIA,1000,30:;",
               TO_ALLOCATE_ANNOTATION: "GPU-a,NVIDIA,1000,30:;",
               NODE_ANNOTATION: "n1", BIND_PHASE_ANNOTATION: "allocating"}


def pending_pod(version: str = "5") -> dict[str, Any]:
    return pod_json("p", namespace="ml", uid="u-p", scheduler=SCHEDULER_NAME, version=version)


async def test_bind_reads_the_pod_then_binds_it_with_its_annotations_in_one_write(
        harness: Harness) -> None:
    api = harness.api
    api.pods["ml/p"] = pending_pod(version="5")
    await harness.cluster.bind("ml", "p", "u-p", "n1", ANNOTATIONS)

    assert [(r.method, r.path) for r in api.requests] == [
        ("GET", "/api/v1/namespaces/ml/pods/p"),
        ("POST", "/api/v1/namespaces/ml/pods/p/binding"),
    ]
    binding = api.requests[1].body
    assert binding["metadata"] == {"name": "p", "namespace": "ml", "uid": "u-p",
                                   "resourceVersion": "5", "annotations": ANNOTATIONS}
    assert binding["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}
    assert api.pods["ml/p"]["spec"]["nodeName"] == "n1"
    assert api.pods["ml/p"]["metadata"]["annotations"] == ANNOTATIONS


@pytest.mark.parametrize("watched", [False, True], ids=["read-first", "watched"])
async def test_the_binding_carries_the_labels_onto_the_pod(harness: Harness,
                                                           watched: bool) -> None:
    api = harness.api
    api.pods["ml/p"] = pending_pod(version="5")
    labels = {VGPU_NODE_LABEL: "n1"}
    if watched:
        async with watching(api, harness.cluster, pending_pod(version="5")):
            await harness.cluster.bind("ml", "p", "u-p", "n1", ANNOTATIONS, labels=labels)
    else:
        await harness.cluster.bind("ml", "p", "u-p", "n1", ANNOTATIONS, labels=labels)
    [binding] = api.sent("POST", "/binding")
    assert binding.body["metadata"]["labels"] == {"hami.io/vgpu-node": "n1"}
    assert api.pods["ml/p"]["metadata"]["labels"] == {"app": "trainer",
                                                      "hami.io/vgpu-node": "n1"}


async def test_a_pod_without_gpus_is_bound_without_annotations(harness: Harness) -> None:
    api = harness.api
    api.pods["ml/p"] = pending_pod()
    await harness.cluster.bind("ml", "p", "u-p", "n1",
                               {ALLOCATED_ANNOTATION: None, TO_ALLOCATE_ANNOTATION: None})
    assert [r.method for r in api.requests] == ["GET", "POST"]  # nothing to remove
    assert api.pods["ml/p"]["metadata"]["annotations"] == {}


async def test_an_allocation_its_author_wrote_is_removed_as_read_before_the_binding(
        harness: Harness) -> None:
    api = harness.api
    api.pods["ml/p"] = pending_pod(version="5")
    api.pods["ml/p"]["metadata"]["annotations"] = {ALLOCATED_ANNOTATION: "GPU-x,NVIDIA,1,0:;",
                                                   "team": "vision"}
    await harness.cluster.bind("ml", "p", "u-p", "n1",
                               {ALLOCATED_ANNOTATION: None, TO_ALLOCATE_ANNOTATION: None})
    _, patch, binding = api.requests
    # A Binding can set annotations, never remove one: the removal is a patch, as read.
    assert patch.body == {"metadata": {"annotations": {ALLOCATED_ANNOTATION: None},
                                       "uid": "u-p", "resourceVersion": "5"}}
    assert binding.body["metadata"]["resourceVersion"] == "6"
    assert api.pods["ml/p"]["metadata"]["annotations"] == {"team": "vision"}
    assert api.pods["ml/p"]["spec"]["nodeName"] == "n1"


@pytest.mark.parametrize(("pod", "refusal"), [
    (pod_json("p", namespace="ml", uid="u-p", scheduler=SCHEDULER_NAME, node="n2",
              phase="Running"), "the pod is already on node n2"),
    (pod_json("p", namespace="ml", uid="u-p", scheduler=SCHEDULER_NAME, phase="Succeeded"),
     "the pod is Succeeded, not Pending"),
    (pod_json("p", namespace="ml", uid="u-p"),
     "the pod is for scheduler 'default-scheduler', not 'pyhami-scheduler'"),
    (None, "the pod no longer exists"),
])
async def test_bind_leaves_alone_a_pod_that_is_not_pyhamis_to_bind(
        harness: Harness, pod: dict[str, Any] | None, refusal: str) -> None:
    api = harness.api
    if pod is not None:
        api.pods["ml/p"] = pod
    with pytest.raises(ClusterError) as raised:
        await harness.cluster.bind("ml", "p", "u-p", "n1", ANNOTATIONS)
    assert str(raised.value) == f"binding pod ml/p to node n1: {refusal}"
    assert [r.method for r in api.requests] == ["GET"]  # nothing written


async def test_a_pod_changed_between_the_read_and_the_binding_is_left_as_it_is(
        harness: Harness) -> None:
    api = harness.api
    api.pods["ml/p"] = pending_pod()
    api.after_read = [lambda pod: pod["metadata"]["annotations"].update(team="vision")]
    with pytest.raises(ClusterError) as raised:
        await harness.cluster.bind("ml", "p", "u-p", "n1", ANNOTATIONS)
    assert "creating the Binding failed: HTTP 409 Conflict" in str(raised.value)
    assert api.pods["ml/p"]["metadata"]["annotations"] == {"team": "vision"}
    assert "nodeName" not in api.pods["ml/p"]["spec"]


async def test_a_refused_binding_leaves_nothing_written(harness: Harness) -> None:
    api = harness.api
    api.pods["ml/p"] = pending_pod(version="5")
    api.binding_status = 409
    with pytest.raises(ClusterError) as raised:
        await harness.cluster.bind("ml", "p", "u-p", "n1", ANNOTATIONS)
    assert str(raised.value) == (
        "binding pod ml/p to node n1: creating the Binding failed: HTTP 409 Conflict: "
        'pod p is already assigned to node "n9"')
    assert api.sent("PATCH", "/pods/p") == []
    assert api.pods["ml/p"]["metadata"]["annotations"] == {}


async def test_a_refused_removal_stops_before_the_binding(harness: Harness) -> None:
    api = harness.api
    api.pods["ml/p"] = pending_pod()
    api.pods["ml/p"]["metadata"]["annotations"] = {ALLOCATED_ANNOTATION: "GPU-x,NVIDIA,1,0:;"}
    api.patch_statuses = [422]
    with pytest.raises(ClusterError) as raised:
        await harness.cluster.bind("ml", "p", "u-p", "n1", {ALLOCATED_ANNOTATION: None})
    assert str(raised.value) == (
        "binding pod ml/p to node n1: removing the allocation annotations failed: "
        "HTTP 422 Invalid: metadata.uid: field is immutable")
    assert api.sent("POST", "/binding") == []


@asynccontextmanager
async def watching(api: StubApiServer, cluster: KubernetesCluster,
                   *pods: dict[str, Any]) -> AsyncIterator[AsyncIterator[PodChange]]:
    """The cluster's pod watch running, the pods listed delivered; only the requests
    made after are left in ``api.requests``. Yields the changes to come."""
    api.all_pods.lists = [(list(pods), "10")]
    changes = cluster.changes()
    try:
        await take(changes, len(pods))
        api.requests.clear()
        yield changes
    finally:
        await changes.aclose()


def pod_requests(api: StubApiServer) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in api.requests if "/namespaces/" in r.path]


async def test_a_pod_the_watch_delivered_is_bound_in_one_request_without_a_read(
        harness: Harness) -> None:
    api = harness.api
    api.pods["ml/p"] = pending_pod(version="5")
    async with watching(api, harness.cluster, pending_pod(version="5")):
        await harness.cluster.bind("ml", "p", "u-p", "n1", ANNOTATIONS)
        assert pod_requests(api) == [("POST", "/api/v1/namespaces/ml/pods/p/binding")]
    # The uid alone guards it: the API refuses a pod on a node or being deleted anyway.
    [binding] = api.sent("POST", "/binding")
    assert binding.body["metadata"] == {"name": "p", "namespace": "ml", "uid": "u-p",
                                        "annotations": ANNOTATIONS}
    assert api.pods["ml/p"]["spec"]["nodeName"] == "n1"
    assert api.pods["ml/p"]["metadata"]["annotations"] == ANNOTATIONS


@pytest.mark.parametrize("watched", [
    pod_json("q", namespace="ml", uid="u-q", scheduler=SCHEDULER_NAME),  # another pod
    pod_json("p", namespace="ml", uid="u-old", scheduler=SCHEDULER_NAME),  # another uid
])
async def test_a_pod_the_watch_has_not_delivered_is_read_first(
        harness: Harness, watched: dict[str, Any]) -> None:
    api = harness.api
    api.pods["ml/p"] = pending_pod(version="5")
    async with watching(api, harness.cluster, watched):
        await harness.cluster.bind("ml", "p", "u-p", "n1", ANNOTATIONS)
        assert pod_requests(api) == [("GET", "/api/v1/namespaces/ml/pods/p"),
                                     ("POST", "/api/v1/namespaces/ml/pods/p/binding")]
    assert api.sent("POST", "/binding")[0].body["metadata"]["resourceVersion"] == "5"
    assert api.pods["ml/p"]["spec"]["nodeName"] == "n1"


async def test_a_removal_the_watched_pod_has_nothing_to_remove_of_binds_that_version(
        harness: Harness) -> None:
    api = harness.api
    api.pods["ml/p"] = pending_pod(version="5")
    async with watching(api, harness.cluster, pending_pod(version="5")):
        await harness.cluster.bind("ml", "p", "u-p", "n1",
                                   {**ANNOTATIONS, MIG_ALLOCATIONS_ANNOTATION: None})
        assert pod_requests(api) == [("POST", "/api/v1/namespaces/ml/pods/p/binding")]
    # Bound as the version watched: one changed since might hold what is to go.
    [binding] = api.sent("POST", "/binding")
    assert binding.body["metadata"]["resourceVersion"] == "5"
    assert binding.body["metadata"]["annotations"] == ANNOTATIONS
    assert api.pods["ml/p"]["spec"]["nodeName"] == "n1"


async def test_a_removal_on_a_watched_pod_that_holds_it_is_read_first(
        harness: Harness) -> None:
    api = harness.api
    held = pod_json("p", namespace="ml", uid="u-p", scheduler=SCHEDULER_NAME, version="5",
                    annotations={ALLOCATED_ANNOTATION: ALLOCATED})
    api.pods["ml/p"] = held
    async with watching(api, harness.cluster, held):
        await harness.cluster.bind("ml", "p", "u-p", "n1", {ALLOCATED_ANNOTATION: None})
        assert [method for method, _ in pod_requests(api)] == ["GET", "PATCH", "POST"]
    assert ALLOCATED_ANNOTATION not in api.pods["ml/p"]["metadata"]["annotations"]


async def test_a_removal_on_a_watched_pod_changed_since_is_read_again(
        harness: Harness) -> None:
    api = harness.api
    # Annotated by its author since the watch delivered it.
    api.pods["ml/p"] = pod_json("p", namespace="ml", uid="u-p", scheduler=SCHEDULER_NAME,
                                version="6", annotations={ALLOCATED_ANNOTATION: ALLOCATED})
    async with watching(api, harness.cluster, pending_pod(version="5")):
        await harness.cluster.bind("ml", "p", "u-p", "n1", {ALLOCATED_ANNOTATION: None})
        assert [method for method, _ in pod_requests(api)] == ["POST", "GET", "PATCH", "POST"]
    assert ALLOCATED_ANNOTATION not in api.pods["ml/p"]["metadata"]["annotations"]
    assert api.pods["ml/p"]["spec"]["nodeName"] == "n1"


async def test_a_watched_pod_that_is_not_pyhamis_is_refused_without_a_request(
        harness: Harness) -> None:
    api = harness.api
    api.pods["ml/p"] = pending_pod()
    running = pod_json("p", namespace="ml", uid="u-p", scheduler=SCHEDULER_NAME,
                       phase="Running", node="n2")
    async with watching(api, harness.cluster, running):
        with pytest.raises(ClusterError) as raised:
            await harness.cluster.bind("ml", "p", "u-p", "n1", ANNOTATIONS)
        assert pod_requests(api) == []
    assert str(raised.value) == "binding pod ml/p to node n1: the pod is already on node n2"


async def test_a_refused_binding_of_a_watched_pod_reads_it_and_refuses_with_the_reason(
        harness: Harness) -> None:
    api = harness.api
    # Placed by someone else since the watch delivered it.
    api.pods["ml/p"] = pod_json("p", namespace="ml", uid="u-p", scheduler=SCHEDULER_NAME,
                                node="n2")
    async with watching(api, harness.cluster, pending_pod()):
        with pytest.raises(ClusterError) as raised:
            await harness.cluster.bind("ml", "p", "u-p", "n1", ANNOTATIONS)
        assert pod_requests(api) == [("POST", "/api/v1/namespaces/ml/pods/p/binding"),
                                     ("GET", "/api/v1/namespaces/ml/pods/p")]
    assert str(raised.value) == "binding pod ml/p to node n1: the pod is already on node n2"
    assert api.pods["ml/p"]["metadata"]["annotations"] == {}


async def test_a_refused_binding_of_a_watched_pod_that_reads_as_bindable_binds_it_as_read(
        harness: Harness) -> None:
    api = harness.api
    # Re-created since the watch delivered it; the caller named no uid.
    api.pods["ml/p"] = pod_json("p", namespace="ml", uid="u-new", scheduler=SCHEDULER_NAME,
                                version="7")
    async with watching(api, harness.cluster, pending_pod()):
        await harness.cluster.bind("ml", "p", "", "n1", ANNOTATIONS)
        assert [method for method, _ in pod_requests(api)] == ["POST", "GET", "POST"]
    first, second = (binding.body["metadata"] for binding in api.sent("POST", "/binding"))
    assert (first["uid"], first.get("resourceVersion")) == ("u-p", None)
    assert (second["uid"], second["resourceVersion"]) == ("u-new", "7")
    assert api.pods["ml/p"]["spec"]["nodeName"] == "n1"


async def test_a_pod_the_watch_saw_deleted_is_read_first(harness: Harness) -> None:
    api = harness.api
    api.all_pods.watches = [[watch_event("DELETED", pending_pod())]]
    async with watching(api, harness.cluster, pending_pod()) as changes:
        assert await take(changes, 1) == [("ml/p", "Pending", True)]
        with pytest.raises(ClusterError) as raised:
            await harness.cluster.bind("ml", "p", "u-p", "n1", ANNOTATIONS)
        assert [method for method, _ in pod_requests(api)] == ["GET"]
    assert str(raised.value) == "binding pod ml/p to node n1: the pod no longer exists"


async def test_retry_pod_stamps_the_waiting_pod_as_read_and_ignores_a_gone_one(
    harness: Harness, caplog: pytest.LogCaptureFixture,
) -> None:
    api = harness.api
    for name in ("waiting", "stuck"):
        api.pods[f"ml/{name}"] = pod_json(name, namespace="ml", uid=f"u-{name}",
                                          scheduler=SCHEDULER_NAME, version="7")
    await harness.cluster.retry_pod("ml", "waiting", "1700000000.5")
    patches = api.sent("PATCH", "/namespaces/ml/pods/waiting")
    assert [p.body for p in patches] == [
        {"metadata": {"annotations": {"pyhami.io/capacity-freed": "1700000000.5"},
                      "uid": "u-waiting", "resourceVersion": "7"}}]
    assert patches[0].content_type == "application/merge-patch+json"
    api.patch_statuses = [500]
    with caplog.at_level(logging.WARNING, logger="scheduler.cluster.kube"):
        await harness.cluster.retry_pod("ml", "gone", "1")  # deleted: nothing to retry
        assert not caplog.records
        await harness.cluster.retry_pod("ml", "stuck", "1")
    assert [r.getMessage() for r in caplog.records] == [
        "pod ml/stuck not nudged to retry: HTTP 500 InternalError: etcd is down"]


@pytest.mark.parametrize(("pod", "why"), [
    (pod_json("p", namespace="ml", uid="u-p", scheduler="default-scheduler"),
     "the pod is for scheduler 'default-scheduler', not 'pyhami-scheduler'"),
    (pod_json("p", namespace="ml", uid="u-p", scheduler=SCHEDULER_NAME, node="n1",
              phase="Running"), "the pod is already on node n1"),
])
async def test_retry_pod_writes_nothing_on_a_pod_that_is_not_pyhamis_to_place(
    harness: Harness, caplog: pytest.LogCaptureFixture, pod: dict[str, Any], why: str,
) -> None:
    harness.api.pods["ml/p"] = pod
    with caplog.at_level(logging.INFO, logger="scheduler.cluster.kube"):
        await harness.cluster.retry_pod("ml", "p", "1")
    assert harness.api.sent("PATCH", "/pods/p") == []
    assert [r.getMessage() for r in caplog.records] == [f"pod ml/p not nudged to retry: {why}"]


async def test_an_event_is_attached_to_the_pod_by_uid(harness: Harness) -> None:
    api = harness.api
    api.pods["ml/p"] = pod_json("p", namespace="ml", uid="u-p")
    await harness.cluster.record_event("ml", "p", "Warning", "FilteringFailed", "no node fits")

    assert [(r.method, r.path) for r in api.requests] == [
        ("GET", "/api/v1/namespaces/ml/pods/p"), ("POST", "/api/v1/namespaces/ml/events")]
    event = api.requests[1].body
    assert event["metadata"] == {"name": event["metadata"]["name"], "namespace": "ml"}
    assert event["metadata"]["name"].startswith("p.")
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "ml",
                                       "name": "p", "uid": "u-p"}
    assert (event["reason"], event["message"], event["type"], event["count"]) == (
        "FilteringFailed", "no node fits", "Warning", 1)
    assert event["source"] == {"component": "pyhami-scheduler"}
    assert event["reportingComponent"] == "pyhami-scheduler"
    assert event["reportingInstance"].startswith("pyhami-scheduler-")
    stamp = datetime.fromisoformat(event["firstTimestamp"])
    assert abs(time.time() - stamp.timestamp()) < 60

    await harness.cluster.record_event("ml", "p", "Normal", "Bound", "bound to n1")
    assert len(api.sent("GET", "/pods/p")) == 1  # the uid is remembered


async def test_a_repeated_event_is_one_event_whose_count_rises(harness: Harness) -> None:
    api = harness.api
    api.pods["ml/p"] = pod_json("p", namespace="ml", uid="u-p")
    for _ in range(3):
        await harness.cluster.record_event("ml", "p", "Warning", "FilteringFailed", "no fit")
    (created,) = api.sent("POST", "/namespaces/ml/events")
    name = created.body["metadata"]["name"]
    patches = api.sent("PATCH", f"/namespaces/ml/events/{name}")
    assert [p.body["count"] for p in patches] == [2, 3]
    assert {p.content_type for p in patches} == {"application/merge-patch+json"}
    (stored,) = api.events.values()
    assert (stored["count"], stored["message"]) == (3, "no fit")
    assert stored["firstTimestamp"] == created.body["firstTimestamp"]
    assert stored["lastTimestamp"] >= stored["firstTimestamp"]

    # Another message, another reason, another pod: each an Event of its own.
    await harness.cluster.record_event("ml", "p", "Warning", "FilteringFailed", "other")
    await harness.cluster.record_event("ml", "p", "Warning", "BindingFailed", "no fit")
    await harness.cluster.record_event("ml", "q", "Warning", "FilteringFailed", "no fit")
    assert sorted(e["count"] for e in api.events.values()) == [1, 1, 1, 3]


async def test_concurrent_repeats_are_all_counted(harness: Harness) -> None:
    harness.api.pods["ml/p"] = pod_json("p", namespace="ml", uid="u-p")
    await asyncio.gather(*(harness.cluster.record_event(
        "ml", "p", "Warning", "FilteringFailed", "no fit") for _ in range(6)))
    (stored,) = harness.api.events.values()
    assert stored["count"] == 6


async def test_an_event_gone_from_the_api_is_written_anew_counting_on(
        harness: Harness) -> None:
    api = harness.api
    api.pods["ml/p"] = pod_json("p", namespace="ml", uid="u-p")
    await harness.cluster.record_event("ml", "p", "Warning", "FilteringFailed", "no fit")
    (first,) = api.events.values()
    api.events.clear()  # expired (the API server's --event-ttl) or deleted by someone
    await harness.cluster.record_event("ml", "p", "Warning", "FilteringFailed", "no fit")
    (again,) = api.events.values()
    assert again["metadata"]["name"] == first["metadata"]["name"]
    assert (again["count"], again["firstTimestamp"]) == (2, first["firstTimestamp"])
    assert len(api.sent("POST", "/events")) == 2
    await harness.cluster.record_event("ml", "p", "Warning", "FilteringFailed", "no fit")
    assert again["count"] == 3


async def test_a_restarted_daemon_counts_on_from_the_event_the_api_holds(
        harness: Harness) -> None:
    api = harness.api
    api.pods["ml/p"] = pod_json("p", namespace="ml", uid="u-p")
    for _ in range(2):
        await harness.cluster.record_event("ml", "p", "Warning", "FilteringFailed", "no fit")
    restarted = Kubernetes.from_kubeconfig(str(harness.kubeconfig))
    try:
        await restarted.cluster.record_event("ml", "p", "Warning", "FilteringFailed", "no fit")
        await restarted.cluster.record_event("ml", "p", "Warning", "FilteringFailed", "no fit")
    finally:
        await restarted.close()
    (stored,) = api.events.values()
    assert stored["count"] == 4
    name = stored["metadata"]["name"]
    assert len(api.sent("GET", f"/events/{name}")) == 1  # then it is remembered again


async def test_an_event_that_cannot_be_written_is_only_logged(
        harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    harness.api.event_status = 403
    with caplog.at_level(logging.WARNING, logger="scheduler.cluster.kube"):
        await harness.cluster.record_event("ml", "gone", "Warning", "FilteringFailed", "m")
    assert "HTTP 403 Forbidden: events are forbidden" in caplog.text
    posted = harness.api.sent("POST", "/events")
    assert len(posted) == 1
    assert "uid" not in posted[0].body["involvedObject"]  # the GET found no pod


# Changes --------------------------------------------------------------------------------


def watch_event(kind: str, pod: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": pod}


EXPIRED = {"type": "ERROR", "object": status_json(410, "Expired",
                                                  "too old resource version: 100 (300)")}


def summary(change: PodChange) -> tuple[str, str, bool]:
    return change.pod.key, change.pod.phase, change.deleted


async def take(changes: AsyncIterator[PodChange], count: int) -> list[tuple[str, str, bool]]:
    return [summary(await asyncio.wait_for(anext(changes), 5)) for _ in range(count)]


def watch_task_ended() -> bool:
    return not any(task.get_name() == _client.PODS.watch_task for task in asyncio.all_tasks())


async def test_the_watch_resumes_and_lists_again_when_expired(harness: Harness) -> None:
    api = harness.api
    api.all_pods.lists = [
        ([pod_json("a", version="90"), pod_json("b", version="95")], "100"),
        ([pod_json("a", phase="Running", version="250"), pod_json("d", version="260")],
         "300"),
    ]
    api.all_pods.watches = [
        [watch_event("ADDED", pod_json("c", version="101"))],  # then the stream ends
        [watch_event("MODIFIED", pod_json("a", phase="Running", version="102")),
         # As the API server sends it: a pod skeleton with null containers.
         {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                         "metadata": {"resourceVersion": "150"},
                                         "spec": {"containers": None}, "status": {}}},
         watch_event("DELETED", pod_json("b", phase="Succeeded", version="160")),
         EXPIRED],
    ]
    changes = harness.cluster.changes()
    try:
        assert await take(changes, 8) == [
            ("default/a", "Pending", False), ("default/b", "Pending", False),  # the list
            ("default/c", "Pending", False),  # the watch from 100, which then ends
            ("default/a", "Running", False), ("default/b", "Succeeded", True),  # from 101
            ("default/c", "Pending", True),  # missing from the list taken after the 410
            ("default/a", "Running", False), ("default/d", "Pending", False),
        ]
        await wait_for(lambda: len(watches_sent(api)) == 3)
    finally:
        await changes.aclose()

    assert [w.query.get("resourceVersion") for w in watches_sent(api)] == ["100", "101", "300"]
    assert {(w.query["timeoutSeconds"], w.query["allowWatchBookmarks"])
            for w in watches_sent(api)} == {("60", "true")}
    assert [r.query.get("continue") for r in lists_sent(api)] == [None, "0:1", None, "1:1"]
    assert watch_task_ended()


async def test_the_watch_starts_where_list_pods_ended(harness: Harness) -> None:
    api = harness.api
    api.all_pods.lists = [([pod_json("a"), pod_json("b")], "100"), ([pod_json("a")], "200")]
    api.all_pods.watches = [[EXPIRED]]
    assert len(await harness.cluster.list_pods()) == 2
    changes = harness.cluster.changes()
    consumer = asyncio.create_task(take(changes, 2))
    # b went while no watch ran: the list after the 410 shows it as deleted.
    assert await consumer == [("default/b", "Pending", True), ("default/a", "Pending", False)]
    await wait_for(lambda: len(watches_sent(api)) == 2)
    assert [w.query.get("resourceVersion") for w in watches_sent(api)] == ["100", "200"]
    assert len(lists_sent(api)) == 3  # list_pods' two pages, then one after the 410

    stuck = asyncio.create_task(take(changes, 1))
    await asyncio.sleep(0.1)
    stuck.cancel()  # a consumer cancelled while it waits stops the watch as well
    with pytest.raises(asyncio.CancelledError):
        await stuck
    await changes.aclose()
    assert watch_task_ended()


async def test_watch_failures_are_retried_with_backoff(
        harness: Harness, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_watch, "RETRY_FIRST_DELAY", 0.05)
    api = harness.api
    api.all_pods.lists = [([], "100"), ([pod_json("y", version="150")], "200")]
    api.all_pods.watches = [500, 410, [watch_event("ADDED", pod_json("x", version="201"))]]
    changes = harness.cluster.changes()
    try:
        with caplog.at_level(logging.INFO, logger="scheduler.cluster.kube"):
            assert await take(changes, 2) == [("default/y", "Pending", False),
                                              ("default/x", "Pending", False)]
    finally:
        await changes.aclose()
    assert "pod watch failed, retrying in 0 s: HTTP 500 InternalError: etcd is down" in (
        caplog.text)
    assert "resourceVersion 100 expired; listing pods again" in caplog.text
    assert [w.query.get("resourceVersion") for w in watches_sent(api)][:3] == [
        "100", "100", "200"]
    assert watch_task_ended()


def watches_sent(api: StubApiServer) -> list[Recorded]:
    return [r for r in api.sent("GET", "/api/v1/pods") if r.query.get("watch") == "true"]


def lists_sent(api: StubApiServer) -> list[Recorded]:
    return [r for r in api.sent("GET", "/api/v1/pods") if "watch" not in r.query]


async def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_the_watch_held_open_ends_as_soon_as_it_is_stopped(harness: Harness) -> None:
    api = harness.api
    api.all_pods.lists = [([pod_json("a")], "100")]  # then the watch stays open without events
    changes = harness.cluster.changes()
    assert await take(changes, 1) == [("default/a", "Pending", False)]
    await wait_for(lambda: len(watches_sent(api)) == 1)
    await changes.aclose()
    assert watch_task_ended()  # stopped when aclose() returns, not at the watch's timeout


# The transport ----------------------------------------------------------------------------


def configuration(port: int, token: str) -> kubernetes_client.Configuration:
    """A client configuration as the kubeconfig and in-cluster loaders leave it."""
    loaded = kubernetes_client.Configuration()
    loaded.host = f"http://127.0.0.1:{port}"
    loaded.api_key["BearerToken"] = f"Bearer {token}"
    return loaded


async def test_a_token_rotated_within_the_second_is_read_again_on_the_401() -> None:
    api = StubApiServer()
    api.pods["ml/p"] = pod_json("p", namespace="ml")
    async with serve(api) as port:
        loaded = configuration(port, "expired")
        tokens = iter(["expired", TOKEN])
        hook_runs = []

        def rotate(rotated: kubernetes_client.Configuration) -> None:
            # As the in-cluster loader's hook does: the token file read again.
            hook_runs.append(1)
            rotated.api_key["BearerToken"] = f"Bearer {next(tokens)}"

        loaded.refresh_api_key_hook = rotate
        transport = _transport.ApiTransport(_client._endpoint(loaded))
        try:
            assert decode_pod(await _client.read_pod(transport, "ml", "p")).key == "ml/p"
            assert decode_pod(await _client.read_pod(transport, "ml", "p")).key == "ml/p"
        finally:
            await transport.close()
    # Read for the first call, again after its 401; the third call reuses the header.
    assert len(hook_runs) == 2


async def test_a_token_refused_twice_is_a_401(tmp_path: Path) -> None:
    api = StubApiServer()
    async with serve(api) as port:
        transport = _transport.ApiTransport(_client._endpoint(configuration(port, "wrong")))
        try:
            with pytest.raises(ApiStatusError) as refused:
                await _client.read_pod(transport, "ml", "p")
        finally:
            await transport.close()
    assert refused.value.status == 401


async def test_an_error_status_is_raised_with_the_api_message(harness: Harness) -> None:
    transport = _transport.ApiTransport(_client._endpoint(configuration(harness.port, TOKEN)))
    try:
        with pytest.raises(ApiStatusError) as missing:
            await _client.read_pod(transport, "ml", "absent")
        harness.api.get_status = 503
        with pytest.raises(ApiStatusError) as failed:
            await _client.read_pod(transport, "ml", "p")
    finally:
        await transport.close()
    assert (missing.value.status, missing.value.reason) == (404, "Not Found")
    assert describe_failure(missing.value) == 'HTTP 404 NotFound: pods "absent" not found'
    assert (failed.value.status, failed.value.reason) == (503, "Service Unavailable")
    assert describe_failure(failed.value) == "HTTP 503 InternalError: broken"


async def test_an_unreachable_api_server_is_a_transport_failure(tmp_path: Path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    # Nothing listens on the port any more: the connection is refused.
    kubernetes = Kubernetes.from_kubeconfig(str(write_kubeconfig(tmp_path / "kc", port)))
    try:
        with pytest.raises(ClusterError) as raised:
            await kubernetes.cluster.get_pod("ml", "p")
    finally:
        await kubernetes.close()
    cause = raised.value.__cause__
    assert isinstance(cause, _transport.API_FAILURES)
    assert not isinstance(cause, ApiStatusError)
    assert str(raised.value).startswith("reading pod ml/p failed: ConnectionRefusedError")
