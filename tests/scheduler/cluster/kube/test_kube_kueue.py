"""The admission check's writes as the API server receives them: the server-side apply of
the check's own entry in a Workload's status, and of an AdmissionCheck's Active
condition."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from common.core.workloads import POD_SET_ANNOTATION, WORKLOAD_ANNOTATION, CheckState, PodSetUpdate
from scheduler.cluster import CheckUpdate
from scheduler.cluster.kube._requests import check_active_body, check_state_body
from tests.fakes.kueue import CHECK, gpu_pod_template, workload

NOW = datetime(2026, 12, 6, 12, 30, 0, tzinfo=UTC)
BEFORE = "2026-12-06T10:00:00Z"


@pytest.mark.parametrize(("state", "current", "since"), [
    (CheckState.PENDING, "Pending", BEFORE),  # a new message: the state did not move
    (CheckState.READY, "Pending", "2026-12-06T12:30:00Z"),
    (CheckState.RETRY, "Pending", "2026-12-06T12:30:00Z"),
], ids=["same-state", "ready", "retry"])
def test_the_transition_time_moves_only_with_the_state(state: CheckState, current: str,
                                                       since: str) -> None:
    built = workload("train", ("workers", 2, gpu_pod_template()), check_state=current,
                     since=BEFORE)
    body = check_state_body(built, CHECK, CheckUpdate(state, "why"), NOW)
    (entry,) = body["status"]["admissionChecks"]  # type: ignore[index]
    assert entry == {"name": CHECK, "state": state.value, "message": "why",
                     "lastTransitionTime": since}
    assert body["metadata"] == {"name": "train", "namespace": "lab"}
    assert body["apiVersion"] == "kueue.x-k8s.io/v1beta2"


def test_ready_carries_the_pod_set_updates_and_retry_no_wait() -> None:
    built = workload("train", ("workers", 2, gpu_pod_template()))
    ready = check_state_body(built, CHECK, CheckUpdate(CheckState.READY, "held", (
        PodSetUpdate("workers", annotations={WORKLOAD_ANNOTATION: "train",
                                             POD_SET_ANNOTATION: "workers"}),)), NOW)
    (entry,) = ready["status"]["admissionChecks"]  # type: ignore[index]
    assert entry["podSetUpdates"] == [{"name": "workers", "annotations": {
        WORKLOAD_ANNOTATION: "train", POD_SET_ANNOTATION: "workers"}}]
    retry = check_state_body(built, CHECK, CheckUpdate(CheckState.RETRY, "no room"), NOW)
    (entry,) = retry["status"]["admissionChecks"]  # type: ignore[index]
    # No requeueAfterSeconds: Kueue v0.17 would hold the quota that long before evicting.
    assert "requeueAfterSeconds" not in entry
    assert "podSetUpdates" not in entry


def test_a_long_message_is_cut_to_kueues_bound() -> None:
    built = workload("train", ("workers", 2, gpu_pod_template()))
    body = check_state_body(built, CHECK, CheckUpdate(CheckState.PENDING, "x" * 50_000), NOW)
    (entry,) = body["status"]["admissionChecks"]  # type: ignore[index]
    assert len(entry["message"]) == 32768


def test_the_active_condition() -> None:
    body = check_active_body("gpu-placement", "pyhami answers", NOW)
    assert body["status"] == {"conditions": [{
        "type": "Active", "status": "True", "reason": "Active", "message": "pyhami answers",
        "lastTransitionTime": "2026-12-06T12:30:00Z"}]}
