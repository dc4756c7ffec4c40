"""The manifests of ``k8s/``, created for real in the API server and used as shipped."""

from __future__ import annotations

import copy
import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest
import yaml

from harness.controlplane import (
    SCHEDULER_SERVICE_ACCOUNT,
    SYSTEM_NAMESPACE,
    manifests,
    shipped_scheduler_config,
    versions,
)
from tests.e2e.controlplane import ControlPlane, allowed

SCHEDULER_USER = f"system:serviceaccount:{SYSTEM_NAMESPACE}:{SCHEDULER_SERVICE_ACCOUNT}"
AGENT_USER = f"system:serviceaccount:{SYSTEM_NAMESPACE}:pyhami-agent"


def test_every_manifest_is_stored_by_the_api_server(control_plane: ControlPlane) -> None:
    wanted = manifests()
    assert len(control_plane.created) == len(wanted), "some k8s/ objects were not created"
    api = control_plane.api
    for doc in wanted:
        name = doc["metadata"]["name"]
        stored = api.get(api.path(doc["apiVersion"], doc["kind"],
                                  doc["metadata"].get("namespace"), name))
        assert stored["metadata"].get("uid"), f"{doc['kind']} {name} has no uid"
        assert stored["kind"] == doc["kind"], stored


def test_the_shipped_images_match_the_tested_kubernetes(control_plane: ControlPlane) -> None:
    kubernetes_version, _ = versions(control_plane.bin_dir)
    deployment = control_plane.api.get(
        f"/apis/apps/v1/namespaces/{SYSTEM_NAMESPACE}/deployments/pyhami-scheduler")
    pod_spec = deployment["spec"]["template"]["spec"]
    images = {c["name"]: c["image"] for c in pod_spec["containers"]}
    assert images["kube-scheduler"].endswith(f":{kubernetes_version}"), images
    assert pod_spec["serviceAccountName"] == SCHEDULER_SERVICE_ACCOUNT


def test_the_disruption_budget_covers_the_two_scheduler_pods(control_plane: ControlPlane) -> None:
    api = control_plane.api
    deployment = api.get(api.path("apps/v1", "Deployment", SYSTEM_NAMESPACE, "pyhami-scheduler"))
    budget = api.get(api.path("policy/v1", "PodDisruptionBudget", SYSTEM_NAMESPACE,
                              "pyhami-scheduler"))
    assert deployment["spec"]["replicas"] == 2
    assert budget["spec"]["maxUnavailable"] == 1
    wanted = budget["spec"]["selector"]["matchLabels"]
    assert wanted.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    others = [doc for doc in manifests() if doc["kind"] in {"DaemonSet", "StatefulSet"}]
    assert others, "k8s/ ships the agent and NATS too"
    for other in others:
        labels = other["spec"]["template"]["metadata"]["labels"]
        assert not wanted.items() <= labels.items(), f"the budget covers {other['kind']} pods"


def test_kube_scheduler_runs_the_charts_configuration_with_mutual_tls(
        control_plane: ControlPlane) -> None:
    chart: dict[str, Any] = yaml.safe_load(control_plane.chart_config)
    used = copy.deepcopy(control_plane.scheduler_config)
    (extender,) = used["extenders"]
    assert extender["urlPrefix"] == control_plane.daemon_url
    assert control_plane.daemon_url.startswith("https://127.0.0.1:")
    assert extender["enableHTTPS"] is True
    pki = control_plane.extender_pki
    assert extender["tlsConfig"] == {"caFile": str(pki.server.ca),
                                     "certFile": str(pki.kube_scheduler.cert),
                                     "keyFile": str(pki.kube_scheduler.key)}
    assert used["clientConnection"]["kubeconfig"] == str(control_plane.scheduler_kubeconfig)
    (charts,) = chart["extenders"]
    for key in ("urlPrefix", "tlsConfig"):
        extender[key] = charts[key]
    used["clientConnection"]["kubeconfig"] = chart["clientConnection"]["kubeconfig"]
    assert used == chart, ("the suite changed more than the extender's port and certificate "
                           "files and the kubeconfig")


def test_k8s_ships_that_configuration_over_plain_http_on_loopback(
        control_plane: ControlPlane) -> None:
    """k8s/ leaves the extender's TLS off (no Secret to ask for), and differs in no more."""
    with_tls: dict[str, Any] = yaml.safe_load(control_plane.chart_config)
    (extender,) = with_tls["extenders"]
    assert extender.pop("tlsConfig")["caFile"].startswith("/etc/pyhami/")
    extender.update(enableHTTPS=False, urlPrefix="http://127.0.0.1:8888")
    assert yaml.safe_load(shipped_scheduler_config()) == with_tls


