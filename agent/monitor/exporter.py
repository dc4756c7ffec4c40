"""HAMi's node monitor metrics, as HAMi v2.10's ``vGPUmonitor`` writes them: names, labels
and units (``cmd/vGPUmonitor/metrics.go``), from what the monitor measured.

The host gauges come from the probe at each scrape; the container gauges from the
monitor's latest scan, named by the daemon's list of the node's pods. As in HAMi, only
app containers of pods the node is known to run are reported (init containers are not);
unlike HAMi, a container measured through NVML's processes is reported too, with an
empty ``container`` where the pod's processes on that card cannot be told apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.monitor.model import ContainerUsage, HostCard
from common.core.mig import MigReservationError, decode_reservations
from common.wire import HoldingPod

ZONE = "vGPU"
"""HAMi's monitor wraps its registry with the constant label ``zone="vGPU"``, as its
scheduler does; every gauge below carries it."""
HOST_LABELS = ["node", "device_index", "device_uuid", "device_type", "zone"]
CONTROLLER_LABELS = ["device_index", "device_uuid", "device_type", "zone"]
"""HAMi's memory controller gauge has no ``node`` label."""
CONTAINER_LABELS = ["namespace", "pod", "container", "vdevice_index", "device_uuid", "zone"]


def device_type(name: str) -> str:
    """HAMi's monitor prefixes ``NVIDIA-`` to NVML's name unconditionally
    (``NVIDIA-NVIDIA H200``), unlike its device plugin's registration."""
    return f"NVIDIA-{name}"


@dataclass(frozen=True)
class MonitorSnapshot:
    """What the monitor's last scan found, and the pods it names them by."""

    containers: tuple[ContainerUsage, ...] = ()
    pods: Mapping[str, HoldingPod] = field(default_factory=dict)
    """The pods holding cards on the node, by uid (the daemon's list)."""
    skipped: Mapping[str, int] = field(default_factory=dict)
    """Inputs skipped since the agent started, by reason (cumulative)."""
    cache_lies: int = 0
    """Uuids of cards a container was not given, named in its HAMi-core cache file and
    ignored, since the agent started (cumulative, counted at every scan)."""


class MonitorCollector(Collector):
    """The scrape: ``host()`` (NVML now) and ``snapshot()`` (the last scan) as HAMi's
    gauges, and pyhami's counters of what was skipped and of the cache files' lies."""

    def __init__(self, node: str, host: Callable[[], list[HostCard]],
                 snapshot: Callable[[], MonitorSnapshot],
                 clock: Callable[[], float] = time.time) -> None:
        self._node = node
        self._host = host
        self._snapshot = snapshot
        self._clock = clock

    def collect(self) -> Iterable[Metric]:
        yield from _host_gauges(self._node, self._host())
        snapshot = self._snapshot()
        yield from _container_gauges(snapshot, self._clock())
        yield _mig_devices(snapshot.pods)
        skipped = CounterMetricFamily(
            "pyhami_monitor_skipped", "Cache files, folders and processes the node's monitor "
            "skipped, by reason", labels=["reason"])
        for reason, count in sorted(snapshot.skipped.items()):
            skipped.add_metric([reason], count)
        yield skipped
        lies = CounterMetricFamily(
            "pyhami_monitor_cache_lies", "Cards named in a container's HAMi-core cache file "
            "that the container was not given, ignored (counted at every scan)")
        lies.add_metric([], snapshot.cache_lies)
        yield lies


def _host_gauges(node: str, cards: list[HostCard]) -> Iterable[Metric]:
    memory = GaugeMetricFamily("hami_host_gpu_memory_used_bytes",
                               "GPU device memory usage", labels=HOST_LABELS)
    utilization = GaugeMetricFamily("hami_host_gpu_utilization_ratio",
                                    "GPU core utilization", labels=HOST_LABELS)
    controller = GaugeMetricFamily("hami_host_gpu_memory_controller_utilization_ratio",
                                   "GPU memory controller utilization", labels=CONTROLLER_LABELS)
    for card in cards:
        kind = device_type(card.name)
        if card.memory_used is not None:
            memory.add_metric([node, str(card.index), card.uuid, kind, ZONE], card.memory_used)
        if card.utilization is not None:
            utilization.add_metric([node, str(card.index), card.uuid, kind, ZONE],
                                   card.utilization)
        if card.memory_utilization is not None:
            controller.add_metric([str(card.index), card.uuid, kind, ZONE],
                                  card.memory_utilization)
    return memory, utilization, controller


