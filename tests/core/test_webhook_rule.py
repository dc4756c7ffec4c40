"""The webhook's rule (``common.core.admission``): which new pods pyhami's scheduler takes.

As HAMi v2.10's webhook: a pod asking for a GPU resource pyhami manages, naming no
scheduler of its own (none, or ``default-scheduler``, which the API server fills in), is
given ``pyhami-scheduler``; every pod passing that gate gets the device configuration's
environment, a GPU pod its runtime class; a GPU pod with a privileged container or a node
already named is refused, in that order.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from common.core.admission import AdmittedPod, EnvAddition, admit, names_no_other_scheduler
from common.core.deviceconfig import DeviceConfig
from common.core.vendors import ResourceNames

OURS = "pyhami-scheduler"


def pod(*, limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None,
        init_limits: dict[str, Any] | None = None, scheduler: str | None = "default-scheduler",
        node: str | None = None, privileged: str | None = None,
        app_env: list[dict[str, str]] | None = None,
        runtime_class: str | None = None) -> AdmittedPod:
    """A pod as the API server hands it to the webhook (JSON, camelCase)."""
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    containers: list[dict[str, Any]] = [{"name": "app", "image": "cuda", "resources": resources},
                                        {"name": "sidecar", "image": "envoy"}]
    if app_env is not None:
        containers[0]["env"] = app_env
    spec: dict[str, Any] = {"containers": containers}
    if runtime_class is not None:
        spec["runtimeClassName"] = runtime_class
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
    assert admission.denial is None


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


@pytest.mark.parametrize("scheduler", ["default-scheduler", OURS])
def test_a_gpu_pod_already_on_a_node_is_denied(scheduler: str) -> None:
    admission = admit(pod(limits={"nvidia.com/gpu": "1"}, node="gpu-node-1",
                          scheduler=scheduler), OURS)
    assert admission.denial == "pod has node assigned"
    assert not admission.redirect and not admission.ours
    assert admission.reason == "already assigned to node gpu-node-1"


def test_a_pod_on_a_node_without_gpus_is_allowed() -> None:
    admission = admit(pod(limits={"cpu": "1"}, node="gpu-node-1"), OURS)
    assert admission.denial is None


@pytest.mark.parametrize("container", ["app", "sidecar", "warm-up"])
def test_a_privileged_container_in_a_gpu_pod_is_denied(container: str) -> None:
    admission = admit(pod(limits={"nvidia.com/gpu": "1"}, init_limits={},
                          privileged=container), OURS)
    assert admission.denial == f"container {container} is privileged"
    assert not admission.redirect and not admission.ours
    assert not admission.mutates


def test_the_privileged_denial_comes_before_the_node_one() -> None:
    admission = admit(pod(limits={"nvidia.com/gpu": "1"}, node="n", privileged="sidecar"),
                      OURS)
    assert admission.denial == "container sidecar is privileged"


def test_the_first_privileged_container_is_named_init_first() -> None:
    document = msgspec.json.encode({"spec": {
        "initContainers": [{"name": "warm-up", "securityContext": {"privileged": True}}],
        "containers": [{"name": "app", "securityContext": {"privileged": True},
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    admission = admit(msgspec.json.decode(document, type=AdmittedPod), OURS)
    assert admission.denial == "container warm-up is privileged"


def test_privileged_false_is_not_privileged() -> None:
    document = msgspec.json.encode({"spec": {"containers": [{
        "name": "app", "securityContext": {"privileged": False},
        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    assert admit(msgspec.json.decode(document, type=AdmittedPod), OURS).redirect


def test_a_privileged_pod_without_gpus_is_allowed() -> None:
    admission = admit(pod(limits={"cpu": "1"}, privileged="app"), OURS)
    assert not admission.redirect
    assert admission.denial is None


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


# The device configuration's mutations -------------------------------------------------

EVERY_KEY = DeviceConfig(
    resources=ResourceNames(count="example.com/vgpu", priority="example.com/vprio"),
    overwrite_env=True, gpu_core_policy="force", runtime_class_name="nvidia")
"""Every key the webhook reads set away from HAMi's chart default."""


def envs(added_env: tuple[EnvAddition, ...]) -> dict[str, list[tuple[str, str]]]:
    return {f"{added.field}/{added.index}": list(added.variables) for added in added_env}


