"""``/api/resourcequotas`` on a live standalone daemon: what it stores, answers and refuses
(validate at the door: a quota pyhami cannot apply is a 400 naming the field, and nothing
is stored)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import nats
import pytest

from common.core.quota import QuotaStanding, ResourceQuotaManifest
from pyhami.demo import lab_pod
from scheduler.cluster.standalone import BUCKET, StoredQuota
from scheduler.web.limits import POD_BODY_LIMIT
from tests.harness import Lab, eventually
from tests.quotas import NAMESPACE, QUOTAS, call, quota, standings, team_pod


async def listed(lab: Lab) -> dict[str, Any]:
    status, text = await call(lab.pods.session, "GET", f"{lab.daemon.url}{QUOTAS}")
    assert status == 200, text
    body: dict[str, Any] = json.loads(text)
    return body


def with_hard(hard: object, **spec: Any) -> dict[str, Any]:
    manifest = quota("q")
    manifest["spec"] = {"hard": hard, **spec}
    return manifest


def selector(*expressions: dict[str, Any]) -> dict[str, Any]:
    return {"matchExpressions": list(expressions)}


MEMORY = "limits.nvidia.com/gpumem"
CORES = "limits.nvidia.com/gpucores"
WHERE = f"ResourceQuota {NAMESPACE}/q"

REFUSED: list[Any] = [
    pytest.param(with_hard({MEMORY: "lots"}), f"{WHERE}: spec.hard[{MEMORY}]: 'lots' is not a "
                 "quantity", id="not-a-quantity"),
    pytest.param(with_hard({MEMORY: "-1"}), f"{WHERE}: spec.hard[{MEMORY}]: '-1' is a negative "
                 "number", id="negative"),
    pytest.param(with_hard({CORES: str(2**53 + 1)}), f"{WHERE}: spec.hard[{CORES}]: "
                 f"'{2**53 + 1}' is above 2^53", id="beyond-2^53"),
    pytest.param(with_hard({MEMORY: 2**70}), f"{WHERE}: spec.hard[{MEMORY}]: an integer of 71 "
                 "bits is above 2^53", id="integer-beyond-any-quantity"),
    pytest.param(with_hard({MEMORY: "0.5"}), f"{WHERE}: spec.hard[{MEMORY}]: '0.5' is not an "
                 "integer", id="fraction"),
    pytest.param(with_hard({CORES: True}), f"{WHERE}: spec.hard[{CORES}]: True is not a "
                 "quantity", id="boolean"),
    pytest.param(with_hard({}, scopes=["Forever"]), f"{WHERE}: spec.scopes[0]: 'Forever' is "
                 "not a scope pyhami applies", id="unknown-scope"),
    pytest.param(with_hard({}, scopes=["Terminating", "NotTerminating"]),
                 f"{WHERE}: scopes Terminating and NotTerminating exclude each other",
                 id="opposed-scopes"),
    pytest.param(with_hard({}, scopeSelector=selector(
        {"scopeName": "PriorityClass", "operator": "Near"})),
        f"{WHERE}: spec.scopeSelector.matchExpressions[0].operator: 'Near' is not one of",
        id="unknown-operator"),
    pytest.param(with_hard({}, scopeSelector=selector(
        {"scopeName": "PriorityClass", "operator": "In"})),
        f"{WHERE}: spec.scopeSelector.matchExpressions[0].values: operator In needs at least "
        "one value", id="in-without-values"),
    pytest.param(with_hard({}, scopeSelector=selector(
        {"scopeName": "BestEffort", "operator": "In", "values": ["x"]})),
        f"{WHERE}: spec.scopeSelector.matchExpressions[0]: scope BestEffort takes operator "
        "Exists", id="values-on-a-plain-scope"),
    pytest.param({"kind": "ResourceQuota", "metadata": {"name": "Bad_Name"}},
                 "metadata.name: 'Bad_Name' is not a valid DNS-1123 subdomain", id="bad-name"),
    pytest.param({"metadata": {"name": "q", "namespace": "a.b"}},
                 "metadata.namespace: 'a.b' is not a valid DNS-1123 label", id="bad-namespace"),
    pytest.param({"kind": "ResourceQuota", "metadata": {}}, "metadata.name: must not be empty",
                 id="no-name"),
    pytest.param({"kind": "Pod", "metadata": {"name": "q"}}, "request body: kind is 'Pod', "
                 "expected 'ResourceQuota'", id="another-kind"),
    pytest.param(with_hard([1]), "request body: Expected `object | null`, got `array` - at "
                 "`$.spec.hard`", id="hard-not-a-mapping"),
    pytest.param(["a", "list"], "request body: expected a ResourceQuota manifest (a mapping)",
                 id="not-a-mapping"),
]


@pytest.mark.parametrize(("body", "message"), REFUSED)
async def test_a_quota_pyhami_cannot_apply_is_refused_by_name_and_nothing_is_stored(
        lab: Lab, body: object, message: str) -> None:
    status, text = await call(lab.pods.session, "POST", f"{lab.daemon.url}{QUOTAS}",
                              json_body=body)
    assert status == 400
    assert message in text
    assert text.count("\n") == 1  # one line
    assert (await listed(lab))["items"] == []
    assert standings(lab.daemon) == []


@pytest.mark.parametrize(("body", "status", "message"), [
    pytest.param("metadata: {name: q}\nspec: {hard: {limits.nvidia.com/gpumem: 1e10000000}}",
                 400, "ResourceQuota default/q: spec.hard[limits.nvidia.com/gpumem]: "
                 "'1e10000000' is above 2^53", id="yaml-exponent"),
    pytest.param('{"metadata":{"name":"q"},"spec":{"hard":{"limits.nvidia.com/gpumem":'
                 '1e10000000}}}', 400, "'1e10000000' is above 2^53", id="json-exponent-literal"),
    pytest.param("a: &a [1, 2]\nb: *a\n", 400, "YAML aliases (*name) are not accepted",
                 id="yaml-alias"),
    pytest.param("{" * 100_000, 400, "request body", id="deep-nesting"),
    pytest.param("\xff\xfe", 400, "request body", id="not-text"),
    pytest.param("#" * (POD_BODY_LIMIT + 1), 413, "Maximum request body size 3145728 exceeded",
                 id="over-3-MiB"),
])
async def test_a_body_that_is_no_manifest_is_a_client_error(
        lab: Lab, body: str, status: int, message: str) -> None:
    answer = await call(lab.pods.session, "POST", f"{lab.daemon.url}{QUOTAS}",
                        data=body.encode("utf-8", "surrogateescape"))
    assert answer[0] == status
    assert message in answer[1]
    assert (await listed(lab))["items"] == []


async def test_a_quota_is_kept_as_given_listed_replaced_and_deleted(lab: Lab) -> None:
    http, url = lab.pods.session, f"{lab.daemon.url}{QUOTAS}"
    given = quota("gpu-quota", memory=4000)
    given["metadata"]["labels"] = {"team": "a"}
    given["status"] = {"hard": {"pods": "100"}, "used": {"pods": "0"}}
    status, text = await call(http, "POST", url, json_body=given)
    assert (status, json.loads(text)) == (201, given)
    status, text = await call(http, "POST", url, json_body=given)
    assert status == 409
    assert text == f"ResourceQuota {NAMESPACE}/gpu-quota already exists\n"

    one = f"{url}/{NAMESPACE}/gpu-quota"
    status, text = await call(http, "GET", one)
    assert (status, json.loads(text)) == (200, given)
    assert await listed(lab) == {"apiVersion": "v1", "kind": "ResourceQuotaList",
                                 "items": [given]}
    assert await call(http, "GET", f"{one}/events") == (200, "[]")

    raised = quota("gpu-quota", memory=6000)
    del raised["metadata"]["name"], raised["metadata"]["namespace"]  # the URL names it
    status, text = await call(http, "PUT", one, json_body=raised)
    assert status == 200
    assert json.loads(text)["metadata"] == {"name": "gpu-quota", "namespace": NAMESPACE}
    assert standings(lab.daemon) == [
        QuotaStanding(NAMESPACE, "gpu-quota", "nvidia.com/gpumem", 0, 6000)]

    assert (await call(http, "DELETE", one))[0] == 204
    assert await call(http, "DELETE", one) == (
        404, f"ResourceQuota {NAMESPACE}/gpu-quota not found\n")
    assert (await call(http, "GET", one))[0] == 404
    assert standings(lab.daemon) == []


async def test_a_put_creates_and_refuses_a_body_naming_another_quota(lab: Lab) -> None:
    http, url = lab.pods.session, f"{lab.daemon.url}{QUOTAS}"
    status, text = await call(http, "PUT", f"{url}/{NAMESPACE}/other",
                              json_body=quota("gpu-quota", memory=1000))
    assert status == 400
    assert text == "request body: metadata.name 'gpu-quota' is not the URL's 'other'\n"
    status, text = await call(http, "PUT", f"{url}/team-b/gpu-quota",
                              json_body=quota("gpu-quota", memory=1000))
    assert status == 400
    assert "metadata.namespace 'team-a' is not the URL's 'team-b'" in text
    status, _ = await call(http, "PUT", f"{url}/{NAMESPACE}/gpu-quota",
                           json_body=quota("gpu-quota", memory=1000))
    assert status == 201
    assert (await call(http, "GET", f"{url}/{NAMESPACE}/Bad_Name"))[0] == 400


async def test_a_yaml_quota_is_taken_and_kept_as_json(lab: Lab) -> None:
    body = (f"apiVersion: v1\nkind: ResourceQuota\nmetadata:\n  name: yaml-quota\n"
            f"  namespace: {NAMESPACE}\nspec:\n  hard:\n    limits.nvidia.com/gpumem: 2Ki\n")
    status, text = await call(lab.pods.session, "POST", f"{lab.daemon.url}{QUOTAS}",
                              data=body)
    assert status == 201, text
    assert json.loads(text)["spec"] == {"hard": {"limits.nvidia.com/gpumem": "2Ki"}}
    assert standings(lab.daemon) == [
        QuotaStanding(NAMESPACE, "yaml-quota", "nvidia.com/gpumem", 0, 2048)]


async def test_a_quota_without_a_gpu_limit_is_stored_and_limits_nothing(lab: Lab) -> None:
    plain = quota("cpu-only")
    plain["spec"]["hard"] = {"cpu": "1", "pods": "1"}
    status, _ = await call(lab.pods.session, "POST", f"{lab.daemon.url}{QUOTAS}",
                           json_body=plain)
    assert status == 201
    assert (await listed(lab))["items"] == [plain]
    assert standings(lab.daemon) == []
    for name in ("a", "b"):
        await lab.pods.submit(team_pod(name, 8000))
        await lab.pods.placed(name, NAMESPACE)


async def test_a_quota_of_another_namespace_leaves_this_one_alone(lab: Lab) -> None:
    status, _ = await call(lab.pods.session, "POST", f"{lab.daemon.url}{QUOTAS}",
                           json_body=quota("tight", memory=1))
    assert status == 201
    await lab.pods.submit_and_place(lab_pod("default-pod"))  # namespace default


async def test_a_quota_written_to_the_bucket_by_another_writer_is_applied_or_refused_with_an_event(
        lab: Lab) -> None:
    """What the door never lets in may still reach the bucket (another daemon's version, a
    hand edit): the watch brings it, and a quota pyhami cannot apply gets a Warning Event
    while its last valid limits stay."""
    client = await nats.connect(lab.nats.url)
    try:
        bucket = await client.jetstream().key_value(BUCKET)

        async def write(manifest: dict[str, Any]) -> None:
            stored = StoredQuota(manifest=msgspec.convert(manifest, ResourceQuotaManifest),
                                 given=msgspec.json.encode(manifest))
            await bucket.put(f"_resourcequota.{NAMESPACE}.outside", msgspec.msgpack.encode(stored))

        await write(quota("outside", memory=3000))

        async def applied() -> bool:
            return standings(lab.daemon) == [
                QuotaStanding(NAMESPACE, "outside", "nvidia.com/gpumem", 0, 3000)]

        await eventually(applied, "the watch to bring the quota")
        await write(quota("outside", memory=-1))
        url = f"{lab.daemon.url}{QUOTAS}/{NAMESPACE}/outside"

        async def refused() -> bool:
            status, text = await call(lab.pods.session, "GET", f"{url}/events")
            return status == 200 and json.loads(text) != []

        await eventually(refused, "the refusal's Event")
        (event,) = json.loads((await call(lab.pods.session, "GET", f"{url}/events"))[1])
        assert (event["type"], event["reason"], event["message"]) == (
            "Warning", "QuotaRefused",
            f"pyhami cannot apply this quota: ResourceQuota {NAMESPACE}/outside: spec.hard["
            "limits.nvidia.com/gpumem]: '-1' is a negative number; its last valid limits stay "
            "applied")
        assert (await call(lab.pods.session, "GET", url))[1].count('"-1"') == 1  # kept as stored
        assert await applied()
    finally:
        await client.close()


BIG = "x" * (1536 * 1024)  # under the 3 MiB body limit, over the 1 MiB NATS message


@pytest.mark.parametrize(("path", "body"), [
    pytest.param(QUOTAS, {**quota("big", memory=1000), "metadata": {
        "name": "big", "namespace": NAMESPACE, "labels": {"note": BIG}}}, id="quota"),
    pytest.param("/api/pods", {**team_pod("big", 1000), "metadata": {
        "name": "big", "namespace": NAMESPACE, "annotations": {"note": BIG}}}, id="pod"),
])
async def test_what_the_store_cannot_hold_in_one_message_is_a_413_and_nothing_is_written(
        lab: Lab, path: str, body: dict[str, Any]) -> None:
    status, text = await call(lab.pods.session, "POST", f"{lab.daemon.url}{path}",
                              json_body=body)
    assert status == 413
    assert "bytes stored, more than the" in text
    assert text.endswith("the NATS server takes in one message; nothing was written\n")
    assert (await listed(lab))["items"] == []
    assert await lab.pods.pods() == []
    await lab.pods.submit(team_pod("after", 1000))  # the store is written as before
    await lab.pods.placed("after", NAMESPACE)
