"""/bind on a real API server takes only what is pyhami's to bind (docs/reliability.md).

A /bind sent straight to the daemon, as a confused or replayed caller would, for a pod
that is already bound or that belongs to another scheduler changes nothing on the pod
and books nothing; a pod asking for no GPU is bound without any allocation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.controlplane import NODE, ControlPlane, http_post_json, wait_for
from tests.e2e.pods import ALLOCATED, TEST_NAMESPACE, Lab, lab_pod


@pytest.fixture
def lab(control_plane: ControlPlane, clean_namespace: None) -> Iterator[Lab]:
    yield Lab(control_plane)


def bind(lab: Lab, pod: dict[str, Any], node: str) -> str:
    """POST /bind to the daemon as kube-scheduler would; the answer's Error ("" if none)."""
    status, answer = http_post_json(f"{lab.plane.daemon_url}/bind", {
        "PodName": pod["metadata"]["name"], "PodNamespace": TEST_NAMESPACE,
        "PodUID": pod["metadata"]["uid"], "Node": node})
    assert status == 200, answer
    return str(answer.get("Error") or "")


def ledger(lab: Lab) -> tuple[int, int]:
    status = lab.plane.statusz()
    return status["pods_bound"], status["reservations"]


def test_a_second_bind_of_a_bound_pod_changes_nothing(lab: Lab) -> None:
    lab.place("first")
    pod = lab.read("first")

    assert bind(lab, pod, NODE) == ""  # the same node: already done
    refused = bind(lab, pod, "gpu-node-2")
    assert refused == f"pod {TEST_NAMESPACE}/first is already bound to {NODE}", refused

    after = lab.read("first")
    assert after["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
    assert after["metadata"]["annotations"] == pod["metadata"]["annotations"]
    assert ledger(lab) == (1, 0)


def test_a_pod_for_another_scheduler_is_refused_and_left_alone(lab: Lab) -> None:
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


def test_a_pod_asking_for_no_gpu_is_bound_without_an_allocation(lab: Lab) -> None:
    manifest = lab_pod("plain")
    manifest["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "100m"}}
    lab.create_manifest(manifest)
    pod = wait_for(lambda: lab.bound("plain"), "pod plain to be bound",
                   watch=lab.plane.all_processes())
    assert pod["spec"]["nodeName"] == NODE
    assert not any(key.startswith("hami.io/") for key in pod["metadata"].get("annotations") or {})
    assert not [e for e in lab.events("plain") if e.get("reason") == "BindingFailed"]
    assert ledger(lab) == (0, 0)
