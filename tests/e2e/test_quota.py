"""ResourceQuota for GPU memory on the real control plane (docs/scheduler.md, "Quota").

Each test has a namespace of its own holding ordinary ResourceQuotas with
``limits.nvidia.com/gpumem``, and lab pods asking one card with a slice of it. There is
no kube-controller-manager here, so no quota controller fills a quota's ``status`` and
kube-apiserver's own quota admission, which reads that status, passes every pod: what
holds the namespaces to their limits is pyhami alone, in its ``/filter`` (the pod stays
Pending, its FilteringFailed Event saying which quota) and in its webhook (the create is
refused). Namespaces cannot be deleted without that controller either: each test's
stays, emptied of its pods and quotas.

The times the tests measure are printed and kept in ``quota.jsonl`` in the suite's log
folder.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.controlplane import ApiError, wait_for
from pyhami.bench.loopback import http_get
from tests.e2e.controlplane import ControlPlane
from tests.e2e.pods import ClusterLab, lab_pod
from tests.e2e.test_webhook import CONFIGURATIONS, configuration, gpu_pod, webhook

MEMORY = "limits.nvidia.com/gpumem"
SETTLED_S = 3.0
"""With every pod of a burst tried once, no bind for this long: kube-scheduler is done."""
RELEASE_BOUND_S = 2.0
"""The issue's bound on the time from deleting a pod to the waiting one being bound."""
CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
HIGH = "pyhami-e2e-quota-high"


def quotas_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/resourcequotas"


