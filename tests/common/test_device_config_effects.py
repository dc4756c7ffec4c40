"""Each key of HAMi's device configuration does what it does in HAMi, read from the files.

Two pairs of files: ``device-config.yaml`` and ``config.json`` as HAMi's chart renders them
by default, and ``device-config-changed.yaml`` and ``config-changed.json`` with every key
changed. Each row names one key and its effect on what pyhami does with it (the request the
decision core reads, the quota keys, the webhook's patch, the card the agent registers, the
devices the kubelet is offered, the container's environment); the effect is asserted under
both pairs, so a row fails if the key is not read or does nothing. The real kubelet side
(the container config the runtime receives) is in ``tests/e2e/test_device_config.py``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

from agent.cli import node_device_config, plugin_settings
from agent.deviceplugin.allocation import (
    Granted,
    advertised_devices,
    allocate,
    device_id,
)
from agent.registration import registered_card, registered_cards
from agent.vendors.nvidia.containers import HamiCore, NvidiaContainers
from agent.vendors.nvidia.hamicore import hami_core_settings
from agent.vendors.nvidia.simulated import profile_cards
from common.core import parse_pod
from common.core.admission import AdmittedContainer, AdmittedPod, AdmittedPodSpec, admit
from common.core.annotations import CardGrant, encode_devices
from common.core.deviceconfig import (
    CHART_MIG_PROFILE_ALLOWLIST,
    DeviceConfig,
    MigProfiles,
    NodeConfigFile,
    NodeDeviceConfig,
    effective_for,
)
from common.core.pod import Container, PodManifest, PodSpec, ResourceRequirements
from common.core.quota import quota_keys
from common.deviceconfig import load_device_config, load_node_config
from common.wire import PendingContainer, PendingPod, ReportedCard
from pyhami.cli import build_parser
from pyhami.sandbox import DEFAULTS

HAMI = Path(__file__).parent / "hami"
CHART = load_device_config(HAMI / "device-config.yaml")
CHANGED = load_device_config(HAMI / "device-config-changed.yaml")
CHART_NODES = load_node_config(HAMI / "config.json")
CHANGED_NODES = load_node_config(HAMI / "config-changed.json")
NODE = "gpu-1"
"""The node ``config-changed.json``'s entry names (the chart's names another)."""
T4 = profile_cards("t4x4", NODE)[0]
"""15360 MiB, 100 cores, NUMA node 0."""

Limits = dict[str, int]


# What pyhami does with a configuration, one function per part ------------------------------


def request(device: DeviceConfig, limits: Limits) -> tuple[int, int | None, int, int]:
    """(cards, MiB or None, memory percent, cores) the decision core reads from one
    container with ``limits``."""
    pod = PodManifest(spec=PodSpec(containers=[Container(
        name="c", resources=ResourceRequirements(limits=dict(limits)))]))
    container = parse_pod(pod, replace(DEFAULTS, device=device)).containers[0]
    return container.cards, container.memory_mib, container.memory_percent, container.cores


def webhook_env(device: DeviceConfig, gpu_limits: Limits) -> list[dict[str, str]]:
    """The variables the webhook adds to a pod's two containers: one with ``gpu_limits``
    and the device's count name, one asking for nothing."""
    pod = AdmittedPod(spec=AdmittedPodSpec(containers=[
        AdmittedContainer(name="gpu", resources=ResourceRequirements(
            limits={device.resources.count: 1, **gpu_limits})),
        AdmittedContainer(name="plain")]))
    added = {addition.index: dict(addition.variables)
             for addition in admit(pod, "pyhami-scheduler", device).env}
    return [added.get(0, {}), added.get(1, {})]


def runtime_class(device: DeviceConfig) -> str | None:
    pod = AdmittedPod(spec=AdmittedPodSpec(containers=[AdmittedContainer(
        name="gpu", resources=ResourceRequirements(limits={device.resources.count: 1}))]))
    return admit(pod, "pyhami-scheduler", device).runtime_class_name


def registered(config: NodeDeviceConfig, card: ReportedCard = T4) -> tuple[int, int, int]:
    """(memory, cores, count) of ``card`` as the agent registers it."""
    card = registered_card(card, config)
    return card.memory, card.cores, card.count


