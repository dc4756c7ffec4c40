"""Batch Jobs queued in Kueue on the real control plane: made, read and deleted as a
user would with kubectl (the ``kueue`` and ``kueue_namespace`` fixtures of conftest.py)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from harness.controlplane import SCHEDULER_NAME, WAIT_S, wait_for
from harness.kueue import QUEUE_LABEL
from tests.e2e.controlplane import ControlPlane
from tests.e2e.pods import ALLOCATED

KUEUE_NAMESPACE = "pyhami-e2e-kueue"
KUEUE_FLAVOR = "default-flavor"


def jobs_path(namespace: str) -> str:
    return f"/apis/batch/v1/namespaces/{quote(namespace)}/jobs"


def pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/pods"


def gpu_job(name: str, queue: str, *, gpus: int = 1, gpumem: int = 1000) -> dict[str, Any]:
    """A Job of one pod for pyhami-scheduler asking ``gpus`` cards with ``gpumem`` MiB
    each, submitted to the LocalQueue ``queue``; its container sleeps (the suite's GPU node
    has no kubelet: its pods are bound, never run)."""
    resources = {"nvidia.com/gpu": str(gpus), "nvidia.com/gpumem": str(gpumem)}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0,
                 "template": {"spec": {
                     "schedulerName": SCHEDULER_NAME, "restartPolicy": "Never",
                     "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "app", "image": "ubuntu:22.04",
                                     "command": ["sleep", "infinity"],
                                     "resources": {"limits": dict(resources),
                                                   "requests": dict(resources)}}]}}}}


def create_job(plane: ControlPlane, namespace: str, job: dict[str, Any]) -> dict[str, Any]:
    return plane.api.create(jobs_path(namespace), job)


def read_job(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    return plane.api.get(f"{jobs_path(namespace)}/{quote(name)}")


def job_pods(plane: ControlPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = plane.api.get(
        pods_path(namespace), labelSelector=f"batch.kubernetes.io/job-name={name}")["items"]
    return found


def wait_job_pod_placed(plane: ControlPlane, namespace: str, name: str,
                        timeout: float = WAIT_S) -> dict[str, Any]:
    """Until the Job's one pod is bound with pyhami's allocation annotation; the pod."""
    def placed() -> dict[str, Any] | None:
        for pod in job_pods(plane, namespace, name):
            annotations = pod["metadata"].get("annotations") or {}
            if pod["spec"].get("nodeName") and ALLOCATED in annotations:
                return pod
        return None

    return wait_for(placed, f"the pod of Job {name} bound by pyhami", timeout,
                    watch=plane.all_processes())


def delete_job(plane: ControlPlane, namespace: str, name: str) -> None:
    """The Job and its pods, gone (``delete_jobs``'s way)."""
    plane.api.delete(f"{jobs_path(namespace)}/{quote(name)}", propagationPolicy="Background")

    def gone() -> bool:
        pods = job_pods(plane, namespace, name)
        for pod in pods:
            plane.api.delete(f"{pods_path(namespace)}/{quote(pod['metadata']['name'])}",
                             gracePeriodSeconds="0")
        return not pods

    wait_for(gone, f"the pods of Job {name} to be gone", interval=0.5)


def delete_jobs(plane: ControlPlane, namespace: str) -> None:
    """Every Job of ``namespace`` and its pods, gone. No kubelet confirms the pods'
    deletion: they are deleted at once (the job controller lifts its finalizer)."""
    for job in plane.api.get(jobs_path(namespace))["items"]:
        plane.api.delete(f"{jobs_path(namespace)}/{quote(job['metadata']['name'])}",
                         propagationPolicy="Background")
    wait_for(lambda: not plane.api.get(jobs_path(namespace))["items"],
             f"the Jobs of namespace {namespace} to be gone")

    def pods_gone() -> bool:
        if plane.api.get(pods_path(namespace))["items"]:
            plane.api.delete(pods_path(namespace), gracePeriodSeconds="0")
            return False
        return True

    wait_for(pods_gone, f"the pods of namespace {namespace} to be gone", interval=0.5)
