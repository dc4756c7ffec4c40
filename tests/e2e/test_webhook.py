"""The mutating webhook on the real kube-apiserver.

A MutatingWebhookConfiguration as the chart registers it (``failurePolicy: Ignore``, the
``hami.io/webhook=ignore`` namespace opt-out), but reaching the suite's daemon at
``https://127.0.0.1:<port>/webhook`` with the test CA as ``caBundle``: there is no
kube-proxy, so no Service routes here. Then the self-managed certificate: a second
daemon, with the RBAC it needs, makes its Secret and keeps a configuration's
``caBundle`` set to its CA.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from cryptography import x509

from harness.controlplane import (
    SCHEDULER_NAME,
    SCHEDULER_SERVICE_ACCOUNT,
    START_TIMEOUT_S,
    SYSTEM_NAMESPACE,
    ApiError,
    Process,
    tail,
    wait_for,
)
from pyhami.bench.loopback import http_get
from pyhami.natsserver import free_port
from scheduler.cluster.kube import Kubernetes
from scheduler.tls.webhook import self_managed, service_names
from tests.e2e.controlplane import NODE, TEST_NAMESPACE, ControlPlane
from tests.e2e.pods import HAMI_EXAMPLE, ClusterLab, card_uuid, lab_pod

CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
OPT_OUT_NAMESPACE = "pyhami-e2e-opted-out"
OPT_OUT = {"hami.io/webhook": "ignore"}
JSON_PATCH = "application/json-patch+json"


def webhook(name: str, client_config: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """One webhook for pods being created, as the chart registers it."""
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Ignore",
        "matchPolicy": "Equivalent",
        "timeoutSeconds": 10,
        "clientConfig": client_config,
        "namespaceSelector": {"matchExpressions": [
            {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]},
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                   "resources": ["pods"], "scope": "*"}],
        **fields,
    }


def configuration(name: str, *webhooks: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration", "metadata": {"name": name},
            "webhooks": list(webhooks)}


def gpu_pod(name: str, namespace: str = TEST_NAMESPACE,
            scheduler: str | None = None) -> dict[str, Any]:
    """The lab pod, naming the scheduler given or, by default, none (as HAMi's examples)."""
    pod = lab_pod(name)
    pod["metadata"]["namespace"] = namespace
    del pod["spec"]["schedulerName"]
    if scheduler is not None:
        pod["spec"]["schedulerName"] = scheduler
    return pod


def pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def dry_run_scheduler(plane: ControlPlane, namespace: str = TEST_NAMESPACE) -> str:
    """The schedulerName a GPU pod naming none would be created with now (nothing stored)."""
    created = plane.api.request("POST", pods_path(namespace), gpu_pod("probe", namespace),
                                query={"dryRun": "All"})
    name: str = created["spec"]["schedulerName"]
    return name


@pytest.fixture(scope="module")
def registered(control_plane: ControlPlane) -> Iterator[str]:
    """The suite's daemon registered as a webhook; removed afterwards, and waited for,
    so that later tests see pods exactly as they create them."""
    assert control_plane.webhook_tls is not None
    api = control_plane.api
    name = "pyhami-e2e-webhook"
    ca = base64.b64encode(control_plane.webhook_tls.ca.read_bytes()).decode()
    api.create(CONFIGURATIONS, configuration(name, webhook(
        "vgpu.pyhami.io", {"url": control_plane.webhook_url, "caBundle": ca},
        objectSelector={"matchExpressions": [
            {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]},
        reinvocationPolicy="Never")))
    api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": OPT_OUT_NAMESPACE,
                                                   "labels": OPT_OUT}})
    api.create(f"/api/v1/namespaces/{OPT_OUT_NAMESPACE}/serviceaccounts",
               {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
    try:
        # The API server picks a new configuration up within moments.
        wait_for(lambda: dry_run_scheduler(control_plane) == SCHEDULER_NAME,
                 "the API server to call the webhook", watch=control_plane.all_processes())
        yield name
    finally:
        api.delete(f"{CONFIGURATIONS}/{name}")
        api.delete(pods_path(OPT_OUT_NAMESPACE), gracePeriodSeconds="0")
        # No namespace controller runs here to finish deleting a namespace: it stays, empty.
        wait_for(lambda: dry_run_scheduler(control_plane) == "default-scheduler",
                 "the API server to stop calling the webhook")


@pytest.fixture
def lab(registered: str, lab: ClusterLab) -> ClusterLab:
    """The suite's lab (conftest.py), the webhook registered before it."""
    return lab


def test_a_lab_pod_without_scheduler_name_is_placed_by_pyhami(lab: ClusterLab) -> None:
    lab.create_manifest(gpu_pod("hami-manifest"))
    assert lab.read("hami-manifest")["spec"]["schedulerName"] == SCHEDULER_NAME
    placed = lab.wait_placed("hami-manifest")
    assert placed.node == NODE
    assert placed.allocated == f"{card_uuid(0)},NVIDIA,1000,0:;", placed.allocated
    assert placed.annotations.get("hami.io/vgpu-node") == NODE
    assert placed.annotations.get("hami.io/bind-phase") == "allocating"


def test_hamis_own_example_unchanged_is_given_pyhamis_name_and_bound(lab: ClusterLab) -> None:
    # HAMi's examples/nvidia/default_use.yaml, byte for byte (test_hami_scheduler_name.py
    # pins its digest): it names no scheduler, as HAMi's webhook fills the name in.
    manifest = yaml.safe_load(HAMI_EXAMPLE.read_text())
    name = manifest["metadata"]["name"]
    lab.create_manifest(manifest)
    assert lab.read(name)["spec"]["schedulerName"] == SCHEDULER_NAME
    placed = lab.wait_placed(name)
    assert placed.node == NODE
    assert placed.allocated.split(":")[0].split(",")[2:] == ["3000", "30"], placed.allocated


def test_a_pod_naming_another_scheduler_is_left_alone(lab: ClusterLab) -> None:
    lab.create_manifest(gpu_pod("volcano-job", scheduler="volcano"))
    assert lab.read("volcano-job")["spec"]["schedulerName"] == "volcano"
    lab.assert_pending("volcano-job")


def test_a_pod_without_gpus_keeps_the_default_scheduler(lab: ClusterLab) -> None:
    pod = gpu_pod("cpu-only")
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    lab.create_manifest(pod)
    assert lab.read("cpu-only")["spec"]["schedulerName"] == "default-scheduler"


def test_a_pod_labelled_to_opt_out_is_left_alone(lab: ClusterLab) -> None:
    pod = gpu_pod("opted-out-pod")
    pod["metadata"]["labels"] = dict(OPT_OUT)
    lab.create_manifest(pod)
    assert lab.read("opted-out-pod")["spec"]["schedulerName"] == "default-scheduler"


def test_a_namespace_labelled_to_opt_out_is_not_mutated(
        control_plane: ControlPlane, registered: str) -> None:
    api = control_plane.api
    created = api.create(pods_path(OPT_OUT_NAMESPACE), gpu_pod("opted-out", OPT_OUT_NAMESPACE))
    assert created["spec"]["schedulerName"] == "default-scheduler"
    # The same pod in a namespace without the label is pyhami's.
    assert dry_run_scheduler(control_plane) == SCHEDULER_NAME


def test_with_the_daemon_down_pods_are_created_unchanged(
        control_plane: ControlPlane, registered: str) -> None:
    """failurePolicy Ignore: an unreachable webhook admits the pod as it was written."""
    assert control_plane.stop_daemon() == 0
    try:
        assert dry_run_scheduler(control_plane) == "default-scheduler"
    finally:
        control_plane.start_daemon()
    assert dry_run_scheduler(control_plane) == SCHEDULER_NAME


# The self-managed certificate ---------------------------------------------------------

SELF_SECRET = "pyhami-e2e-hook-tls"
SELF_SERVICE = "pyhami-e2e-hook"
SELF_CONFIGURATION = "pyhami-e2e-self-managed"
SELF_NAMES = service_names(SELF_SERVICE, SYSTEM_NAMESPACE)
ROLE = "pyhami-e2e-webhook-tls"
SECRETS = f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/secrets"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def webhook_rbac(secret: str, configuration_name: str) -> list[tuple[str, dict[str, Any]]]:
    """What the daemon needs beyond the scheduler's RBAC to manage its own certificate:
    read and create its Secret; read and patch its MutatingWebhookConfiguration."""
    subject = [{"kind": "ServiceAccount", "name": SCHEDULER_SERVICE_ACCOUNT,
                "namespace": SYSTEM_NAMESPACE}]
    return [
        (f"{RBAC}/namespaces/{SYSTEM_NAMESPACE}/roles", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": ROLE, "namespace": SYSTEM_NAMESPACE},
            "rules": [
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                 "resourceNames": [secret]},
                # A create cannot be limited to a name: RBAC knows none before the object.
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
            ]}),
        (f"{RBAC}/namespaces/{SYSTEM_NAMESPACE}/rolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": ROLE, "namespace": SYSTEM_NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE},
            "subjects": subject}),
        (f"{RBAC}/clusterroles", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": ROLE},
            "rules": [{"apiGroups": ["admissionregistration.k8s.io"],
                       "resources": ["mutatingwebhookconfigurations"],
                       "verbs": ["get", "patch"], "resourceNames": [configuration_name]}]}),
        (f"{RBAC}/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": ROLE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": ROLE},
            "subjects": subject}),
    ]