@pytest.mark.parametrize(("device", "limits", "env", "runtime_class"), [
    (DeviceConfig(), {"nvidia.com/gpu": "1", "nvidia.com/priority": "1"},
     {"containers/0": [("CUDA_TASK_PRIORITY", "1")]}, None),
    (DeviceConfig(), {"nvidia.com/gpu": "1"}, {}, None),
    (DeviceConfig(gpu_core_policy=""), {"nvidia.com/gpu": "1"}, {}, None),
    (DeviceConfig(gpu_core_policy="disable"), {"nvidia.com/gpu": "1"},
     {"containers/0": [("GPU_CORE_UTILIZATION_POLICY", "disable")],
      "containers/1": [("GPU_CORE_UTILIZATION_POLICY", "disable")]}, None),
    (DeviceConfig(overwrite_env=True), {"nvidia.com/gpu": "1"},
     {"containers/1": [("NVIDIA_VISIBLE_DEVICES", "none")]}, None),
    (DeviceConfig(runtime_class_name="nvidia"), {"nvidia.com/gpu": "1"}, {}, "nvidia"),
    (EVERY_KEY, {"example.com/vgpu": "1", "example.com/vprio": "0"},
     {"containers/0": [("CUDA_TASK_PRIORITY", "0"), ("GPU_CORE_UTILIZATION_POLICY", "force")],
      "containers/1": [("GPU_CORE_UTILIZATION_POLICY", "force"),
                       ("NVIDIA_VISIBLE_DEVICES", "none")]}, "nvidia"),
    # Under custom names, HAMi's default names are no GPU resource and no priority.
    (EVERY_KEY, {"nvidia.com/gpu": "1", "nvidia.com/priority": "1"},
     {"containers/0": [("GPU_CORE_UTILIZATION_POLICY", "force"),
                       ("NVIDIA_VISIBLE_DEVICES", "none")],
      "containers/1": [("GPU_CORE_UTILIZATION_POLICY", "force"),
                       ("NVIDIA_VISIBLE_DEVICES", "none")]}, None),
], ids=["priority", "chart-defaults", "empty-policy", "core-policy", "overwrite-env",
        "runtime-class", "every-key", "every-key-default-names"])
def test_each_key_writes_what_hamis_webhook_writes(
        device: DeviceConfig, limits: dict[str, str],
        env: dict[str, list[tuple[str, str]]], runtime_class: str | None) -> None:
    admission = admit(pod(limits=limits), OURS, device)
    assert envs(admission.env) == env
    assert admission.runtime_class_name == runtime_class
    assert admission.denial is None


@pytest.mark.parametrize(("quantity", "written"), [
    ("1", "1"), (2, "2"), ("0", "0"), ("1k", "1000"), ("0.5", None), ("x", None)],
    ids=["text", "number", "zero", "suffix", "fraction", "unreadable"])
def test_the_task_priority_is_the_limits_whole_value(quantity: Any,
                                                      written: str | None) -> None:
    # A fraction is no extended-resource quantity: the API server refuses the pod after.
    admission = admit(pod(limits={"nvidia.com/gpu": "1", "nvidia.com/priority": quantity}),
                      OURS)
    assert envs(admission.env) == ({"containers/0": [("CUDA_TASK_PRIORITY", written)]}
                                   if written else {})


def test_the_task_priority_is_read_from_limits_only() -> None:
    admission = admit(pod(limits={"nvidia.com/gpu": "1"},
                          requests={"nvidia.com/priority": "1"}), OURS)
    assert admission.env == ()


def test_init_containers_come_first_and_have_their_own_list() -> None:
    admission = admit(pod(limits={"nvidia.com/gpu": "1"}, init_limits={"cpu": "1"}), OURS,
                      DeviceConfig(overwrite_env=True))
    assert [(added.field, added.index) for added in admission.env] == [
        ("initContainers", 0), ("containers", 1)]


@pytest.mark.parametrize(("app_env", "has_env"), [
    (None, False), ([], True), ([{"name": "CUDA_TASK_PRIORITY", "value": "0"}], True)],
    ids=["no-env", "empty-env", "env"])
def test_the_variables_say_whether_the_container_has_an_env_list(
        app_env: list[dict[str, str]] | None, has_env: bool) -> None:
    # An existing CUDA_TASK_PRIORITY is not de-duplicated, as HAMi: the appended one is
    # the last of its name, which is the one the container sees.
    admission = admit(pod(limits={"nvidia.com/gpu": "1", "nvidia.com/priority": "1"},
                          app_env=app_env), OURS)
    (added,) = admission.env
    assert added.has_env is has_env
    assert added.variables == (("CUDA_TASK_PRIORITY", "1"),)


def test_a_pods_own_runtime_class_is_kept() -> None:
    admission = admit(pod(limits={"nvidia.com/gpu": "1"}, runtime_class="kata"), OURS,
                      DeviceConfig(runtime_class_name="nvidia"))
    assert admission.runtime_class_name is None
    assert not admission.env


def test_a_pod_without_gpus_gets_the_env_but_no_runtime_class_and_no_scheduler() -> None:
    # As HAMi: every container the webhook processes gets the core policy, and one asking
    # for no card the empty device list; the runtime class is for GPU pods.
    admission = admit(pod(limits={"cpu": "1"}), OURS, EVERY_KEY)
    assert envs(admission.env) == {
        f"containers/{index}": [("GPU_CORE_UTILIZATION_POLICY", "force"),
                                ("NVIDIA_VISIBLE_DEVICES", "none")] for index in (0, 1)}
    assert admission.runtime_class_name is None
    assert not admission.redirect and not admission.ours and admission.mutates


def test_a_pod_naming_another_scheduler_gets_nothing() -> None:
    admission = admit(pod(limits={"example.com/vgpu": "1", "example.com/vprio": "1"},
                          scheduler="volcano"), OURS, EVERY_KEY)
    assert not admission.mutates and admission.denial is None


def test_a_pod_already_naming_pyhami_is_mutated_but_not_redirected() -> None:
    admission = admit(pod(limits={"example.com/vgpu": "1"}, scheduler=OURS), OURS, EVERY_KEY)
    assert not admission.redirect and admission.ours
    assert admission.runtime_class_name == "nvidia"
    assert len(admission.env) == 2