def resource_quota(name: str, memory: int,
                   scope_selector: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ResourceQuota as ``kubectl create quota NAME --hard=limits.nvidia.com/gpumem=N``
    writes it, with ``scope_selector`` as its ``spec.scopeSelector`` when given."""
    spec: dict[str, Any] = {"hard": {MEMORY: str(memory)}}
    if scope_selector is not None:
        spec["scopeSelector"] = scope_selector
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name},
            "spec": spec}


def quota_pod(name: str, memory: int, priority_class: str | None = None) -> dict[str, Any]:
    """The lab pod asking one card with ``memory`` MiB of it."""
    pod = lab_pod(name)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = str(memory)
    if priority_class is not None:
        pod["spec"]["priorityClassName"] = priority_class
    return pod


def sentence(namespace: str, used: int, limit: int, quota: str, asked: int) -> str:
    """The refusal as pyhami words it (``QuotaRefusal.text``)."""
    return (f"{namespace} would use {used + asked} of {limit} MiB nvidia.com/gpumem under "
            f"ResourceQuota {quota} (asked {asked})")


def record(plane: ControlPlane, **measured: object) -> None:
    with (plane.logs / "quota.jsonl").open("a") as out:
        out.write(json.dumps(measured) + "\n")
    print("quota:", json.dumps(measured))


class QuotaLab(ClusterLab):
    """A namespace of the test's own, its ResourceQuotas and its pods."""

    def __init__(self, plane: ControlPlane, namespace: str,
                 labels: dict[str, str] | None = None) -> None:
        super().__init__(plane, namespace)
        plane.create_namespace(namespace, labels)
        self.quotas = quotas_path(namespace)

    def limit(self, name: str, memory: int,
              scope_selector: dict[str, Any] | None = None) -> None:
        """Create the quota, and wait until the daemon applies it (its gauge shows it)."""
        self.api.create(self.quotas, resource_quota(name, memory, scope_selector))
        wait_for(lambda: quota_gauge(self.plane, "pyhami_resource_quota_limit",
                                     self.namespace, name) == memory,
                 f"the daemon to apply ResourceQuota {self.namespace}/{name}",
                 watch=self.plane.all_processes())

    def add(self, name: str, memory: int, priority_class: str | None = None) -> None:
        self.create_manifest(quota_pod(name, memory, priority_class))

    def put(self, name: str, memory: int, priority_class: str | None = None) -> None:
        """Create the pod and wait until it is bound."""
        self.add(name, memory, priority_class)
        self.wait_placed(name)

    def assert_refused(self, name: str, used: int, limit: int, quota: str,
                       asked: int) -> dict[str, Any]:
        """Until pyhami refuses the pod with the quota's sentence; it is still Pending."""
        event = self.wait_event(name, "FilteringFailed",
                                sentence(self.namespace, used, limit, quota, asked))
        self.assert_pending(name)
        return event

    def _delete_pods(self, selector: str) -> None:
        self.api.delete(self.pods, gracePeriodSeconds="0", fieldSelector=selector)
        wait_for(lambda: not self.api.get(self.pods, fieldSelector=selector)["items"],
                 f"the pods of namespace {self.namespace} to be gone ({selector or 'all'})")

    def bound_names(self) -> set[str]:
        return {pod["metadata"]["name"] for pod in self.api.get(self.pods)["items"]
                if pod["spec"].get("nodeName")}

    def refused(self, name: str) -> bool:
        """Whether pyhami's /filter has refused the pod at least once."""
        return any(e.get("reason") == "FilteringFailed" for e in self.events(name))

    def empty(self) -> None:
        """Delete its pods and quotas; wait until the daemon's ledger holds none of them.

        The waiting pods go first: deleting a bound one frees quota, and a waiting pod
        placed then and deleted a moment later could leave a reservation for a pod the
        daemon already saw go, held until it expires (``--reservation-ttl``)."""
        self._delete_pods("spec.nodeName=")  # the waiting ones
        self._delete_pods("")
        self.api.delete(self.quotas)
        if self.plane.processes["pyhami-scheduler"].running:
            wait_for(lambda: not [key for key in self.plane.ledgerz()["pods"]
                                  if key.startswith(f"{self.namespace}/")],
                     f"pyhami's ledger to release the pods of {self.namespace}",
                     watch=self.plane.all_processes())


def metric_samples(plane: ControlPlane) -> list[Any]:
    status, body = http_get(f"http://127.0.0.1:{plane.metrics_port}/metrics")
    assert status == 200, body[:200]
    return [sample for family in text_string_to_metric_families(body.decode())
            for sample in family.samples]


def quota_gauge(plane: ControlPlane, metric: str, namespace: str, quota: str) -> float | None:
    """``pyhami_resource_quota_used`` or ``_limit`` of one quota's GPU memory."""
    for sample in metric_samples(plane):
        labels = sample.labels
        if (sample.name == metric and labels.get("namespace") == namespace
                and labels.get("resource_quota") == quota
                and labels.get("resource") == "nvidia.com/gpumem"):
            return float(sample.value)
    return None


def hami_used(plane: ControlPlane, namespace: str) -> tuple[str, float] | None:
    """HAMi's ``hami_resource_quota_used`` of the namespace's GPU memory: its ``limit``
    label and its value."""
    for sample in metric_samples(plane):
        labels = sample.labels
        if (sample.name == "hami_resource_quota_used" and labels.get("namespace") == namespace
                and labels.get("quota_name") == "nvidia.com/gpumem"):
            return labels["limit"], float(sample.value)
    return None


@pytest.fixture
def quota_lab(control_plane: ControlPlane) -> Iterator[Callable[..., QuotaLab]]:
    """Makes the test's namespaces (``QuotaLab``); empties them afterwards."""
    made: list[QuotaLab] = []

    def make(namespace: str, labels: dict[str, str] | None = None) -> QuotaLab:
        lab = QuotaLab(control_plane, namespace, labels)
        made.append(lab)
        return lab

    yield make
    for lab in made:
        lab.empty()


def wait_bound_within(lab: QuotaLab, name: str, started: float) -> float:
    """Until the pod is bound; the seconds since ``started`` (``time.monotonic()``)."""
    wait_for(lambda: lab.bound(name), f"pod {name} to be bound", interval=0.05,
             watch=lab.plane.all_processes())
    return round(time.monotonic() - started, 3)


# The tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("quotas", [
    {"gpu-quota": 4000},
    {"large": 8000, "small": 4000},
], ids=["one-quota", "two-quotas-the-smaller-refuses"])
def test_a_pod_over_the_quota_waits_and_binds_once_the_first_is_deleted(
        quota_lab: Callable[..., QuotaLab], control_plane: ControlPlane,
        quotas: dict[str, int]) -> None:
    lab = quota_lab(f"pyhami-e2e-quota-{len(quotas)}")
    for name, memory in quotas.items():
        lab.limit(name, memory)
    tightest = min(quotas, key=quotas.__getitem__)
    lab.put("first", 3000)
    lab.add("second", 3000)
    event = lab.assert_refused("second", 3000, 4000, tightest, 3000)
    assert event["type"] == "Warning", event
    # Every quota charges the pod bound; HAMi's gauge shows the tightest limit.
    for name in quotas:
        assert quota_gauge(control_plane, "pyhami_resource_quota_used", lab.namespace,
                           name) == 3000, name
    assert hami_used(control_plane, lab.namespace) == ("4000", 3000.0)

    started = time.monotonic()
    lab.api.delete(f"{lab.pods}/first", gracePeriodSeconds="0")
    seconds = wait_bound_within(lab, "second", started)
    record(control_plane, test="delete_to_bind", quotas=len(quotas), seconds=seconds)
    assert seconds <= RELEASE_BOUND_S, (
        f"the second pod was bound {seconds} s after the first was deleted")


def test_twenty_pods_at_once_under_a_quota_for_five_bind_exactly_five(
        quota_lab: Callable[..., QuotaLab], control_plane: ControlPlane) -> None:
    lab = quota_lab("pyhami-e2e-quota-burst")
    lab.limit("five", 5000)
    names = [f"burst-{i:02d}" for i in range(20)]
    for name in names:
        lab.add(name, 1000)

    # Settled: every pod bound or refused once, then no bind for SETTLED_S.
    wait_for(lambda: all(name in lab.bound_names() or lab.refused(name) for name in names),
             "every pod of the burst to be tried", watch=control_plane.all_processes())
    last = (lab.bound_names(), time.monotonic())
    while time.monotonic() - last[1] < SETTLED_S:
        time.sleep(0.25)
        bound = lab.bound_names()
        if bound != last[0]:
            last = (bound, time.monotonic())
    bound = last[0]
    assert len(bound) == 5, f"{len(bound)} pods bound under a 5000 MiB quota: {sorted(bound)}"
    for name in set(names) - bound:
        lab.assert_pending(name)
    assert quota_gauge(control_plane, "pyhami_resource_quota_used", lab.namespace,
                       "five") == 5000
    assert hami_used(control_plane, lab.namespace) == ("5000", 5000.0)


