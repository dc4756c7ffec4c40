"""A real kubelet against the fake CRI runtime: its Node registers and reports Ready by
itself, and a pod bound to it runs, with its container config recorded by the runtime."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from harness.controlplane import ApiError, versions, wait_for
from tests.e2e.controlplane import (
    KUBELET_NODE,
    TEST_NAMESPACE,
    ControlPlane,
    recorded_env,
    serving_unix,
)

PODS = f"/api/v1/namespaces/{TEST_NAMESPACE}/pods"


@pytest.fixture(scope="module")
def kubelet(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """The control plane with a kubelet; afterwards the kubelet, its runtime and its Node
    are gone, so the other tests see one node as before."""
    control_plane.start_kubelet()
    try:
        yield control_plane
    finally:
        control_plane.stop_kubelet()
        with contextlib.suppress(ApiError):
            control_plane.api.delete(f"/api/v1/nodes/{KUBELET_NODE}")


def ready_condition(node: dict[str, Any]) -> dict[str, Any]:
    [ready] = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    return ready


def test_the_kubelet_registers_its_node_ready(kubelet: ControlPlane) -> None:
    node = kubelet.api.get(f"/api/v1/nodes/{KUBELET_NODE}")
    ready = ready_condition(node)
    assert (ready["status"], ready["reason"]) == ("True", "KubeletReady")
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == versions(kubelet.bin_dir)[0]
    assert info["containerRuntimeVersion"].startswith("fakeRuntime://")
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == KUBELET_NODE
    # Capacity is the kubelet's own report; no device plugin serves a GPU resource now (a
    # kubelet that had one before lists it with none left).
    assert int(node["status"]["allocatable"]["pods"]) > 0
    assert int(node["status"]["allocatable"].get("nvidia.com/gpu", "0")) == 0
    # The kubelet serves the device plugin Registration in the fixed folder.
    assert serving_unix(kubelet.kubelet_device_plugins / "kubelet.sock")


def run_plain_pod(plane: ControlPlane, name: str) -> dict[str, Any]:
    """A pod without GPU bound to the kubelet's node, once it is Running."""
    plane.api.create(PODS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE},
        "spec": {"nodeName": KUBELET_NODE, "automountServiceAccountToken": False,
                 "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "app", "image": "ubuntu:22.04",
                                 "command": ["sleep", "infinity"],
                                 "env": [{"name": "E2E_MARK", "value": name}]}]}})
    return wait_for(lambda: running(plane, name), f"pod {name} Running on {KUBELET_NODE}",
                    watch=[plane.process("kubelet"), plane.process("fake-cri")])


def running(plane: ControlPlane, name: str) -> dict[str, Any] | None:
    pod = plane.api.get(f"{PODS}/{name}")
    return pod if pod["status"].get("phase") == "Running" else None


def test_a_pod_bound_to_the_kubelet_runs_in_the_fake_runtime(
        kubelet: ControlPlane, clean_namespace: None) -> None:
    name = "plain-on-kubelet"
    pod = run_plain_pod(kubelet, name)
    [status] = pod["status"]["containerStatuses"]
    assert status["ready"] is True and "running" in status["state"]
    assert status["containerID"].startswith("fakeRuntime://")

    [created] = kubelet.created_containers(name)
    assert created["sandboxConfig"]["metadata"]["namespace"] == TEST_NAMESPACE
    assert created["sandboxConfig"]["metadata"]["uid"] == pod["metadata"]["uid"]
    config = created["config"]
    assert config["metadata"]["name"] == "app"
    assert config["command"] == ["sleep", "infinity"]
    assert recorded_env(created)["E2E_MARK"] == name


def test_a_restarted_kubelet_serves_again_and_keeps_its_pods(
        kubelet: ControlPlane, clean_namespace: None) -> None:
    name = "survives-restart"
    before = run_plain_pod(kubelet, name)
    registration = kubelet.kubelet_device_plugins / "kubelet.sock"
    socket_before = registration.stat().st_ctime_ns
    kubelet.stop_kubelet(runtime=False)
    assert not serving_unix(registration)
    kubelet.start_kubelet()
    # A new Registration socket (a device plugin registers again on seeing it) ...
    assert serving_unix(registration)
    assert registration.stat().st_ctime_ns != socket_before
    # ... and the running container found in the runtime, not created again.
    after = wait_for(lambda: running(kubelet, name), f"pod {name} still Running")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert len(kubelet.created_containers(name)) == 1
