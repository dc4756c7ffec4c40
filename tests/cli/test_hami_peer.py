"""``scripts/bench-cluster --peer hami=BINARY``'s harness code, without HAMi: the node
annotations it writes read as HAMi's format (the project's reference,
/work/shared/hami-v2.10-reference.md §0.2, §3.1, §3.2), kube-scheduler's configuration and
HAMi's flags as HAMi v2.10.0's chart renders them, the patches of the Allocate stand-in,
and the flag's refusals."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import yaml
from aiohttp import web

from agent.vendors.nvidia.simulated import profile_cards
from harness import hami_peer
from harness.bench_cluster import schedulers
from tests.paths import REPO

# pkg/device/devices.go:DeviceInfo, its JSON names in field order (MarshalNodeDevices copies
# id, count, devmem, devcore, type, numa, health, index, mode, migProfiles into it).
DEVICE_INFO_ORDER = ("id", "index", "count", "devmem", "devcore", "type", "numa", "mode",
                     "migProfiles", "migtemplate", "health", "devicevendor", "custominfo")
NEVER_WRITTEN = {"devicevendor", "custominfo", "migtemplate"}


def decode_register(value: str) -> list[dict[str, Any]]:
    """As pkg/device/nvidia/device.go:GetNodeDevices reads it: JSON only, a non-empty list."""
    devices = json.loads(value)
    assert isinstance(devices, list) and devices, "no gpu found on node"
    return devices


@pytest.mark.parametrize("profile", ["h100x8-islands", "a100x8-nvswitch", "t4x4"])
def test_register_annotation_reads_as_hamis_json(profile: str) -> None:
    cards = profile_cards(profile, "bench-node-00000")
    value = hami_peer.register_annotation(cards)
    # Go's json.Marshal: no spaces between tokens.
    assert value == json.dumps(json.loads(value), separators=(",", ":"))
    devices = decode_register(value)
    assert len(devices) == len(cards)
    for card, device in zip(cards, devices, strict=True):
        keys = list(device)
        assert keys == [key for key in DEVICE_INFO_ORDER if key in device]
        assert not NEVER_WRITTEN & set(keys)
        assert device["id"] == card.uuid
        assert device.get("index", 0) == card.index  # omitempty: index 0 is left out
        assert ("index" in device) == (card.index != 0)
        assert device["count"] == 10 and device["devcore"] == 100
        assert device["devmem"] == card.memory
        assert device["type"].startswith("NVIDIA")
        assert device["mode"] == "hami-core" and device["health"] is True
        assert "numa" not in device or device["numa"] > 0


@pytest.mark.parametrize(("name", "numa", "index", "expected"), [
    ("NVIDIA H100 80GB HBM3", 1, 1,
     '{"id":"GPU-x","index":1,"count":10,"devmem":81559,"devcore":100,'
     '"type":"NVIDIA H100 80GB HBM3","numa":1,"mode":"hami-core","health":true}'),
    ("Tesla T4", -1, 0,
     '{"id":"GPU-x","count":10,"devmem":81559,"devcore":100,'
     '"type":"NVIDIA-Tesla T4","mode":"hami-core","health":true}'),
    ("NVIDIA A100-SXM4-80GB", 0, 3,
     '{"id":"GPU-x","index":3,"count":10,"devmem":81559,"devcore":100,'
     '"type":"NVIDIA A100-SXM4-80GB","mode":"hami-core","health":true}'),
], ids=["reference-example", "prefixed-type-no-numa", "numa-zero-omitted"])
def test_one_card_is_written_byte_for_byte(name: str, numa: int, index: int,
                                           expected: str) -> None:
    (card, *_) = profile_cards("h100x8-islands", "n")
    card = msgspec.structs.replace(card, uuid="GPU-x", type=name, numa=numa, index=index,
                                   memory=81559)
    assert hami_peer.register_annotation([card]) == f"[{expected}]"


def test_handshake_is_what_hamis_scheduler_writes_and_reads() -> None:
    value = hami_peer.handshake_value(datetime(2026, 12, 7, 0, 8, 5))
    assert value == "Requesting_2026-12-07 00:08:05"
    # pkg/device/devices.go:CheckHealth: contains "Requesting", the time after "_" in
    # Go's time.DateTime layout.
    assert "Requesting" in value
    assert datetime.strptime(value.partition("_")[2], "%Y-%m-%d %H:%M:%S")
    annotations = hami_peer.node_annotations(profile_cards("t4x4", "n"), datetime.now())
    assert set(annotations) == {"hami.io/node-nvidia-register", "hami.io/node-handshake"}


def test_scheduler_config_is_the_charts() -> None:
    """charts/hami/templates/scheduler/configmap.yaml (Kubernetes > 1.25, webhook enabled),
    _helpers.tpl hami-vgpu.scheduler.managedResources, values.yaml schedulerName."""
    config = hami_peer.scheduler_config("https://127.0.0.1:1234", "/k", "ns", 50, 100)
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["profiles"] == [{"schedulerName": "hami-scheduler"}]
    assert config["leaderElection"]["resourceName"] == "hami-scheduler"
    assert config["clientConnection"] == {"kubeconfig": "/k", "qps": 50, "burst": 100}
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "https://127.0.0.1:1234"
    assert extender["enableHTTPS"] is True
    assert extender["tlsConfig"] == {"insecure": True}
    assert extender["filterVerb"] == "filter"
    assert extender["bindVerb"] == "bind"
    assert extender["nodeCacheCapable"] is True
    assert extender["weight"] == 1
    assert extender["httpTimeout"] == "30s"
    assert "prioritizeVerb" not in extender and "preemptVerb" not in extender
    resources = extender["managedResources"]
    assert all(resource["ignoredByScheduler"] is True for resource in resources)
    names = [resource["name"] for resource in resources]
    assert names[:5] == ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores",
                         "nvidia.com/gpumem-percentage", "nvidia.com/priority"]
    assert len(names) == len(set(names)) == 28


@pytest.mark.parametrize(("limits", "client"), [
    (None, []), ((5000, 5000), ["--kube-qps=5000", "--kube-burst=5000"])],
    ids=["chart", "raised"])
def test_scheduler_args_are_the_charts(limits: tuple[int, int] | None,
                                       client: list[str]) -> None:
    """charts/hami/templates/scheduler/deployment.yaml, container vgpu-scheduler-extender."""
    args = hami_peer.scheduler_args(
        Path("/bin/hami"), port=1, metrics_port=2, cert_file=Path("/c"), key_file=Path("/k"),
        device_config=Path("/d"), namespace="ns", limits=limits)
    assert args == ["/bin/hami", "--http_bind=127.0.0.1:1", "--cert_file=/c", "--key_file=/k",
                    "--scheduler-name=hami-scheduler", "--metrics-bind-address=127.0.0.1:2",
                    "--node-scheduler-policy=binpack", "--gpu-scheduler-policy=spread",
                    "--force-overwrite-default-scheduler=true", "--device-config-file=/d",
                    "--leader-elect=false", "--leader-elect-resource-name=hami-scheduler",
                    "--leader-elect-resource-namespace=ns", *client, "--debug", "-v=4"]
    assert hami_peer.CHART_CLIENT_LIMITS == (5, 10)


def test_device_config_is_the_charts_nvidia_section() -> None:
    nvidia = yaml.safe_load(hami_peer.DEVICE_CONFIG)["nvidia"]
    assert nvidia["resourceCountName"] == "nvidia.com/gpu"
    assert nvidia["resourceMemoryName"] == "nvidia.com/gpumem"
    assert nvidia["deviceSplitCount"] == 10 and nvidia["defaultGPUNum"] == 1
    assert nvidia["defaultMemory"] == 0 and nvidia["memoryFactor"] == 1


@pytest.mark.parametrize(("before", "after"), [
    ("GPU-a,NVIDIA,1000,0:;", ";"),
    ("GPU-a,NVIDIA,3000,30:;;GPU-b,NVIDIA,81920,100:GPU-c,NVIDIA,81920,100:;",
     ";;GPU-b,NVIDIA,81920,100:GPU-c,NVIDIA,81920,100:;"),
    (";;GPU-b,NVIDIA,1,1:;", ";;;"),
    (";", ";"),
    ("", ""),
], ids=["one", "first-of-three", "skips-empty", "nothing-left", "empty"])
def test_erase_next_container(before: str, after: str) -> None:
    assert hami_peer.erase_next_container(before) == after


@pytest.mark.parametrize(("left", "complete"), [
    (";", True), ("", True), (";;;", True), ("GPU-a,NVIDIA,1000,0:;", False),
    (";GPU-a,NVIDIA,1000,0:;", False)])
def test_allocation_complete(left: str, complete: bool) -> None:
    assert hami_peer.allocation_complete(left) is complete


def test_the_stand_ins_patches() -> None:
    assert hami_peer.erase_patch(";") == {
        "metadata": {"annotations": {"hami.io/vgpu-devices-to-allocate": ";"}}}
    assert hami_peer.success_patch() == {
        "metadata": {"annotations": {"hami.io/bind-phase": "success"}}}
    patch = hami_peer.release_lock_patch("42")
    assert patch == {"metadata": {"annotations": {"hami.io/mutex.lock": None},
                                  "resourceVersion": "42"}}
    assert json.dumps(patch) == ('{"metadata": {"annotations": {"hami.io/mutex.lock": null}, '
                                 '"resourceVersion": "42"}}')


@pytest.mark.parametrize(("value", "owner"), [
    ("2026-12-07T00:08:05Z,pyhami-bench,hami-raised-00001", ("pyhami-bench",
                                                             "hami-raised-00001")),
    ("2026-12-07T00:08:05Z", None), ("a,b", None)], ids=["owner", "legacy", "malformed"])
def test_lock_owner(value: str, owner: tuple[str, str] | None) -> None:
    assert hami_peer.lock_owner(value) == owner


def pod(node: str | None, phase: str | None, left: str) -> dict[str, Any]:
    annotations = {"hami.io/vgpu-devices-to-allocate": left}
    if phase is not None:
        annotations["hami.io/bind-phase"] = phase
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
            "spec": {"nodeName": node} if node else {}}


@pytest.mark.parametrize(("item", "wanted"), [
    (pod("n", "allocating", "GPU-a,NVIDIA,1000,0:;"), True),
    (pod(None, "allocating", "GPU-a,NVIDIA,1000,0:;"), False),
    (pod("n", None, "GPU-a,NVIDIA,1000,0:;"), False),
    (pod("n", "success", ";"), False),
    (pod("n", "allocating", ";"), False)],
    ids=["bound", "not-bound", "filtered-only", "done", "nothing-left"])
def test_wants_allocate(item: dict[str, Any], wanted: bool) -> None:
    assert hami_peer.wants_allocate(item) is wanted


def test_the_peers_phase_comes_between() -> None:
    peer = hami_peer.Peer("hami", Path("/x"))
    assert schedulers(None) == ("pyhami", "default")
    assert schedulers(peer) == ("pyhami", "hami", "default")


@pytest.mark.parametrize(("value", "message"), [
    ("hami=/no/such/file", "--peer hami=/no/such/file: no executable file /no/such/file "
                           "(build it with scripts/build-hami-scheduler.sh CHECKOUT)"),
    ("volcano=/bin/sh", "--peer volcano=/bin/sh: expected hami=BINARY (HAMi's scheduler, "
                        "built with scripts/build-hami-scheduler.sh)"),
    ("hami", "--peer hami: expected hami=BINARY (HAMi's scheduler, built with "
             "scripts/build-hami-scheduler.sh)"),
], ids=["missing", "other-peer", "no-binary"])
def test_a_bad_peer_is_one_line_and_exit_2(tmp_path: Path, value: str, message: str) -> None:
    for name in ("etcd", "kube-apiserver", "kube-scheduler", "helm"):
        (tmp_path / name).touch(mode=0o755)
    done = subprocess.run(
        [str(REPO / "scripts" / "bench-cluster"), "--nodes", "2", "--pods", "2",
         "--peer", value], cwd=tmp_path,
        env={**os.environ, "PYHAMI_CONTROL_PLANE_DIR": str(tmp_path), "PYTHON": sys.executable},
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == f"bench-cluster: {message}\n"


def test_a_file_that_is_not_executable_is_refused(tmp_path: Path) -> None:
    binary = tmp_path / "scheduler"
    binary.write_text("")
    assert hami_peer.parse_peer(f"hami={binary}") == (
        f"--peer hami={binary}: no executable file {binary} (build it with "
        "scripts/build-hami-scheduler.sh CHECKOUT)")
    binary.chmod(0o755)
    assert hami_peer.parse_peer(f"hami={binary}") == hami_peer.Peer("hami", binary.resolve())


def test_the_stand_in_plays_allocate_over_the_api() -> None:
    """Against a fake API server: the requests, in order, and their bodies."""
    lock = "2026-12-07T00:08:05Z,ns,p"
    state: dict[str, Any] = {
        "pod": {"metadata": {"name": "p", "namespace": "ns", "annotations": {
            "hami.io/bind-phase": "allocating",
            "hami.io/vgpu-devices-to-allocate": "GPU-a,NVIDIA,1000,0:;"}},
            "spec": {"nodeName": "n"}},
        "node": {"metadata": {"name": "n", "resourceVersion": "7",
                              "annotations": {"hami.io/mutex.lock": lock}}}}
    seen: list[tuple[str, str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        kind = "pod" if "/pods/" in request.path else "node"
        body = await request.json() if request.method == "PATCH" else None
        seen.append((request.method, kind, body))
        if body is not None:
            assert request.content_type == "application/merge-patch+json"
            for key, value in body["metadata"].get("annotations", {}).items():
                annotations = state[kind]["metadata"]["annotations"]
                if value is None:
                    annotations.pop(key, None)
                else:
                    annotations[key] = value
        return web.json_response(state[kind])

    async def play() -> hami_peer.AllocateStandIn:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        standin = hami_peer.AllocateStandIn(f"http://127.0.0.1:{port}")
        async with aiohttp.ClientSession() as http:
            standin.offer(http, state["pod"])
            standin.offer(http, state["pod"])  # once per pod
            await standin.drain()
        await runner.cleanup()
        return standin

    standin = asyncio.run(play())
    assert standin.errors == []
    assert seen == [
        ("GET", "node", None), ("GET", "pod", None),
        ("PATCH", "pod", hami_peer.erase_patch(";")), ("GET", "pod", None),
        ("PATCH", "pod", hami_peer.success_patch()), ("GET", "node", None),
        ("PATCH", "node", hami_peer.release_lock_patch("7"))]
    assert state["pod"]["metadata"]["annotations"]["hami.io/bind-phase"] == "success"
    assert "hami.io/mutex.lock" not in state["node"]["metadata"]["annotations"]
