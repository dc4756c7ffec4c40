"""HAMi's scheduler as a peer of pyhami in ``scripts/bench-cluster --peer hami=BINARY``.

Nothing of HAMi is shipped or committed here: the user builds HAMi's scheduler from a
checkout of their own (``scripts/build-hami-scheduler.sh CHECKOUT``) and names the binary.
What this module holds are facts read from HAMi v2.10.0's source (tag ``v2.10.0``, commit
``4707fb02c91c545bc7343ce26dba4c32919f9a3e``; the project's reference is
``/work/shared/hami-v2.10-reference.md``), each cited by file and function, and the bench's
own code that plays the parts of HAMi's chart and of HAMi's device plugin:

* the KubeSchedulerConfiguration of HAMi's chart (:func:`scheduler_config`) and the
  scheduler's own flags as the chart passes them (:func:`scheduler_args`);
* each Node's ``hami.io/node-nvidia-register`` as HAMi's device plugin writes it, and
  ``hami.io/node-handshake`` as HAMi's scheduler writes it (:func:`node_annotations`);
* the device plugin's part at the kubelet's Allocate, once HAMi has bound a pod
  (:class:`AllocateStandIn`): bind phase ``success`` and the node lock released.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from common.wire import ReportedCard

PEER_NAME = "hami"
PROCESS = "hami-scheduler"
# charts/hami/values.yaml: schedulerName.
SCHEDULER_NAME = "hami-scheduler"

# pkg/device/nvidia/device.go (constants): the node annotations of the NVIDIA backend.
REGISTER = "hami.io/node-nvidia-register"
HANDSHAKE = "hami.io/node-handshake"
# pkg/util/nodelock/nodelock.go: NodeLockKey, NodeLockSep.
NODE_LOCK = "hami.io/mutex.lock"
NODE_LOCK_SEP = ","
# pkg/util/types.go: DeviceBindPhase, DeviceBindAllocating, DeviceBindSuccess;
# pkg/device/nvidia/device.go:InitNvidiaDevice: InRequestDevices["NVIDIA"].
BIND_PHASE = "hami.io/bind-phase"
ALLOCATING = "allocating"
SUCCESS = "success"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
# pkg/device/devices.go: OneContainerMultiDeviceSplitSymbol, OnePodMultiContainerSplitSymbol.
DEVICE_SEP = ":"
CONTAINER_SEP = ";"
# pkg/device/nvidia/device.go: NvidiaGPUDevice, the common word the device plugin's
# PodAllocationTrySuccess looks for in what is left to allocate (with the other
# backends' words, device.DevicesToHandle; none of them is in an erased annotation).
NVIDIA_WORD = "NVIDIA"

# HAMi's scheduler's Kubernetes client when no flag is given (cmd/scheduler/main.go:init,
# --kube-qps/--kube-burst default to pkg/util/client/options.go DefaultQPS/DefaultBurst =
# client-go's rest.DefaultQPS 5, rest.DefaultBurst 10). The chart passes neither flag.
CHART_CLIENT_LIMITS = (5, 10)


# The chart ------------------------------------------------------------------------------

# charts/hami/templates/_helpers.tpl: hami-vgpu.scheduler.managedResources, with
# charts/hami/values.yaml's defaults (ascend and mthreads' customresources only when those
# devices are enabled: mthreads.com/vgpu comes from its default list). Rendered with
# `helm template` of the v2.10.0 chart; every one is ignoredByScheduler: true.
MANAGED_RESOURCES = (
    "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores",
    "nvidia.com/gpumem-percentage", "nvidia.com/priority", "cambricon.com/vmlu",
    "hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores", "metax-tech.com/gpu",
    "metax-tech.com/sgpu", "metax-tech.com/vcore", "metax-tech.com/vmemory",
    "mthreads.com/vgpu", "enflame.com/drs-gcu", "enflame.com/gcu-memory",
    "enflame.com/gcu-core", "enflame.com/gcu", "kunlunxin.com/xpu", "kunlunxin.com/vxpu",
    "kunlunxin.com/vxpu-memory", "aws.amazon.com/neuron", "aws.amazon.com/neuroncore",
    "vastaitech.com/va", "birentech.com/gpu", "amd.com/gpu", "amd.com/gpumem",
    "amd.com/gpucores",
)


def scheduler_config(extender_url: str, kubeconfig: str, namespace: str, qps: int,
                     burst: int) -> dict[str, Any]:
    """kube-scheduler's configuration as HAMi's chart renders it for Kubernetes 1.26 and
    later (charts/hami/templates/scheduler/configmap.yaml, with the chart's default
    ``scheduler.admissionWebhook.enabled: true``: the extender over HTTPS, its certificate
    not checked). The bench's changes: the extender's address (the chart's is
    ``https://127.0.0.1:443`` in the scheduler's pod), the kubeconfig and client limits
    (the chart sets no ``clientConnection``: kube-scheduler's defaults), and no leader
    election (the chart's ``scheduler.leaderElect`` is true; the bench runs one of each)."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig, "qps": qps, "burst": burst},
        "leaderElection": {"leaderElect": False, "resourceName": SCHEDULER_NAME,
                           "resourceNamespace": namespace},
        "profiles": [{"schedulerName": SCHEDULER_NAME}],
        "extenders": [{
            "urlPrefix": extender_url,
            "enableHTTPS": True,
            "tlsConfig": {"insecure": True},
            "filterVerb": "filter",
            "bindVerb": "bind",
            "nodeCacheCapable": True,
            "weight": 1,
            "httpTimeout": "30s",
            "managedResources": [{"name": name, "ignoredByScheduler": True}
                                 for name in MANAGED_RESOURCES],
        }],
    }


# charts/hami/templates/scheduler/device-configmap.yaml's nvidia: section as the chart
# renders it by default (values.yaml: devicePlugin.deviceSplitCount 10,
# deviceMemoryScaling 1, deviceCoreScaling 1, devices.nvidia.libCudaLogLevel 1; the
# migProfileAllowlist, used only in MIG mode, is left out). Parsed by
# pkg/scheduler/config/config.go:LoadConfig into NvidiaConfig; the other backends'
# sections are left out (InitDevicesWithConfig initialises them with empty names).
DEVICE_CONFIG = """\
nvidia:
  resourceCountName: nvidia.com/gpu
  resourceMemoryName: nvidia.com/gpumem
  resourceMemoryPercentageName: nvidia.com/gpumem-percentage
  resourceCoreName: nvidia.com/gpucores
  resourcePriorityName: nvidia.com/priority
  overwriteEnv: false
  defaultMemory: 0
  defaultCores: 0
  defaultGPUNum: 1
  preConfiguredDeviceMemory: 0
  memoryFactor: 1
  deviceSplitCount: 10
  deviceMemoryScaling: 1
  deviceCoreScaling: 1
  enableNumaTopology: false
  gpuCorePolicy: default
  libCudaLogLevel: 1
  runtimeClassName: ""
"""


def scheduler_args(binary: Path, *, port: int, metrics_port: int, cert_file: Path,
                   key_file: Path, device_config: Path, namespace: str,
                   limits: tuple[int, int] | None) -> list[str]:
    """HAMi's scheduler's command line as charts/hami/templates/scheduler/deployment.yaml
    writes it (container vgpu-scheduler-extender, admission webhook enabled, so TLS), with
    values.yaml's defaults: binpack nodes, spread GPUs, ``scheduler.extender.extraArgs``
    ``--debug -v=4``. Bench changes: loopback ports instead of 0.0.0.0:443 and :9395, no
    leader election (as kube-scheduler and pyhami run here). ``limits``: (qps, burst)
    passed as --kube-qps/--kube-burst; None leaves HAMi's defaults, as the chart does."""
    client = [] if limits is None else [f"--kube-qps={limits[0]}", f"--kube-burst={limits[1]}"]
    return [
        str(binary),
        f"--http_bind=127.0.0.1:{port}",
        f"--cert_file={cert_file}",
        f"--key_file={key_file}",
        f"--scheduler-name={SCHEDULER_NAME}",
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",
        "--node-scheduler-policy=binpack",
        "--gpu-scheduler-policy=spread",
        "--force-overwrite-default-scheduler=true",
        f"--device-config-file={device_config}",
        "--leader-elect=false",
        f"--leader-elect-resource-name={SCHEDULER_NAME}",
        f"--leader-elect-resource-namespace={namespace}",
        *client,
        "--debug",
        "-v=4",
    ]


def scheduler_env(kubeconfig: Path, namespace: str) -> dict[str, str]:
    """The environment the chart gives the extender container (POD_NAME, POD_NAMESPACE,
    HAMI_NODELOCK_EXPIRE from ``scheduler.nodeLockExpire: 5m``), and KUBECONFIG, which
    pkg/util/client/client.go reads before falling back to the in-cluster config."""
    return {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_NAME": PROCESS,
            "POD_NAMESPACE": namespace, "HAMI_NODELOCK_EXPIRE": "5m"}


# The nodes ------------------------------------------------------------------------------


def device_type(name: str) -> str:
    """The registered type of a card (plugin/register.go:getAPIDevices): its NVML name,
    prefixed with ``NVIDIA-`` when it does not start with ``NVIDIA``."""
    return name if name.startswith("NVIDIA") else f"NVIDIA-{name}"


def register_entry(card: ReportedCard) -> dict[str, Any]:
    """One card as pkg/device/devices.go:MarshalNodeDevices writes it: the fields of
    ``DeviceInfo`` in its order (id, index, count, devmem, devcore, type, numa, mode,
    migProfiles, health), each ``omitempty``: a zero value is left out."""
    fields: list[tuple[str, Any]] = [
        ("id", card.uuid), ("index", card.index), ("count", card.count),
        ("devmem", card.memory), ("devcore", card.cores), ("type", device_type(card.type)),
        ("numa", max(card.numa, 0)), ("mode", card.mode), ("health", card.health)]
    return {key: value for key, value in fields if value}


def register_annotation(cards: Iterable[ReportedCard]) -> str:
    """``hami.io/node-nvidia-register``: Go's ``json.Marshal`` of the list, without spaces
    (the bench's card names hold none of the characters Go escapes, ``<>&``)."""
    return json.dumps([register_entry(card) for card in cards], separators=(",", ":"))


def handshake_value(now: datetime) -> str:
    """``hami.io/node-handshake`` as HAMi's scheduler itself writes it on a node that has
    none (pkg/device/devices.go:CheckHealth: ``Requesting_`` and Go's time.DateTime
    layout in the scheduler's local zone). In v2.10.0 the device plugin no longer
    writes it; the bench writes it so that HAMi's first pass finds every node handshaken
    (less than 60 s ago, or later with allocatable nvidia.com/gpu > 0: healthy)."""
    return f"Requesting_{now.strftime('%Y-%m-%d %H:%M:%S')}"


def node_annotations(cards: Iterable[ReportedCard], now: datetime) -> dict[str, str]:
    return {REGISTER: register_annotation(cards), HANDSHAKE: handshake_value(now)}


# The pods -------------------------------------------------------------------------------


def pod_limits() -> dict[str, str]:
    """The same request pyhami's pods make: one vGPU of 1000 MiB."""
    return {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}


# The device plugin's part at Allocate -------------------------------------------------


def lock_owner(value: str) -> tuple[str, str] | None:
    """(namespace, pod) holding a node lock, from pkg/util/nodelock/nodelock.go:
    ParseNodeLock's format ``<RFC3339>,<namespace>,<pod>``; None for the legacy value
    (a time alone) or a malformed one."""
    parts = value.split(NODE_LOCK_SEP)
    if len(parts) != 3:
        return None
    return parts[1], parts[2]


def erase_next_container(to_allocate: str) -> str:
    """What is left to allocate once the kubelet's Allocate has served the next container:
    plugin/util.go:popNextContainerDevices empties the first container entry with
    devices, and plugin/util.go:patchErasedAnnotation writes the pod's entries back with
    pkg/device/devices.go:EncodePodSingleDevice (each entry ends with ``;``)."""
    entries = to_allocate.split(CONTAINER_SEP)
    if entries and entries[-1] == "":
        entries.pop()  # what follows the last entry's ";"
    for number, entry in enumerate(entries):
        if entry:
            entries[number] = ""
            break
    return "".join(f"{entry}{CONTAINER_SEP}" for entry in entries)


def allocation_complete(to_allocate: str, words: Sequence[str] = (NVIDIA_WORD,)) -> bool:
    """plugin/util.go:podAllocationTrySuccess: the pod is done when what is left to
    allocate names no device backend's common word."""
    return not any(word in to_allocate for word in words)


def erase_patch(remaining: str) -> dict[str, Any]:
    """plugin/util.go:patchErasedAnnotation through pkg/util/util.go:PatchPodAnnotations
    (a JSON merge patch of the pod's annotations)."""
    return {"metadata": {"annotations": {TO_ALLOCATE: remaining}}}


def success_patch() -> dict[str, Any]:
    """plugin/util.go:PodAllocationSuccess → updatePodAnnotationsAndReleaseLock: the pod's
    ``hami.io/bind-phase: success`` (PatchPodAnnotations, a JSON merge patch)."""
    return {"metadata": {"annotations": {BIND_PHASE: SUCCESS}}}


def release_lock_patch(resource_version: str) -> dict[str, Any]:
    """pkg/util/nodelock/nodelock.go:ReleaseNodeLock's merge patch of the Node: the lock
    annotation removed, guarded by the Node's resourceVersion."""
    return {"metadata": {"annotations": {NODE_LOCK: None}, "resourceVersion": resource_version}}


def wants_allocate(pod: Mapping[str, Any]) -> bool:
    """A pod the kubelet would now run Allocate for: bound by HAMi (a node, and the bind
    phase ``allocating`` that Bind writes) with something left to allocate."""
    annotations = pod.get("metadata", {}).get("annotations") or {}
    return (bool(pod.get("spec", {}).get("nodeName"))
            and annotations.get(BIND_PHASE) == ALLOCATING
            and not allocation_complete(annotations.get(TO_ALLOCATE, "")))


MERGE = {"Content-Type": "application/merge-patch+json"}


@dataclass
class AllocateStandIn:
    """What HAMi's device plugin does at the kubelet's Allocate, for each pod HAMi binds,
    done from the bench over the API as the plugin does it (the bench has no kubelet;
    without this, HAMi's node lock would hold each node until ``--node-lock-timeout``).

    It stands in for, in HAMi v2.10.0's
    pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go:Allocate (the success
    path, hami-core mode, one container with one GPU):

    1. pkg/util/util.go:GetPendingPod: the Node read, the pod named by its lock
       (``hami.io/mutex.lock``) read (GET node, GET pod);
    2. plugin/util.go:patchErasedAnnotation: ``hami.io/vgpu-devices-to-allocate`` with the
       served container's entry erased (:func:`erase_next_container`; PATCH pod);
    3. plugin/util.go:PodAllocationTrySuccess: the pod read again, and when nothing is left
       to allocate (:func:`allocation_complete`), PodAllocationSuccess →
       updatePodAnnotationsAndReleaseLock: ``hami.io/bind-phase: success`` (PATCH pod,
       :func:`success_patch`) and pkg/util/nodelock/nodelock.go:ReleaseNodeLock (GET
       node, then PATCH node removing the lock if this pod holds it,
       :func:`release_lock_patch`).

    Not played: the container response (env, mounts, HAMi-core's cache directory), the
    kubelet's own gRPC call, the MIG path, the failure path (``failed``)."""

    server: str
    done: set[str] = field(default_factory=set)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    def offer(self, http: aiohttp.ClientSession, pod: Mapping[str, Any]) -> None:
        """Called with each pod the bench's watch sees."""
        name = pod["metadata"]["name"]
        if name in self.done or not wants_allocate(pod):
            return
        self.done.add(name)
        task = asyncio.create_task(self.allocate(http, pod))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def allocate(self, http: aiohttp.ClientSession, pod: Mapping[str, Any]) -> None:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        node_name = pod["spec"]["nodeName"]
        pod_url = f"{self.server}/api/v1/namespaces/{namespace}/pods/{name}"
        node_url = f"{self.server}/api/v1/nodes/{node_name}"
        try:
            await self._get(http, node_url)  # GetPendingPod: the lock names the pod
            current = await self._get(http, pod_url)
            left = current["metadata"].get("annotations", {}).get(TO_ALLOCATE, "")
            await self._patch(http, pod_url, erase_patch(erase_next_container(left)))
            current = await self._get(http, pod_url)  # podAllocationTrySuccess
            if not allocation_complete(current["metadata"].get("annotations", {})
                                       .get(TO_ALLOCATE, "")):
                return
            await self._patch(http, pod_url, success_patch())
            node = await self._get(http, node_url)  # ReleaseNodeLock
            lock = (node["metadata"].get("annotations") or {}).get(NODE_LOCK)
            if lock is None or lock_owner(lock) not in (None, (namespace, name)):
                return
            await self._patch(http, node_url,
                              release_lock_patch(node["metadata"]["resourceVersion"]))
        except Exception as error:  # counted in the report, not fatal
            self.errors.append(f"{name}: {error!r}")

    async def drain(self) -> None:
        while self.tasks:
            await asyncio.gather(*list(self.tasks))

    @staticmethod
    async def _get(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
        async with http.get(url) as response:
            response.raise_for_status()
            body: dict[str, Any] = await response.json()
            return body

    @staticmethod
    async def _patch(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
        async with http.patch(url, data=json.dumps(body), headers=MERGE) as response:
            response.raise_for_status()


# The flag -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    name: str
    binary: Path


def parse_peer(value: str) -> Peer | str:
    """``--peer hami=BINARY``: the peer, or why not in one line."""
    name, sep, binary = value.partition("=")
    if not sep or name != PEER_NAME or not binary:
        return f"--peer {value}: expected {PEER_NAME}=BINARY (HAMi's scheduler, built with " \
               "scripts/build-hami-scheduler.sh)"
    path = Path(binary)
    if not path.is_file() or not os.access(path, os.X_OK):
        return (f"--peer {value}: no executable file {binary} (build it with "
                "scripts/build-hami-scheduler.sh CHECKOUT)")
    return Peer(name, path.resolve())