@pytest.mark.parametrize(("verb", "resource", "group", "namespace", "name", "subresource"), [
    ("watch", "pods", "", None, None, None),
    ("patch", "pods", "", "pyhami-e2e", "p", None),
    ("create", "pods", "", "pyhami-e2e", "p", "binding"),
    ("list", "nodes", "", None, None, None),
    ("get", "resourcequotas", "", "pyhami-e2e", None, None),
    ("list", "resourcequotas", "", None, None, None),
    ("watch", "resourcequotas", "", None, None, None),
    ("create", "events", "", "pyhami-e2e", None, None),
    ("create", "events", "events.k8s.io", "pyhami-e2e", None, None),
    ("update", "leases", "coordination.k8s.io", SYSTEM_NAMESPACE, "pyhami-scheduler", None),
    ("get", "configmaps", "", "kube-system", "extension-apiserver-authentication", None),
])
def test_scheduler_identity_may(  # noqa: PLR0917 (one parameter per column)
        control_plane: ControlPlane, verb: str, resource: str, group: str,
        namespace: str | None, name: str | None, subresource: str | None) -> None:
    assert allowed(control_plane.api, SCHEDULER_USER, verb, resource, group=group,
                    namespace=namespace, name=name, subresource=subresource), (
        f"{SCHEDULER_USER} may not {verb} {resource}/{subresource or ''} in {namespace}")


@pytest.mark.parametrize(("verb", "resource", "group", "namespace", "name"), [
    ("list", "secrets", "", None, None),
    ("update", "nodes", "", None, "gpu-node-1"),
    ("create", "pods", "", "pyhami-e2e", None),
    ("create", "deployments", "apps", SYSTEM_NAMESPACE, None),
    ("update", "leases", "coordination.k8s.io", SYSTEM_NAMESPACE, "someone-else"),
    ("update", "configmaps", "", "kube-system", "extension-apiserver-authentication"),
])
def test_scheduler_identity_may_not(  # noqa: PLR0917 (one parameter per column)
        control_plane: ControlPlane, verb: str, resource: str, group: str,
        namespace: str | None, name: str | None) -> None:
    assert not allowed(control_plane.api, SCHEDULER_USER, verb, resource, group=group,
                        namespace=namespace, name=name), (
        f"{SCHEDULER_USER} may {verb} {resource} in {namespace}: more than it needs")


def test_agent_identity_has_no_api_access(control_plane: ControlPlane) -> None:
    for verb, resource in (("list", "pods"), ("get", "nodes"), ("create", "events")):
        assert not allowed(control_plane.api, AGENT_USER, verb, resource,
                            namespace="pyhami-e2e"), f"the agent may {verb} {resource}"


def test_kube_scheduler_was_never_forbidden(control_plane: ControlPlane) -> None:
    """Its RBAC (k8s/rbac.yaml) covers everything kube-scheduler reads and writes."""
    log = control_plane.process("kube-scheduler").log.read_text(errors="replace")
    forbidden = [line for line in log.splitlines() if "forbidden" in line.lower()]
    assert not forbidden, "kube-scheduler was refused:\n" + "\n".join(forbidden[:10])


def test_pyhami_daemon_was_never_forbidden(control_plane: ControlPlane) -> None:
    """The ClusterRole pyhami-scheduler covers every call the daemon makes."""
    log = control_plane.process("pyhami-scheduler").log.read_text(errors="replace")
    refused = [line for line in log.splitlines() if "HTTP 403" in line or "Forbidden" in line]
    assert not refused, "the pyhami daemon was refused:\n" + "\n".join(refused[:10])


def priority_of(control_plane: ControlPlane, token: str) -> tuple[str, str]:
    """The FlowSchema and priority level kube-apiserver files a request under, by uid, as
    its priority-and-fairness response headers name them."""
    context = ssl.create_default_context(cafile=str(control_plane.ca_file))
    request = urllib.request.Request(
        f"{control_plane.server}/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods?limit=1",
        headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        return (answer.headers["X-Kubernetes-PF-FlowSchema-UID"],
                answer.headers["X-Kubernetes-PF-PriorityLevel-UID"])


def test_the_scheduler_pods_requests_get_a_schedulers_priority(
        control_plane: ControlPlane) -> None:
    """kube-apiserver files the scheduler pod's requests under the shipped FlowSchema, at
    the priority level its built-in one gives kube-scheduler, not workload-low."""
    flowcontrol = "/apis/flowcontrol.apiserver.k8s.io/v1"
    ours = control_plane.api.get(f"{flowcontrol}/flowschemas/pyhami-scheduler")
    builtin = control_plane.api.get(f"{flowcontrol}/flowschemas/kube-scheduler")
    high = control_plane.api.get(f"{flowcontrol}/prioritylevelconfigurations/workload-high")
    assert ours["spec"]["priorityLevelConfiguration"] == builtin["spec"][
        "priorityLevelConfiguration"] == {"name": "workload-high"}
    assert priority_of(control_plane, control_plane.scheduler_token) == (
        ours["metadata"]["uid"], high["metadata"]["uid"])
    # Another ServiceAccount's request still lands in workload-low.
    agent = control_plane.api.create(
        f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/serviceaccounts/pyhami-agent/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": 600}})["status"]["token"]
    low = control_plane.api.get(f"{flowcontrol}/prioritylevelconfigurations/workload-low")
    with pytest.raises(urllib.error.HTTPError) as forbidden:
        priority_of(control_plane, agent)  # the agent may not list pods: 403, still filed
    assert forbidden.value.headers["X-Kubernetes-PF-PriorityLevel-UID"] == (
        low["metadata"]["uid"])