def test_a_restarted_daemon_charges_the_namespace_what_its_bound_pods_hold(
        quota_lab: Callable[..., QuotaLab], control_plane: ControlPlane) -> None:
    lab = quota_lab("pyhami-e2e-quota-restart")
    lab.limit("gpu-quota", 4000)
    lab.put("before", 3000)

    assert control_plane.stop_daemon() == 0
    control_plane.start_daemon()
    # Rebuilt from the pod's allocation annotation, before the daemon answered.
    assert quota_gauge(control_plane, "pyhami_resource_quota_used", lab.namespace,
                       "gpu-quota") == 3000
    lab.add("after", 3000)
    lab.assert_refused("after", 3000, 4000, "gpu-quota", 3000)


@pytest.fixture
def high_priority(control_plane: ControlPlane) -> Iterator[str]:
    control_plane.api.create(CLASSES, {
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": HIGH}, "value": 1000,
        "description": "made by pyhami's end-to-end quota test"})
    yield HIGH
    control_plane.api.delete(f"{CLASSES}/{HIGH}")


def test_a_quota_scoped_to_a_priority_class_caps_only_its_pods(
        quota_lab: Callable[..., QuotaLab], control_plane: ControlPlane,
        high_priority: str) -> None:
    lab = quota_lab("pyhami-e2e-quota-scoped")
    lab.limit("high-only", 2000, {"matchExpressions": [
        {"scopeName": "PriorityClass", "operator": "In", "values": [high_priority]}]})
    lab.add("plain-1", 3000)
    lab.add("plain-2", 3000)
    lab.add("high-1", 2000, high_priority)
    for name in ("plain-1", "plain-2", "high-1"):
        lab.wait_placed(name)
    lab.add("high-2", 1000, high_priority)
    lab.assert_refused("high-2", 2000, 2000, "high-only", 1000)
    # The plain pods are not charged, so evicting them would make no room: they stay.
    assert lab.bound_names() == {"plain-1", "plain-2", "high-1"}
    assert quota_gauge(control_plane, "pyhami_resource_quota_used", lab.namespace,
                       "high-only") == 2000
    lab.put("plain-3", 3000)


WEBHOOK_CONFIGURATION = "pyhami-e2e-quota-webhook"


@pytest.fixture
def webhook_namespace(control_plane: ControlPlane,
                      quota_lab: Callable[..., QuotaLab]) -> Iterator[QuotaLab]:
    """A namespace whose pod creations the API server sends to the daemon's webhook, as
    the chart registers it, limited to that namespace so no other test sees it."""
    assert control_plane.webhook_tls is not None
    lab = quota_lab("pyhami-e2e-quota-webhook")
    ca = base64.b64encode(control_plane.webhook_tls.ca.read_bytes()).decode()
    api = control_plane.api
    api.create(CONFIGURATIONS, configuration(WEBHOOK_CONFIGURATION, webhook(
        "vgpu.pyhami.io", {"url": control_plane.webhook_url, "caBundle": ca},
        namespaceSelector={"matchLabels": {"kubernetes.io/metadata.name": lab.namespace}})))

    def mutated() -> bool:
        probe = api.request("POST", lab.pods, gpu_pod("probe", lab.namespace),
                            query={"dryRun": "All"})
        return bool(probe["spec"]["schedulerName"] == "pyhami-scheduler")

    try:
        wait_for(mutated, "the API server to call the webhook",
                 watch=control_plane.all_processes())
        yield lab
    finally:
        api.delete(f"{CONFIGURATIONS}/{WEBHOOK_CONFIGURATION}")


def test_the_webhook_denies_a_pod_whose_request_alone_exceeds_what_is_left(
        webhook_namespace: QuotaLab) -> None:
    lab = webhook_namespace
    lab.limit("gpu-quota", 4000)
    lab.put("first", 3000)
    with pytest.raises(ApiError) as denied:
        lab.add("second", 3000)
    assert denied.value.status == 403, denied.value
    # The API server's Status, as kubectl prints its message.
    status = json.loads(str(denied.value).split(": HTTP 403: ", 1)[1])
    assert (status["reason"], status["message"]) == (
        "Forbidden", 'admission webhook "vgpu.pyhami.io" denied the request: '
        + sentence(lab.namespace, 3000, 4000, "gpu-quota", 3000)), status
    assert "second" not in {pod["metadata"]["name"]
                            for pod in lab.api.get(lab.pods)["items"]}
    # What is left is still admitted.
    lab.put("third", 1000)
