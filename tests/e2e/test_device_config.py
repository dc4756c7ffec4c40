"""A HAMi cluster's device configuration, on the real control plane with a real kubelet.

The agent of gpu-node-2 (four simulated 15,360 MiB T4s) serves its device plugin to the
real kubelet of that node, started with HAMi's files: ``device-config.yaml`` as HAMi's
chart renders it (tests/common/hami, every vendor's section) with keys of its ``nvidia:``
section changed, and a ``config.json`` with an entry for the node. One kubelet serves the
whole module; only the agent restarts between configurations. Shown:

- ``deviceMemoryScaling: 2``: two pods of 15,000 MiB each, binpacked, run on one card,
  and the container config the kubelet passed to the runtime carries
  ``CUDA_OVERSUBSCRIBE=true``;
- the node's ``filterdevices`` (by UUID) and ``devicesplitcount``: the card is absent from
  the Node's allocatable (three cards times the node's split count) and from the cards
  the daemon holds for the node (``/ledgerz``);
- ``nvidia.com/priority: 0`` in a container's limits: the webhook (registered with the
  API server as the chart registers it) writes ``CUDA_TASK_PRIORITY=0`` into the pod, the
  kubelet admits the pod although its Node has no such resource, and the runtime gets it;
- custom resource names (``example.com/vgpu``, ...) given to the agent and to the daemon,
  and to the chart for kube-scheduler's ``managedResources``: the Node's allocatable uses
  the custom count name, and a pod asking under the custom names runs on the card pyhami
  chose. The session's daemon and kube-scheduler run with the custom names from that
  test, the module's last, on; they are restarted as they were once the kubelet's Node
  is gone.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.core.annotations import ALLOCATED_ANNOTATION, CardGrant, decode_devices
from harness.controlplane import (
    ApiError,
    Process,
    chart_scheduler_config,
    wait_for,
)
from scheduler.service.handlers.cordons import CORDON_REFRESH_S
from tests.e2e.controlplane import (
    KUBELET_NODE,
    ControlPlane,
    recorded_env,
)
from tests.e2e.pods import PODS, POLICY, lab_pod
from tests.e2e.test_webhook import CONFIGURATIONS, configuration, dry_run_scheduler, webhook

HAMI_FILES = Path(__file__).parents[1] / "common" / "hami"
T4_MIB = 15360
CARDS = 4
FILTERED = f"GPU-{KUBELET_NODE}-1"
NODE_SPLIT = 4
CUSTOM_NAMES = {"resourceCountName": "example.com/vgpu",
                "resourceMemoryName": "example.com/vgpu-memory",
                "resourceMemoryPercentageName": "example.com/vgpu-memory-percentage",
                "resourceCoreName": "example.com/vgpu-cores",
                "resourcePriorityName": "example.com/vgpu-priority"}
# The same five names under HAMi's chart values, as pyhami's chart takes them.
CUSTOM_CHART_VALUES = {"resourceName": "example.com/vgpu",
                       "resourceMem": "example.com/vgpu-memory",
                       "resourceMemPercentage": "example.com/vgpu-memory-percentage",
                       "resourceCores": "example.com/vgpu-cores",
                       "resourcePriority": "example.com/vgpu-priority"}


def hami_device_config(directory: Path, name: str, **nvidia: object) -> Path:
    """HAMi's chart-rendered ``device-config.yaml`` with ``nvidia`` keys changed."""
    document = yaml.safe_load((HAMI_FILES / "device-config.yaml").read_text())
    document["nvidia"].update(nvidia)
    path = directory / name
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


class KubeletNode:
    """The kubelet's node and its agent, restarted with other device files on demand."""

    def __init__(self, plane: ControlPlane, directory: Path) -> None:
        self.plane = plane
        self.directory = directory
        # A stand-in libvgpu.so: the plugin then gives containers HAMi-core's contract.
        self.hami_core = directory / "vgpu"
        self.hami_core.mkdir()
        (self.hami_core / "libvgpu.so").write_bytes(b"")
        self._agent: Process | None = None
        self._files: tuple[str, ...] = ()
        self.scheduler_changed = False

    def use(self, *files: str) -> None:
        """The agent running with these device file flags (restarted if it runs others)."""
        if self._agent is not None and self._agent.running and files == self._files:
            return
        self.stop_agent()
        plane = self.plane
        self._agent = plane.run("agent-gpu-node-2", [
            *plane.pyhami_command(), "agent", "--node", KUBELET_NODE, "--inventory", "sim:t4x4",
            "--nats", plane.nats_url,
            "--nats-token-file", str(plane.agent_token(KUBELET_NODE)),
            "--device-plugin", "--kubelet-dir", str(plane.kubelet_device_plugins),
            "--hami-core-dir", str(self.hami_core), "--poll-interval", "0.5",
            "--heartbeat-interval", "1", *files])
        self._files = files

    def schedule_with(self, device_config: Path, scheduler_config: dict[str, Any]) -> None:
        """The session's daemon with ``--device-config`` and kube-scheduler with
        ``scheduler_config`` until the module ends (the node fixture restores them)."""
        self.scheduler_changed = True
        self.plane.restart_scheduler("--device-config", str(device_config),
                                     scheduler_config=scheduler_config,
                                     nodes=self.plane.statusz()["nodes"])

    def stop_agent(self) -> None:
        if self._agent is not None:
            self._agent.stop()
        self._agent = None

    def allocatable(self, resource: str) -> int | None:
        node = self.plane.api.get(f"/api/v1/nodes/{KUBELET_NODE}")
        value = node["status"].get("allocatable", {}).get(resource)
        return int(value) if value is not None else None

    def ledger_cards(self) -> dict[str, dict[str, Any]]:
        """The cards the daemon holds for the node, by uuid (``/ledgerz``)."""
        return {card["uuid"]: card for card in self.plane.ledgerz()["cards"]
                if card["node"] == KUBELET_NODE}