def advertised(config: NodeDeviceConfig) -> list[tuple[str, int | None]]:
    """(device id, NUMA node) of what the device plugin lists for the T4."""
    settings = plugin_settings(_agent_args(), config)
    return [(device.id, device.numa) for device in advertised_devices(
        [registered_card(T4, config)], numa_topology=settings.numa_topology)]


def container_env(config: NodeDeviceConfig) -> dict[str, str]:
    """The environment the device plugin's Allocate gives a container of one T4 slice."""
    pod = PendingPod(namespace="lab", name="p", uid="uid-p", bind_time=1,
                     devices=encode_devices([[CardGrant(T4.uuid, 3000, 30)]]),
                     containers=(PendingContainer(name="c"),))
    hami = HamiCore(library="/usr/local/vgpu/libvgpu.so", preload="/usr/local/vgpu/preload",
                    containers="/usr/local/vgpu/containers", lock="/tmp/vgpulock",
                    settings=hami_core_settings(config))
    result = allocate([pod], {}, [[device_id(T4.uuid, 0)]], node=NODE, node_cards={T4.uuid},
                      runtime=NvidiaContainers(hami, lambda: "cache"))
    assert isinstance(result, Granted)
    (allocation,) = result.allocations
    return allocation.envs


def _agent_args(*flags: str) -> argparse.Namespace:
    return build_parser({}).parse_args(["agent", "--node", NODE, "--device-plugin", *flags])


# The nvidia: section --------------------------------------------------------------------

C = CHANGED.resources  # the changed names: a pod written for them means nothing under HAMi's

Effect = Callable[[DeviceConfig], object]
NVIDIA_KEYS: list[tuple[str, Effect, object, object]] = [
    ("resourceCountName", lambda d: request(d, {C.count: 1})[0], 0, 1),
    ("resourceMemoryName",
     lambda d: (request(d, {C.count: 1, C.memory: 3})[1], quota_keys(d.resources)[0]),
     (None, "limits.nvidia.com/gpumem"), (3 * 1024, "limits.example.com/vgpu-memory")),
    ("resourceMemoryPercentageName",
     lambda d: request(d, {C.count: 1, C.memory_percentage: 50})[2], 100, 50),
    ("resourceCoreName",
     lambda d: (request(d, {C.count: 1, C.memory: 1, C.cores: 20})[3],
                quota_keys(d.resources)[1]),
     (0, "limits.nvidia.com/gpucores"), (20, "limits.example.com/vgpu-cores")),
    ("resourcePriorityName",
     lambda d: webhook_env(d, {C.priority: 0})[0].get("CUDA_TASK_PRIORITY"), None, "0"),
    ("overwriteEnv", lambda d: webhook_env(d, {})[1].get("NVIDIA_VISIBLE_DEVICES"),
     None, "none"),
    ("defaultMemory",
     lambda d: request(d, {d.resources.count: 1, d.resources.cores: 10})[1], None, 2048),
    ("defaultCores", lambda d: request(d, {d.resources.memory: 1})[3], 0, 25),
    ("defaultGPUNum", lambda d: request(d, {d.resources.memory: 1})[0], 1, 2),
    ("memoryFactor", lambda d: request(d, {d.resources.count: 1, d.resources.memory: 4})[1],
     4, 4096),
    ("preConfiguredDeviceMemory",
     lambda d: registered(NodeDeviceConfig(d), msgspec.structs.replace(T4, memory=0))[0],
     0, 24576 * 2),
    ("deviceSplitCount", lambda d: len(advertised(NodeDeviceConfig(d))), 10, 4),
    ("deviceMemoryScaling",
     lambda d: (registered(NodeDeviceConfig(d))[0],
                container_env(NodeDeviceConfig(d)).get("CUDA_OVERSUBSCRIBE")),
     (15360, None), (30720, "true")),
    ("deviceCoreScaling", lambda d: registered(NodeDeviceConfig(d))[1], 100, 150),
    ("enableNumaTopology", lambda d: {numa for _, numa in advertised(NodeDeviceConfig(d))},
     {None}, {0}),
    ("gpuCorePolicy",
     lambda d: [env.get("GPU_CORE_UTILIZATION_POLICY") for env in webhook_env(d, {})],
     [None, None], ["force", "force"]),
    ("disableCoreLimit",
     lambda d: container_env(NodeDeviceConfig(d)).get("GPU_CORE_UTILIZATION_POLICY"),
     None, "disable"),
    ("libCudaLogLevel", lambda d: container_env(NodeDeviceConfig(d)).get("LIBCUDA_LOG_LEVEL"),
     "1", "3"),
    ("runtimeClassName", runtime_class, None, "nvidia"),
    # Read and checked now; the MIG issue places pods by it.
    ("migProfileAllowlist", lambda d: d.mig_profile_allowlist, CHART_MIG_PROFILE_ALLOWLIST,
     (MigProfiles(models=("A100-SXM4-80GB",), profiles=("1g.10gb", "7g.79gb")),)),
]


