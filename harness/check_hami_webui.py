"""HAMi-WebUI's server reads the nodes pyhami registers: a manual check.

Starts etcd and kube-apiserver (the control plane the end-to-end suite builds), creates a
Ready node labelled gpu=on whose ``hami.io/node-nvidia-register`` is what pyhami's daemon
writes for the simulated eight-card node ``a100x8-nvswitch``, and a running pod holding a
slice of its first card as pyhami binds one; runs HAMi-WebUI's server (built by
scripts/build-hami-webui.sh) against it, and prints what its node and card lists say.
Exit status 1 when they do not show the node's eight cards and the pod's slice.

    scripts/check-hami-webui /tmp/hami-webui/hami-webui-server
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agent.registration import registered_cards
from agent.vendors.nvidia.simulated import profile_cards
from common.core import Node
from common.core.annotations import (
    ALLOCATED_ANNOTATION,
    VGPU_NODE_LABEL,
    CardGrant,
    encode_devices,
)
from common.core.deviceconfig import NodeDeviceConfig
from common.core.registration import node_register
from common.core.vendors import NVIDIA
from harness.controlplane import ApiServerPlane
from pyhami.natsserver import free_port

BIN = Path.home() / ".cache/pyhami/control-plane/v1.36.3"
NODE = "lab-node"
SLICE = CardGrant("", 3000, 30)
NODE_INFO = {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "6.1.0",
             "osImage": "Debian GNU/Linux 12", "containerRuntimeVersion": "fake://1",
             "kubeletVersion": "v1.36.3", "kubeProxyVersion": "", "operatingSystem": "linux",
             "architecture": "amd64"}
CONFIG = """server:
  http: {{addr: 127.0.0.1:{http}, timeout: 60s}}
  grpc: {{addr: 127.0.0.1:{grpc}, timeout: 60s}}
prometheus: {{address: http://127.0.0.1:{prometheus}, timeout: 5s}}
exporter: {{interval: 30s, timeout: 60s}}
node_selectors:
  NVIDIA: gpu=on
  Ascend: ascend=on
  DCU: dcu=on
  MLU: mlu=on
  Metax: metax-tech.com/gpu.installed=true
"""


def post(url: str) -> Any:
    request = urllib.request.Request(url, data=b'{"filters":{}}', method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=20) as answer:
        return json.loads(answer.read())


def prepare(plane: ApiServerPlane) -> str:
    """The node and the pod, as pyhami leaves them; returns the first card's uuid."""
    api = plane.api
    cards = registered_cards(profile_cards("a100x8-nvswitch", NODE), NodeDeviceConfig())
    register = node_register(Node(name=NODE, cards=[card.card() for card in cards]))
    node = api.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": NODE, "labels": {"gpu": "on"},
        "annotations": {NVIDIA.register_annotation: register}}})
    node["status"] = {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                      "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                      "message": "ok",
                                      "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                      "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                      "nodeInfo": NODE_INFO}
    api.send("PUT", f"/api/v1/nodes/{NODE}/status", node)
    api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": "lab"}})
    api.create("/api/v1/namespaces/lab/serviceaccounts",
               {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "lab"}})
    grant = CardGrant(cards[0].uuid, SLICE.memory, SLICE.cores)
    pod = api.create("/api/v1/namespaces/lab/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "train", "namespace": "lab", "labels": {VGPU_NODE_LABEL: NODE},
        "annotations": {VGPU_NODE_LABEL: NODE, ALLOCATED_ANNOTATION: encode_devices([[grant]])}},
        "spec": {"nodeName": NODE, "serviceAccountName": "lab",
                 "automountServiceAccountToken": False, "containers": [{
                     "name": "main", "image": "lab", "resources": {"limits": {
                         "nvidia.com/gpu": "1", "nvidia.com/gpumem": str(SLICE.memory)}}}]}})
    pod["status"] = {"phase": "Running"}
    api.send("PUT", "/api/v1/namespaces/lab/pods/train/status", pod)
    return cards[0].uuid


def main(webui: str) -> int:
    scratch = Path(tempfile.mkdtemp(prefix="pyhami-webui-"))
    (scratch / "logs").mkdir()
    plane = ApiServerPlane(bin_dir=BIN, logs=scratch / "logs", data=scratch)
    server = None
    try:
        plane.start_etcd()
        plane.start_apiserver()
        first = prepare(plane)
        http = free_port()
        config = scratch / "config.yaml"
        config.write_text(CONFIG.format(http=http, grpc=free_port(), prometheus=free_port()))
        with (scratch / "logs" / "webui.log").open("w") as log:
            server = subprocess.Popen([webui, "-conf", str(config),
                                       "--kubeconfig", str(plane.admin_kubeconfig)],
                                      stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{http}"
        for _ in range(100):
            try:
                if urllib.request.urlopen(f"{base}/readyz", timeout=2).read() == b"ok":
                    break
            except OSError:
                time.sleep(0.2)
        time.sleep(2)  # its informers' first lists
        (node,) = post(f"{base}/v1/nodes")["list"]
        gpus = {gpu["uuid"]: gpu for gpu in post(f"{base}/v1/gpus")["list"]}
        print(json.dumps({"node": node, "first_card": gpus.get(first)}, indent=2))
        shown = (node["name"], node["cardCnt"], node["vgpuTotal"], node["memoryTotal"],
                 node["memoryUsed"], node["coreUsed"], len(gpus))
        expected = (NODE, 8, 80, 8 * 81920, SLICE.memory, SLICE.cores, 8)
        print("as expected" if shown == expected else f"shown {shown}, expected {expected}")
        return 0 if shown == expected else 1
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        plane.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
