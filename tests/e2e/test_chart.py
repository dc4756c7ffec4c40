"""The Helm chart ``charts/pyhami``, rendered by Helm and created in the real API server.

Two releases, each in a namespace of its own and under its own name (so that their
cluster-scoped objects do not meet those of ``k8s/`` the suite already created): the
chart's defaults, and ``ci/custom-values.yaml`` (an existing NATS, the webhook with a
Secret of its own, the extender over mutual TLS, the monitoring objects, three replicas
kept on different nodes, faster leader election, other policies). The API
server validates every object on creation; nothing runs them (no controllers, no
kubelet), so only what was stored is checked. A third release goes through ``helm
install`` and ``helm uninstall`` themselves. ``k8s/`` must be the chart's rendering.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.core.deviceconfig import DeviceConfig, NodeConfigFile, NodeSettings
from common.core.vendors import ResourceNames
from common.deviceconfig import load_device_config, load_node_config
from harness.controlplane import K8S_DIR, REPO, ApiError, KubeApi, wait_for
from tests.e2e.controlplane import ControlPlane, allowed

CHART = REPO / "charts" / "pyhami"
RENDER_SCRIPT = REPO / "scripts" / "render-k8s.sh"
KUBE_VERSION = "v1.36.3"
MONITORING = "monitoring.coreos.com/v1"
MONITORING_KINDS = {"ServiceMonitor": "servicemonitors", "PrometheusRule": "prometheusrules"}
OPT_OUT = [{"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet")


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    values: Path | None
    fullname: str

    @property
    def scheduler(self) -> str:
        return f"{self.fullname}-scheduler"

    @property
    def scheduler_user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.scheduler}"


DEFAULTS = Release("pyhami-defaults", "pyhami-chart-defaults", None, "pyhami-defaults")
CUSTOM = Release("gpu", "pyhami-chart-custom", CHART / "ci" / "custom-values.yaml", "gpu-pyhami")
# kube-scheduler's leader election timings each release renders: Kubernetes' defaults, and
# those of ci/custom-values.yaml.
LEADER_ELECTION = {
    DEFAULTS: {"leaseDuration": "15s", "renewDeadline": "10s", "retryPeriod": "2s"},
    CUSTOM: {"leaseDuration": "6s", "renewDeadline": "4s", "retryPeriod": "1s"},
}


@dataclass
class Installed:
    """What one release rendered, and the objects the API server stored for it."""

    release: Release
    rendered: list[dict[str, Any]]
    stored: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return self.stored[(kind, name)]

    def extender_command(self) -> list[str]:
        command: list[str] = self.container("Deployment", self.release.scheduler,
                                            "extender")["command"]
        return command

    def container(self, kind: str, name: str, container: str) -> dict[str, Any]:
        spec = self.get(kind, name)["spec"]["template"]["spec"]
        found: dict[str, Any] = next(c for c in spec["containers"] if c["name"] == container)
        return found


def custom_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "ci" / "custom-values.yaml").read_text())
    return values


def helm_template(helm: Path, release: Release) -> str:
    command = [str(helm), "template", release.name, str(CHART), "--namespace",
               release.namespace, "--kube-version", KUBE_VERSION]
    if release.values is not None:
        command += ["--values", str(release.values)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"helm template {release.name} failed:\n{done.stderr}"
    return done.stdout


def monitoring_crd(kind: str, plural: str) -> dict[str, Any]:
    """The least CustomResourceDefinition that stores the Prometheus Operator's kind."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com", "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                      "listKind": f"{kind}List"},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                "openAPIV3Schema": {"type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True}}}],
        },
    }


def _object_path(api: KubeApi, doc: dict[str, Any]) -> str:
    return api.path(doc["apiVersion"], doc["kind"], doc["metadata"].get("namespace"),
                    doc["metadata"]["name"])


@pytest.fixture(scope="module")
def helm(control_plane_binaries: Path) -> Path:
    """The helm scripts/build-control-plane.sh built beside the control plane; rendering
    needs no running cluster."""
    return control_plane_binaries / "helm"


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane, helm: Path) -> Iterator[dict[Release, Installed]]:
    api = control_plane.api
    created: list[str] = []  # object paths, deleted in reverse on the way out
    try:
        crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        for kind, plural in MONITORING_KINDS.items():
            try:
                api.create(crds, monitoring_crd(kind, plural))
            except ApiError as error:
                if error.status != HTTPStatus.CONFLICT:
                    raise
                continue  # already there: left to whoever created it
            created.append(f"{crds}/{plural}.monitoring.coreos.com")

        def served() -> bool:
            names = {r["name"] for r in api.get(f"/apis/{MONITORING}")["resources"]}
            return set(MONITORING_KINDS.values()) <= names

        wait_for(served, f"the API server to serve {MONITORING}")
        releases = {}
        for release in (DEFAULTS, CUSTOM):
            api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": release.namespace}})
            created.append(f"/api/v1/namespaces/{release.namespace}")
            rendered = [doc for doc in yaml.safe_load_all(helm_template(helm, release)) if doc]
            releases[release] = installed_release = Installed(release, rendered)
            for doc in rendered:
                path = api.path(doc["apiVersion"], doc["kind"], doc["metadata"].get("namespace"))
                stored = api.create(path, doc)
                created.append(_object_path(api, doc))
                installed_release.stored[(doc["kind"], doc["metadata"]["name"])] = stored
        yield releases
    finally:
        # The webhooks above all: they would keep calling Services that never answer.
        for path in reversed(created):
            with contextlib.suppress(ApiError):
                api.delete(path)


@pytest.mark.parametrize("release", [DEFAULTS, CUSTOM], ids=["defaults", "custom"])
def test_every_rendered_object_is_stored(installed: dict[Release, Installed],
                                         control_plane: ControlPlane, release: Release) -> None:
    ours = installed[release]
    api = control_plane.api
    assert len(ours.stored) == len(ours.rendered), "two rendered objects share a kind and name"
    for doc in ours.rendered:
        stored = api.get(_object_path(api, doc))
        assert stored["metadata"].get("uid"), f"{doc['kind']} {doc['metadata']['name']}"
        assert stored["metadata"].get("namespace") in {None, release.namespace, "kube-system"}


def test_each_value_set_renders_the_objects_it_asks_for(
        installed: dict[Release, Installed]) -> None:
    defaults = {kind for kind, _ in installed[DEFAULTS].stored}
    custom = {kind for kind, _ in installed[CUSTOM].stored}
    assert {"StatefulSet", "MutatingWebhookConfiguration", "Deployment", "DaemonSet",
            "PodDisruptionBudget"} <= defaults
    assert "PodDisruptionBudget" in custom
    assert not defaults & set(MONITORING_KINDS), "monitoring objects are opt-in"
    assert "StatefulSet" not in custom, "an existing NATS needs no bundled one"
    assert set(MONITORING_KINDS) | {"MutatingWebhookConfiguration"} <= custom
    roles = {name for kind, name in installed[CUSTOM].stored if kind == "Role"}
    assert roles == {f"{CUSTOM.scheduler}-leader-election"}, (
        "with a webhook Secret given, the daemon needs no access to Secrets")


def test_the_scheduler_runs_the_values_replicas_policies_and_extender(
        installed: dict[Release, Installed]) -> None:
    for release, replicas, gpu, node in ((DEFAULTS, 2, "spread", "binpack"),
                                         (CUSTOM, 3, "binpack", "spread")):
        ours = installed[release]
        deployment = ours.get("Deployment", release.scheduler)
        assert deployment["spec"]["replicas"] == replicas
        command = ours.extender_command()
        assert command[:3] == ["pyhami", "scheduler", "--in-cluster"]
        assert f"--gpu-scheduler-policy={gpu}" in command
        assert f"--node-scheduler-policy={node}" in command
        config = yaml.safe_load(ours.get("ConfigMap", f"{release.scheduler}-config")
                                ["data"]["config.yaml"])
        (extender,) = config["extenders"]
        listen = next(flag for flag in command if flag.startswith("--listen="))
        assert listen == "--listen=127.0.0.1:8888", "the extender binds pods: loopback only"
        scheme = "https" if extender["enableHTTPS"] else "http"
        assert extender["urlPrefix"] == f"{scheme}://127.0.0.1:8888"
        managed = {r["name"] for r in extender["managedResources"] if r["ignoredByScheduler"]}
        assert "nvidia.com/priority" in managed
        election = LEADER_ELECTION[release]
        assert config["leaderElection"] == {"leaderElect": True,
                                            "resourceNamespace": release.namespace,
                                            "resourceName": release.scheduler, **election}
        # The daemons follow the Lease kube-scheduler elects its leader on.
        assert f"--leader-lease={release.namespace}/{release.scheduler}" in command
        env = {e["name"]: e for e in ours.container("Deployment", release.scheduler,
                                                    "extender")["env"]}
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert "--node-timeout=60" in installed[CUSTOM].extender_command()
    kube_scheduler = installed[CUSTOM].container("Deployment", CUSTOM.scheduler, "kube-scheduler")
    assert kube_scheduler["image"] == f"registry.k8s.io/kube-scheduler:{KUBE_VERSION}"
    assert kube_scheduler["command"][-1] == "--v=4"


