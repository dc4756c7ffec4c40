"""The daemon's API client (``scheduler.cluster.kube``'s transport and its lean HTTP/1.1
client) against a real kube-apiserver over TLS with a token: Bindings, the API's error
statuses, a token refused then read again, lists in pages, the pod watch and its relist
on 410, and aiohttp's client (kept for a proxy) answering alike.

Only etcd and kube-apiserver run here (``ApiServerPlane``), once for the module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from harness.controlplane import ApiServerPlane
from scheduler.cluster import ClusterError, ClusterPod, PodChange
from scheduler.cluster.kube import _binding, _client, _transport, _watch
from scheduler.cluster.kube._aiohttp import AiohttpClient
from scheduler.cluster.kube._lean import LeanClient
from scheduler.cluster.kube._requests import binding_body
from scheduler.cluster.kube._transport import ApiStatusError, ApiTransport, describe_failure

NAMESPACE = "api-client"
SCHEDULER = "pyhami-scheduler"


@pytest.fixture(scope="module")
def plane(control_plane_binaries: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServerPlane]:
    data = tmp_path_factory.mktemp("api-client")
    running = ApiServerPlane(bin_dir=control_plane_binaries, logs=data, data=data)
    try:
        running.start_etcd()
        running.start_apiserver()
        running.create_namespace(NAMESPACE)
        yield running
    finally:
        running.stop()


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"schedulerName": SCHEDULER, "automountServiceAccountToken": False,
                     "containers": [{"name": "app", "image": "busybox",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def create(plane: ApiServerPlane, name: str) -> str:
    uid: str = plane.api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod(name))[
        "metadata"]["uid"]
    return uid


def stored(plane: ApiServerPlane, name: str) -> dict[str, Any]:
    return plane.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")


def lean(plane: ApiServerPlane) -> ApiTransport:
    api = _client.load_kubeconfig(str(plane.admin_kubeconfig), None)
    assert isinstance(api._http, LeanClient)
    return api


async def test_pods_are_bound_with_their_annotations_watched_or_read(
        plane: ApiServerPlane) -> None:
    api = lean(plane)
    binder = _binding.PodBinder(api, SCHEDULER)
    watched_uid = create(plane, "watched")
    read_uid = create(plane, "read")
    changes = _watch.follow(api, _client.PODS, None, _watch.UnreadableLog())
    try:
        seen: dict[str, ClusterPod] = {}
        while len(seen) < 2:
            change: PodChange = await asyncio.wait_for(anext(changes), 30)
            seen[change.pod.key] = change.pod
        await binder.bind(NAMESPACE, "watched", watched_uid, "node-a", {"pyhami/x": "1"},
                          watched=seen[f"{NAMESPACE}/watched"])
        await binder.bind(NAMESPACE, "read", read_uid, "node-b", {"pyhami/x": "2"},
                          watched=None)
        # The watch sees both bindings.
        bound: dict[str, str | None] = {}
        while len(bound) < 2:
            change = await asyncio.wait_for(anext(changes), 30)
            if change.pod.node is not None:
                bound[change.pod.key] = change.pod.node
    finally:
        await changes.aclose()
        await api.close()
    assert bound == {f"{NAMESPACE}/watched": "node-a", f"{NAMESPACE}/read": "node-b"}
    assert stored(plane, "watched")["metadata"]["annotations"] == {"pyhami/x": "1"}
    assert stored(plane, "read")["spec"]["nodeName"] == "node-b"


async def test_the_apis_refusals_read_as_its_status(plane: ApiServerPlane) -> None:
    uid = create(plane, "refused")
    api = lean(plane)
    try:
        await _client.create_binding(api, NAMESPACE, "refused",
                                     binding_body(NAMESPACE, "refused", uid, "node-a"))
        with pytest.raises(ApiStatusError) as conflict:
            await _client.create_binding(api, NAMESPACE, "refused",
                                         binding_body(NAMESPACE, "refused", uid, "node-b"))
        with pytest.raises(ApiStatusError) as missing:
            await _client.read_pod(api, NAMESPACE, "absent")
        with pytest.raises(ClusterError, match="the pod no longer exists"):
            await _binding.PodBinder(api, SCHEDULER).bind(NAMESPACE, "absent", "", "node-a",
                                                          {}, watched=None)
        # The connection that carried the refusals serves on.
        assert msgspec.json.decode(await _client.read_pod(api, NAMESPACE, "refused"))[
            "spec"]["nodeName"] == "node-a"
    finally:
        await api.close()
    assert conflict.value.status == 409
    assert describe_failure(conflict.value).startswith("HTTP 409 Conflict: ")
    assert describe_failure(missing.value) == (
        'HTTP 404 NotFound: pods "absent" not found')


async def test_a_binding_on_condition_of_a_version_is_refused_for_a_pod_changed_since(
        plane: ApiServerPlane) -> None:
    # What PodBinder's one-request bind of a watched pod with a removal relies on.
    uid = create(plane, "changed")
    version = stored(plane, "changed")["metadata"]["resourceVersion"]
    plane.api.merge_patch(f"/api/v1/namespaces/{NAMESPACE}/pods/changed",
                          {"metadata": {"annotations": {"author": "wrote"}}})
    api = lean(plane)
    try:
        with pytest.raises(ApiStatusError) as refused:
            await _client.create_binding(api, NAMESPACE, "changed", binding_body(
                NAMESPACE, "changed", uid, "node-a", resource_version=version))
    finally:
        await api.close()
    assert refused.value.status == 409
    assert "spec" not in stored(plane, "changed") or not stored(plane, "changed")["spec"].get(
        "nodeName")


async def test_a_token_refused_is_read_again_once(plane: ApiServerPlane) -> None:
    endpoint = lean(plane)._endpoint
    right = endpoint.authorization()
    issued = iter(["Bearer wrong", right, "Bearer wrong", "Bearer wrong"])
    forgotten: list[bool] = []
    rotating = _transport.Endpoint(
        endpoint.base_url, endpoint.ssl_context, endpoint.server_name, None,
        authorization=lambda: next(issued), forget_authorization=lambda: forgotten.append(True))
    api = ApiTransport(rotating)
    try:
        assert await _client.list_nodes(api)
        with pytest.raises(ApiStatusError) as refused:
            await _client.list_nodes(api)
    finally:
        await api.close()
    assert refused.value.status == 401
    assert forgotten == [True, True]


async def test_a_list_in_pages_and_a_watch_from_an_expired_version(
        plane: ApiServerPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    for number in range(12):
        create(plane, f"paged-{number}")
    monkeypatch.setattr(_client, "LIST_PAGE_SIZE", 5)
    api = lean(plane)
    try:
        snapshot = await _client.list_all(api, _client.PODS)
        # From a version long gone: the API server answers 410, the watch lists again.
        changes = _watch.follow(api, _client.PODS, _client.Snapshot([], "1"),
                                _watch.UnreadableLog())
        try:
            keys: set[str] = set()
            while not {f"{NAMESPACE}/paged-{n}" for n in range(12)} <= keys:
                keys.add((await asyncio.wait_for(anext(changes), 30)).pod.key)
        finally:
            await changes.aclose()
    finally:
        await api.close()
    assert {f"{NAMESPACE}/paged-{n}" for n in range(12)} <= {p.key for p in snapshot.items}


async def test_aiohttps_client_answers_alike(plane: ApiServerPlane) -> None:
    create(plane, "alike")
    api = lean(plane)
    proxied = ApiTransport(api._endpoint, AiohttpClient(api._endpoint))
    try:
        mine = msgspec.json.decode(await _client.read_pod(api, NAMESPACE, "alike"))
        theirs = msgspec.json.decode(await _client.read_pod(proxied, NAMESPACE, "alike"))
        with pytest.raises(ApiStatusError) as missing:
            await _client.read_pod(proxied, NAMESPACE, "absent")
    finally:
        await api.close()
        await proxied.close()
    assert mine == theirs
    assert describe_failure(missing.value) == 'HTTP 404 NotFound: pods "absent" not found'
