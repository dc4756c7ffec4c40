"""MIG on a real kubelet: the agent of gpu-node-2 runs ``sim:a100x8-mig`` (eight A100 80GB
in MIG mode, NVML's tables, placements enforced by the simulated NVML) and serves its
device plugin to the real kubelet.

A pod asking 8,000 MiB with ``nvidia.com/vgpu-mode: mig`` gets ``1g.10gb`` at slice 6 (the
smallest profile that holds it, at the highest free slice, as HAMi v2.10 chooses); the
container config the runtime received names the instance's MIG UUID, which the pod's
``hami.io/vgpu-mig-allocations`` records with its GPU and compute instance ids; deleting the
pod destroys the instance (the agent says so). A ``hami-core`` pod is refused on that node
with ``CardTypeMismatch``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.core.mig import MIG_ALLOCATIONS_ANNOTATION, decode_reservations
from harness.controlplane import Process, wait_for
from scheduler.service.handlers.cordons import CORDON_REFRESH_S
from tests.e2e.controlplane import KUBELET_NODE, ControlPlane, recorded_env
from tests.e2e.pods import ClusterLab, lab_pod

CARDS, INSTANCES = 8, 7  # eight A100 80GB, seven 1g instances each at most
MIG_POD = {"nvidia.com/vgpu-mode": "mig"}


@pytest.fixture(scope="module")
def mig_node(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[ControlPlane, Path]]:
    plane = control_plane
    plane.start_kubelet()
    hami_core = tmp_path_factory.mktemp("vgpu-mig")
    log = plane.logs / "agent-gpu-node-2-mig.log"
    agent = Process("agent-gpu-node-2-mig", [
        *plane.pyhami_command(), "agent", "--node", KUBELET_NODE,
        "--inventory", "sim:a100x8-mig", "--nats", plane.nats_url,
        "--nats-token-file", str(plane.agent_token(KUBELET_NODE)),
        "--device-plugin", "--kubelet-dir", str(plane.kubelet_device_plugins),
        "--hami-core-dir", str(hami_core), "--poll-interval", "0.5",
        "--heartbeat-interval", "1",
    ], log).start()
    try:
        yield plane, log
    finally:
        plane.retire_kubelet(agent, CORDON_REFRESH_S * 3)


def on_the_node(name: str, annotations: dict[str, str], mib: int) -> dict[str, Any]:
    pod = lab_pod(name, annotations)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": KUBELET_NODE}
    pod["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mib)}
    return pod


def test_a_mig_pod_gets_its_instance_and_loses_it_when_deleted(
        mig_node: tuple[ControlPlane, Path], clean_namespace: None) -> None:
    plane, log = mig_node
    wait_for(lambda: plane.allocatable_gpus() == CARDS * INSTANCES, "the MIG node's devices")
    lab = ClusterLab(plane)
    lab.create_manifest(on_the_node("mig-small", MIG_POD, 8000))
    placed = lab.wait_placed("mig-small")
    (reserved,) = decode_reservations(placed.annotations[MIG_ALLOCATIONS_ANNOTATION])
    assert (reserved.profile, reserved.placement.start, reserved.placement.size) == (
        "1g.10gb", 6, 1)

    def recorded() -> Any:
        notes = lab.read("mig-small")["metadata"].get("annotations") or {}
        (entry,) = decode_reservations(notes.get(MIG_ALLOCATIONS_ANNOTATION, ""))
        return entry if entry.live and notes.get("hami.io/bind-phase") == "success" else None

    live = wait_for(recorded, "the instance's runtime identity on the pod")
    created = plane.created_container("mig-small")
    env = recorded_env(created)
    assert env["NVIDIA_VISIBLE_DEVICES"] == live.mig_uuid
    assert live.mig_uuid.startswith("MIG-")
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" not in env  # a MIG instance needs no HAMi-core
    lab.delete("mig-small")
    wait_for(lambda: f"MIG instance 1g.10gb at slice 6 on {reserved.gpu_uuid} destroyed"
             in log.read_text(), "the agent destroying the deleted pod's instance")


def test_a_hami_core_pod_is_refused_on_the_mig_node(
        mig_node: tuple[ControlPlane, Path], clean_namespace: None) -> None:
    plane, _ = mig_node
    wait_for(lambda: plane.allocatable_gpus() == CARDS * INSTANCES, "the MIG node's devices")
    lab = ClusterLab(plane)
    lab.create_manifest(on_the_node("shared", {"nvidia.com/vgpu-mode": "hami-core"}, 1000))
    lab.wait_event("shared", "FailedScheduling", "CardTypeMismatch")
    lab.assert_pending("shared")