@pytest.fixture(scope="module")
def rbac(control_plane: ControlPlane) -> Iterator[None]:
    objects = webhook_rbac(SELF_SECRET, SELF_CONFIGURATION)
    for path, body in objects:
        control_plane.api.create(path, body)
    yield
    for path, body in reversed(objects):
        control_plane.api.delete(f"{path}/{body['metadata']['name']}")


class SelfManagedDaemon:
    """A second ``pyhami scheduler`` with the scheduler's ServiceAccount, its webhook
    certificate self-managed. kube-scheduler never calls it."""

    def __init__(self, plane: ControlPlane, *, secret: str = SELF_SECRET) -> None:
        self.plane = plane
        self.port, self.webhook_port = free_port(), free_port()
        self.process = Process("pyhami-self-managed", [
            *plane.pyhami_command(), "scheduler",
            "--kubeconfig", str(plane.scheduler_kubeconfig), *plane.nats_flags(),
            "--listen", f"127.0.0.1:{self.port}", "--metrics", f"127.0.0.1:{free_port()}",
            "--resync-wait", "1", "--namespace", SYSTEM_NAMESPACE,
            "--webhook-listen", f"127.0.0.1:{self.webhook_port}",
            "--webhook-tls-secret", secret, "--webhook-service", SELF_SERVICE,
            "--webhook-configuration", SELF_CONFIGURATION, "--webhook-check-period", "0.5",
        ], plane.logs / "pyhami-self-managed.log")

    def start(self) -> SelfManagedDaemon:
        self.process.start()
        wait_for(lambda: http_get(f"http://127.0.0.1:{self.port}/readyz")[0] == 200,
                 "the self-managed daemon's /readyz", START_TIMEOUT_S, watch=[self.process])
        return self

    def log(self) -> str:
        return self.process.log.read_text(errors="replace")


