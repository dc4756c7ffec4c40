"""Kueue v0.17 on the real control plane (issue 47): a batch Job queued in a LocalQueue is
admitted by Kueue, unsuspended, its pod made by kube-controller-manager's job controller and
bound by kube-scheduler through pyhami's extender; Kueue's "Using HAMi" resource
transformation counts ``nvidia.com/gpumem`` times ``nvidia.com/gpu`` against a
ClusterQueue's ``nvidia.com/total-gpumem``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.controlplane import wait_for
from harness.kueue import API, Kueue, condition, has_condition
from tests.e2e.controlplane import NODE, ControlPlane
from tests.e2e.kueue_jobs import (
    KUEUE_FLAVOR,
    create_job,
    delete_job,
    gpu_job,
    job_pods,
    read_job,
    wait_job_pod_placed,
)


@pytest.fixture
def queues(kueue: Kueue, kueue_namespace: str,
           request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """A ClusterQueue and its LocalQueue named after the test; (cluster queue, local
    queue). Its quotas: the test's ``@pytest.mark.parametrize("queues", [QUOTAS],
    indirect=True)``, or room for eight cards."""
    quotas: dict[str, str] = getattr(request, "param", None) or {
        "nvidia.com/gpu": "8", "nvidia.com/total-gpumem": "16000"}
    name = request.node.originalname.replace("_", "-")[:40].strip("-")
    kueue.create_cluster_queue(f"cq-{name}", quotas, flavor=KUEUE_FLAVOR)
    kueue.create_local_queue(kueue_namespace, f"lq-{name}", f"cq-{name}")
    yield f"cq-{name}", f"lq-{name}"
    kueue.delete("localqueues", f"lq-{name}", kueue_namespace)
    kueue.delete("clusterqueues", f"cq-{name}")


def _usage(workload: dict[str, Any]) -> dict[str, int]:
    """What the admitted Workload counts against its ClusterQueue, resource by resource."""
    (pod_set,) = workload["status"]["admission"]["podSetAssignments"]
    return {name: _quantity(value) for name, value in pod_set["resourceUsage"].items()}


def _quantity(value: str) -> int:
    """A whole quantity as Kubernetes writes one (1000 is "1k")."""
    factors = {"k": 10**3, "M": 10**6, "G": 10**9}
    if value[-1:] in factors:
        return int(value[:-1]) * factors[value[-1]]
    return int(value)


def test_a_queued_job_runs(control_plane: ControlPlane, kueue: Kueue, kueue_namespace: str,
                           queues: tuple[str, str]) -> None:
    cq, lq = queues
    job = create_job(control_plane, kueue_namespace, gpu_job("queued", lq))
    # Kueue's webhook suspends it; its Workload then waits for quota.
    assert job["spec"]["suspend"] is True, job["spec"]
    uid = job["metadata"]["uid"]

    workload = kueue.wait_workload(kueue_namespace, uid, "Admitted")
    assert has_condition(workload, "QuotaReserved")
    assert workload["status"]["admission"]["clusterQueue"] == cq
    # The transformation: 1 card x 1000 MiB, counted as total-gpumem, gpumem not at all.
    assert _usage(workload) == {"nvidia.com/gpu": 1, "nvidia.com/total-gpumem": 1000}

    wait_for(lambda: read_job(control_plane, kueue_namespace, "queued")["spec"]["suspend"]
             is False, "Kueue to unsuspend Job queued")
    pod = wait_job_pod_placed(control_plane, kueue_namespace, "queued")
    assert pod["spec"]["nodeName"] == NODE
    assert pod["spec"]["schedulerName"] == "pyhami-scheduler"

    # The pod succeeds (as its kubelet would report it): the job controller completes the
    # Job and Kueue finishes the Workload, releasing its quota.
    name = pod["metadata"]["name"]
    control_plane.api.merge_patch(
        f"/api/v1/namespaces/{kueue_namespace}/pods/{name}/status",
        {"status": {"phase": "Succeeded", "containerStatuses": [{
            "name": "app", "image": "ubuntu:22.04", "imageID": "", "ready": False,
            "restartCount": 0, "state": {"terminated": {
                "exitCode": 0, "reason": "Completed",
                "startedAt": "2026-01-01T00:00:00Z",
                "finishedAt": "2026-01-01T00:00:01Z"}}}]}})

    def complete() -> bool:
        conditions = read_job(control_plane, kueue_namespace, "queued")["status"].get(
            "conditions") or []
        return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)

    wait_for(complete, "the job controller to complete Job queued",
             watch=control_plane.all_processes())
    kueue.wait_workload(kueue_namespace, uid, "Finished")


@pytest.mark.parametrize("queues", [{"nvidia.com/gpu": "8",
                                     "nvidia.com/total-gpumem": "3000"}], indirect=True)
def test_total_gpumem_quota_admits_within_and_holds_beyond(
        control_plane: ControlPlane, kueue: Kueue, kueue_namespace: str,
        queues: tuple[str, str]) -> None:
    cq, lq = queues
    first = create_job(control_plane, kueue_namespace, gpu_job("two-cards", lq, gpus=2))
    workload = kueue.wait_workload(kueue_namespace, first["metadata"]["uid"], "Admitted")
    assert _usage(workload) == {"nvidia.com/gpu": 2, "nvidia.com/total-gpumem": 2000}
    wait_job_pod_placed(control_plane, kueue_namespace, "two-cards")

    # 2000 + 1 x 1500 > 3000: held, suspended, no pod.
    second = create_job(control_plane, kueue_namespace, gpu_job("beyond", lq, gpumem=1500))
    uid = second["metadata"]["uid"]

    def pending() -> dict[str, Any] | None:
        for found in kueue.workloads(kueue_namespace, job_uid=uid):
            reserved = condition(found, "QuotaReserved")
            if reserved is not None and reserved["status"] == "False":
                return found
        return None

    held = wait_for(pending, "Kueue to hold Job beyond for lack of quota",
                    watch=control_plane.all_processes())
    reason = condition(held, "QuotaReserved")
    assert reason is not None and "nvidia.com/total-gpumem" in reason["message"], reason
    assert not has_condition(held, "Admitted")
    assert read_job(control_plane, kueue_namespace, "beyond")["spec"]["suspend"] is True
    assert job_pods(control_plane, kueue_namespace, "beyond") == []
    wait_for(lambda: kueue.get("clusterqueues", cq)["status"].get("pendingWorkloads") == 1
             and kueue.get("clusterqueues", cq)["status"].get("admittedWorkloads") == 1,
             f"ClusterQueue {cq} to count one admitted and one pending Workload")

    # The first Job gone, its quota is free: the held one is admitted and placed.
    delete_job(control_plane, kueue_namespace, "two-cards")
    kueue.wait_workload(kueue_namespace, uid, "Admitted")
    wait_job_pod_placed(control_plane, kueue_namespace, "beyond")


def test_an_admission_check_holds_a_job_until_its_controller_says_ready(
        control_plane: ControlPlane, kueue: Kueue, kueue_namespace: str) -> None:
    """What a Kueue AdmissionCheck controller does (issue 47), played through the API: the
    check made Active, the Workload's check state set Ready."""
    check = "pyhami-e2e-check"
    kueue.create_admission_check(check, "pyhami.io/e2e")
    kueue.create_cluster_queue("cq-checked", {"nvidia.com/gpu": "8",
                                              "nvidia.com/total-gpumem": "16000"},
                               flavor=KUEUE_FLAVOR, admission_checks=[check])
    kueue.create_local_queue(kueue_namespace, "lq-checked", "cq-checked")
    try:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        control_plane.api.merge_patch(
            f"{API}/admissionchecks/{check}/status",
            {"status": {"conditions": [{"type": "Active", "status": "True", "reason": "Active",
                                        "message": "the e2e test plays the controller",
                                        "lastTransitionTime": now}]}})
        job = create_job(control_plane, kueue_namespace, gpu_job("checked", "lq-checked"))
        uid = job["metadata"]["uid"]
        kueue.wait_workload(kueue_namespace, uid, "QuotaReserved")
        workload = kueue.wait_check(kueue_namespace, uid, check, "Pending")
        assert has_condition(workload, "QuotaReserved")
        (state,) = workload["status"]["admissionChecks"]
        assert not has_condition(workload, "Admitted")
        assert read_job(control_plane, kueue_namespace, "checked")["spec"]["suspend"] is True

        name = workload["metadata"]["name"]
        control_plane.api.merge_patch(
            f"{API}/namespaces/{kueue_namespace}/workloads/{name}/status",
            {"status": {"admissionChecks": [{**state, "state": "Ready", "message": "ready",
                                             "lastTransitionTime": now}]}})
        kueue.wait_workload(kueue_namespace, uid, "Admitted")
        wait_job_pod_placed(control_plane, kueue_namespace, "checked")
    finally:
        kueue.delete("localqueues", "lq-checked", kueue_namespace)
        kueue.delete("clusterqueues", "cq-checked")
        kueue.delete("admissionchecks", check)
