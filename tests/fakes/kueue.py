"""Kueue's side of the admission check, for service tests without an API server: Workloads
built as Kueue writes them, and a ``KueueApi`` that records what the check writes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec

from common.core.workloads import AdmissionCheck, Workload
from scheduler.cluster import AdmissionCheckChange, CheckUpdate, ClusterError, WorkloadChange

CHECK = "gpu-placement"


def gpu_pod_template(*, cards: int = 1, memory: int = 4000, cores: int | None = None,
                     annotations: dict[str, str] | None = None) -> dict[str, Any]:
    limits: dict[str, Any] = {"nvidia.com/gpu": cards, "nvidia.com/gpumem": memory}
    if cores is not None:
        limits["nvidia.com/gpucores"] = cores
    return {"metadata": {"annotations": annotations or {}},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}}


def workload(name: str, *pod_sets: tuple[str, int, dict[str, Any]], namespace: str = "lab",
             quota: bool = True, check_state: str | None = "Pending", message: str = "",
             check: str = CHECK, priority: int = 0, created: str = "2026-12-06T10:00:00Z",
             version: str = "1", finished: bool = False,
             since: str = "2026-12-06T10:00:00Z",
             admitted: dict[str, int] | None = None) -> Workload:
    """A Workload as Kueue writes it: ``pod_sets`` (name, count, template), its quota
    reserved (``quota``) and the check ``check`` in ``check_state`` (None: no check);
    ``admitted``: the count Kueue admitted of a pod set, where it admitted fewer."""
    conditions = []
    if quota:
        conditions.append({"type": "QuotaReserved", "status": "True"})
    if finished:
        conditions.append({"type": "Finished", "status": "True"})
    checks = ([] if check_state is None else
              [{"name": check, "state": check_state, "message": message,
                "lastTransitionTime": since}])
    return _decode({
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                     "resourceVersion": version, "creationTimestamp": created},
        "spec": {"podSets": [{"name": n, "count": c, "template": t} for n, c, t in pod_sets],
                 "priority": priority, "queueName": "lq"},
        "status": {"conditions": conditions, "admissionChecks": checks,
                   **({} if admitted is None else {"admission": {
                       "clusterQueue": "cq", "podSetAssignments": [
                           {"name": n, "count": c} for n, c in admitted.items()]}})},
    })


def _decode(document: dict[str, Any]) -> Workload:
    # Through JSON, as the watch reads it: the templates stay raw until the check reads them.
    return msgspec.json.decode(msgspec.json.encode(document), type=Workload)


def admission_check(name: str = CHECK, controller: str = "pyhami.io/placement"
                    ) -> AdmissionCheck:
    return msgspec.convert({"metadata": {"name": name, "uid": f"uid-{name}"},
                            "spec": {"controllerName": controller}}, AdmissionCheck)


class RecordingKueue:
    """The ``KueueApi`` port: what the check wrote, in order; ``refuse`` makes the next
    writes fail as an API server that does not answer."""

    def __init__(self) -> None:
        self.written: list[tuple[str, str, CheckUpdate]] = []
        self.activated: list[str] = []
        self.refuse = False

    def states(self, workload: str) -> list[str]:
        return [update.state.value for key, _, update in self.written if key == workload]

    def last(self, workload: str) -> CheckUpdate:
        return [update for key, _, update in self.written if key == workload][-1]

    async def workload_changes(self) -> AsyncIterator[WorkloadChange]:
        raise AssertionError("not used: the test delivers the changes")
        yield  # pragma: no cover

    async def admission_check_changes(self) -> AsyncIterator[AdmissionCheckChange]:
        raise AssertionError("not used: the test delivers the changes")
        yield  # pragma: no cover

    async def set_check(self, workload: Workload, check: str, update: CheckUpdate) -> None:
        if self.refuse:
            raise ClusterError(f"Workload {workload.key}: the API server did not answer")
        self.written.append((workload.key, check, update))

    async def activate_check(self, name: str, message: str) -> None:
        if self.refuse:
            raise ClusterError(f"AdmissionCheck {name}: the API server did not answer")
        self.activated.append(name)