def secret_data(plane: ControlPlane, name: str = SELF_SECRET) -> dict[str, bytes]:
    secret = plane.api.get(f"{SECRETS}/{name}")
    assert secret["type"] == "kubernetes.io/tls"
    return {key: base64.b64decode(value) for key, value in secret["data"].items()}


def ca_bundles(plane: ControlPlane) -> list[tuple[str, bytes]]:
    """Each webhook of the configuration, in order, with its caBundle."""
    stored = plane.api.get(f"{CONFIGURATIONS}/{SELF_CONFIGURATION}")
    return [(hook["name"], base64.b64decode(hook["clientConfig"].get("caBundle", "")))
            for hook in stored["webhooks"]]


def review_through_tls(port: int, ca: bytes) -> dict[str, Any]:
    """POST a review for a GPU pod to the webhook, trusting only ``ca`` and checking the
    name the API server would call it by (``<service>.<namespace>.svc``)."""
    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u-1", "kind": {"group": "", "version": "v1",
                                                          "kind": "Pod"},
                                   "operation": "CREATE", "namespace": TEST_NAMESPACE,
                                   "object": gpu_pod("p")}}).encode()
    context = ssl.create_default_context(cadata=ca.decode())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=SELF_NAMES[-1]) as tls:
        tls.sendall(b"POST /webhook HTTP/1.1\r\nHost: " + SELF_NAMES[-1].encode() +
                    b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), answer[:300]
    document: dict[str, Any] = json.loads(payload)
    return document


