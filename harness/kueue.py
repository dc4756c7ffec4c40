"""Kueue (sigs.k8s.io/kueue) on a control plane of ``harness.controlplane``, as a process.

What its kustomize deployment (``config/default`` of the module) would install, done
through the API: the CRDs, the conversion webhooks of those its ``crd/kustomization.yaml``
patches, the namespace ``kueue-system``, the webhook Service with an EndpointSlice at this
machine's address (kube-apiserver runs with ``--enable-aggregator-routing``, so it calls a
webhook at an endpoint of its Service; it refuses loopback endpoints), the webhook
configurations (named ``kueue-...`` as kustomize's namePrefix names them, the pod,
deployment and statefulset hooks sparing kube-system and kueue-system) and the empty
Secret its internal certificate management fills. No kubelet mounts that Secret: the
runner copies its data into Kueue's certificate folder, as the kubelet would, until
Kueue stops.

The binary and the manifests come from ``scripts/build-control-plane.sh``
(``kueue``, ``kueue-manifests/`` beside the other binaries).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import ipaddress
import json
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from harness.controlplane import (
    START_TIMEOUT_S,
    WAIT_S,
    ApiError,
    ApiServerPlane,
    Process,
    wait_for,
)
from pyhami.bench.loopback import http_get
from pyhami.natsserver import free_port

NAMESPACE = "kueue-system"
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"
# kustomize's namePrefix of config/default; Kueue's certificate rotator injects its CA into
# the configurations of these names (<service name without -webhook-service>-...).
NAME_PREFIX = "kueue-"
GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
API = f"/apis/{API_VERSION}"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
MANIFESTS = "kueue-manifests"
# The CRDs config/components/crd/kustomization.yaml gives a conversion webhook (its
# resourceflavors patch is commented out), the ones Kueue's rotator injects its CA into.
CONVERSION_CRDS = frozenset(f"{plural}.{GROUP}" for plural in (
    "localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters"))
# The webhooks config/components/webhook/kustomization.yaml keeps out of kube-system and
# kueue-system, by the integration (framework) that serves them.
WORKLOAD_HOOKS = {"pod": ("mpod.kb.io", "vpod.kb.io"),
                  "deployment": ("mdeployment.kb.io", "vdeployment.kb.io"),
                  "statefulset": ("mstatefulset.kb.io", "vstatefulset.kb.io")}
HAMI_TRANSFORMATIONS: list[dict[str, Any]] = [
    {"input": "nvidia.com/gpumem", "multiplyBy": "nvidia.com/gpu", "strategy": "Replace",
     "outputs": {"nvidia.com/total-gpumem": "1"}}]
"""Kueue's "Using HAMi" recipe: a pod's ``nvidia.com/gpumem`` (MiB per card) times its
``nvidia.com/gpu`` counted as ``nvidia.com/total-gpumem``, which a ClusterQueue can cover."""


# The manifests -----------------------------------------------------------------------------


def manifests_dir(bin_dir: Path) -> Path:
    return bin_dir / MANIFESTS


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def crds(directory: Path) -> list[dict[str, Any]]:
    """Kueue's CRDs, those of ``CONVERSION_CRDS`` with the conversion webhook of their patch
    pointed at ``WEBHOOK_SERVICE`` in ``NAMESPACE``."""
    patches: dict[str, dict[str, Any]] = {}
    for path in sorted((directory / "crd" / "patches").glob("webhook_in_*.yaml")):
        for patch in _documents(path):
            patches[patch["metadata"]["name"]] = patch["spec"]["conversion"]
    found = []
    for path in sorted((directory / "crd" / "bases").glob("*.yaml")):
        for crd in _documents(path):
            name = crd["metadata"]["name"]
            if name in CONVERSION_CRDS:
                conversion = copy.deepcopy(patches[name])
                conversion["webhook"]["clientConfig"]["service"].update(
                    name=WEBHOOK_SERVICE, namespace=NAMESPACE)
                crd["spec"]["conversion"] = conversion
            found.append(crd)
    if not found:
        raise FileNotFoundError(f"no CRDs in {directory / 'crd' / 'bases'}")
    return found


def webhook_configurations(directory: Path, frameworks: Iterable[str]) -> list[dict[str, Any]]:
    """The mutating and validating configurations of ``webhook/manifests.yaml`` as Kueue's
    kustomize renders them. The pod, deployment and statefulset hooks are left out unless
    their integration is among ``frameworks`` (Kueue answers them with a no-op then; left
    out, no pod of the cluster waits on Kueue)."""
    enabled = set(frameworks)
    dropped = {hook for name, hooks in WORKLOAD_HOOKS.items() if name not in enabled
               for hook in hooks}
    kept_out_of = {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                         "operator": "NotIn",
                                         "values": ["kube-system", NAMESPACE]}]}
    workload_hooks = {hook for hooks in WORKLOAD_HOOKS.values() for hook in hooks}
    configurations = []
    for doc in _documents(directory / "webhook" / "manifests.yaml"):
        doc["metadata"]["name"] = NAME_PREFIX + doc["metadata"]["name"]
        webhooks = []
        for hook in doc["webhooks"]:
            if hook["name"] in dropped:
                continue
            hook["clientConfig"]["service"].update(name=WEBHOOK_SERVICE, namespace=NAMESPACE)
            if hook["name"] in workload_hooks:
                hook["namespaceSelector"] = copy.deepcopy(kept_out_of)
            webhooks.append(hook)
        doc["webhooks"] = webhooks
        configurations.append(doc)
    return configurations


def host_ipv4() -> str:
    """This machine's first global (non-loopback) IPv4 address, where the API server can
    reach a webhook of this machine through an EndpointSlice."""
    done = subprocess.run(["ip", "-j", "-4", "addr", "show", "scope", "global"],
                          capture_output=True, text=True, timeout=30, check=False)
    if done.returncode == 0:
        for interface in json.loads(done.stdout or "[]"):
            for address in interface.get("addr_info", []):
                ip = ipaddress.ip_address(address.get("local", "0.0.0.0"))
                if not ip.is_loopback and not ip.is_link_local and not ip.is_unspecified:
                    return str(ip)
    raise RuntimeError(
        "Kueue's webhooks need a non-loopback IPv4 address of this machine for their "
        "EndpointSlice (the API server refuses loopback endpoints), and `ip -4 addr show "
        f"scope global` found none (exit {done.returncode}: {done.stderr.strip()})")


# Kueue's objects ---------------------------------------------------------------------------


def resource_flavor(name: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": name}}


def cluster_queue(name: str, quotas: Mapping[str, str], *, flavor: str = "default-flavor",
                  admission_checks: Sequence[str] = (),
                  namespace_selector: Mapping[str, Any] | None = None,
                  queueing_strategy: str | None = None) -> dict[str, Any]:
    """A ClusterQueue of one resource group covering the resources of ``quotas`` (name:
    nominal quota) in ``flavor``, for every namespace unless ``namespace_selector``;
    ``queueing_strategy``: ``StrictFIFO`` or ``BestEffortFIFO`` (Kueue's default)."""
    spec: dict[str, Any] = {
        "namespaceSelector": dict(namespace_selector or {}),
        "resourceGroups": [{
            "coveredResources": list(quotas),
            "flavors": [{"name": flavor, "resources": [
                {"name": resource, "nominalQuota": quota}
                for resource, quota in quotas.items()]}]}]}
    if queueing_strategy is not None:
        spec["queueingStrategy"] = queueing_strategy
    if admission_checks:
        spec["admissionChecksStrategy"] = {
            "admissionChecks": [{"name": check} for check in admission_checks]}
    return {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": spec}


def local_queue(namespace: str, name: str, cluster_queue_name: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue_name}}


def admission_check(name: str, controller_name: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "AdmissionCheck", "metadata": {"name": name},
            "spec": {"controllerName": controller_name}}


def condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """The status condition of type ``kind`` of a Kueue object, if any."""
    for found in obj.get("status", {}).get("conditions") or ():
        if found.get("type") == kind:
            result: dict[str, Any] = found
            return result
    return None


def has_condition(obj: Mapping[str, Any], kind: str) -> bool:
    found = condition(obj, kind)
    return found is not None and found.get("status") == "True"


# The runner -------------------------------------------------------------------------------


@dataclass
class Kueue:
    """Kueue installed on ``plane`` and run as its process ``kueue`` (``start``; ``stop``).

    ``frameworks`` are its integrations (``batch/job`` by default); ``configuration`` is
    merged over the Configuration the runner writes, top-level key by key (e.g.
    ``{"resources": {"transformations": HAMI_TRANSFORMATIONS}}``)."""

    plane: ApiServerPlane
    frameworks: tuple[str, ...] = ("batch/job",)
    configuration: dict[str, Any] = field(default_factory=dict)
    process: Process | None = None
    webhook_port: int = 0
    health_port: int = 0
    metrics_port: int = 0
    host: str = ""
    start_s: float = 0.0
    """How long the last ``start`` took, in seconds (the install included the first time)."""
    _stop_mirror: threading.Event = field(default_factory=threading.Event)
    _mirror: threading.Thread | None = None
    _mirror_error: BaseException | None = None

    @property
    def manifests(self) -> Path:
        return manifests_dir(self.plane.bin_dir)

    @property
    def cert_dir(self) -> Path:
        return self.plane.data / "kueue-certs"

    @property
    def config_file(self) -> Path:
        return self.plane.data / "kueue-config.yaml"

    # Install, start, stop -------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Install (once) and run Kueue; returns once its webhooks answer."""
        started = time.monotonic()
        if not self.webhook_port:
            self.host = host_ipv4()
            self.webhook_port, self.health_port = free_port(), free_port()
            self.metrics_port = free_port()
            self.install()
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self._stop_mirror.clear()
        self._mirror = threading.Thread(target=self._mirror_secret, name="kueue-cert-mirror",
                                        daemon=True)
        self._mirror.start()
        self.process = self.plane.run("kueue", [
            str(self.plane.bin_dir / "kueue"), f"--config={self.config_file}",
            f"--kubeconfig={self.plane.admin_kubeconfig}", "--zap-log-level=3"])
        self.wait_ready(timeout)
        self.start_s = round(time.monotonic() - started, 1)

    def stop(self) -> None:
        self._stop_mirror.set()
        if self.process is not None:
            self.process.stop()
        if self._mirror is not None:
            self._mirror.join(10)

    def restart(self, configuration: Mapping[str, Any] | None = None) -> None:
        """Stop Kueue and start it again, with ``configuration`` instead if given."""
        self.stop()
        if configuration is not None:
            self.configuration = dict(configuration)
        self.start()

    def config(self) -> dict[str, Any]:
        """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for this runner."""
        document: dict[str, Any] = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.metrics_port}"},
            "webhook": {"port": self.webhook_port, "certDir": str(self.cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": True, "webhookServiceName": WEBHOOK_SERVICE,
                                       "webhookSecretName": WEBHOOK_SECRET},
            "integrations": {"frameworks": list(self.frameworks)},
        }
        document.update(copy.deepcopy(self.configuration))
        return document

    def install(self) -> None:
        """Everything Kueue finds in a cluster before it starts (see the module's text)."""
        api = self.plane.api
        crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        for crd in crds(self.manifests):
            api.create(crd_path, crd)
        self.plane.create_namespace(NAMESPACE)
        api.create(f"/api/v1/namespaces/{NAMESPACE}/services", {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": WEBHOOK_SERVICE, "namespace": NAMESPACE},
            "spec": {"ports": [{"name": "https", "port": 443, "protocol": "TCP",
                                "targetPort": self.webhook_port}]}})
        # No selector: the endpoint is this machine, as an EndpointSlice controller would
        # list a pod.
        api.create(f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices", {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{WEBHOOK_SERVICE}-host", "namespace": NAMESPACE,
                         "labels": {"kubernetes.io/service-name": WEBHOOK_SERVICE}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.host], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": self.webhook_port, "protocol": "TCP"}]})
        for configuration in webhook_configurations(self.manifests, self.frameworks):
            kind = configuration["kind"].lower() + "s"
            api.create(f"/apis/admissionregistration.k8s.io/v1/{kind}", configuration)
        api.create(f"/api/v1/namespaces/{NAMESPACE}/secrets", {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": WEBHOOK_SECRET, "namespace": NAMESPACE}})

        def established() -> bool:
            for crd in api.get(crd_path)["items"]:
                if crd["spec"]["group"] == GROUP and not any(
                        c["type"] == "Established" and c["status"] == "True"
                        for c in (crd.get("status") or {}).get("conditions") or ()):
                    return False
            return True

        wait_for(established, "Kueue's CRDs to be established", START_TIMEOUT_S)

    def _mirror_secret(self) -> None:
        """As a kubelet mounting the Secret: its keys as files of ``cert_dir``, rewritten
        when they change, until ``stop``."""
        written: dict[str, bytes] = {}
        path = f"/api/v1/namespaces/{NAMESPACE}/secrets/{WEBHOOK_SECRET}"
        try:
            while not self._stop_mirror.is_set():
                with contextlib.suppress(ApiError, OSError, ValueError):
                    data = self.plane.api.get(path).get("data") or {}
                    for key, value in data.items():
                        content = base64.b64decode(value)
                        if written.get(key) != content:
                            temporary = self.cert_dir / f".{key}.tmp"
                            temporary.write_bytes(content)
                            temporary.chmod(0o600)
                            temporary.replace(self.cert_dir / key)
                            written[key] = content
                self._stop_mirror.wait(0.5)
        except BaseException as error:  # pragma: no cover - surfaced by wait_ready
            self._mirror_error = error

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Until /readyz answers and the webhooks do: a dry-run ResourceFlavor is accepted."""
        assert self.process is not None
        api = self.plane.api

        def ready() -> bool:
            if self._mirror_error is not None:
                raise RuntimeError(f"copying {WEBHOOK_SECRET} failed: {self._mirror_error}")
            if http_get(f"http://127.0.0.1:{self.health_port}/readyz")[0] != 200:
                return False
            api.request("POST", f"{API}/resourceflavors", resource_flavor("readiness-probe"),
                        query={"dryRun": "All"})
            return True

        wait_for(ready, "Kueue's /readyz and its webhooks", timeout, interval=0.5,
                 watch=[self.process])

    # Kueue's objects ------------------------------------------------------------------

    def create_resource_flavor(self, name: str = "default-flavor") -> dict[str, Any]:
        return self.plane.api.create(f"{API}/resourceflavors", resource_flavor(name))

    def create_cluster_queue(self, name: str, quotas: Mapping[str, str], *,
                             flavor: str = "default-flavor",
                             admission_checks: Sequence[str] = (),
                             namespace_selector: Mapping[str, Any] | None = None,
                             queueing_strategy: str | None = None) -> dict[str, Any]:
        """``cluster_queue``'s ClusterQueue; ``quotas`` maps a covered resource to its
        nominal quota."""
        return self.plane.api.create(f"{API}/clusterqueues", cluster_queue(
            name, quotas, flavor=flavor, admission_checks=admission_checks,
            namespace_selector=namespace_selector, queueing_strategy=queueing_strategy))

    def create_local_queue(self, namespace: str, name: str,
                           cluster_queue_name: str) -> dict[str, Any]:
        return self.plane.api.create(f"{API}/namespaces/{quote(namespace)}/localqueues",
                                     local_queue(namespace, name, cluster_queue_name))

    def create_admission_check(self, name: str, controller_name: str) -> dict[str, Any]:
        return self.plane.api.create(f"{API}/admissionchecks",
                                     admission_check(name, controller_name))

    def get(self, plural: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        where = f"/namespaces/{quote(namespace)}" if namespace else ""
        return self.plane.api.get(f"{API}{where}/{plural}/{quote(name)}")

    def delete(self, plural: str, name: str, namespace: str | None = None) -> None:
        """Delete a Kueue object; gone already is fine."""
        where = f"/namespaces/{quote(namespace)}" if namespace else ""
        try:
            self.plane.api.delete(f"{API}{where}/{plural}/{quote(name)}")
        except ApiError as error:
            if error.status != 404:
                raise

    def workloads(self, namespace: str, *, job_uid: str | None = None) -> list[dict[str, Any]]:
        """The Workloads of ``namespace`` (of one job, by its uid, if ``job_uid``)."""
        query = {"labelSelector": f"{JOB_UID_LABEL}={job_uid}"} if job_uid else {}
        found: list[dict[str, Any]] = self.plane.api.get(
            f"{API}/namespaces/{quote(namespace)}/workloads", **query)["items"]
        return found

    def wait_workload(self, namespace: str, job_uid: str, kind: str, *,
                      timeout: float = WAIT_S) -> dict[str, Any]:
        """Until the job's Workload has the condition ``kind`` (Admitted, QuotaReserved,
        ...) True; the Workload."""
        def met() -> dict[str, Any] | None:
            for workload in self.workloads(namespace, job_uid=job_uid):
                if has_condition(workload, kind):
                    return workload
            return None

        return wait_for(met, f"the Workload of job {job_uid} in {namespace} {kind}", timeout,
                        interval=0.5, watch=self.plane.all_processes())

    def wait_check(self, namespace: str, job_uid: str, check: str, state: str,
                   *needles: str, timeout: float = WAIT_S) -> dict[str, Any]:
        """Until the job's Workload shows ``check`` in ``state`` with every needle in its
        message; the Workload. Kueue writes a Workload's checks list in a pass of its own,
        sometimes after QuotaReserved, so a test waits for the state, not the condition."""
        def met() -> dict[str, Any] | None:
            for workload in self.workloads(namespace, job_uid=job_uid):
                found = check_state(workload, check)
                if found and found["state"] == state and all(
                        needle in found.get("message", "") for needle in needles):
                    return workload
            return None

        return wait_for(met, f"check {check} {state} {needles} on job {job_uid} in {namespace}",
                        timeout, interval=0.2, watch=self.plane.all_processes())


def check_state(workload: dict[str, Any], check: str) -> dict[str, Any] | None:
    """The workload's entry for ``check`` in ``status.admissionChecks``, if Kueue wrote it."""
    for state in workload.get("status", {}).get("admissionChecks") or ():
        if state["name"] == check:
            found: dict[str, Any] = state
            return found
    return None
