"""The Kubernetes adapter's ResourceQuotas against the stub API server: the list at start
(``list_quotas``), the list-and-watch that follows them (``quota_changes``), the Events on
a ResourceQuota (``record_quota_event``), and objects the API sends that do not decode.

What only a real API server shows (its validation of a quota, the watch's
resourceVersion semantics, RBAC) is left to tests/e2e/test_quota.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from common.core.quota import QuotaRejected, Scope, parse_quota
from scheduler.cluster import ClusterError, QuotaChange
from scheduler.cluster.kube import Kubernetes, KubernetesCluster, _client, _watch, _wire
from scheduler.metrics import UnreadableCollector
from tests.fakes.apiserver import (
    StubApiServer,
    pod_json,
    quota_json,
    serve,
    status_json,
    write_kubeconfig,
)
from tests.strategies import json_floats, json_junk

MEMORY = "limits.nvidia.com/gpumem"
CORES = "limits.nvidia.com/gpucores"
EXPIRED = {"type": "ERROR", "object": status_json(410, "Expired",
                                                  "too old resource version: 100 (300)")}
# Not a quantity: the API server would never send it, a stub or a newer API might.
NOT_A_QUANTITY = {"not": "a quantity"}


@pytest.fixture
async def stub(tmp_path: Path) -> AsyncIterator[tuple[StubApiServer, KubernetesCluster]]:
    api = StubApiServer()
    async with serve(api) as port:
        kubernetes = Kubernetes.from_kubeconfig(str(write_kubeconfig(tmp_path / "kc", port)))
        yield api, kubernetes.cluster
        await kubernetes.close()


def event(kind: str, quota: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": quota}


def summary(change: QuotaChange) -> tuple[str, str, bool]:
    hard = change.quota.spec.hard or {}
    return change.quota.key, str(hard.get(MEMORY)), change.deleted


async def take(changes: AsyncIterator[QuotaChange], count: int) -> list[tuple[str, str, bool]]:
    return [summary(await asyncio.wait_for(anext(changes), 5)) for _ in range(count)]


def watches_sent(api: StubApiServer) -> list[dict[str, str]]:
    return [r.query for r in api.sent("GET", "/api/v1/resourcequotas")
            if r.query.get("watch") == "true"]


def lists_sent(api: StubApiServer) -> list[dict[str, str]]:
    return [r.query for r in api.sent("GET", "/api/v1/resourcequotas")
            if "watch" not in r.query]


async def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def watch_task_ended() -> bool:
    return not any(task.get_name() == _client.QUOTAS.watch_task for task in asyncio.all_tasks())


# Decoding ---------------------------------------------------------------------------------


def test_a_quota_decodes_as_the_decision_core_reads_it() -> None:
    raw = quota_json("gpu", {MEMORY: "16Ki", CORES: "200", "pods": "10"}, namespace="team-a",
                     uid="u-q", version="42", scope_selector={"matchExpressions": [
                         {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]})
    manifest, version = _wire.quota_and_version(json.dumps(raw).encode())

    assert (manifest.key, manifest.metadata.uid, version) == ("team-a/gpu", "u-q", "42")
    quota = parse_quota(manifest)
    assert (quota.namespace, quota.name, quota.memory, quota.cores) == (
        "team-a", "gpu", 16384, 200)
    (rule,) = quota.rules
    assert (rule.scope, rule.operator, rule.values) == (
        Scope.PRIORITY_CLASS, "In", frozenset({"high"}))


@pytest.mark.parametrize(("raw", "key", "uid", "version"), [
    ({"metadata": {"name": "q", "namespace": "ns", "uid": "u", "resourceVersion": "7"},
      "spec": {"hard": {MEMORY: NOT_A_QUANTITY}}}, "ns/q", "u", "7"),
    ({"metadata": {"name": "q", "namespace": "ns"}, "spec": "not an object"}, "ns/q", "", ""),
    ({"metadata": ["not", "an", "object"]}, "?", "", ""),
], ids=["a-value-not-a-quantity", "a-spec-not-an-object", "metadata-not-an-object"])
def test_an_object_that_does_not_decode_is_named_as_far_as_its_metadata_allows(
        raw: dict[str, Any], key: str, uid: str, version: str) -> None:
    data = json.dumps(raw).encode()
    with pytest.raises(msgspec.DecodeError) as failed:
        _wire.quota_and_version(data)
    unreadable = _wire.Unreadable.of(data, failed.value)
    assert (unreadable.key, unreadable.uid, unreadable.resource_version) == (key, uid, version)
    assert unreadable.error == str(failed.value)


finite = json_floats
junk = json_junk(max_leaves=8)
quota_objects = st.fixed_dictionaries({}, optional={
    "metadata": st.fixed_dictionaries({}, optional={
        "name": st.sampled_from(["gpu-quota", "a"]) | st.text(max_size=10) | junk,
        "namespace": st.sampled_from(["team-a", "b"]) | st.text(max_size=10) | junk,
        "uid": st.text(max_size=6) | junk, "resourceVersion": st.text(max_size=6) | junk}),
    "spec": st.fixed_dictionaries({}, optional={
        "hard": st.dictionaries(
            st.sampled_from([MEMORY, CORES, "pods"]) | st.text(max_size=6),
            st.integers(0, 10**6).map(str) | st.integers() | finite | st.text(max_size=12)
            | junk, max_size=3),
        "scopes": st.lists(st.sampled_from(["Terminating", "BestEffort", "x"]) | junk,
                           max_size=3),
        "scopeSelector": st.fixed_dictionaries({}, optional={"matchExpressions": st.lists(
            st.fixed_dictionaries({}, optional={
                "scopeName": st.sampled_from(["PriorityClass", "Terminating"]) | junk,
                "operator": st.sampled_from(["In", "Exists"]) | junk,
                "values": st.lists(st.text(max_size=6), max_size=3) | junk}),
            max_size=2) | junk}) | junk}) | junk,
}) | junk


@settings(max_examples=300, deadline=None)
@given(quota_objects)
def test_any_object_in_a_watch_is_a_quota_the_core_judges_or_an_unreadable_one(
        obj: Any) -> None:
    """The door a ResourceQuota comes in by: whatever the API sends, a watch event decodes
    to a quota, which ``parse_quota`` applies or refuses by name, or is named unreadable;
    nothing else is raised, so the watch goes on."""
    line = json.dumps({"type": "MODIFIED", "object": obj}).encode()
    seen = _watch.seen(line, _client.QUOTAS)
    if seen.item is None:
        assert seen.unreadable is not None
        return
    try:
        parse_quota(seen.item)
    except QuotaRejected as refused:
        assert str(refused).startswith("ResourceQuota ")


# Reads ------------------------------------------------------------------------------------


async def test_list_quotas_lists_every_namespace_a_page_at_a_time(
        stub: tuple[StubApiServer, KubernetesCluster]) -> None:
    api, cluster = stub
    api.all_quotas.lists = [([quota_json("gpu", {MEMORY: "4000"}, namespace="team-a"),
                              quota_json("cpu", {"limits.cpu": "8"}, namespace="team-b")],
                             "100")]
    quotas = await cluster.list_quotas()

    assert [(q.key, q.spec.hard) for q in quotas] == [
        ("team-a/gpu", {MEMORY: "4000"}), ("team-b/cpu", {"limits.cpu": "8"})]
    assert [(q.get("limit"), q.get("continue")) for q in lists_sent(api)] == [
        ("500", None), ("500", "0:1")]


async def test_a_refused_list_is_a_cluster_error(
        stub: tuple[StubApiServer, KubernetesCluster]) -> None:
    """As without the RBAC to list ResourceQuotas: the daemon cannot start on half a view."""
    api, cluster = stub
    api.all_quotas.forbidden = True
    with pytest.raises(ClusterError) as refused:
        await cluster.list_quotas()
    assert str(refused.value) == (
        'listing ResourceQuotas failed: HTTP 403 Forbidden: resourcequotas is forbidden: User '
        '"stub-token" cannot list resource "resourcequotas" in API group "" at the cluster '
        'scope')


# Changes ----------------------------------------------------------------------------------


async def test_the_watch_goes_on_from_the_list_and_lists_again_after_410(
        stub: tuple[StubApiServer, KubernetesCluster], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_watch, "RETRY_FIRST_DELAY", 0.05)
    api, cluster = stub
    api.all_quotas.lists = [
        ([quota_json("a", {MEMORY: "4000"}, version="90"),
          quota_json("b", {MEMORY: "8000"}, version="95")], "100"),
        # After the 410: a changed while no watch ran, c gone, d new.
        ([quota_json("a", {MEMORY: "6000"}, version="250"),
          quota_json("d", {MEMORY: "1000"}, version="260")], "300"),
    ]
    api.all_quotas.watches = [
        [event("ADDED", quota_json("c", {MEMORY: "2000"}, version="101")),
         event("MODIFIED", quota_json("b", {MEMORY: "9000"}, version="102")),
         {"type": "BOOKMARK", "object": {"kind": "ResourceQuota", "apiVersion": "v1",
                                         "metadata": {"resourceVersion": "150"}}},
         event("DELETED", quota_json("b", {MEMORY: "9000"}, version="160"))],
        500,  # the stream above ended; the next watch fails, and is retried
        [EXPIRED],
    ]
    assert len(await cluster.list_quotas()) == 2
    changes = cluster.quota_changes()
    try:
        with caplog.at_level(logging.INFO, logger="scheduler.cluster.kube"):
            assert await take(changes, 6) == [
                ("default/c", "2000", False), ("default/b", "9000", False),  # from 100
                ("default/b", "9000", True),
                ("default/c", "2000", True),  # missing from the list taken after the 410
                ("default/a", "6000", False), ("default/d", "1000", False),
            ]
            await wait_for(lambda: len(watches_sent(api)) == 4)
    finally:
        await changes.aclose()
    assert [w.get("resourceVersion") for w in watches_sent(api)] == ["100", "160", "160", "300"]
    assert len(lists_sent(api)) == 2 + 2  # list_quotas' two pages, then two after the 410
    assert ("ResourceQuota watch failed, retrying in 0 s: HTTP 500 InternalError: etcd is "
            "down") in caplog.text
    assert "resourceVersion 160 expired; listing ResourceQuotas again" in caplog.text
    assert watch_task_ended()


async def test_without_a_list_first_the_watch_lists(
        stub: tuple[StubApiServer, KubernetesCluster]) -> None:
    api, cluster = stub
    api.all_quotas.lists = [([quota_json("a", {MEMORY: "4000"})], "100")]
    changes = cluster.quota_changes()
    try:
        assert await take(changes, 1) == [("default/a", "4000", False)]
        await wait_for(lambda: len(watches_sent(api)) == 1)
    finally:
        await changes.aclose()  # the watch held open ends with the iteration
    assert watches_sent(api)[0]["resourceVersion"] == "100"
    assert watch_task_ended()


# Objects that do not decode ---------------------------------------------------------------


def unreadable_quota(name: str, version: str) -> dict[str, Any]:
    return quota_json(name, {MEMORY: NOT_A_QUANTITY}, version=version)


async def test_an_unreadable_quota_is_left_out_of_the_list_logged_and_counted_once(
        stub: tuple[StubApiServer, KubernetesCluster],
        caplog: pytest.LogCaptureFixture) -> None:
    api, cluster = stub
    api.all_quotas.lists = [([unreadable_quota("bad", "7"), quota_json("good", {MEMORY: "1"})],
                             "100")]
    with caplog.at_level(logging.WARNING, logger="scheduler.cluster.kube"):
        assert [q.key for q in await cluster.list_quotas()] == ["default/good"]
        assert [q.key for q in await cluster.list_quotas()] == ["default/good"]
    assert cluster.unreadable.counts == {"ResourceQuota": 1, "pod": 0}
    registry = CollectorRegistry()
    registry.register(UnreadableCollector(cluster.unreadable.counts))
    exposition = generate_latest(registry).decode()
    assert 'pyhami_cluster_objects_unreadable_total{kind="ResourceQuota"} 1.0' in exposition
    assert 'pyhami_cluster_objects_unreadable_total{kind="pod"} 0.0' in exposition
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("ResourceQuota default/bad (resourceVersion 7) does not decode, "
                           "left out until it changes: Expected `")
    assert "`$.spec.hard[...]`" in line


async def test_the_watch_goes_past_an_unreadable_quota(
        stub: tuple[StubApiServer, KubernetesCluster],
        caplog: pytest.LogCaptureFixture) -> None:
    api, cluster = stub
    api.all_quotas.lists = [
        ([quota_json("a", {MEMORY: "4000"}, version="90"),
          quota_json("b", {MEMORY: "8000"}, version="95")], "100"),
        # After the 410: b still unreadable, a unreadable now: both stand as last read.
        ([unreadable_quota("a", "250"), unreadable_quota("b", "103")], "300"),
    ]
    api.all_quotas.watches = [
        [event("MODIFIED", unreadable_quota("a", "101")),  # a stays as last read
         event("MODIFIED", unreadable_quota("b", "103")),
         event("ADDED", {"metadata": "not an object"}),
         event("ADDED", quota_json("c", {MEMORY: "2000"}, version="104")),
         # Deleted while unreadable: what was read of it before is deleted.
         event("DELETED", unreadable_quota("a", "105")),
         EXPIRED],
    ]
    assert len(await cluster.list_quotas()) == 2
    changes = cluster.quota_changes()
    try:
        with caplog.at_level(logging.WARNING, logger="scheduler.cluster.kube"):
            assert await take(changes, 2) == [
                ("default/c", "2000", False), ("default/a", "4000", True)]
            await wait_for(lambda: len(watches_sent(api)) == 2)
    finally:
        await changes.aclose()
    # The list after the 410 deleted nothing and delivered nothing: b stands as read.
    assert [w.get("resourceVersion") for w in watches_sent(api)] == ["100", "300"]
    # a at 101, b at 103, the object without metadata, a at 105, a at 250 (b at 103 again
    # in the list after the 410 is the same version: not counted twice).
    assert cluster.unreadable.counts == {"ResourceQuota": 5, "pod": 0}
    assert "ResourceQuota ? (resourceVersion ?) does not decode" in caplog.text
    assert watch_task_ended()


async def test_a_pod_that_does_not_decode_no_longer_stalls_the_pod_watch(
        stub: tuple[StubApiServer, KubernetesCluster]) -> None:
    api, cluster = stub
    bad = pod_json("bad", version="101")
    bad["spec"]["containers"] = "not a list"
    api.all_pods.lists = [([], "100")]
    api.all_pods.watches = [[event("ADDED", bad), event("ADDED", pod_json("x", version="102"))]]
    changes = cluster.changes()
    try:
        first = await asyncio.wait_for(anext(changes), 5)
    finally:
        await changes.aclose()
    assert first.pod.key == "default/x"
    assert cluster.unreadable.counts == {"ResourceQuota": 0, "pod": 1}


# Events -----------------------------------------------------------------------------------


async def test_an_event_on_a_resourcequota_names_it_by_kind_and_uid(
        stub: tuple[StubApiServer, KubernetesCluster]) -> None:
    api, cluster = stub
    api.all_quotas.lists = [([quota_json("gpu", {MEMORY: "-1"}, namespace="team-a",
                                         uid="u-q")], "100")]
    await cluster.list_quotas()
    for _ in range(2):
        await cluster.record_quota_event("team-a", "gpu", "Warning", "QuotaRefused",
                                         "pyhami cannot apply this quota")
    await cluster.record_event("team-a", "gpu", "Warning", "QuotaRefused",
                               "pyhami cannot apply this quota")  # a pod of the same name

    (created, on_pod) = api.sent("POST", "/api/v1/namespaces/team-a/events")
    body = created.body
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "ResourceQuota",
                                      "namespace": "team-a", "name": "gpu", "uid": "u-q"}
    assert (body["type"], body["reason"], body["message"]) == (
        "Warning", "QuotaRefused", "pyhami cannot apply this quota")
    assert body["metadata"]["name"].startswith("gpu.")
    assert on_pod.body["involvedObject"]["kind"] == "Pod"
    assert on_pod.body["metadata"]["name"] != body["metadata"]["name"]
    assert api.events[f"team-a/{body['metadata']['name']}"]["count"] == 2
    # The quota's uid came from the list: no ResourceQuota was read for it.
    assert not [r for r in api.requests if "/resourcequotas/" in r.path]


async def test_an_event_on_a_quota_never_listed_has_no_uid_and_a_failure_is_only_logged(
        stub: tuple[StubApiServer, KubernetesCluster],
        caplog: pytest.LogCaptureFixture) -> None:
    api, cluster = stub
    await cluster.record_quota_event("team-a", "gpu", "Warning", "QuotaRefused", "m")
    (created,) = api.sent("POST", "/events")
    assert "uid" not in created.body["involvedObject"]

    api.event_status = 403
    with caplog.at_level(logging.WARNING, logger="scheduler.cluster.kube"):
        await cluster.record_quota_event("team-a", "other", "Warning", "QuotaRefused", "m")
    assert ("event QuotaRefused on ResourceQuota team-a/other not recorded: HTTP 403 "
            "Forbidden: events are forbidden") in caplog.text


async def test_the_uid_follows_the_watch(
        stub: tuple[StubApiServer, KubernetesCluster]) -> None:
    api, cluster = stub
    api.all_quotas.lists = [([quota_json("gpu", {MEMORY: "1"}, uid="u-1")], "100")]
    api.all_quotas.watches = [[
        event("DELETED", quota_json("gpu", {MEMORY: "1"}, uid="u-1", version="101")),
        event("ADDED", quota_json("gpu", {MEMORY: "2"}, uid="u-2", version="102"))]]
    await cluster.list_quotas()
    changes = cluster.quota_changes()
    try:
        await take(changes, 2)
    finally:
        await changes.aclose()
    await cluster.record_quota_event("default", "gpu", "Warning", "QuotaRefused", "m")
    (created,) = api.sent("POST", "/events")
    assert created.body["involvedObject"]["uid"] == "u-2"