@pytest.mark.parametrize(("key", "effect", "chart", "changed"), NVIDIA_KEYS,
                         ids=[row[0] for row in NVIDIA_KEYS])
def test_each_nvidia_key_has_its_effect(key: str, effect: Effect, chart: object,
                                        changed: object) -> None:
    assert effect(CHART) == chart, f"{key} under the chart's device-config.yaml"
    assert effect(CHANGED) == changed, f"{key} under the changed device-config.yaml"


def test_the_table_covers_every_key_of_the_changed_file() -> None:
    import yaml  # noqa: PLC0415 (only this test reads the file's keys itself)

    written = yaml.safe_load((HAMI / "device-config-changed.yaml").read_text())["nvidia"]
    assert sorted(written) == sorted(row[0] for row in NVIDIA_KEYS)


def test_the_charts_files_change_nothing_pyhami_does_without_them() -> None:
    assert DeviceConfig() == CHART
    assert effective_for(CHART, CHART_NODES, NODE) == NodeDeviceConfig()


# The nodeconfig entry (config.json), over the chart's global values ------------------------


def on_node(nodes: NodeConfigFile) -> NodeDeviceConfig:
    return effective_for(CHART, nodes, NODE)


NodeEffect = Callable[[NodeDeviceConfig], object]
NODE_KEYS: list[tuple[str, NodeEffect, object, object]] = [
    ("operatingmode", lambda c: c.operating_mode, "hami-core", "mig"),
    ("devicesplitcount", lambda c: registered(c)[2], 10, 3),
    ("devicememoryscaling",
     lambda c: (registered(c)[0], container_env(c).get("CUDA_OVERSUBSCRIBE")),
     (15360, None), (23040, "true")),
    ("devicecorescaling", lambda c: registered(c)[1], 100, 200),
    ("preconfigureddevicememory",
     lambda c: registered(c, msgspec.structs.replace(T4, memory=0))[0], 0,
     int(16384 * 1.5)),
    ("libcudaloglevel", lambda c: container_env(c).get("LIBCUDA_LOG_LEVEL"), "1", "4"),
    ("enablenumatopology", lambda c: {numa for _, numa in advertised(c)}, {None}, {0}),
    # Read and checked now; the MIG issue serves it.
    ("migstrategy", lambda c: c.mig_strategy, "none", "mixed"),
    ("filterdevices",
     lambda c: [card.index for card in registered_cards(
         [msgspec.structs.replace(T4, uuid="GPU-aaaa"), *profile_cards("t4x4", NODE)[1:]],
         c)],
     [0, 1, 2, 3], [2]),
    ("enablegetpreferredallocation",
     lambda c: plugin_settings(_agent_args(), c).preferred_allocation, False, True),
]


@pytest.mark.parametrize(("key", "effect", "chart", "changed"), NODE_KEYS,
                         ids=[row[0] for row in NODE_KEYS])
def test_each_nodeconfig_key_has_its_effect(key: str, effect: NodeEffect, chart: object,
                                            changed: object) -> None:
    assert effect(on_node(CHART_NODES)) == chart, f"{key} under the chart's config.json"
    assert effect(on_node(CHANGED_NODES)) == changed, f"{key} under the changed config.json"


def test_the_node_table_covers_every_key_of_the_changed_entry() -> None:
    import json  # noqa: PLC0415

    (entry,) = json.loads((HAMI / "config-changed.json").read_text())["nodeconfig"]
    assert sorted(entry) == sorted(["name", *(row[0] for row in NODE_KEYS)])


def test_the_agent_takes_the_mig_mode_the_changed_entry_sets() -> None:
    args = _agent_args("--device-config", str(HAMI / "device-config.yaml"),
                       "--node-config", str(HAMI / "config-changed.json"))
    assert node_device_config(args, NODE).operating_mode == "mig"
