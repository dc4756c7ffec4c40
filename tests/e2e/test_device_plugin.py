"""The decision reaches the container, on a real kubelet.

The agent of gpu-node-2 (its token issued by the real kube-apiserver for a pod on that
node) serves its device plugin to the real kubelet of gpu-node-2: the Node's
``nvidia.com/gpu`` comes from the kubelet, not from a hand patch. A lab pod for that node
goes from Pending through kube-scheduler and pyhami's filter and bind to Running; the
container config the runtime received carries the cards and the limits pyhami chose,
and the pod's ``hami.io/bind-phase`` becomes ``success``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from common.core.annotations import ALLOCATED_ANNOTATION, BIND_PHASE_ANNOTATION, decode_devices
from pyhami._controlplane import ApiError, Process, wait_for
from scheduler.service.reactions import CORDON_REFRESH_S
from tests.e2e.controlplane import KUBELET_NODE, ControlPlane, recorded_env
from tests.e2e.pods import PODS, lab_pod

CARDS, SPLIT = 4, 10  # the simulated t4x4 and the default split count


@pytest.fixture(scope="module")
def gpu_kubelet(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[ControlPlane]:
    plane = control_plane
    plane.start_kubelet()
    hami_core = tmp_path_factory.mktemp("vgpu")  # no libvgpu.so: limits in the env only
    agent = Process("agent-gpu-node-2", [
        *plane.pyhami_command(), "agent", "--node", KUBELET_NODE, "--inventory", "sim:t4x4",
        "--nats", plane.nats_url, "--nats-token-file", str(plane.agent_token(KUBELET_NODE)),
        "--device-plugin", "--kubelet-dir", str(plane.kubelet_device_plugins),
        "--hami-core-dir", str(hami_core), "--poll-interval", "0.5",
        "--heartbeat-interval", "1",
    ], plane.logs / "agent-gpu-node-2.log").start()
    try:
        yield plane
    finally:
        agent.stop()
        plane.stop_kubelet()
        with contextlib.suppress(ApiError):
            plane.api.delete(f"/api/v1/nodes/{KUBELET_NODE}")
        # The other tests see one node again once the daemon has forgotten this one (it
        # reads the Nodes again every CORDON_REFRESH_S).
        wait_for(lambda: plane.statusz()["nodes"] == 1, f"the daemon forgetting {KUBELET_NODE}",
                 timeout=CORDON_REFRESH_S * 3)


def allocatable_gpus(plane: ControlPlane) -> int | None:
    node = plane.api.get(f"/api/v1/nodes/{KUBELET_NODE}")
    value = node["status"].get("allocatable", {}).get("nvidia.com/gpu")
    return int(value) if value is not None else None


def test_the_kubelet_advertises_the_devices_of_the_agents_plugin(
        gpu_kubelet: ControlPlane) -> None:
    wait_for(lambda: allocatable_gpus(gpu_kubelet) == CARDS * SPLIT,
             "the kubelet's Node advertising the plugin's nvidia.com/gpu devices")


def test_a_lab_pod_runs_with_the_cards_pyhami_chose(gpu_kubelet: ControlPlane,
                                                    clean_namespace: None) -> None:
    plane = gpu_kubelet
    wait_for(lambda: allocatable_gpus(plane) == CARDS * SPLIT, "the plugin's devices")
    pod = lab_pod("on-a-real-kubelet")
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": KUBELET_NODE}
    plane.api.create(PODS, pod)
    path = f"{PODS}/on-a-real-kubelet"

    def running() -> dict[str, Any] | None:
        stored = plane.api.get(path)
        return stored if stored["status"].get("phase") == "Running" else None

    stored = wait_for(running, "the lab pod Running on the kubelet's node")
    annotations = stored["metadata"]["annotations"]
    assert stored["spec"]["nodeName"] == KUBELET_NODE
    ((grant,),) = decode_devices(annotations[ALLOCATED_ANNOTATION])
    (created,) = [request for request in plane.recorded_containers()
                  if request["sandboxConfig"]["metadata"]["name"] == "on-a-real-kubelet"]
    env = recorded_env(created)
    assert env["NVIDIA_VISIBLE_DEVICES"] == grant.uuid
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{grant.memory}m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == str(grant.cores)
    wait_for(lambda: plane.api.get(path)["metadata"]["annotations"].get(
        BIND_PHASE_ANNOTATION) == "success", "the pod's bind-phase success")