def test_the_daemon_makes_its_certificate_and_keeps_the_ca_bundle(
        control_plane: ControlPlane, rbac: None) -> None:
    api = control_plane.api
    daemon = SelfManagedDaemon(control_plane)
    try:
        daemon.start()
        data = secret_data(control_plane)
        assert sorted(data) == ["ca.crt", "tls.crt", "tls.key"]
        leaf = x509.load_pem_x509_certificate(data["tls.crt"])
        covered = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert covered.get_values_for_type(x509.DNSName) == list(SELF_NAMES)
        leaf.verify_directly_issued_by(x509.load_pem_x509_certificate(data["ca.crt"]))
        # No configuration yet: a warning, and the daemon serves on.
        wait_for(lambda: f"MutatingWebhookConfiguration {SELF_CONFIGURATION} not found"
                 in daemon.log(), "the warning about the missing configuration")
        assert daemon.process.running

        # As the chart registers it: no caBundle. Never called here (no namespace matches).
        service = {"service": {"name": SELF_SERVICE, "namespace": SYSTEM_NAMESPACE,
                               "path": "/webhook", "port": 443}}
        never = {"namespaceSelector": {"matchLabels": {"pyhami-e2e": "never"}}}
        api.create(CONFIGURATIONS, configuration(
            SELF_CONFIGURATION, webhook("vgpu.pyhami.io", service, **never),
            webhook("second.pyhami.io", service, **never)))
        # Both set, in the order listed: mutating webhooks run in that order.
        expected = [("vgpu.pyhami.io", data["ca.crt"]), ("second.pyhami.io", data["ca.crt"])]
        wait_for(lambda: ca_bundles(control_plane) == expected,
                 "the daemon to set the caBundle of both webhooks", watch=[daemon.process])

        # What a helm upgrade does to it: the daemon puts it back.
        blanked = api.request("PATCH", f"{CONFIGURATIONS}/{SELF_CONFIGURATION}", [
            {"op": "replace", "path": "/webhooks/1/clientConfig/caBundle", "value": ""}],
            content_type=JSON_PATCH)
        assert not blanked["webhooks"][1]["clientConfig"].get("caBundle"), blanked
        wait_for(lambda: ca_bundles(control_plane) == expected,
                 "the daemon to put the caBundle back", watch=[daemon.process])
        status = json.loads(http_get(f"http://127.0.0.1:{daemon.port}/statusz")[1])
        assert status["webhook"] == {
            "listen": f"127.0.0.1:{daemon.webhook_port}", "scheduler_name": SCHEDULER_NAME,
            "certificate": f"Secret {SYSTEM_NAMESPACE}/{SELF_SECRET}",
            "configuration": SELF_CONFIGURATION, "ca_bundle": "caBundle in place"}

        # The listener serves the Secret's certificate at the Service's name.
        answer = review_through_tls(daemon.webhook_port, data["ca.crt"])
        assert answer["response"]["patchType"] == "JSONPatch"

        # A restart serves the same Secret: nothing is made again.
        version = api.get(f"{SECRETS}/{SELF_SECRET}")["metadata"]["resourceVersion"]
        assert daemon.process.stop() == 0
        daemon.start()
        assert api.get(f"{SECRETS}/{SELF_SECRET}")["metadata"]["resourceVersion"] == version
        review_through_tls(daemon.webhook_port, data["ca.crt"])
    finally:
        daemon.process.stop()
        for path in (f"{CONFIGURATIONS}/{SELF_CONFIGURATION}", f"{SECRETS}/{SELF_SECRET}"):
            try:
                api.delete(path)
            except ApiError as error:
                if error.status != 404:
                    raise


def test_a_secret_holding_no_certificate_stops_the_start_with_one_line(
        control_plane: ControlPlane, rbac: None) -> None:
    api = control_plane.api
    # The Role lets the daemon read only its own Secret's name: use that name.
    api.create(SECRETS, {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                         "metadata": {"name": SELF_SECRET},
                         "data": {"tls.crt": base64.b64encode(b"not a cert").decode(),
                                  "tls.key": base64.b64encode(b"not a key").decode()}})
    daemon = SelfManagedDaemon(control_plane)
    try:
        popen = daemon.process.start().popen
        assert popen is not None
        wait_for(lambda: popen.poll() is not None, "the daemon to exit", START_TIMEOUT_S)
        assert popen.returncode == 2, tail(daemon.process.log)
        last = daemon.log().strip().splitlines()[-1]
        assert last == (f"pyhami scheduler: --webhook-tls-secret: Secret {SYSTEM_NAMESPACE}/"
                        f"{SELF_SECRET} has no ca.crt; delete the Secret to have the daemon "
                        "make a new one")
    finally:
        daemon.process.stop()
        api.delete(f"{SECRETS}/{SELF_SECRET}")


async def test_replicas_starting_together_serve_one_certificate(
        control_plane: ControlPlane) -> None:
    """Both read no Secret, both make one; the second create is a 409 and reads the first's."""
    kubernetes = Kubernetes.from_kubeconfig(str(control_plane.admin_kubeconfig))
    secrets = kubernetes.secrets
    secret = "pyhami-e2e-race-tls"
    try:
        now = datetime.now(UTC)
        first, second = await asyncio.gather(*(
            self_managed(secrets, SYSTEM_NAMESPACE, secret, SELF_NAMES, now) for _ in range(2)))
        assert first == second
        assert secret_data(control_plane, secret)["ca.crt"] == first.ca
        assert await secrets.webhook_ca_bundles("pyhami-e2e-no-such-configuration") is None
        assert await secrets.read_secret(SYSTEM_NAMESPACE, "pyhami-e2e-no-such-secret") is None
    finally:
        await kubernetes.close()
        control_plane.api.delete(f"{SECRETS}/{secret}")