def test_a_drain_moves_the_scheduler_pods_one_at_a_time(
        installed: dict[Release, Installed], control_plane: ControlPlane) -> None:
    api = control_plane.api
    for release in (DEFAULTS, CUSTOM):
        ours = installed[release]
        budget = api.get(api.path("policy/v1", "PodDisruptionBudget", release.namespace,
                                  release.scheduler))
        # A budget of 0 would block every drain of a node a scheduler pod runs on.
        assert budget["spec"]["maxUnavailable"] == 1
        assert "minAvailable" not in budget["spec"]
        assert selected(budget["spec"]["selector"], pod_labels(ours)) == {release.scheduler}
        deployment = ours.get("Deployment", release.scheduler)
        assert budget["spec"]["selector"] == deployment["spec"]["selector"]
        # A rollout starts the new pod before it stops an old one.
        assert deployment["spec"]["strategy"] == {
            "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}


@pytest.mark.parametrize(("release", "rule"), [
    (DEFAULTS, "preferredDuringSchedulingIgnoredDuringExecution"),
    (CUSTOM, "requiredDuringSchedulingIgnoredDuringExecution"),
], ids=["soft", "hard"])
def test_the_scheduler_pods_keep_to_different_nodes(
        installed: dict[Release, Installed], release: Release, rule: str) -> None:
    ours = installed[release]
    affinity = ours.get("Deployment", release.scheduler)["spec"]["template"]["spec"]["affinity"]
    (terms,) = affinity["podAntiAffinity"].values()
    assert set(affinity["podAntiAffinity"]) == {rule}
    (term,) = terms
    if rule.startswith("preferred"):
        assert term["weight"] == 100
        term = term["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert selected(term["labelSelector"], pod_labels(ours)) == {release.scheduler}


def helm_template_set(helm: Path, *settings: str) -> list[dict[str, Any]]:
    """The chart's defaults rendered with these --set settings."""
    command = [str(helm), "template", "pyhami", str(CHART), "--kube-version", KUBE_VERSION]
    for setting in settings:
        command += ["--set", setting]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.mark.parametrize("settings", [["scheduler.replicas=1"],
                                      ["scheduler.podDisruptionBudget.enabled=false"]])
def test_no_disruption_budget_for_one_replica_or_when_off(helm: Path,
                                                          settings: list[str]) -> None:
    documents = helm_template_set(helm, *settings)
    budgets = {doc["metadata"]["name"] for doc in documents
               if doc["kind"] == "PodDisruptionBudget"}
    assert budgets == {"pyhami-nats"}, "the scheduler's budget is left out, NATS's kept"
    assert "Deployment" in {doc["kind"] for doc in documents}


@pytest.mark.parametrize(("settings", "expected"), [
    ([], {"runAsUser": 0, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
          "capabilities": {"drop": ["ALL"]}}),
    (["agent.migPrivileged=true"], {"runAsUser": 0, "privileged": True,
                                    "readOnlyRootFilesystem": True}),
])
def test_the_agent_is_privileged_only_for_mig(helm: Path, settings: list[str],
                                              expected: dict[str, Any]) -> None:
    (daemonset,) = [d for d in helm_template_set(helm, *settings) if d["kind"] == "DaemonSet"]
    (agent,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert agent["securityContext"] == expected


@pytest.mark.parametrize(("settings", "expected"), [
    ([], []),
    (["devicePlugin.migStrategy=mixed"], ["--mig-strategy=mixed"]),
])
def test_the_mig_strategy_reaches_the_agent(helm: Path, settings: list[str],
                                            expected: list[str]) -> None:
    (daemonset,) = [d for d in helm_template_set(helm, *settings) if d["kind"] == "DaemonSet"]
    (agent,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert [arg for arg in agent["command"] if arg.startswith("--mig")] == expected


def _daemon_rules_and_command(documents: list[dict[str, Any]],
                              ) -> tuple[list[dict[str, Any]], list[str]]:
    role = next(doc for doc in documents
                if doc["kind"] == "ClusterRole" and doc["metadata"]["name"].endswith("-scheduler"))
    deployment = next(doc for doc in documents if doc["kind"] == "Deployment"
                      and doc["metadata"]["name"].endswith("-scheduler"))
    extender = next(c for c in deployment["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "extender")
    return role["rules"], extender["command"]


@pytest.mark.parametrize("registration", [True, False], ids=["on", "off"])
def test_node_registration_brings_the_nodes_patch_right_and_off_leaves_it_out(
        helm: Path, registration: bool) -> None:
    documents = helm_template_set(helm, f"scheduler.nodeRegistration={str(registration).lower()}")
    rules, command = _daemon_rules_and_command(documents)
    patches_nodes = any("nodes" in rule["resources"] and "patch" in rule["verbs"]
                        for rule in rules)
    assert patches_nodes is registration
    assert ("--no-node-registration" in command) is not registration


@pytest.mark.parametrize(("value", "flag"), [("one", None), ("all", "--filter-nodes=all")])
def test_filter_nodes_reaches_the_daemon_only_when_not_hamis_answer(
        helm: Path, value: str, flag: str | None) -> None:
    _, command = _daemon_rules_and_command(helm_template_set(helm,
                                                             f"scheduler.filterNodes={value}"))
    assert [arg for arg in command if arg.startswith("--filter-nodes")] == (
        [flag] if flag else [])


@pytest.mark.parametrize("written", [True, False], ids=["on", "off"])
def test_success_events_off_give_the_daemon_its_flag(helm: Path, written: bool) -> None:
    documents = helm_template_set(helm, f"scheduler.successEvents={str(written).lower()}")
    _, command = _daemon_rules_and_command(documents)
    assert ("--no-success-events" in command) is not written


@pytest.mark.parametrize("name", ["pyhami-scheduler", "hami-scheduler"])
def test_the_scheduler_name_is_kube_schedulers_profile_and_the_daemons(helm: Path,
                                                                       name: str) -> None:
    settings = [] if name == "pyhami-scheduler" else [f"schedulerName={name}"]
    documents = helm_template_set(helm, *settings)
    _, command = _daemon_rules_and_command(documents)
    assert f"--scheduler-name={name}" in command
    config_map = next(doc for doc in documents if doc["kind"] == "ConfigMap"
                      and doc["metadata"]["name"] == "pyhami-scheduler-config")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert [profile["schedulerName"] for profile in config["profiles"]] == [name]
    # The Lease, the Service and the webhook keep the release's names, whatever it serves.
    assert config["leaderElection"]["resourceName"] == "pyhami-scheduler"
    assert "--webhook-configuration=pyhami-scheduler" in command


@pytest.mark.parametrize(("settings", "version"), [
    ((), "flowcontrol.apiserver.k8s.io/v1"),
    (("--kube-version", "v1.29.0", "--api-versions",
      "flowcontrol.apiserver.k8s.io/v1/FlowSchema"), "flowcontrol.apiserver.k8s.io/v1"),
    (("--kube-version", "v1.28.0", "--api-versions",
      "flowcontrol.apiserver.k8s.io/v1beta3/FlowSchema"), "flowcontrol.apiserver.k8s.io/v1beta3"),
    (("--kube-version", "v1.26.0", "--api-versions",
      "flowcontrol.apiserver.k8s.io/v1beta3/FlowSchema"), "flowcontrol.apiserver.k8s.io/v1beta3"),
], ids=["no-cluster", "1.29", "1.28", "1.26"])
def test_the_flow_schema_is_rendered_in_the_version_the_cluster_serves(
        helm: Path, settings: tuple[str, ...], version: str) -> None:
    command = [str(helm), "template", "pyhami", str(CHART), *settings,
               "--show-only", "templates/scheduler-flowschema.yaml"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    (schema,) = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    assert (schema["kind"], schema["apiVersion"]) == ("FlowSchema", version)


# HAMi v2.10's chart values pyhami's chart names otherwise, as a HAMi values file sets
# them, and the pyhami key (or the words) the refusal must name.
HAMI_VALUES_MOVED: list[tuple[str, object, str]] = [
    ("global.imageRegistry", "registry.example.com", "image.repository"),
    ("global.imagePullSecrets", ["pull"], "global.imagePullSecrets: imagePullSecrets"),
    ("global.gpuHookPath", "/opt", "devicePlugin.hamiCoreDir, which is <gpuHookPath>/vgpu"),
    ("global.somethingNew", True, "global.somethingNew: HAMi's value, with no pyhami"),
    ("namespaceOverride", "kube-system", "helm install --namespace"),
    ("devices", {"nvidia": {"gpuCorePolicy": "force"}}, "device-config.content"),
    ("mluResourceName", "cambricon.com/vmlu", "pyhami schedules NVIDIA cards only"),
    ("legacyMetrics", True, "legacyMetrics: not needed"),
    ("scheduler.nodeName", "master-1", "scheduler.nodeSelector"),
    ("scheduler.nodeLabelSelector", {"gpu": "on"}, "agent.nodeSelector"),
    ("scheduler.overwriteEnv", "true", "nvidia.overwriteEnv, through device-config.content"),
    ("scheduler.forceOverwriteDefaultScheduler", False, "always gives a GPU pod naming"),
    ("scheduler.leaderElect", True, "scheduler.leaderElection"),
    ("scheduler.admissionWebhook", {"enabled": False}, "webhook.enabled"),
    ("scheduler.certManager", {"enabled": True}, "webhook.tls.existingSecret"),
    ("scheduler.kubeScheduler.enabled", True, "kube-scheduler always runs beside the daemon"),
    ("scheduler.kubeScheduler.extraNewArgs", ["--config=/config/config.yaml"],
     "scheduler.kubeScheduler.extraArgs"),
    ("scheduler.kubeScheduler.image.registry", "registry.example.com",
     "scheduler.kubeScheduler.image.repository, with the registry in it"),
    ("scheduler.kubeScheduler.extraArgs", ["--policy-config-file=/config/config.json"],
     "HAMi's for Kubernetes before 1.22"),
    ("scheduler.extender.image", {"repository": "projecthami/hami"}, "image.repository"),
    ("scheduler.extender.extraArgs", ["--debug", "-v=4"], "--log-level=debug"),
    ("devicePlugin.pluginPath", "/var/lib/kubelet/device-plugins", "devicePlugin.kubeletDir"),
    ("devicePlugin.libPath", "/usr/local/vgpu", "devicePlugin.hamiCoreDir"),
    ("devicePlugin.nvidiaNodeSelector", {"gpu": "on"}, "devicePlugin.nvidiaNodeSelector: "
     "agent.nodeSelector"),
    ("devicePlugin.tolerations", [], "devicePlugin.tolerations: agent.tolerations"),
    ("devicePlugin.extraArgs", ["-v=4"], "agent.extraArgs"),
    ("devicePlugin.hostPID", True, "agent.monitor.hostPID"),
    ("devicePlugin.monitor", {"ctrPath": "/usr/local/vgpu/containers"}, "agent.monitor"),
    ("devicePlugin.enableNumaTopology", True, "nvidia.enableNumaTopology"),
    ("devicePlugin.securityContext", {"privileged": True}, "agent.migPrivileged"),
    ("devicePlugin.resources", {}, "devicePlugin.resources: agent.resources"),
]


def helm_template_json(helm: Path, values: dict[str, object],
                       ) -> subprocess.CompletedProcess[str]:
    command = [str(helm), "template", "pyhami", str(CHART), "--kube-version", KUBE_VERSION]
    for path, value in values.items():
        command += ["--set-json", f"{path}={json.dumps(value)}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("path", "value", "instead"), HAMI_VALUES_MOVED,
                         ids=[path for path, _, _ in HAMI_VALUES_MOVED])
def test_a_hami_value_pyhami_names_otherwise_is_refused_with_its_new_name(
        helm: Path, path: str, value: object, instead: str) -> None:
    done = helm_template_json(helm, {path: value})
    assert done.returncode != 0
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert "HAMi's chart values, which pyhami's chart names otherwise" in line, line
    assert instead in line and path.rsplit(".", maxsplit=1)[-1] in line, line


def test_every_hami_value_of_a_values_file_is_named_in_one_refusal(helm: Path) -> None:
    done = helm_template_json(helm, {path: value for path, value, _ in HAMI_VALUES_MOVED})
    assert done.returncode != 0
    for path, _, instead in HAMI_VALUES_MOVED:
        assert instead in done.stderr, (path, done.stderr)
        assert path.rsplit(".", 1)[-1] in done.stderr, (path, done.stderr)


@pytest.mark.parametrize(("path", "value"), [
    ("schedulerName", "hami-scheduler"),
    ("resourceName", "nvidia.com/gpu"),
    ("resourceMem", "nvidia.com/gpumem"),
    ("scheduler.defaultSchedulerPolicy", {"nodeSchedulerPolicy": "spread",
                                          "gpuSchedulerPolicy": "binpack"}),
    ("scheduler.replicas", 1),
    ("scheduler.podAnnotations", {}),
    ("scheduler.tolerations", []),
    ("scheduler.kubeScheduler.image.tag", ""),
    ("scheduler.kubeScheduler.image.repository", "registry.k8s.io/kube-scheduler"),
    ("scheduler.kubeScheduler.resources", {}),
    ("scheduler.extender.resources", {}),
    ("devicePlugin.enabled", True),
    ("devicePlugin.deviceSplitCount", 10),
    ("devicePlugin.deviceMemoryScaling", 1),
    ("devicePlugin.deviceCoreScaling", 1),
    ("devicePlugin.migStrategy", "none"),
    ("devicePlugin.runtimeClassName", ""),
    ("devicePlugin.nodeConfiguration", {"config": '{"nodeconfig": []}',
                                        "externalConfigName": ""}),
    ("device-config", {"content": ""}),
    ("nameOverride", ""),
])
def test_hamis_values_of_the_same_name_and_meaning_are_taken(helm: Path, path: str,
                                                             value: object) -> None:
    done = helm_template_json(helm, {path: value})
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("kube_version", "image"), [
    ("v1.30.2+k3s1", "registry.k8s.io/kube-scheduler:v1.30.2"),
    ("v1.28.5-eks-2d5f260", "registry.k8s.io/kube-scheduler:v1.28.5"),
])
def test_an_empty_kube_scheduler_tag_is_the_clusters_version_as_in_hami(
        helm: Path, kube_version: str, image: str) -> None:
    command = [str(helm), "template", "pyhami", str(CHART), "--kube-version", kube_version,
               "--set", "scheduler.kubeScheduler.image.tag="]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    deployment = next(doc for doc in yaml.safe_load_all(done.stdout)
                      if doc and doc["kind"] == "Deployment")
    images = {c["name"]: c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert images["kube-scheduler"] == image


def test_an_affinity_of_the_users_keeps_the_anti_affinity_unless_it_has_its_own(
        helm: Path) -> None:
    def affinity(*settings: str) -> dict[str, Any]:
        (deployment,) = [d for d in helm_template_set(helm, *settings)
                         if d["kind"] == "Deployment"]
        found: dict[str, Any] = deployment["spec"]["template"]["spec"].get("affinity", {})
        return found

    zone = ("scheduler.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0]")
    node_rule = [f"{zone}.key=zone", f"{zone}.operator=Exists"]
    assert set(affinity(*node_rule)) == {"nodeAffinity", "podAntiAffinity"}
    assert set(affinity(*node_rule, "scheduler.antiAffinity=none")) == {"nodeAffinity"}
    assert affinity("scheduler.antiAffinity=none") == {}
    own = ("scheduler.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution"
           "[0]")
    mine = affinity("scheduler.antiAffinity=hard", f"{own}.weight=5",
                    f"{own}.podAffinityTerm.topologyKey=zone",
                    f"{own}.podAffinityTerm.labelSelector.matchLabels.team=a")
    assert mine["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0][
        "weight"] == 5
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in mine["podAntiAffinity"]


def mounts(ours: Installed, container: str) -> dict[str, str]:
    """The container's volume mounts: volume name to mount path."""
    found = ours.container("Deployment", ours.release.scheduler, container)
    return {m["name"]: m["mountPath"] for m in found.get("volumeMounts", [])}


def secret_volumes(ours: Installed) -> dict[str, tuple[str, list[str]]]:
    """The pod's Secret volumes: name to (Secret, the keys it projects; [] for all)."""
    spec = ours.get("Deployment", ours.release.scheduler)["spec"]["template"]["spec"]
    return {v["name"]: (v["secret"]["secretName"], [i["key"] for i in v["secret"].get(
        "items", [])]) for v in spec["volumes"] if "secret" in v}


def test_the_extender_is_plain_http_on_loopback_unless_tls_is_asked_for(
        installed: dict[Release, Installed]) -> None:
    defaults = installed[DEFAULTS]
    config = yaml.safe_load(defaults.get("ConfigMap", f"{DEFAULTS.scheduler}-config")
                            ["data"]["config.yaml"])
    (extender,) = config["extenders"]
    assert (extender["enableHTTPS"], extender["urlPrefix"]) == (False, "http://127.0.0.1:8888")
    assert "tlsConfig" not in extender
    assert not [f for f in defaults.extender_command() if f.startswith("--extender-")]
    assert not {"extender-tls", "extender-ca"} & set(secret_volumes(defaults))


def test_the_extender_tls_values_reach_the_daemon_and_kube_scheduler(
        installed: dict[Release, Installed]) -> None:
    custom = installed[CUSTOM]
    tls = custom_values()["scheduler"]["extender"]["tls"]
    volumes = secret_volumes(custom)
    # Each container gets only its own keys of each Secret.
    assert volumes["extender-tls"] == (tls["secretName"], ["tls.crt", "tls.key"])
    assert volumes["extender-ca"] == (tls["secretName"], ["ca.crt"])
    assert volumes["extender-client"] == (tls["clientSecretName"], ["tls.crt", "tls.key"])
    assert volumes["extender-client-ca"] == (tls["clientSecretName"], ["ca.crt"])
    daemon, kube_scheduler = mounts(custom, "extender"), mounts(custom, "kube-scheduler")
    assert not {"extender-client", "extender-ca"} & set(daemon)
    assert not {"extender-tls", "extender-client-ca"} & set(kube_scheduler)

    command = custom.extender_command()
    assert f"--extender-cert-file={daemon['extender-tls']}/tls.crt" in command
    assert f"--extender-key-file={daemon['extender-tls']}/tls.key" in command
    assert f"--extender-client-ca-file={daemon['extender-client-ca']}/ca.crt" in command
    config = yaml.safe_load(custom.get("ConfigMap", f"{CUSTOM.scheduler}-config")
                            ["data"]["config.yaml"])
    (extender,) = config["extenders"]
    assert (extender["enableHTTPS"], extender["urlPrefix"]) == (True, "https://127.0.0.1:8888")
    assert extender["tlsConfig"] == {
        "caFile": f"{kube_scheduler['extender-ca']}/ca.crt",
        "certFile": f"{kube_scheduler['extender-client']}/tls.crt",
        "keyFile": f"{kube_scheduler['extender-client']}/tls.key"}


def test_the_kubelet_probes_the_daemon_on_its_metrics_port(
        installed: dict[Release, Installed]) -> None:
    for ours in installed.values():
        daemon = ours.container("Deployment", ours.release.scheduler, "extender")
        assert {"name": "metrics", "containerPort": 9395, "protocol": "TCP"} in daemon["ports"]
        assert "--metrics=0.0.0.0:9395" in daemon["command"]
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            assert daemon[probe]["httpGet"] == {"path": path, "port": "metrics",
                                                "scheme": "HTTP"}, daemon[probe]


def test_the_webhook_is_registered_as_hamis_users_expect(
        installed: dict[Release, Installed]) -> None:
    for release in (DEFAULTS, CUSTOM):
        ours = installed[release]
        (webhook,) = ours.get("MutatingWebhookConfiguration", release.scheduler)["webhooks"]
        assert webhook["name"] == "gpu-pods.pyhami.io"
        assert webhook["clientConfig"]["service"] == {
            "name": release.scheduler, "namespace": release.namespace, "path": "/webhook",
            "port": 443}
        assert (webhook["failurePolicy"], webhook["sideEffects"]) == ("Ignore", "None")
        assert webhook["admissionReviewVersions"] == ["v1"]
        (rule,) = webhook["rules"]
        assert (rule["operations"], rule["resources"]) == (["CREATE"], ["pods"])
        assert webhook["namespaceSelector"] == {"matchExpressions": OPT_OUT}
        service = ours.get("Service", release.scheduler)
        ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
        assert ports == {"metrics": (9395, "metrics"), "webhook": (443, "webhook")}
        extender = ours.container("Deployment", release.scheduler, "extender")
        assert {"name": "webhook", "containerPort": 8443, "protocol": "TCP"} in extender["ports"]
        assert "--webhook-listen=0.0.0.0:8443" in extender["command"]
    # The daemon's own certificate: it gets the CA into caBundle itself.
    (webhook,) = installed[DEFAULTS].get("MutatingWebhookConfiguration",
                                         DEFAULTS.scheduler)["webhooks"]
    assert not webhook["clientConfig"].get("caBundle")
    assert {f"--webhook-tls-secret={DEFAULTS.scheduler}-webhook-tls",
            f"--webhook-service={DEFAULTS.scheduler}",
            f"--webhook-configuration={DEFAULTS.scheduler}"} <= set(
        installed[DEFAULTS].extender_command())
    # A Secret of the user's: mounted, handed over as files, its CA in caBundle.
    custom = installed[CUSTOM]
    (webhook,) = custom.get("MutatingWebhookConfiguration", CUSTOM.scheduler)["webhooks"]
    values = custom_values()
    assert webhook["clientConfig"]["caBundle"] == values["webhook"]["tls"]["caBundle"]
    base64.b64decode(webhook["clientConfig"]["caBundle"], validate=True)
    spec = custom.get("Deployment", CUSTOM.scheduler)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["webhook-tls"]["secret"]["secretName"] == values["webhook"]["tls"][
        "existingSecret"]
    mounts = {m["name"]: m["mountPath"] for m in custom.container(
        "Deployment", CUSTOM.scheduler, "extender")["volumeMounts"]}
    command = custom.extender_command()
    assert f"--tls-cert-file={mounts['webhook-tls']}/tls.crt" in command
    assert f"--tls-private-key-file={mounts['webhook-tls']}/tls.key" in command
    assert not any(flag.startswith("--webhook-tls-secret") for flag in command)


@pytest.mark.parametrize(("verb", "resource", "group", "name", "namespace", "expected"), [
    ("create", "secrets", "", None, DEFAULTS.namespace, True),
    ("get", "secrets", "", f"{DEFAULTS.scheduler}-webhook-tls", DEFAULTS.namespace, True),
    ("get", "secrets", "", "someone-elses", DEFAULTS.namespace, False),
    ("list", "secrets", "", None, DEFAULTS.namespace, False),
    ("create", "secrets", "", None, "default", False),
    ("patch", "mutatingwebhookconfigurations", "admissionregistration.k8s.io",
     DEFAULTS.scheduler, None, True),
    ("get", "mutatingwebhookconfigurations", "admissionregistration.k8s.io",
     DEFAULTS.scheduler, None, True),
    ("patch", "mutatingwebhookconfigurations", "admissionregistration.k8s.io",
     CUSTOM.scheduler, None, False),
    # The NATS auth callout: its Secret, and TokenReviews of the agents' tokens.
    ("get", "secrets", "", f"{DEFAULTS.fullname}-nats-auth", DEFAULTS.namespace, True),
    ("update", "secrets", "", f"{DEFAULTS.fullname}-nats-auth", DEFAULTS.namespace, False),
    ("create", "tokenreviews", "authentication.k8s.io", None, None, True),
    ("create", "tokenrequests", "authentication.k8s.io", None, None, False),
])
def test_the_daemon_may_manage_its_webhook_certificate_and_no_more(  # noqa: PLR0917 (columns)
        installed: dict[Release, Installed], control_plane: ControlPlane, verb: str,
        resource: str, group: str, name: str | None, namespace: str | None,
        expected: bool) -> None:
    assert installed[DEFAULTS].stored, "the release was not installed"
    answer = allowed(control_plane.api, DEFAULTS.scheduler_user, verb, resource, group=group,
                     namespace=namespace, name=name)
    assert answer is expected, f"{DEFAULTS.scheduler_user} {verb} {resource} {name}: {answer}"


def test_with_its_own_secret_the_daemon_reads_no_secrets(
        installed: dict[Release, Installed], control_plane: ControlPlane) -> None:
    assert installed[CUSTOM].stored, "the release was not installed"
    for verb in ("create", "get"):
        assert not allowed(control_plane.api, CUSTOM.scheduler_user, verb, "secrets",
                           namespace=CUSTOM.namespace, name="anything")


ROLE_PROBE = "daemon-role-probe"
CLUSTER_ROLE_BINDINGS = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"


@pytest.fixture(scope="module")
def daemon_role_only(installed: dict[Release, Installed],
                     control_plane: ControlPlane) -> Iterator[str]:
    """A ServiceAccount bound to the daemon's ClusterRole and to nothing else: what that role
    alone allows (the scheduler pod's own account holds kube-scheduler's roles too)."""
    assert installed[DEFAULTS].stored, "the release was not installed"
    api = control_plane.api
    accounts = f"/api/v1/namespaces/{DEFAULTS.namespace}/serviceaccounts"
    binding = f"{DEFAULTS.scheduler}-{ROLE_PROBE}"
    api.create(accounts, {"apiVersion": "v1", "kind": "ServiceAccount",
                          "metadata": {"name": ROLE_PROBE}})
    api.create(CLUSTER_ROLE_BINDINGS, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": binding},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": DEFAULTS.scheduler},
        "subjects": [{"kind": "ServiceAccount", "name": ROLE_PROBE,
                      "namespace": DEFAULTS.namespace}]})
    user = f"system:serviceaccount:{DEFAULTS.namespace}:{ROLE_PROBE}"
    try:
        wait_for(lambda: allowed(api, user, "list", "nodes"), "the probe's binding to count")
        yield user
    finally:
        for path in (f"{CLUSTER_ROLE_BINDINGS}/{binding}", f"{accounts}/{ROLE_PROBE}"):
            with contextlib.suppress(ApiError):
                api.delete(path)


@pytest.mark.parametrize(("verb", "resource", "subresource", "group", "namespace", "expected"), [
    ("list", "pods", None, "", None, True),
    ("watch", "pods", None, "", None, True),
    ("get", "pods", None, "", "team-a", True),
    ("patch", "pods", None, "", "team-a", True),  # annotations; only pyhami's pods, in code
    ("create", "pods", "binding", "", "team-a", True),
    ("list", "nodes", None, "", None, True),
    ("create", "events", None, "", "team-a", True),
    ("get", "events", None, "", "team-a", True),
    ("patch", "events", None, "", "team-a", True),
    ("delete", "pods", None, "", "team-a", True),  # preemption's victims, chosen in code
    ("list", "poddisruptionbudgets", None, "policy", None, True),
    ("get", "poddisruptionbudgets", None, "policy", "team-a", False),
    ("list", "resourcequotas", None, "", None, True),  # the namespaces' GPU limits
    ("watch", "resourcequotas", None, "", None, True),
    ("get", "resourcequotas", None, "", "team-a", True),
    ("update", "resourcequotas", None, "", "team-a", False),
    ("get", "podgroups", None, "scheduling.x-k8s.io", "team-a", True),  # a group's count
    ("get", "podgroups", None, "scheduling.k8s.io", "team-a", True),
    ("list", "podgroups", None, "scheduling.k8s.io", None, False),
    ("update", "podgroups", None, "scheduling.x-k8s.io", "team-a", False),
    ("patch", "resourcequotas", "status", "", "team-a", False),
    ("update", "pods", None, "", "team-a", False),
    ("create", "pods", None, "", "team-a", False),
    ("patch", "pods", "status", "", "team-a", False),
    ("create", "pods", "eviction", "", "team-a", False),
    ("get", "nodes", None, "", None, False),
    ("update", "nodes", None, "", None, False),
    # hami.io/node-nvidia-register for HAMi-WebUI (scheduler.nodeRegistration, on by default)
    ("patch", "nodes", None, "", None, True),
    ("patch", "nodes", "status", "", None, False),
    ("list", "secrets", None, "", None, False),
    ("get", "secrets", None, "", "kube-system", False),
    ("delete", "events", None, "", "team-a", False),
    ("create", "events", None, "events.k8s.io", "team-a", False),
])
def test_the_daemons_cluster_role_allows_what_it_calls_and_no_more(  # noqa: PLR0917 (columns)
        daemon_role_only: str, control_plane: ControlPlane, verb: str, resource: str,
        subresource: str | None, group: str, namespace: str | None, expected: bool) -> None:
    answer = allowed(control_plane.api, daemon_role_only, verb, resource, group=group,
                     namespace=namespace, subresource=subresource)
    assert answer is expected, f"the daemon's role: {verb} {resource}/{subresource}: {answer}"


@pytest.mark.parametrize(("verb", "resource", "namespace", "name"), [
    ("update", "nodes", None, "gpu-node-1"),
    ("delete", "nodes", None, "gpu-node-1"),
    ("list", "secrets", None, None),
    ("get", "secrets", "kube-system", "anything"),
    ("create", "pods", "team-a", None),
    ("update", "pods", "team-a", "p"),
])
def test_the_scheduler_pods_identity_may_not(  # noqa: PLR0917 (columns)
        installed: dict[Release, Installed], control_plane: ControlPlane, verb: str,
        resource: str, namespace: str | None, name: str | None) -> None:
    """kube-scheduler's roles and the daemon's together, as the pod's account holds them."""
    assert installed[DEFAULTS].stored, "the release was not installed"
    assert not allowed(control_plane.api, DEFAULTS.scheduler_user, verb, resource,
                       namespace=namespace, name=name), f"{verb} {resource} {namespace}/{name}"


def nats_hosts(release: Release, servers: int) -> list[str]:
    """The bundled NATS servers' stable DNS names: each StatefulSet pod's, by its headless
    Service."""
    nats = f"{release.fullname}-nats"
    return [f"{nats}-{index}.{nats}-headless.{release.namespace}.svc"
            for index in range(servers)]


def test_nats_bundled_or_existing_reaches_both_pods(installed: dict[Release, Installed]) -> None:
    every_server = ",".join(f"nats://{host}:4222" for host in nats_hosts(DEFAULTS, 3))
    service = installed[DEFAULTS].get("Service", f"{DEFAULTS.fullname}-nats")
    assert [p["port"] for p in service["spec"]["ports"]] == [4222]
    values = custom_values()
    existing = values["nats"]
    assert isinstance(existing["url"], list), "ci/custom-values.yaml gives nats.url as a list"
    for release, url in ((DEFAULTS, f"--nats={every_server}"),
                         (CUSTOM, f"--nats={','.join(existing['url'])}")):
        ours = installed[release]
        agent = ours.container("DaemonSet", f"{release.fullname}-agent", "agent")
        for command in (ours.extender_command(), agent["command"]):
            assert url in command, command
    custom = installed[CUSTOM]
    for container in (custom.container("DaemonSet", f"{CUSTOM.fullname}-agent", "agent"),
                      custom.container("Deployment", CUSTOM.scheduler, "extender")):
        env = {e["name"]: e.get("valueFrom", {}) for e in container["env"]}
        assert env["PYHAMI_NATS_PASSWORD"]["secretKeyRef"] == {
            "name": existing["auth"]["existingSecret"], "key": existing["auth"]["passwordKey"]}
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert f"--nats-ca={mounts['nats-tls']}/{existing['tls']['caKey']}" in container["command"]
        assert f"--nats-user={existing['auth']['user']}" in container["command"]


def nats_routes(config: str) -> list[str]:
    """The route URLs of a nats-server configuration's cluster block (none: no cluster)."""
    found = re.search(r"\bcluster \{.*?routes: \[(.*?)\]", config, re.DOTALL)
    return found[1].split() if found else []


def test_the_bundled_nats_is_a_cluster_of_three_on_different_nodes(
        installed: dict[Release, Installed], control_plane: ControlPlane) -> None:
    ours = installed[DEFAULTS]
    api = control_plane.api
    nats = f"{DEFAULTS.fullname}-nats"
    statefulset = ours.get("StatefulSet", nats)
    assert statefulset["spec"]["replicas"] == 3
    headless = ours.get("Service", statefulset["spec"]["serviceName"])["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    assert {p["name"]: p["port"] for p in headless["ports"]}["cluster"] == 6222
    assert selected({"matchLabels": headless["selector"]}, pod_labels(ours)) == {nats}
    # Every server routes to every pod's stable name (itself included: nats-server skips it)
    # and names itself after its pod, as JetStream in a cluster needs.
    config = ours.get("ConfigMap", f"{nats}-config")["data"]["nats.conf"]
    hosts = nats_hosts(DEFAULTS, 3)
    assert nats_routes(config) == [f"nats://{host}:6222" for host in hosts]
    assert f"name: {nats}\n" in config and "listen: 0.0.0.0:6222" in config
    assert "server_name: $POD_NAME" in config and "jetstream {" in config
    # The auth callout on every server: each includes the daemon's auth.conf.
    assert 'include "auth/auth.conf"' in config
    spec = statefulset["spec"]["template"]["spec"]
    (server,) = spec["containers"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in server["env"]}
    assert env == {"POD_NAME": "metadata.name"}
    auth = next(v for v in spec["volumes"] if v["name"] == "auth")["secret"]
    assert auth["secretName"] == f"{DEFAULTS.fullname}-nats-auth"
    assert {m["name"]: m["mountPath"] for m in server["volumeMounts"]}["auth"] == "/etc/nats/auth"
    budget = api.get(api.path("policy/v1", "PodDisruptionBudget", DEFAULTS.namespace, nats))
    assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
    assert selected(budget["spec"]["selector"], pod_labels(ours)) == {nats}
    (preferred,) = spec["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["weight"] == 100
    term = preferred["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert selected(term["labelSelector"], pod_labels(ours)) == {nats}


@pytest.mark.parametrize(("servers", "anti_affinity"), [
    (1, "soft"), (3, "hard"), (5, "none"),
], ids=["one-server", "three-hard", "five-none"])
def test_the_nats_cluster_follows_its_replicas_and_anti_affinity(
        helm: Path, servers: int, anti_affinity: str) -> None:
    rendered = render(helm, f"nats.antiAffinity={anti_affinity}",
                      typed={"nats.replicas": servers})
    statefulset = rendered[("StatefulSet", "pyhami-nats")]
    config = rendered[("ConfigMap", "pyhami-nats-config")]["data"]["nats.conf"]
    assert statefulset["spec"]["replicas"] == servers
    release = Release("pyhami", "default", None, "pyhami")
    hosts = nats_hosts(release, servers)
    clients = {kind: next(c for c in rendered[(kind, name)]["spec"]["template"]["spec"][
        "containers"] if c["command"][0] == "pyhami")["command"]
        for kind, name in (("Deployment", "pyhami-scheduler"), ("DaemonSet", "pyhami-agent"))}
    affinity = statefulset["spec"]["template"]["spec"].get("affinity", {})
    if anti_affinity == "none":
        assert affinity == {}
    else:
        rule = {"soft": "preferredDuringSchedulingIgnoredDuringExecution",
                "hard": "requiredDuringSchedulingIgnoredDuringExecution"}[anti_affinity]
        assert set(affinity["podAntiAffinity"]) == {rule}
    ports = {p["containerPort"] for p in statefulset["spec"]["template"]["spec"]["containers"][0][
        "ports"]}
    opened = ingress_by_port(rendered[("NetworkPolicy", "pyhami-nats")])
    if servers == 1:
        # One server, as before: no cluster, no budget, the Service's address.
        assert nats_routes(config) == [] and "server_name" not in config
        assert ("PodDisruptionBudget", "pyhami-nats") not in rendered
        assert 6222 not in ports and 6222 not in opened
        for command in clients.values():
            assert "--nats=nats://pyhami-nats.default.svc:4222" in command
        return
    assert nats_routes(config) == [f"nats://{host}:6222" for host in hosts]
    assert rendered[("PodDisruptionBudget", "pyhami-nats")]["spec"]["maxUnavailable"] == 1
    assert 6222 in ports and 6222 in opened
    every_server = ",".join(f"nats://{host}:4222" for host in hosts)
    for command in clients.values():
        assert f"--nats={every_server}" in command


@pytest.mark.parametrize("url", [
    "nats://a.example:4222,tls://b.example:4222",
    ["nats://a.example:4222", "tls://b.example:4222"],
], ids=["comma-separated", "list"])
def test_an_existing_nats_cluster_is_given_as_a_string_or_a_list(
        helm: Path, url: str | list[str]) -> None:
    rendered = render(helm, "nats.enabled=false", typed={"nats.url": url})
    assert ("StatefulSet", "pyhami-nats") not in rendered
    assert ("PodDisruptionBudget", "pyhami-nats") not in rendered
    for kind, name in (("Deployment", "pyhami-scheduler"), ("DaemonSet", "pyhami-agent")):
        commands = [c["command"] for c in rendered[(kind, name)]["spec"]["template"]["spec"][
            "containers"] if c["command"][0] == "pyhami"]
        assert "--nats=nats://a.example:4222,tls://b.example:4222" in commands[0]


def test_the_agent_runs_on_gpu_nodes_with_the_split_count(
        installed: dict[Release, Installed]) -> None:
    defaults = installed[DEFAULTS].get("DaemonSet", f"{DEFAULTS.fullname}-agent")
    spec = defaults["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gpu": "on"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"]
    assert not [a for a in spec["containers"][0]["command"] if "--device-split-count" in a]
    assert "deviceSplitCount: 10\n" in installed[DEFAULTS].get(
        "ConfigMap", f"{DEFAULTS.fullname}-device-config")["data"]["device-config.yaml"]
    custom = installed[CUSTOM].get("DaemonSet", f"{CUSTOM.fullname}-agent")
    spec = custom["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["runtimeClassName"] == "nvidia"
    (container,) = spec["containers"]
    assert "deviceSplitCount: 4\n" in installed[CUSTOM].get(
        "ConfigMap", f"{CUSTOM.fullname}-device-config")["data"]["device-config.yaml"]
    assert container["image"] == "registry.example.com/gpu/pyhami:0.1.0-custom"
    for ours in installed.values():
        for kind, name in (("DaemonSet", f"{ours.release.fullname}-agent"),
                           ("Deployment", ours.release.scheduler)):
            for c in ours.get(kind, name)["spec"]["template"]["spec"]["containers"]:
                assert c["resources"].get("requests"), f"{kind} {name}: {c['name']} has none"


def test_monitoring_objects_watch_the_metrics_service(installed: dict[Release, Installed]) -> None:
    custom = installed[CUSTOM]
    monitor = custom.get("ServiceMonitor", CUSTOM.scheduler)
    service = custom.get("Service", CUSTOM.scheduler)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"][
        "labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    rules = {rule["alert"]: rule["expr"] for group in custom.get(
        "PrometheusRule", CUSTOM.scheduler)["spec"]["groups"] for rule in group["rules"]}
    assert set(rules) == {"PyhamiNodeStale", "PyhamiNatsDisconnected", "PyhamiSchedulerNotReady",
                          "PyhamiNoLeader", "PyhamiSeveralLeaders"}
    for alert, metric in (("PyhamiNodeStale", "pyhami_node_stale"),
                          ("PyhamiNatsDisconnected", "pyhami_nats_connected"),
                          ("PyhamiSchedulerNotReady", "pyhami_ready"),
                          ("PyhamiNoLeader", "sum(pyhami_leader{"),
                          ("PyhamiSeveralLeaders", "sum(pyhami_leader{")):
        assert metric in rules[alert], rules[alert]
    assert rules["PyhamiNoLeader"].endswith("== 0")
    assert rules["PyhamiSeveralLeaders"].endswith("> 1")
    dashboard = custom.get("ConfigMap", f"{CUSTOM.fullname}-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = (CHART / "dashboards" / "pyhami.json").read_text()
    assert json.loads(dashboard["data"]["pyhami.json"]) == json.loads(shipped)


def pod_labels(ours: Installed) -> dict[str, dict[str, str]]:
    """The pod template labels of each workload of the release, by workload name."""
    return {name: doc["spec"]["template"]["metadata"]["labels"]
            for (kind, name), doc in ours.stored.items() if kind in WORKLOADS}


def selected(selector: dict[str, Any], pods: dict[str, dict[str, str]]) -> set[str]:
    """The workloads whose pods a label selector of the chart's (matchLabels only) selects."""
    assert set(selector) <= {"matchLabels"}, selector
    wanted = selector.get("matchLabels", {})
    return {name for name, labels in pods.items() if wanted.items() <= labels.items()}


def ingress_by_port(policy: dict[str, Any]) -> dict[int, list[dict[str, Any]] | None]:
    """Each port a policy opens, with the peers it lets in (None: anyone)."""
    opened: dict[int, list[dict[str, Any]] | None] = {}
    for rule in policy["spec"].get("ingress", []):
        for port in rule["ports"]:
            assert port["protocol"] == "TCP" and port["port"] not in opened, policy
            opened[port["port"]] = rule.get("from")
    return opened


def container_ports(ours: Installed, workload: str) -> set[int]:
    kind = next(kind for kind, name in ours.stored if name == workload and kind in WORKLOADS)
    return {port["containerPort"] for c in ours.get(kind, workload)["spec"]["template"]["spec"][
        "containers"] for port in c.get("ports", [])}


@pytest.mark.parametrize("release", [DEFAULTS, CUSTOM], ids=["defaults", "custom"])
def test_network_policies_let_in_only_what_each_pod_serves_to_whom_it_serves(
        installed: dict[Release, Installed], control_plane: ControlPlane,
        release: Release) -> None:
    ours = installed[release]
    api = control_plane.api
    policies = {name: api.get(api.path("networking.k8s.io/v1", "NetworkPolicy",
                                       release.namespace, name))
                for kind, name in ours.stored if kind == "NetworkPolicy"}
    pods = pod_labels(ours)
    agent, nats, scheduler = (f"{release.fullname}-agent", f"{release.fullname}-nats",
                              release.scheduler)
    bundled_nats = release is DEFAULTS
    assert (nats in pods) is bundled_nats
    # Each policy governs the pods of one workload, named after it; every pod has one.
    assert {name: selected(policy["spec"]["podSelector"], pods)
            for name, policy in policies.items()} == {name: {name} for name in pods}
    for name, policy in policies.items():
        assert policy["spec"]["policyTypes"] == ["Ingress"], name
        assert set(ingress_by_port(policy)) <= container_ports(ours, name), name
    values = yaml.safe_load((CHART / "values.yaml").read_text())["networkPolicy"]
    if release is CUSTOM:
        values = custom_values()["networkPolicy"]
    prometheus = [values["prometheus"]]
    assert ingress_by_port(policies[agent]) == {9394: prometheus}  # the node monitor
    assert ingress_by_port(policies[scheduler]) == {8443: None, 9395: prometheus}
    if bundled_nats:
        opened = ingress_by_port(policies[nats])
        assert opened[8222] == prometheus
        clients = opened[4222]
        assert clients is not None
        assert all(set(peer) == {"podSelector"} for peer in clients), "this namespace only"
        assert set().union(*(selected(peer["podSelector"], pods) for peer in clients)) == {
            agent, scheduler}
        # The routes between the servers: from the servers alone.
        routes = opened[6222]
        assert routes is not None and all(set(peer) == {"podSelector"} for peer in routes)
        assert set().union(*(selected(peer["podSelector"], pods) for peer in routes)) == {nats}
        assert set(opened) == {4222, 6222, 8222}


def test_network_policies_can_be_turned_off(helm: Path) -> None:
    command = [str(helm), "template", "pyhami", str(CHART), "--kube-version", KUBE_VERSION,
               "--set", "networkPolicy.enabled=false"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    kinds = {doc["kind"] for doc in yaml.safe_load_all(done.stdout) if doc}
    assert "NetworkPolicy" not in kinds and "Deployment" in kinds


@pytest.mark.parametrize(("settings", "message"), [
    (["nats.enabled=false"], "nats.url is required when nats.enabled is false"),
    (["nats.replicas=2"], "nats.replicas (2) must be odd: the servers decide by majority"),
    (["nats.replicas=4"], "nats.replicas (4) must be odd"),
    (["nats.replicas=0"], "at '/nats/replicas': minimum"),
    (["nats.replicas=9"], "at '/nats/replicas': maximum"),
    (["nats.antiAffinity=always"],
     "at '/nats/antiAffinity': value must be one of 'soft', 'hard', 'none'"),
    (["nats.enabled=false", "nats.url[0]=nats://a:4222 nats://b:4222"], "at '/nats/url'"),
    (["webhook.tls.existingSecret=serving"],
     "webhook.tls.caBundle is required with webhook.tls.existingSecret"),
    (["nats.auth.passwordKey=password"], "nats.auth.existingSecret is required"),
    (["nats.tls.existingSecret=tls", "nats.tls.certKey=tls.crt"],
     "nats.tls.certKey and nats.tls.keyKey go together"),
    (["scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy=packed"],
     "at '/scheduler/defaultSchedulerPolicy/nodeSchedulerPolicy': value must be one of "
     "'binpack', 'spread'"),
    (["devicePlugin.deviceSplitCount=0"], "at '/devicePlugin/deviceSplitCount': minimum"),
    (["networkPolicy.prometheus.namespaceSelector=null",
      "networkPolicy.prometheus.podSelector=null"],
     "networkPolicy.prometheus needs a namespaceSelector or a podSelector"),
    (["nats.serverTls.secretName=nats-tls"],
     "nats.serverTls.secretName needs nats.tls.existingSecret and nats.tls.caKey"),
    (["nats.serverTls.secretName=nats-tls", "nats.tls.existingSecret=t", "nats.tls.caKey=ca.crt",
      "nats.serverTls.verifyClients=true"],
     "nats.serverTls.verifyClients needs nats.serverTls.secretName and a client certificate"),
    (["nats.authCallout.enabled=true", "nats.auth.user=pyhami"],
     "nats.auth is for authCallout.enabled=false"),
    (["webhook.tls.existingSecrets=serving"],
     "at '/webhook/tls': additional properties 'existingSecrets' not allowed"),
    (["scheduler.extender.tls.enabled=true"],
     "scheduler.extender.tls.secretName is required when scheduler.extender.tls.enabled"),
    (["scheduler.extender.tls.clientSecretName=callers"],
     "scheduler.extender.tls.clientSecretName needs scheduler.extender.tls.enabled"),
    (["scheduler.extender.tls.mutual=true"],
     "at '/scheduler/extender/tls': additional properties 'mutual' not allowed"),
    (["scheduler.leaderElection.renewDeadline=ten"],
     "at '/scheduler/leaderElection/renewDeadline': 'ten' does not match pattern"),
    (["scheduler.leaderElection.leaseDuration=1500ms"],
     "at '/scheduler/leaderElection/leaseDuration': '1500ms' does not match pattern"),
    (["scheduler.leaderElection.renewDeadline=15s"],
     "scheduler.leaderElection.renewDeadline (15s) must be shorter than "
     "scheduler.leaderElection.leaseDuration (15s)"),
    (["scheduler.leaderElection.leaseDuration=1m", "scheduler.leaderElection.renewDeadline=1m"],
     "scheduler.leaderElection.renewDeadline (1m) must be shorter than"),
    (["scheduler.leaderElection.renewDeadline=2.4s"],
     "scheduler.leaderElection.renewDeadline (2.4s) must be longer than 1.2 x "
     "scheduler.leaderElection.retryPeriod (2s)"),
    (["scheduler.leaderElection.retryPeriod=0s"],
     "scheduler.leaderElection.retryPeriod must be longer than 0"),
    (["scheduler.podDisruptionBudget.maxUnavailable=0"],
     "at '/scheduler/podDisruptionBudget/maxUnavailable': 'oneOf' failed"),
    (["scheduler.antiAffinity=strict"],
     "at '/scheduler/antiAffinity': value must be one of 'soft', 'hard', 'none'"),
    (["resourceName=vgpu"], "at '/resourceName': 'vgpu' does not match pattern"),
    (["resourceCores=example.com/"], "at '/resourceCores': 'example.com/' does not match"),
    (["devicePlugin.deviceMemoryScaling=0"],
     "at '/devicePlugin/deviceMemoryScaling': exclusiveMinimum"),
    (["devicePlugin.deviceCoreScaling=-1"],
     "at '/devicePlugin/deviceCoreScaling': exclusiveMinimum"),
    (["scheduler.defaultCores=101"], "at '/scheduler/defaultCores': maximum"),
    (["scheduler.defaultMem=-1"], "at '/scheduler/defaultMem': minimum"),
    (["scheduler.defaultGPUNum=one"], "at '/scheduler/defaultGPUNum': got string"),
    (["devicePlugin.nodeConfiguration.config=nodeconfig"],
     "devicePlugin.nodeConfiguration.config is not JSON"),
    (["device-config.path=/device-config.yaml"],
     "at '/device-config': additional properties 'path' not allowed"),
    (["schedulerName=default-scheduler"],
     "schedulerName default-scheduler is the cluster's own scheduler"),
    (["schedulerName=HAMi_Scheduler"], "at '/schedulerName': 'HAMi_Scheduler' does not match"),
])
def test_values_that_cannot_work_are_refused_by_name(helm: Path, settings: list[str],
                                                     message: str) -> None:
    command = [str(helm), "template", "pyhami", str(CHART), "--kube-version", KUBE_VERSION]
    for setting in settings:
        command += ["--set", setting]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_the_bundled_nats_serves_tls_and_every_pod_verifies_it(helm: Path) -> None:
    settings = ["nats.serverTls.secretName=nats-server-tls", "nats.serverTls.verifyClients=true",
                "nats.tls.existingSecret=nats-client-tls", "nats.tls.caKey=ca.crt",
                "nats.tls.certKey=tls.crt", "nats.tls.keyKey=tls.key"]
    command = [str(helm), "template", "pyhami", str(CHART), "--kube-version", KUBE_VERSION]
    for setting in settings:
        command += ["--set", setting]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    docs = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    by_kind = {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}
    config = by_kind[("ConfigMap", "pyhami-nats-config")]["data"]["nats.conf"]
    server = by_kind[("StatefulSet", "pyhami-nats")]["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in server["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in server["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "nats-server-tls"
    for key in ("cert_file", "key_file", "ca_file"):
        path = re.search(rf"{key}: (\S+)", config)
        assert path is not None and path.group(1).startswith(mounts["tls"] + "/"), config
    assert "verify: true" in config
    for kind, name, container in (("DaemonSet", "pyhami-agent", "agent"),
                                  ("Deployment", "pyhami-scheduler", "extender")):
        spec = by_kind[(kind, name)]["spec"]["template"]["spec"]
        (ours,) = [c for c in spec["containers"] if c["name"] == container]
        tls_dir = {m["name"]: m["mountPath"] for m in ours["volumeMounts"]}["nats-tls"]
        every_server = ",".join(f"tls://pyhami-nats-{index}.pyhami-nats-headless.default.svc:4222"
                                for index in range(3))
        assert f"--nats={every_server}" in ours["command"]
        assert f"--nats-ca={tls_dir}/ca.crt" in ours["command"]
        assert f"--nats-cert={tls_dir}/tls.crt" in ours["command"]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_agent_serves_the_kubelet_its_device_plugin(helm: Path, enabled: bool) -> None:
    command = [str(helm), "template", "pyhami", str(CHART), "--kube-version", KUBE_VERSION,
               "--set", f"devicePlugin.enabled={str(enabled).lower()}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    (agent,) = [doc for doc in yaml.safe_load_all(done.stdout)
                if doc and doc["kind"] == "DaemonSet"]
    spec = agent["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
    if not enabled:
        assert "--device-plugin" not in container["command"]
        assert "device-plugins" not in volumes and "runAsUser" not in container[
            "securityContext"]
        return
    assert "--device-plugin" in container["command"]
    assert "--kubelet-dir=/var/lib/kubelet/device-plugins" in container["command"]
    assert volumes["device-plugins"]["hostPath"]["path"] == mounts["device-plugins"] == (
        "/var/lib/kubelet/device-plugins")
    assert volumes["hami-core"]["hostPath"]["path"] == mounts["hami-core"] == "/usr/local/vgpu"
    assert container["securityContext"]["runAsUser"] == 0
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # It still needs no Kubernetes API: no ServiceAccount token but the NATS one.
    assert spec["automountServiceAccountToken"] is False


@pytest.mark.parametrize(("settings", "port", "host_pid"), [
    ((), 9394, True),
    (("agent.monitor.port=9500", "agent.monitor.hostPID=false", "devicePlugin.enabled=false",
      "serviceMonitor.enabled=true"), 9500, False),
], ids=["defaults", "changed"])
def test_the_agents_serve_hamis_node_monitor(helm: Path, settings: tuple[str, ...], port: int,
                                             host_pid: bool) -> None:
    rendered = render(helm, *settings)
    agent = rendered[("DaemonSet", "pyhami-agent")]["spec"]["template"]["spec"]
    (container,) = agent["containers"]
    assert f"--metrics=0.0.0.0:{port}" in container["command"]
    assert "--containers-dir=/usr/local/vgpu/containers" in container["command"]
    assert container["ports"] == [{"name": "monitor", "containerPort": port}]
    assert agent.get("hostPID", False) is host_pid
    # The monitor reads (and its feedback loop writes) the cache files, plugin or not.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["hami-core"] == "/usr/local/vgpu"
    service = rendered[("Service", "pyhami-agent")]["spec"]
    assert service["ports"] == [{"name": "monitor", "port": port, "targetPort": "monitor"}]
    assert service["selector"].items() <= rendered[("DaemonSet", "pyhami-agent")]["spec"][
        "template"]["metadata"]["labels"].items()
    monitor = rendered.get(("ServiceMonitor", "pyhami-agent"))
    assert (monitor is not None) is ("serviceMonitor.enabled=true" in settings)
    if monitor is not None:
        assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["monitor"]


def render(helm: Path, *settings: str, typed: dict[str, object] | None = None,
           ) -> dict[tuple[str, str], dict[str, Any]]:
    """``helm template`` of release pyhami with ``--set`` settings and ``typed`` values
    (``--set-json``: a number stays a number, where ``--set 2.5`` gives a string), by
    (kind, name)."""
    command = [str(helm), "template", "pyhami", str(CHART), "--kube-version", KUBE_VERSION]
    for setting in settings:
        command += ["--set", setting]
    for path, value in (typed or {}).items():
        command += ["--set-json", f"{path}={json.dumps(value)}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return {(doc["kind"], doc["metadata"]["name"]): doc
            for doc in yaml.safe_load_all(done.stdout) if doc}


def device_config_file(rendered: dict[tuple[str, str], dict[str, Any]]) -> str:
    text: str = rendered[("ConfigMap", "pyhami-device-config")]["data"]["device-config.yaml"]
    return text


# HAMi's chart rendering (tests/common/hami), whose nvidia: section the chart's defaults
# render; migProfileAllowlist is left out, and reads as the chart's allowlist.
HAMI_FILES = REPO / "tests" / "common" / "hami"


def test_the_default_device_config_is_hamis_chart_rendering(helm: Path, tmp_path: Path) -> None:
    rendered = render(helm)
    ours = yaml.safe_load(device_config_file(rendered))
    hamis = yaml.safe_load((HAMI_FILES / "device-config.yaml").read_text())["nvidia"]
    del hamis["migProfileAllowlist"]
    assert ours == {"nvidia": hamis}
    path = tmp_path / "device-config.yaml"
    path.write_text(device_config_file(rendered))
    assert load_device_config(path) == DeviceConfig()
    node = rendered[("ConfigMap", "pyhami-node-config")]["data"]["config.json"]
    path = tmp_path / "config.json"
    path.write_text(node)
    assert load_node_config(path) == NodeConfigFile(())


@pytest.mark.parametrize(("path", "key", "value"), [
    ("resourceName", "resourceCountName", "example.com/vgpu"),
    ("resourceMem", "resourceMemoryName", "example.com/vgpu-memory"),
    ("resourceMemPercentage", "resourceMemoryPercentageName",
     "example.com/vgpu-share"),
    ("resourceCores", "resourceCoreName", "example.com/vgpu-cores"),
    ("resourcePriority", "resourcePriorityName",
     "example.com/vgpu-priority"),
    ("scheduler.defaultMem", "defaultMemory", 4096),
    ("scheduler.defaultCores", "defaultCores", 30),
    ("scheduler.defaultGPUNum", "defaultGPUNum", 2),
    ("devicePlugin.deviceSplitCount", "deviceSplitCount", 4),
    ("devicePlugin.deviceMemoryScaling", "deviceMemoryScaling", 2.5),
    ("devicePlugin.deviceCoreScaling", "deviceCoreScaling", 1.5),
    ("devicePlugin.runtimeClassName", "runtimeClassName", "nvidia"),
], ids=["resourceName", "resourceMem", "resourceMemPercentage", "resourceCores",
        "resourcePriority", "defaultMem", "defaultCores", "defaultGPUNum", "deviceSplitCount",
        "deviceMemoryScaling", "deviceCoreScaling", "runtimeClassName"])
def test_each_device_value_reaches_its_key_and_no_other(helm: Path, path: str, key: str,
                                                         value: object) -> None:
    defaults = yaml.safe_load(device_config_file(render(helm)))["nvidia"]
    changed = yaml.safe_load(device_config_file(render(helm, typed={path: value})))["nvidia"]
    assert defaults[key] != value
    assert changed == {**defaults, key: value}


EVERY_DEVICE_VALUE_CHANGED: dict[str, object] = {
    "resourceName": "example.com/vgpu", "resourceMem": "example.com/vgpu-memory",
    "resourceMemPercentage": "example.com/vgpu-share", "resourceCores": "example.com/vgpu-cores",
    "resourcePriority": "example.com/vgpu-priority", "scheduler.defaultMem": 4096,
    "scheduler.defaultCores": 30, "scheduler.defaultGPUNum": 2,
    "devicePlugin.deviceSplitCount": 4, "devicePlugin.deviceMemoryScaling": 2.5,
    "devicePlugin.deviceCoreScaling": 1.5, "devicePlugin.runtimeClassName": "nvidia"}


def test_every_device_value_changed_is_read_by_pyhami(helm: Path, tmp_path: Path) -> None:
    rendered = render(helm, typed=EVERY_DEVICE_VALUE_CHANGED)
    path = tmp_path / "device-config.yaml"
    path.write_text(device_config_file(rendered))
    config = load_device_config(path)
    assert config.resources == ResourceNames(
        "example.com/vgpu", "example.com/vgpu-memory", "example.com/vgpu-share",
        "example.com/vgpu-cores", "example.com/vgpu-priority")
    assert (config.default_memory, config.default_cores, config.default_gpu_num) == (4096, 30, 2)
    assert config.node == replace(NodeSettings(), device_split_count=4,
                                  device_memory_scaling=2.5, device_core_scaling=1.5)
    assert config.runtime_class_name == "nvidia"


@pytest.mark.parametrize("settings", [
    [], ["resourceName=example.com/vgpu", "resourceMem=example.com/vgpu-memory",
         "resourceMemPercentage=example.com/vgpu-share", "resourceCores=example.com/vgpu-cores",
         "resourcePriority=example.com/vgpu-priority"],
], ids=["hamis-names", "custom-names"])
def test_kube_scheduler_leaves_the_configured_resources_to_pyhami(helm: Path,
                                                                  settings: list[str]) -> None:
    rendered = render(helm, *settings)
    names = yaml.safe_load(device_config_file(rendered))["nvidia"]
    config = yaml.safe_load(rendered[("ConfigMap", "pyhami-scheduler-config")]["data"][
        "config.yaml"])
    (extender,) = config["extenders"]
    assert extender["managedResources"] == [
        {"name": names[key], "ignoredByScheduler": True}
        for key in ("resourceCountName", "resourceMemoryName", "resourceMemoryPercentageName",
                    "resourceCoreName", "resourcePriorityName")]
    assert {r["name"] for r in extender["managedResources"]} == (
        {s.partition("=")[2] for s in settings} or {
            "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage",
            "nvidia.com/gpucores", "nvidia.com/priority"})


def config_map_folders(spec: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """Each ConfigMap the container mounts, by name, with the folder it is mounted at."""
    volumes = {v["name"]: v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v}
    return {volumes[m["name"]]: m["mountPath"] for m in container["volumeMounts"]
            if m["name"] in volumes and m.get("readOnly")}


@pytest.mark.parametrize("plugin", [True, False], ids=["device-plugin", "no-device-plugin"])
def test_the_daemon_and_the_agents_read_the_device_config_files(helm: Path,
                                                                plugin: bool) -> None:
    rendered = render(helm, f"devicePlugin.enabled={str(plugin).lower()}")
    scheduler = rendered[("Deployment", "pyhami-scheduler")]["spec"]["template"]
    extender = next(c for c in scheduler["spec"]["containers"] if c["name"] == "extender")
    folders = config_map_folders(scheduler["spec"], extender)
    assert f"--device-config={folders['pyhami-device-config']}/device-config.yaml" in extender[
        "command"]
    agent = rendered[("DaemonSet", "pyhami-agent")]["spec"]["template"]
    (container,) = agent["spec"]["containers"]
    folders = config_map_folders(agent["spec"], container)
    assert f"--device-config={folders['pyhami-device-config']}/device-config.yaml" in container[
        "command"]
    assert f"--node-config={folders['pyhami-node-config']}/config.json" in container["command"]
    assert not [arg for arg in container["command"] if arg.startswith("--device-split-count")]
    # A change of either file restarts the pods that read it at start.
    for template in (scheduler, agent):
        assert template["metadata"]["annotations"]["checksum/device-config"]


def test_a_whole_device_config_and_node_configuration_are_taken_as_given(helm: Path) -> None:
    content = "nvidia:\n  deviceSplitCount: 3\n  memoryFactor: 2\ncambricon: {}\n"
    nodes = '{"nodeconfig": [{"name": "gpu-1", "devicememoryscaling": 2}]}'
    rendered = render(helm, "devicePlugin.deviceSplitCount=7", typed={
        "device-config.content": content, "devicePlugin.nodeConfiguration.config": nodes})
    assert device_config_file(rendered) == content
    node = rendered[("ConfigMap", "pyhami-node-config")]["data"]["config.json"]
    assert json.loads(node) == json.loads(nodes)
    changed = render(helm, typed={"device-config.content": content})
    assert (changed[("DaemonSet", "pyhami-agent")]["spec"]["template"]["metadata"]["annotations"]
            != render(helm)[("DaemonSet", "pyhami-agent")]["spec"]["template"]["metadata"][
                "annotations"])


def test_an_existing_node_config_map_is_mounted_and_none_made(helm: Path) -> None:
    rendered = render(helm, "devicePlugin.nodeConfiguration.externalConfigName=hami-device-plugin")
    assert not [name for kind, name in rendered if kind == "ConfigMap" and "node-config" in name]
    agent = rendered[("DaemonSet", "pyhami-agent")]["spec"]["template"]["spec"]
    assert "hami-device-plugin" in config_map_folders(agent, agent["containers"][0])


@pytest.mark.parametrize(("settings", "expected"), [
    ([], None), (["devicePlugin.runtimeClassName=nvidia"], "nvidia"),
    (["devicePlugin.runtimeClassName=nvidia", "agent.runtimeClassName=kata"], "kata"),
], ids=["none", "devicePlugin", "agent-first"])
def test_the_agent_runs_under_the_device_plugins_runtime_class(
        helm: Path, settings: list[str], expected: str | None) -> None:
    agent = render(helm, *settings)[("DaemonSet", "pyhami-agent")]["spec"]["template"]["spec"]
    assert agent.get("runtimeClassName") == expected


def test_helm_install_and_uninstall_against_the_api_server(
        helm: Path, control_plane: ControlPlane, tmp_path: Path) -> None:
    """What a user runs: helm itself creates the release, and removes every object again."""
    release = Release("pyhami-helm", "pyhami-chart-helm", None, "pyhami-helm")
    env = {**os.environ, "KUBECONFIG": str(control_plane.admin_kubeconfig)}
    for setting in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[setting] = str(tmp_path / setting)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(helm), *args, "--namespace", release.namespace], env=env,
                              capture_output=True, text=True, timeout=120, check=False)

    api = control_plane.api
    webhook = ("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
               f"{release.scheduler}")
    try:
        done = run("install", release.name, str(CHART), "--create-namespace")
        assert done.returncode == 0, done.stderr
        assert "kubectl label node GPU-NODE gpu=on" in done.stdout, "no NOTES"
        assert f"get lease {release.scheduler} " in done.stdout, "NOTES name no leader"
        status = json.loads(run("status", release.name, "--output", "json").stdout)
        assert status["info"]["status"] == "deployed"
        assert api.get(webhook)["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        done = run("uninstall", release.name)
        assert done.returncode == 0, done.stderr
        with pytest.raises(ApiError) as gone:
            api.get(webhook)
        assert gone.value.status == HTTPStatus.NOT_FOUND
    finally:
        run("uninstall", release.name, "--ignore-not-found")
        with contextlib.suppress(ApiError):
            api.delete(f"/api/v1/namespaces/{release.namespace}")


def test_k8s_is_the_charts_rendering(helm: Path, tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(RENDER_SCRIPT), "--out", str(tmp_path)],
                          env={**os.environ, "HELM": str(helm)},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"scripts/render-k8s.sh failed:\n{done.stderr}"
    rendered = {path.name: path.read_bytes() for path in tmp_path.glob("*.yaml")}
    generated = {path.name: path.read_bytes() for path in K8S_DIR.glob("*.yaml")
                 if path.read_bytes().startswith(b"# Generated by scripts/render-k8s.sh")}
    stale = sorted(name for name in set(generated) | set(rendered)
                   if generated.get(name) != rendered.get(name))
    assert not stale, (f"k8s/ is not the chart's rendering (differing: {', '.join(stale)}): "
                       "run scripts/render-k8s.sh")
    assert "scheduler-config.yaml" in generated, "the suite's kube-scheduler configuration"


@pytest.mark.parametrize("checking", [True, False], ids=["on", "off"])
def test_kueues_admission_check_brings_its_rules_flags_and_object(helm: Path,
                                                                  checking: bool) -> None:
    documents = helm_template_set(helm, f"scheduler.kueue.admissionCheck={str(checking).lower()}",
                                  "scheduler.kueue.retryAfter=30")
    rules, command = _daemon_rules_and_command(documents)
    kueue_rules = [rule for rule in rules if rule["apiGroups"] == ["kueue.x-k8s.io"]]
    checks = [doc for doc in documents if doc["kind"] == "AdmissionCheck"]
    if not checking:
        assert kueue_rules == [] and checks == []
        assert not [arg for arg in command if arg.startswith("--kueue")]
        return
    assert kueue_rules == [
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads", "admissionchecks"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["kueue.x-k8s.io"],
         "resources": ["workloads/status", "admissionchecks/status"], "verbs": ["patch"]}]
    assert [arg for arg in command if arg.startswith("--kueue")] == [
        "--kueue-admission-check", "--kueue-retry-after=30"]
    (check,) = checks
    assert check["metadata"]["name"] == "pyhami-placement"
    assert check["spec"] == {"controllerName": "pyhami.io/placement"}
