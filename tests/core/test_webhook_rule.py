"""The webhook's rule (``common.core.admission``): which new pods pyhami's scheduler takes.

As HAMi's webhook: a pod asking for a GPU resource pyhami manages, naming no scheduler of
its own (none, or ``default-scheduler``, which the API server fills in), is given
``pyhami-scheduler``; every other pod is left as it is, and none is ever refused.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from common.core.admission import AdmittedPod, admit, names_no_other_scheduler

OURS = "pyhami-scheduler"


def pod(*, limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None,
        init_limits: dict[str, Any] | None = None, scheduler: str | None = "default-scheduler",
        node: str | None = None, privileged: str | None = None) -> AdmittedPod:
    """A pod as the API server hands it to the webhook (JSON, camelCase)."""
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    containers: list[dict[str, Any]] = [{"name": "app", "image": "cuda", "resources": resources},
                                        {"name": "sidecar", "image": "envoy"}]
    spec: dict[str, Any] = {"containers": containers}
    if init_limits is not None:
        spec["initContainers"] = [{"name": "warm-up", "resources": {"limits": init_limits}}]
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if node is not None:
        spec["nodeName"] = node
    if privileged is not None:
        every = [*containers, *spec.get("initContainers", [])]
        for container in every:
            if container["name"] == privileged:
                container["securityContext"] = {"privileged": True}
    document = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "ml"}, "spec": spec}
    return msgspec.json.decode(msgspec.json.encode(document), type=AdmittedPod)


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "nvidia.com/gpumem",
                                      "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"])
def test_each_gpu_resource_alone_gives_the_pod_to_pyhami(resource: str) -> None:
    admission = admit(pod(limits={resource: "1"}), OURS)
    assert admission.redirect, admission
    assert admission.warning is None


def test_gpumem_alone_is_a_gpu_request() -> None:
    # HAMi reads a memory slice without a card count as one card: so does pyhami.
    assert admit(pod(limits={"nvidia.com/gpumem": "3000"}), OURS).redirect


def test_a_gpu_named_in_requests_only_counts() -> None:
    assert admit(pod(requests={"nvidia.com/gpu": "1"}), OURS).redirect


def test_a_gpu_asked_by_an_init_container_counts() -> None:
    assert admit(pod(init_limits={"nvidia.com/gpu": 1}), OURS).redirect


@pytest.mark.parametrize("scheduler", ["default-scheduler", "", None])
def test_the_default_scheduler_or_none_is_replaced(scheduler: str | None) -> None:
    admission = admit(pod(limits={"nvidia.com/gpu": "1"}, scheduler=scheduler), OURS)
    assert admission.redirect
    assert admission.reason == f"asks for a GPU: schedulerName set to {OURS}"


def test_a_pod_naming_another_scheduler_is_left_alone() -> None:
    admission = admit(pod(limits={"nvidia.com/gpu": "1"}, scheduler="volcano"), OURS)
    assert not admission.redirect
    assert admission.reason == "names scheduler volcano"


def test_a_pod_already_naming_pyhami_needs_no_change() -> None:
    admission = admit(pod(limits={"nvidia.com/gpu": "1"}, scheduler=OURS), OURS)
    assert not admission.redirect
    assert admission.reason == f"already names {OURS}"


def test_the_name_written_is_the_configured_one() -> None:
    gpu = pod(limits={"nvidia.com/gpu": "1"}, scheduler="pyhami-scheduler")
    # Another deployment's name is another scheduler, not this one's.
    assert not admit(gpu, "gpu-team").redirect
    assert admit(pod(limits={"nvidia.com/gpu": "1"}), "gpu-team").reason.endswith("gpu-team")


@pytest.mark.parametrize("limits", [
    {}, {"cpu": "2", "memory": "1Gi"}, {"nvidia.com/mig-1g.5gb": "1"},
    {"nvidia.com/priority": "1"}, {"amd.com/gpu": "1"},
])
def test_a_pod_asking_for_no_gpu_pyhami_manages_is_left_alone(limits: dict[str, str]) -> None:
    admission = admit(pod(limits=limits), OURS)
    assert not admission.redirect
    assert admission.reason == "asks for no GPU resource pyhami manages"


def test_a_zero_quantity_still_names_the_resource() -> None:
    # As HAMi: the resource is named, so the pod is pyhami's; the extender then passes a
    # pod that wants no card through.
    assert admit(pod(limits={"nvidia.com/gpu": "0"}), OURS).redirect


def test_a_pod_already_on_a_node_is_left_alone() -> None:
    admission = admit(pod(limits={"nvidia.com/gpu": "1"}, node="gpu-node-1"), OURS)
    assert not admission.redirect
    assert admission.reason == "already assigned to node gpu-node-1"


@pytest.mark.parametrize("container", ["app", "sidecar", "warm-up"])
def test_a_privileged_container_leaves_the_pod_to_its_scheduler_with_a_warning(
        container: str) -> None:
    admission = admit(pod(limits={"nvidia.com/gpu": "1"}, init_limits={},
                          privileged=container), OURS)
    assert not admission.redirect
    assert admission.reason == f"container {container} is privileged"
    assert admission.warning is not None
    assert f"container {container!r} is privileged" in admission.warning
    assert "left to default-scheduler" in admission.warning


def test_privileged_false_is_not_privileged() -> None:
    document = msgspec.json.encode({"spec": {"containers": [{
        "name": "app", "securityContext": {"privileged": False},
        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    assert admit(msgspec.json.decode(document, type=AdmittedPod), OURS).redirect


def test_a_privileged_pod_without_gpus_has_no_warning() -> None:
    admission = admit(pod(limits={"cpu": "1"}, privileged="app"), OURS)
    assert not admission.redirect
    assert admission.warning is None


def test_a_pod_without_containers_is_left_alone() -> None:
    empty = msgspec.json.decode(b'{"spec": {}}', type=AdmittedPod)
    assert not admit(empty, OURS).redirect


@pytest.mark.parametrize(("named", "ours"), [
    (None, True), ("", True), ("default-scheduler", True), (OURS, True),
    ("pyhami-demo", False), ("volcano", False)])
def test_a_pod_is_pyhamis_unless_it_names_another_scheduler(named: str | None,
                                                              ours: bool) -> None:
    # The standalone daemon's own loop places the pods this rule gives it.
    assert names_no_other_scheduler(named, OURS) is ours