def _container_gauges(snapshot: MonitorSnapshot, now: float) -> Iterable[Metric]:
    def gauge(name: str, documentation: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, documentation, labels=CONTAINER_LABELS)

    used = gauge("hami_vgpu_memory_used_bytes", "vGPU device memory usage")
    limit = gauge("hami_vgpu_memory_limit_bytes", "vGPU device memory limit")
    memory = gauge("hami_container_device_memory_bytes", "Container device memory usage")
    utilization = gauge("hami_container_device_utilization_ratio",
                        "Container device utilization")
    context = gauge("hami_vgpu_memory_context_bytes", "vGPU device memory held by contexts")
    module = gauge("hami_vgpu_memory_module_bytes", "vGPU device memory held by modules")
    buffer = gauge("hami_vgpu_memory_buffer_bytes", "vGPU device memory held by buffers")
    elapsed = gauge("hami_container_last_kernel_elapsed_seconds",
                    "Seconds since the container's last kernel launch")
    for usage in snapshot.containers:
        names = _names(snapshot.pods, usage)
        if names is None:
            continue
        for device in usage.devices:
            labels = [*names, str(device.vdevice_index), device.device_uuid, ZONE]
            used.add_metric(labels, device.memory_used)
            memory.add_metric(labels, device.memory_used)
            utilization.add_metric(labels, device.utilization)
            if device.memory_limit is not None:
                limit.add_metric(labels, device.memory_limit)
            for family, value in ((context, device.context), (module, device.module),
                                  (buffer, device.buffer)):
                if value is not None:
                    family.add_metric(labels, value)
            if usage.last_kernel_time:
                elapsed.add_metric(labels, max(now - usage.last_kernel_time, 0.0))
    return used, limit, memory, utilization, context, module, buffer, elapsed


MIG_DEVICE_LABELS = ["namespace", "pod", "container", "vdevice_index", "device_uuid",
                     "mig_uuid", "profile", "gpu_instance_id", "compute_instance_id"]


def _mig_devices(pods: Mapping[str, HoldingPod]) -> Metric:
    """HAMi's ``hami_mig_device_info``: the MIG instances of the pods holding cards, from
    their ``hami.io/vgpu-mig-allocations``, those with a runtime identity only; a pod whose
    annotation does not read is left out."""
    info = GaugeMetricFamily("hami_mig_device_info", "MIG device information",
                             labels=MIG_DEVICE_LABELS)
    for pod in sorted(pods.values(), key=lambda p: (p.namespace, p.name)):
        try:
            reservations = decode_reservations(pod.mig_allocations)
        except MigReservationError:
            continue
        for entry in reservations:
            if not entry.live:
                continue
            container = (pod.containers[entry.container_index].name
                         if entry.container_index < len(pod.containers) else "")
            info.add_metric([pod.namespace, pod.name, container, str(entry.device_index),
                             entry.gpu_uuid, entry.mig_uuid, entry.profile,
                             str(entry.gpu_instance_id), str(entry.compute_instance_id)], 1)
    return info


def _names(pods: Mapping[str, HoldingPod], usage: ContainerUsage) -> list[str] | None:
    """(namespace, pod, container) of a measured container: None for a pod the node is not
    known to run or for an init container, which HAMi does not report either."""
    pod = pods.get(usage.pod_uid)
    if pod is None:
        return None
    if usage.container and not any(container.name == usage.container and not container.init
                                   for container in pod.containers):
        return None
    return [pod.namespace, pod.name, usage.container]
