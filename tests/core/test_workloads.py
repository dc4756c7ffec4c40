"""Kueue's Workloads in the decision core: what the admission check owes one, its pods read
as pod requests under placeholder keys, and a pod's claim to a workload."""

from __future__ import annotations

from typing import Any

import pytest

from common.core import PodRejected
from common.core.workloads import (
    POD_SET_ANNOTATION,
    WORKLOAD_ANNOTATION,
    WORKLOAD_POD_MAX,
    Duty,
    Workload,
    WorkloadRefused,
    check_duty,
    check_message,
    claimed_workload,
    placeholder_key,
    pod_set_updates,
    workload_members,
)
from pyhami.sandbox import DEFAULTS
from tests.fakes.kueue import CHECK, gpu_pod_template, workload

CPU_ONLY: dict[str, Any] = {"spec": {"containers": [{"name": "main", "resources": {
    "requests": {"cpu": "1"}}}]}}
CHECKS = frozenset({CHECK})


@pytest.mark.parametrize(("built", "duty"), [
    (workload("w", ("main", 1, CPU_ONLY)), Duty.PLACE),
    (workload("w", ("main", 1, CPU_ONLY), check_state="Ready"), Duty.HOLD),
    (workload("w", ("main", 1, CPU_ONLY), check_state="Retry"), Duty.NONE),
    (workload("w", ("main", 1, CPU_ONLY), check_state="Rejected"), Duty.NONE),
    # No quota (not yet, or evicted): nothing to place or hold.
    (workload("w", ("main", 1, CPU_ONLY), quota=False), Duty.NONE),
    (workload("w", ("main", 1, CPU_ONLY), check_state="Ready", finished=True), Duty.NONE),
    # Another controller's check.
    (workload("w", ("main", 1, CPU_ONLY), check="provisioning"), Duty.NONE),
    (workload("w", ("main", 1, CPU_ONLY), check_state=None), Duty.NONE),
], ids=["pending", "ready", "retry", "rejected", "no-quota", "finished", "other-check",
        "no-check"])
def test_what_the_check_owes_a_workload(built: Workload, duty: Duty) -> None:
    assert check_duty(built, CHECKS)[0] is duty


def test_each_gpu_pod_is_a_member_under_a_key_no_pod_can_have() -> None:
    built = workload("train", ("driver", 1, CPU_ONLY), ("workers", 3, gpu_pod_template(
        memory=6000, annotations={"hami.io/gpu-scheduler-policy": "spread"})))
    members = workload_members(built, DEFAULTS)
    assert [(m.pod_set, m.index, m.request.key) for m in members] == [
        ("workers", i, f"lab/train[workers#{i}]") for i in range(3)]
    assert members[0].request.key == placeholder_key("lab", "train", "workers", 0)
    assert members[0].request.containers[0].memory_mib == 6000
    assert str(members[0].request.chain) == "spread"
    assert members[0].request.subject.namespace == "lab"


def test_the_counts_kueue_admitted_are_placed_not_the_counts_asked() -> None:
    partial = workload("w", ("main", 8, gpu_pod_template()), admitted={"main": 5})
    assert len(workload_members(partial, DEFAULTS)) == 5


@pytest.mark.parametrize(("built", "says"), [
    (workload("w", ("main", WORKLOAD_POD_MAX + 1, gpu_pod_template())),
     f"spec.podSets: {WORKLOAD_POD_MAX + 1} pods; pyhami places at most {WORKLOAD_POD_MAX}"),
    (workload("w", ("main", 600, gpu_pod_template()), ("more", 600, gpu_pod_template())),
     "spec.podSets: 1200 pods"),
    (workload("w", ("main", 1, {"spec": {"containers": "many"}})),
     "spec.podSets[0].template does not read as a pod"),
    (workload("w", ("main", 1, gpu_pod_template(memory=-5))),
     "spec.podSets[0].template: "),
    (workload("w", ("Not A Name", 1, gpu_pod_template())), "spec.podSets[0].name"),
    (workload("w", ("main", -1, gpu_pod_template())), "spec.podSets[0].count: -1"),
], ids=["over-max", "over-max-summed", "template-not-a-pod", "request-refused",
        "pod-set-name", "negative-count"])
def test_a_workload_pyhami_cannot_place_is_refused_naming_the_field(built: Workload,
                                                                    says: str) -> None:
    with pytest.raises(WorkloadRefused, match=None) as refused:
        workload_members(built, DEFAULTS)
    assert says in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_workload_that_asks_for_no_gpu_has_no_member() -> None:
    assert workload_members(workload("w", ("main", 1000, CPU_ONLY)), DEFAULTS) == []


def test_the_pods_are_asked_to_carry_their_workload_and_pod_set() -> None:
    built = workload("train", ("driver", 1, CPU_ONLY), ("workers", 3, gpu_pod_template()))
    updates = pod_set_updates(built, ["driver", "workers"])
    assert [(u.name, u.annotations) for u in updates] == [
        ("driver", {WORKLOAD_ANNOTATION: "train", POD_SET_ANNOTATION: "driver"}),
        ("workers", {WORKLOAD_ANNOTATION: "train", POD_SET_ANNOTATION: "workers"})]


@pytest.mark.parametrize(("annotations", "claim", "refusal"), [
    ({}, None, None),
    ({WORKLOAD_ANNOTATION: "train", POD_SET_ANNOTATION: "workers"}, ("train", "workers"), None),
    ({WORKLOAD_ANNOTATION: "train"}, None, f"[{POD_SET_ANNOTATION}] is missing"),
    ({POD_SET_ANNOTATION: "workers"}, None, f"[{WORKLOAD_ANNOTATION}] is missing"),
    ({WORKLOAD_ANNOTATION: "Train!", POD_SET_ANNOTATION: "workers"}, None, "Train!"),
    ({WORKLOAD_ANNOTATION: "train", POD_SET_ANNOTATION: "x" * 64}, None, "longer than 63"),
], ids=["none", "both", "no-pod-set", "no-workload", "bad-workload", "long-pod-set"])
def test_a_pod_claims_a_workload_with_both_annotations(
        annotations: dict[str, str], claim: tuple[str, str] | None,
        refusal: str | None) -> None:
    if refusal is None:
        assert claimed_workload(annotations) == claim
        return
    with pytest.raises(PodRejected) as refused:
        claimed_workload(annotations)
    assert refusal in str(refused.value)


def test_kueue_keeps_the_admitted_order_priority_then_age() -> None:
    workloads = [workload("late", created="2026-12-06T10:05:00Z"),
                 workload("urgent", priority=100, created="2026-12-06T11:00:00Z"),
                 workload("early", created="2026-12-06T10:00:00Z")]
    assert [w.metadata.name for w in sorted(workloads, key=lambda w: w.order)] == [
        "urgent", "early", "late"]


def test_a_message_is_cut_to_kueues_bound() -> None:
    assert check_message("short") == "short"
    long = check_message("x" * 40_000)
    assert len(long) == 32768
    assert long.endswith("...")
