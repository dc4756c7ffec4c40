"""On a real API server the daemon writes on and binds only what is pyhami's
(docs/reliability.md, docs/security.md).

A /bind sent straight to the daemon, as a confused or replayed caller would, for a pod
that is already bound or that belongs to another scheduler changes nothing on the pod
and books nothing; a pod asking for no GPU is bound without any allocation. A pod of
another scheduler sent to /filter is not stamped to retry when cards are freed, while a
pyhami pod waiting beside it is.
"""

from __future__ import annotations

from typing import Any

from harness.controlplane import wait_for
from tests.e2e.controlplane import NODE, TEST_NAMESPACE
from tests.e2e.pods import ALLOCATED, ClusterLab, lab_pod

CAPACITY_FREED = "pyhami.io/capacity-freed"
CARDS = 4  # the simulated agent's sim:t4x4


def bind(lab: ClusterLab, pod: dict[str, Any], node: str) -> str:
    """POST /bind to the daemon as kube-scheduler would; the answer's Error ("" if none)."""
    status, answer = lab.plane.post_extender("/bind", {
        "PodName": pod["metadata"]["name"], "PodNamespace": TEST_NAMESPACE,
        "PodUID": pod["metadata"]["uid"], "Node": node})
    assert status == 200, answer
    return str(answer.get("Error") or "")


def ledger(lab: ClusterLab) -> tuple[int, int]:
    status = lab.plane.statusz()
    return status["pods_bound"], status["reservations"]


def test_a_second_bind_of_a_bound_pod_changes_nothing(lab: ClusterLab) -> None:
    lab.place("first")
    pod = lab.read("first")

    assert bind(lab, pod, NODE) == ""  # the same node: already done
    refused = bind(lab, pod, "gpu-node-2")
    assert refused == f"pod {TEST_NAMESPACE}/first is already bound to {NODE}", refused

    after = lab.read("first")
    assert after["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
    assert after["metadata"]["annotations"] == pod["metadata"]["annotations"]
    assert ledger(lab) == (1, 0)


def test_a_pod_for_another_scheduler_is_refused_and_left_alone(lab: ClusterLab) -> None:
    manifest = lab_pod("elsewhere")
    manifest["spec"]["schedulerName"] = "default-scheduler"  # which nothing runs here
    lab.create_manifest(manifest)
    pod = lab.read("elsewhere")

    refused = bind(lab, pod, NODE)
    assert "the pod is for scheduler 'default-scheduler', not 'pyhami-scheduler'" in refused

    after = lab.read("elsewhere")
    assert after["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
    assert not after["spec"].get("nodeName")
    assert ALLOCATED not in (after["metadata"].get("annotations") or {})
    assert ledger(lab) == (0, 0)
    lab.wait_event("elsewhere", "BindingFailed", "default-scheduler")


def test_a_pod_asking_for_no_gpu_is_bound_without_an_allocation(lab: ClusterLab) -> None:
    manifest = lab_pod("plain")
    manifest["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "100m"}}
    lab.create_manifest(manifest)
    pod = wait_for(lambda: lab.bound("plain"), "pod plain to be bound",
                   watch=lab.plane.all_processes())
    assert pod["spec"]["nodeName"] == NODE
    assert not any(key.startswith("hami.io/") for key in pod["metadata"].get("annotations") or {})
    assert not [e for e in lab.events("plain") if e.get("reason") == "BindingFailed"]
    assert ledger(lab) == (0, 0)


def too_big(name: str, scheduler: str | None = None) -> dict[str, Any]:
    pod = lab_pod(name)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(CARDS + 1)
    if scheduler is not None:
        pod["spec"]["schedulerName"] = scheduler
    return pod


def test_a_pod_of_another_scheduler_is_never_stamped_to_retry(lab: ClusterLab) -> None:
    lab.create_manifest(too_big("elsewhere", scheduler="default-scheduler"))
    pod = lab.read("elsewhere")
    # Sent to /filter by a caller that is not kube-scheduler's pyhami profile: refused, so
    # the daemon counts it among the pods waiting for cards.
    status, answer = lab.plane.post_extender("/filter", {"Pod": pod, "NodeNames": [NODE]})
    assert status == 200 and NODE in answer["FailedNodes"], answer
    lab.create_manifest(too_big("waiting"))  # pyhami's, refused by kube-scheduler's calls
    lab.wait_event("waiting", "FilteringFailed")

    lab.place("brief")
    lab.delete("brief")  # its card is freed: the waiting pods are stamped to retry

    wait_for(lambda: CAPACITY_FREED in (lab.read("waiting")["metadata"].get("annotations")
                                        or {}),
             f"pod waiting to be stamped {CAPACITY_FREED}", watch=lab.plane.all_processes())
    log = lab.plane.process("pyhami-scheduler").log
    wait_for(lambda: (f"pod {TEST_NAMESPACE}/elsewhere not nudged to retry: the pod is for "
                      "scheduler 'default-scheduler'") in log.read_text(errors="replace"),
             "the daemon to leave pod elsewhere alone")
    after = lab.read("elsewhere")
    assert after["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
    assert CAPACITY_FREED not in (after["metadata"].get("annotations") or {})
