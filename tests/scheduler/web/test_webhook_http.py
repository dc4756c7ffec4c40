"""The webhook over a real HTTPS listener: AdmissionReview in, JSONPatch out.

Certificates come from the openssl command (``tests.certs``); the client verifies the
listener against its CA as the API server does against the configuration's caBundle.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import json
import os
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from common.core.deviceconfig import DeviceConfig
from common.core.pod import PodManifest
from common.core.vendors import ResourceNames
from pyhami.natsserver import LocalNatsServer, free_port
from pyhami.sandbox import RunningDaemon, standalone_config
from scheduler.config import WebhookConfig
from scheduler.tls.files import CertificateFiles
from scheduler.tls.webhook import WEBHOOK_FLAGS
from scheduler.web.limits import ADMISSION_BODY_LIMIT
from scheduler.web.webhook import webhook_app
from tests.certs import ServerFiles, server_files

OURS = "pyhami-scheduler"
GPU_LIMITS = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}


def pod_json(limits: dict[str, str] | None = None, *, scheduler: str = "default-scheduler",
             privileged: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "app", "image": "cuda:12",
                                 "resources": {"limits": dict(limits or {})}}
    if privileged:
        container["securityContext"] = {"privileged": True}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "trainer", "namespace": "ml"},
            "spec": {"schedulerName": scheduler, "containers": [container],
                     "restartPolicy": "Always"}}


def review(obj: Any, *, uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
           operation: str = "CREATE", kind: dict[str, str] | None = None,
           version: str = "admission.k8s.io/v1", sub_resource: str | None = None,
           ) -> dict[str, Any]:
    """An AdmissionReview as kube-apiserver sends it for a pod being created."""
    request: dict[str, Any] = {
        "uid": uid,
        "kind": kind or {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": kind or {"group": "", "version": "v1", "kind": "Pod"},
        "name": "trainer", "namespace": "ml", "operation": operation,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": obj, "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    if sub_resource is not None:
        request["subResource"] = sub_resource
    return {"apiVersion": version, "kind": "AdmissionReview", "request": request}


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> ServerFiles:
    return server_files(tmp_path_factory.mktemp("webhook-tls"))


def client_context(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


class Webhook:
    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url
        self.session = session

    async def post(self, body: bytes | dict[str, Any],
                   headers: dict[str, str] | None = None) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with self.session.post(self.url, data=data, headers=headers or {
                "Content-Type": "application/json"}) as response:
            text = await response.text()
            if response.status == 200:
                assert response.content_type == "application/json"
                return response.status, json.loads(text)
            return response.status, text


async def serve_webhook(context: ssl.SSLContext) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(webhook_app(OURS))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    return runner, port


@pytest.fixture
async def webhook(tls: ServerFiles) -> AsyncIterator[Webhook]:
    files = CertificateFiles("webhook", WEBHOOK_FLAGS, str(tls.cert), str(tls.key))
    runner, port = await serve_webhook(files.context)
    connector = aiohttp.TCPConnector(ssl=client_context(tls.ca))
    async with aiohttp.ClientSession(connector=connector) as session:
        yield Webhook(f"https://127.0.0.1:{port}/webhook", session)
    await runner.cleanup()


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    response = answer["response"]
    assert response["patchType"] == "JSONPatch", response
    operations: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return operations


def apply(patch: list[dict[str, Any]], document: dict[str, Any]) -> dict[str, Any]:
    """RFC 6902 add of object members and appends to arrays (``/-``): the operations the
    webhook sends. A path through a missing member fails, as it would in the API server."""
    result = copy.deepcopy(document)
    for operation in patch:
        assert operation["op"] in ("add", "replace"), operation
        *parents, last = operation["path"].lstrip("/").split("/")
        target: Any = result
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if last == "-":
            assert isinstance(target, list), operation
            target.append(operation["value"])
        else:
            assert isinstance(target, dict), operation
            target[last] = operation["value"]
    return result


async def test_a_gpu_pod_gets_pyhamis_scheduler_name(webhook: Webhook) -> None:
    pod = pod_json(GPU_LIMITS)
    status, answer = await webhook.post(review(pod, uid="uid-1"))
    assert status == 200
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "uid-1"
    assert response["allowed"] is True
    assert patch_of(answer) == [{"op": "add", "path": "/spec/schedulerName", "value": OURS}]
    patched = apply(patch_of(answer), pod)
    assert patched["spec"]["schedulerName"] == OURS
    assert patched["spec"]["containers"] == pod["spec"]["containers"]


async def test_the_patch_also_adds_a_missing_scheduler_name(webhook: Webhook) -> None:
    pod = pod_json(GPU_LIMITS)
    del pod["spec"]["schedulerName"]
    _, answer = await webhook.post(review(pod))
    assert apply(patch_of(answer), pod)["spec"]["schedulerName"] == OURS


@pytest.mark.parametrize("pod", [
    pod_json({"cpu": "1"}),
    pod_json(GPU_LIMITS, scheduler="volcano"),
    pod_json(GPU_LIMITS, scheduler=OURS),
], ids=["no-gpu", "another-scheduler", "already-ours"])
async def test_a_pod_left_alone_is_allowed_without_a_patch(webhook: Webhook,
                                                           pod: dict[str, Any]) -> None:
    status, answer = await webhook.post(review(pod, uid="uid-2"))
    assert status == 200
    assert answer["response"] == {"uid": "uid-2", "allowed": True}


@pytest.mark.parametrize(("privileged", "node", "message"), [
    (True, None, "container app is privileged"),
    (False, "gpu-node-1", "pod has node assigned"),
    (True, "gpu-node-1", "container app is privileged"),
], ids=["privileged", "on-a-node", "both"])
async def test_hamis_denials(webhook: Webhook, privileged: bool, node: str | None,
                             message: str) -> None:
    pod = pod_json(GPU_LIMITS, privileged=privileged)
    if node is not None:
        pod["spec"]["nodeName"] = node
    status, answer = await webhook.post(review(pod, uid="uid-3"))
    assert status == 200
    assert answer["response"] == {"uid": "uid-3", "allowed": False, "status": {
        "code": 403, "reason": "Forbidden", "message": message}}


async def test_a_v1beta1_review_is_answered_in_v1beta1(webhook: Webhook) -> None:
    _, answer = await webhook.post(review(pod_json(GPU_LIMITS),
                                          version="admission.k8s.io/v1beta1"))
    assert answer["apiVersion"] == "admission.k8s.io/v1beta1"
    assert patch_of(answer)[0]["value"] == OURS


@pytest.mark.parametrize(("kind", "operation", "sub_resource"), [
    ({"group": "apps", "version": "v1", "kind": "Deployment"}, "CREATE", None),
    ({"group": "", "version": "v1", "kind": "ConfigMap"}, "CREATE", None),
    ({"group": "", "version": "v1", "kind": "Pod"}, "UPDATE", None),
    ({"group": "", "version": "v1", "kind": "Pod"}, "CREATE", "ephemeralcontainers"),
], ids=["deployment", "configmap", "pod-update", "pod-subresource"])
async def test_anything_but_a_new_pod_is_allowed_untouched(
        webhook: Webhook, kind: dict[str, str], operation: str,
        sub_resource: str | None) -> None:
    # The object would be patched if it were read as a new pod.
    body = review(pod_json(GPU_LIMITS), uid="uid-3", kind=kind, operation=operation,
                  sub_resource=sub_resource)
    status, answer = await webhook.post(body)
    assert status == 200
    assert answer["response"] == {"uid": "uid-3", "allowed": True}


@pytest.mark.parametrize(("body", "needle"), [
    (b"not json", "not an AdmissionReview"),
    (b"[1, 2]", "not an AdmissionReview"),
    (json.dumps({"apiVersion": "v1", "kind": "Pod"}).encode(), "kind 'Pod' apiVersion 'v1'"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
     "no request.uid"),
    (json.dumps(review(pod_json(GPU_LIMITS), uid="")).encode(), "no request.uid"),
    (json.dumps(review(None)).encode(), "a Pod CREATE carries the Pod"),
    (json.dumps(review({"spec": {"containers": "app"}})).encode(),
     "request.object is not a Pod: Expected `array`, got `str` - at `$.spec.containers`"),
    (json.dumps(review({"spec": {"containers": [{"resources": {"limits": {
        "nvidia.com/gpu": True}}}]}})).encode(), "request.object is not a Pod"),
    (b'{"request": ' * 5000 + b"null" + b"}" * 5000, "not an AdmissionReview"),
], ids=["not-json", "array", "not-a-review", "no-request", "empty-uid", "no-object",
        "containers-not-a-list", "quantity-not-a-quantity", "nested-deeply"])
async def test_a_body_that_cannot_be_read_is_a_400_naming_the_problem(
        webhook: Webhook, body: bytes, needle: str) -> None:
    status, text = await webhook.post(body)
    assert status == 400, text
    assert text.startswith("malformed AdmissionReview: ")
    assert needle in text


@pytest.mark.slow  # waits out the read timeout
async def test_a_body_over_the_limit_is_refused_before_it_is_read(webhook: Webhook) -> None:
    status, _ = await webhook.post(b" " * (ADMISSION_BODY_LIMIT + 1))
    assert status == 413


async def test_only_https_is_served(webhook: Webhook) -> None:
    plain = webhook.url.replace("https://", "http://")
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.post(plain, json=review(pod_json(GPU_LIMITS))) as response:
                await response.read()


async def test_renewed_certificate_files_are_served_without_a_restart(tmp_path: Path) -> None:
    first = server_files(tmp_path / "first")
    files = CertificateFiles("webhook", WEBHOOK_FLAGS, str(first.cert), str(first.key))
    runner, port = await serve_webhook(files.context)
    url = f"https://127.0.0.1:{port}/webhook"
    try:
        async def answered(ca: Path) -> int:
            connector = aiohttp.TCPConnector(ssl=client_context(ca), force_close=True)
            async with aiohttp.ClientSession(connector=connector) as session, \
                    session.post(url, json=review(pod_json(GPU_LIMITS))) as response:
                return response.status

        assert await answered(first.ca) == 200
        assert not files.reload_if_changed(now())
        # What the kubelet does when cert-manager renews the mounted Secret.
        second = server_files(tmp_path / "second")
        stamp = time.time() + 5
        for source, target in ((second.cert, first.cert), (second.key, first.key)):
            target.write_bytes(source.read_bytes())
            os.utime(target, (stamp, stamp))
        assert files.reload_if_changed(now())
        assert await answered(second.ca) == 200
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await answered(first.ca)
    finally:
        await runner.cleanup()


async def test_a_half_written_renewal_keeps_the_served_certificate(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = server_files(tmp_path / "first")
    files = CertificateFiles("webhook", WEBHOOK_FLAGS, str(first.cert), str(first.key))
    second = server_files(tmp_path / "second")
    first.cert.write_bytes(second.cert.read_bytes())  # the key is still the old one
    stamp = time.time() + 5
    os.utime(first.cert, (stamp, stamp))
    assert not files.reload_if_changed(now())
    assert "cannot be served, keeping the current ones" in caplog.text
    assert "is not the private key of the certificate" in caplog.text


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


async def test_the_daemon_serves_the_webhook_on_its_own_listener(
        jetstream_server: LocalNatsServer, tls: ServerFiles) -> None:
    port = free_port()
    config = replace(standalone_config(jetstream_server.url), scheduler_name="gpu-team",
                     webhook=WebhookConfig(listen=("127.0.0.1", port), cert_file=str(tls.cert),
                                           key_file=str(tls.key)))
    daemon = await RunningDaemon(config).start()
    try:
        connector = aiohttp.TCPConnector(ssl=client_context(tls.ca))
        async with aiohttp.ClientSession(connector=connector) as session:
            hook = Webhook(f"https://127.0.0.1:{port}/webhook", session)
            status, answer = await hook.post(review(pod_json(GPU_LIMITS)))
            assert status == 200
            assert patch_of(answer)[0]["value"] == "gpu-team"
            async with session.get(f"{daemon.url}/statusz") as response:
                webhook_status = (await response.json())["webhook"]
        assert webhook_status["listen"] == f"127.0.0.1:{port}"
        assert webhook_status["scheduler_name"] == "gpu-team"
        assert webhook_status["certificate"] == f"files {tls.cert}, {tls.key}"
    finally:
        await daemon.stop()
    with pytest.raises(OSError):  # the listener is closed with the daemon
        await asyncio.open_connection("127.0.0.1", port)


class RecordingGate:
    """A quota gate that refuses every pod of namespace ``refused`` with ``SENTENCE``."""

    SENTENCE = ("ml would use 5000 of 4000 MiB nvidia.com/gpumem under ResourceQuota "
                "gpu-quota (asked 1000)")

    def __init__(self, refused: str = "ml") -> None:
        self.refused = refused
        self.asked: list[tuple[str, str]] = []

    def __call__(self, pod: PodManifest) -> str | None:
        self.asked.append((pod.namespace, pod.metadata.name))
        return self.SENTENCE if pod.namespace == self.refused else None


@pytest.fixture
async def gated(tls: ServerFiles) -> AsyncIterator[tuple[Webhook, RecordingGate]]:
    gate = RecordingGate()
    runner = web.AppRunner(webhook_app(OURS, gate))
    await runner.setup()
    port = free_port()
    files = CertificateFiles("webhook", WEBHOOK_FLAGS, str(tls.cert), str(tls.key))
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=files.context).start()
    connector = aiohttp.TCPConnector(ssl=client_context(tls.ca))
    async with aiohttp.ClientSession(connector=connector) as session:
        yield Webhook(f"https://127.0.0.1:{port}/webhook", session), gate
    await runner.cleanup()


@pytest.mark.parametrize("scheduler", ["default-scheduler", OURS],
                         ids=["redirected", "naming-pyhami"])
async def test_a_pod_over_its_namespaces_quota_is_denied_with_the_sentence(
        gated: tuple[Webhook, RecordingGate], scheduler: str) -> None:
    hook, gate = gated
    status, answer = await hook.post(review(pod_json(GPU_LIMITS, scheduler=scheduler)))
    assert status == 200
    response = answer["response"]
    assert response["allowed"] is False
    assert response["status"] == {"code": 403, "reason": "Forbidden",
                                  "message": RecordingGate.SENTENCE}
    assert "patch" not in response
    assert gate.asked == [("ml", "trainer")]


async def test_the_quota_is_judged_in_the_namespace_the_api_server_names(
        gated: tuple[Webhook, RecordingGate]) -> None:
    hook, gate = gated
    pod = pod_json(GPU_LIMITS)
    del pod["metadata"]["namespace"]  # as kubectl sends a pod created with -n
    body = review(pod)
    body["request"]["namespace"] = "other"
    status, answer = await hook.post(body)
    assert status == 200
    assert answer["response"]["allowed"] is True
    assert patch_of(answer)[0]["value"] == OURS
    assert gate.asked == [("other", "trainer")]


@pytest.mark.parametrize(("limits", "scheduler"), [
    ({}, "default-scheduler"),
    (GPU_LIMITS, "another-scheduler"),
], ids=["no-gpu", "other-scheduler"])
async def test_a_pod_pyhami_will_not_place_is_not_judged_by_quota(
        gated: tuple[Webhook, RecordingGate], limits: dict[str, str], scheduler: str) -> None:
    hook, gate = gated
    status, answer = await hook.post(review(pod_json(limits, scheduler=scheduler)))
    assert status == 200
    assert answer["response"]["allowed"] is True
    assert gate.asked == []


async def test_a_privileged_pod_over_quota_gets_the_privileged_denial(
        gated: tuple[Webhook, RecordingGate]) -> None:
    # HAMi's order: the quota is judged last, once the pod is otherwise admitted.
    hook, gate = gated
    _, answer = await hook.post(review(pod_json(GPU_LIMITS, privileged=True)))
    assert answer["response"]["status"]["message"] == "container app is privileged"
    assert gate.asked == []


EVERY_KEY = DeviceConfig(
    resources=ResourceNames(count="example.com/vgpu", priority="example.com/vprio"),
    overwrite_env=True, gpu_core_policy="force", runtime_class_name="nvidia")


def two_container_pod(limits: dict[str, str], app_env: list[dict[str, str]] | None,
                      runtime_class: str | None = None) -> dict[str, Any]:
    """A pod with an ``app`` (``limits``, ``app_env``) and a ``sidecar`` that has an env
    list, an init container without one."""
    pod = pod_json(limits)
    app = pod["spec"]["containers"][0]
    if app_env is not None:
        app["env"] = app_env
    pod["spec"]["containers"].append({"name": "sidecar", "image": "envoy",
                                      "env": [{"name": "MODE", "value": "proxy"}]})
    pod["spec"]["initContainers"] = [{"name": "warm-up", "image": "busybox"}]
    if runtime_class is not None:
        pod["spec"]["runtimeClassName"] = runtime_class
    return pod


@pytest.mark.parametrize(("device", "limits", "app_env", "expected"), [
    (DeviceConfig(), {"nvidia.com/gpu": "1", "nvidia.com/priority": "1"}, None, {
        "app": [{"name": "CUDA_TASK_PRIORITY", "value": "1"}],
        "sidecar": [{"name": "MODE", "value": "proxy"}],
        "warm-up": None, "runtimeClassName": None}),
    (DeviceConfig(), GPU_LIMITS, None, {
        "app": None, "sidecar": [{"name": "MODE", "value": "proxy"}],
        "warm-up": None, "runtimeClassName": None}),
    (EVERY_KEY, {"example.com/vgpu": "1", "example.com/vprio": "2"},
     [{"name": "CUDA_TASK_PRIORITY", "value": "0"}], {
         "app": [{"name": "CUDA_TASK_PRIORITY", "value": "0"},
                 {"name": "CUDA_TASK_PRIORITY", "value": "2"},
                 {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}],
         "sidecar": [{"name": "MODE", "value": "proxy"},
                     {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"},
                     {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}],
         "warm-up": [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"},
                     {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}],
         "runtimeClassName": "nvidia"}),
], ids=["priority-under-defaults", "chart-defaults", "every-key"])
async def test_the_patch_applied_gives_hamis_pod(
        tls: ServerFiles, device: DeviceConfig, limits: dict[str, str],
        app_env: list[dict[str, str]] | None, expected: dict[str, Any]) -> None:
    runner = web.AppRunner(webhook_app(OURS, None, device))
    await runner.setup()
    port = free_port()
    files = CertificateFiles("webhook", WEBHOOK_FLAGS, str(tls.cert), str(tls.key))
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=files.context).start()
    pod = two_container_pod(limits, app_env)
    try:
        connector = aiohttp.TCPConnector(ssl=client_context(tls.ca))
        async with aiohttp.ClientSession(connector=connector) as session:
            hook = Webhook(f"https://127.0.0.1:{port}/webhook", session)
            status, answer = await hook.post(review(pod))
    finally:
        await runner.cleanup()
    assert status == 200 and answer["response"]["allowed"] is True
    patched = apply(patch_of(answer), pod)
    spec = patched["spec"]
    every = {c["name"]: c.get("env") for c in [*spec["initContainers"], *spec["containers"]]}
    assert {**every, "runtimeClassName": spec.get("runtimeClassName")} == expected
    assert spec["schedulerName"] == OURS
    # Nothing else of the pod changed.
    for container in [*spec["initContainers"], *spec["containers"]]:
        container.pop("env", None)
    for container in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
        container.pop("env", None)
    spec.pop("runtimeClassName", None)
    assert patched == {**pod, "spec": {**pod["spec"], "schedulerName": OURS}}