@pytest.fixture(scope="module")
def node(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[KubeletNode]:
    plane = control_plane
    plane.start_kubelet()
    kubelet_node = KubeletNode(plane, tmp_path_factory.mktemp("device-config"))
    try:
        yield kubelet_node
    finally:
        kubelet_node.stop_agent()
        plane.stop_kubelet()
        with contextlib.suppress(ApiError):
            plane.api.delete(f"/api/v1/nodes/{KUBELET_NODE}")
        if kubelet_node.scheduler_changed:
            # Restarted now, the session's pair reads the Nodes without this one.
            plane.restart_scheduler(nodes=1)
        else:
            wait_for(lambda: plane.statusz()["nodes"] == 1,
                     f"the daemon forgetting {KUBELET_NODE}", timeout=CORDON_REFRESH_S * 3)


@pytest.fixture(scope="module")
def scaled_and_filtered(node: KubeletNode) -> tuple[str, ...]:
    """The agent's flags: memory scaled by 2 for every node; for this node, card 1 filtered
    by UUID and a split count of its own."""
    device_config = hami_device_config(node.directory, "scaled.yaml", deviceMemoryScaling=2)
    node_config = node.directory / "config.json"
    node_config.write_text(yaml.safe_dump({"nodeconfig": [
        {"name": "some-other-node", "devicesplitcount": 9},
        {"name": KUBELET_NODE, "operatingmode": "hami-core", "devicesplitcount": NODE_SPLIT,
         "filterdevices": {"uuid": [FILTERED], "index": []}}]}))
    return ("--device-config", str(device_config), "--node-config", str(node_config))


def gpu_pod(name: str, limits: dict[str, str],
            annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A lab pod for the kubelet's node with these limits."""
    pod = lab_pod(name, annotations)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": KUBELET_NODE}
    pod["spec"]["containers"][0]["resources"]["limits"] = dict(limits)
    return pod


def wait_running(plane: ControlPlane, name: str) -> dict[str, Any]:
    path = f"{PODS}/{name}"

    def running() -> dict[str, Any] | None:
        stored = plane.api.get(path)
        return stored if stored["status"].get("phase") == "Running" else None

    stored = wait_for(running, f"pod {name} Running on {KUBELET_NODE}",
                      watch=plane.all_processes())
    assert stored["spec"]["nodeName"] == KUBELET_NODE
    return stored


def only_grant(pod: dict[str, Any]) -> CardGrant:
    ((grant,),) = decode_devices(pod["metadata"]["annotations"][ALLOCATED_ANNOTATION])
    return grant


def runtime_env(plane: ControlPlane, name: str) -> dict[str, str]:
    """The environment the kubelet gave the runtime for the pod's one container."""
    created = plane.created_container(name)
    return recorded_env(created)


def test_a_filtered_card_is_neither_advertised_nor_reported(
        node: KubeletNode, scaled_and_filtered: tuple[str, ...]) -> None:
    node.use(*scaled_and_filtered)
    wait_for(lambda: node.allocatable("nvidia.com/gpu") == (CARDS - 1) * NODE_SPLIT,
             f"the Node's nvidia.com/gpu to be {CARDS - 1} cards x {NODE_SPLIT}",
             watch=node.plane.all_processes())

    def three_cards() -> dict[str, dict[str, Any]] | None:
        cards = node.ledger_cards()
        return cards if len(cards) == CARDS - 1 else None

    cards = wait_for(three_cards, f"the daemon to hold {CARDS - 1} cards of {KUBELET_NODE}")
    assert sorted(cards) == [f"GPU-{KUBELET_NODE}-{i}" for i in (0, 2, 3)]
    assert {card["count"] for card in cards.values()} == {NODE_SPLIT}


def test_memory_scaled_by_two_holds_two_15000_mib_pods_on_one_t4(
        node: KubeletNode, scaled_and_filtered: tuple[str, ...], clean_namespace: None) -> None:
    plane = node.plane
    node.use(*scaled_and_filtered)
    wait_for(lambda: {card["memory"] for card in node.ledger_cards().values()} == {2 * T4_MIB},
             f"the daemon to hold {KUBELET_NODE}'s cards at {2 * T4_MIB} MiB")
    wait_for(lambda: node.allocatable("nvidia.com/gpu") == (CARDS - 1) * NODE_SPLIT,
             "the plugin's devices on the Node")
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "15000"}
    for name in ("scaled-a", "scaled-b"):
        plane.api.create(PODS, gpu_pod(name, limits, {POLICY: "binpack"}))
    grants = [only_grant(wait_running(plane, name)) for name in ("scaled-a", "scaled-b")]
    assert grants[0].uuid == grants[1].uuid, f"the pods are on two cards: {grants}"
    assert [grant.memory for grant in grants] == [15000, 15000]
    card = node.ledger_cards()[grants[0].uuid]
    assert (card["usedmem"], card["memory"]) == (30000, 2 * T4_MIB)
    for name in ("scaled-a", "scaled-b"):
        env = runtime_env(plane, name)
        assert env["CUDA_OVERSUBSCRIBE"] == "true", env
        assert env["NVIDIA_VISIBLE_DEVICES"] == grants[0].uuid
        assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "15000m"


@pytest.fixture
def registered_webhook(control_plane: ControlPlane) -> Iterator[None]:
    """The session's daemon registered as the pod webhook, as the chart registers it (but
    at its loopback address); removed afterwards, and waited for."""
    plane = control_plane
    assert plane.webhook_tls is not None
    name = "pyhami-e2e-device-config-webhook"
    ca = base64.b64encode(plane.webhook_tls.ca.read_bytes()).decode()
    plane.api.create(CONFIGURATIONS, configuration(name, webhook(
        "vgpu.pyhami.io", {"url": plane.webhook_url, "caBundle": ca},
        reinvocationPolicy="Never")))
    try:
        wait_for(lambda: dry_run_scheduler(plane) == "pyhami-scheduler",
                 "the API server to call the webhook", watch=plane.all_processes())
        yield
    finally:
        plane.api.delete(f"{CONFIGURATIONS}/{name}")
        wait_for(lambda: dry_run_scheduler(plane) == "default-scheduler",
                 "the API server to stop calling the webhook")


def test_priority_zero_reaches_the_container_as_cuda_task_priority(
        node: KubeletNode, scaled_and_filtered: tuple[str, ...], registered_webhook: None,
        clean_namespace: None) -> None:
    plane = node.plane
    node.use(*scaled_and_filtered)
    wait_for(lambda: node.allocatable("nvidia.com/gpu") == (CARDS - 1) * NODE_SPLIT,
             "the plugin's devices on the Node")
    plane.api.create(PODS, gpu_pod("priority-zero", {
        "nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/priority": "0"}))
    stored = wait_running(plane, "priority-zero")
    # The webhook's patch, in the stored pod; the Node has no nvidia.com/priority, which
    # the kubelet's admission leaves out and kube-scheduler ignores (managedResources).
    (container,) = stored["spec"]["containers"]
    assert {"name": "CUDA_TASK_PRIORITY", "value": "0"} in container.get("env", [])
    node_status = plane.api.get(f"/api/v1/nodes/{KUBELET_NODE}")["status"]
    assert "nvidia.com/priority" not in node_status["allocatable"]
    env = runtime_env(plane, "priority-zero")
    assert env["CUDA_TASK_PRIORITY"] == "0"
    assert env["NVIDIA_VISIBLE_DEVICES"] == only_grant(stored).uuid


@pytest.fixture
def custom_names(node: KubeletNode) -> Path:
    """The custom names' device-config.yaml, given to the session's daemon; kube-scheduler
    with the chart's configuration rendered for the same names. Restored once the kubelet's
    Node is gone (the node fixture)."""
    plane = node.plane
    device_config = hami_device_config(node.directory, "custom-names.yaml", **CUSTOM_NAMES)
    values = [f"{key}={value}" for key, value in CUSTOM_CHART_VALUES.items()]
    config = plane.rendered_scheduler_config(chart_scheduler_config(plane.bin_dir, values))
    (extender,) = config["extenders"]
    assert {entry["name"] for entry in extender["managedResources"]} == set(
        CUSTOM_NAMES.values())
    node.schedule_with(device_config, config)
    return device_config


def test_custom_resource_names_are_advertised_and_scheduled(
        node: KubeletNode, custom_names: Path, clean_namespace: None) -> None:
    plane = node.plane
    node.use("--device-config", str(custom_names))
    wait_for(lambda: node.allocatable("example.com/vgpu") == CARDS * 10,
             "the Node's example.com/vgpu to be 4 cards x 10", watch=plane.all_processes())
    wait_for(lambda: len(node.ledger_cards()) == CARDS,
             f"the daemon to hold {CARDS} cards of {KUBELET_NODE}")
    plane.api.create(PODS, gpu_pod("custom-names", {
        "example.com/vgpu": "1", "example.com/vgpu-memory": "3000",
        "example.com/vgpu-cores": "30"}))
    stored = wait_running(plane, "custom-names")
    grant = only_grant(stored)
    assert (grant.memory, grant.cores) == (3000, 30)
    env = runtime_env(plane, "custom-names")
    assert env["NVIDIA_VISIBLE_DEVICES"] == grant.uuid
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert "CUDA_OVERSUBSCRIBE" not in env
