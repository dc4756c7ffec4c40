"""The node monitor's scrape: HAMi v2.10's monitor gauges, names, labels and values, from a
fixed measurement (the sources are tested on their own)."""

from __future__ import annotations

import msgspec
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.monitor.exporter import MonitorCollector, MonitorSnapshot
from agent.monitor.model import ContainerUsage, DeviceUsage, HostCard
from common.wire import HoldingContainer, HoldingPod

NODE = "gpu-node-1"
MIB = 1024 * 1024
CARDS = [HostCard(0, "GPU-a", "NVIDIA H200", 20 * 1024 * MIB, 37, 12),
         HostCard(1, "GPU-b", "Tesla T4", None, None, None)]
POD = HoldingPod(namespace="lab", name="train", uid="uid-1", containers=(
    HoldingContainer(name="warmup", init=True),
    HoldingContainer(name="main", cards=("GPU-a", "GPU-b")),
    HoldingContainer(name="side", cards=("GPU-a",))))
MAIN = ContainerUsage(pod_uid="uid-1", container="main", source="hami-core",
                      last_kernel_time=1000, devices=(
                          DeviceUsage(0, "GPU-a", 3000 * MIB, 42, 4000 * MIB, 300 * MIB,
                                      100 * MIB, 2600 * MIB),
                          DeviceUsage(1, "GPU-b", 10 * MIB, 0, 4000 * MIB, 10 * MIB, 0, 0)))
SIDE_BY_NVML = ContainerUsage(pod_uid="uid-1", container="side", source="nvml",
                              devices=(DeviceUsage(0, "GPU-a", 500 * MIB, 7),))
INIT = ContainerUsage(pod_uid="uid-1", container="warmup", source="hami-core",
                      devices=(DeviceUsage(0, "GPU-a", MIB, 1, MIB),))
STRANGER = ContainerUsage(pod_uid="uid-gone", container="main", source="hami-core",
                          devices=(DeviceUsage(0, "GPU-a", MIB, 1, MIB),))
SNAPSHOT = MonitorSnapshot(containers=(MAIN, SIDE_BY_NVML, INIT, STRANGER),
                           pods={POD.uid: POD}, skipped={"bad_magic": 2, "no_pod": 1})


def scrape(snapshot: MonitorSnapshot = SNAPSHOT) -> dict[str, dict[tuple[tuple[str, str], ...],
                                                                    float]]:
    registry = CollectorRegistry()
    registry.register(MonitorCollector(NODE, lambda: CARDS, lambda: snapshot,
                                       clock=lambda: 1012.5))
    series: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            series.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = (
                sample.value)
    return series


def labels(**values: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({**values, "zone": "vGPU"}.items()))


def container(name: str, index: int, uuid: str) -> tuple[tuple[str, str], ...]:
    return labels(namespace="lab", pod="train", container=name, vdevice_index=str(index),
                  device_uuid=uuid)


def test_host_gauges_carry_hamis_labels_and_skip_what_nvml_has_not() -> None:
    series = scrape()
    host = labels(node=NODE, device_index="0", device_uuid="GPU-a",
                  device_type="NVIDIA-NVIDIA H200")
    assert series["hami_host_gpu_memory_used_bytes"] == {host: 20 * 1024 * MIB}
    assert series["hami_host_gpu_utilization_ratio"] == {host: 37}
    assert series["hami_host_gpu_memory_controller_utilization_ratio"] == {
        labels(device_index="0", device_uuid="GPU-a", device_type="NVIDIA-NVIDIA H200"): 12}


@pytest.mark.parametrize(("metric", "expected"), [
    ("hami_vgpu_memory_used_bytes", {container("main", 0, "GPU-a"): 3000 * MIB,
                                     container("main", 1, "GPU-b"): 10 * MIB,
                                     container("side", 0, "GPU-a"): 500 * MIB}),
    ("hami_container_device_memory_bytes", {container("main", 0, "GPU-a"): 3000 * MIB,
                                            container("main", 1, "GPU-b"): 10 * MIB,
                                            container("side", 0, "GPU-a"): 500 * MIB}),
    ("hami_vgpu_memory_limit_bytes", {container("main", 0, "GPU-a"): 4000 * MIB,
                                      container("main", 1, "GPU-b"): 4000 * MIB}),
    ("hami_container_device_utilization_ratio", {container("main", 0, "GPU-a"): 42,
                                                 container("main", 1, "GPU-b"): 0,
                                                 container("side", 0, "GPU-a"): 7}),
    ("hami_vgpu_memory_context_bytes", {container("main", 0, "GPU-a"): 300 * MIB,
                                        container("main", 1, "GPU-b"): 10 * MIB}),
    ("hami_vgpu_memory_module_bytes", {container("main", 0, "GPU-a"): 100 * MIB,
                                       container("main", 1, "GPU-b"): 0}),
    ("hami_vgpu_memory_buffer_bytes", {container("main", 0, "GPU-a"): 2600 * MIB,
                                       container("main", 1, "GPU-b"): 0}),
    ("hami_container_last_kernel_elapsed_seconds", {container("main", 0, "GPU-a"): 12.5,
                                                    container("main", 1, "GPU-b"): 12.5}),
], ids=["used", "device-memory", "limit", "utilization", "context", "module", "buffer",
        "last-kernel"])
def test_container_gauges_for_app_containers_of_known_pods(
        metric: str, expected: dict[tuple[tuple[str, str], ...], float]) -> None:
    # The init container and the pod the node is not known to run are not reported.
    assert scrape()[metric] == expected


def test_the_skipped_inputs_are_counted_by_reason() -> None:
    assert scrape()["pyhami_monitor_skipped_total"] == {
        (("reason", "bad_magic"),): 2, (("reason", "no_pod"),): 1}


@pytest.mark.parametrize(("lies", "expected"), [(0, 0), (3, 3)], ids=["none", "three"])
def test_the_cache_files_lies_are_one_unlabelled_counter(lies: int, expected: int) -> None:
    series = scrape(MonitorSnapshot(cache_lies=lies))
    assert series["pyhami_monitor_cache_lies_total"] == {(): expected}


def test_an_empty_node_scrapes_the_host_alone() -> None:
    series = scrape(MonitorSnapshot())
    assert "hami_vgpu_memory_used_bytes" not in series
    assert len(series["hami_host_gpu_utilization_ratio"]) == 1


def test_the_mig_instances_of_the_pods_are_listed_once_made() -> None:
    reservations = (
        '[{"containerIndex":1,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.10gb",'
        '"placement":{"start":6,"size":1},"migUUID":"MIG-1","gpuInstanceID":13,'
        '"computeInstanceID":0},'
        '{"containerIndex":1,"deviceIndex":1,"gpuUUID":"GPU-a","profile":"1g.10gb",'
        '"placement":{"start":5,"size":1}}]')
    pods = {"uid-1": msgspec.structs.replace(POD, mig_allocations=reservations),
            "uid-2": HoldingPod(namespace="lab", name="broken", uid="uid-2",
                                mig_allocations="{")}
    series = scrape(MonitorSnapshot(pods=pods))
    # The second instance has no runtime identity yet; the broken annotation is skipped.
    assert series["hami_mig_device_info"] == {tuple(sorted({
        "namespace": "lab", "pod": "train", "container": "main", "vdevice_index": "0",
        "device_uuid": "GPU-a", "mig_uuid": "MIG-1", "profile": "1g.10gb",
        "gpu_instance_id": "13", "compute_instance_id": "0"}.items())): 1.0}
