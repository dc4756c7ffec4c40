"""The daemon's side of the API server, measured by CPU: Binding POSTs and pod watch events
through ``scheduler.cluster.kube``'s transport, against a real kube-apiserver (etcd and
kube-apiserver of the end-to-end suite, over TLS with a token).

    PYTHONPATH=. python harness/benchmarks/kube_client.py [--pods 400] [--rounds 2]

For each HTTP client the transport has (the lean one; aiohttp's, which it keeps for a
proxy), alternating, ``--rounds`` times: ``--pods`` Binding POSTs one after the other
(CPU a call); a pod watch started from before the pods were created, read until it has
delivered every creation and binding, which the API server sends in large reads (CPU an
event, replayed); a pod watch as ``--pods`` pods are patched one at a time by another
process, each event in a read of its own as in the daemon (CPU an event, live). On code
where the transport has one client, that one is measured. CPU is this process's
(``time.process_time``), on uvloop as the daemon runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from harness.controlplane import ApiServerPlane, binaries_dir
from scheduler.cluster.kube import _client, _transport, _watch
from scheduler.cluster.kube._requests import binding_body

NAMESPACE = "bench-client"


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE,
                         "labels": {"app": "bench"}, "annotations": {"team": "a"}},
            "spec": {"schedulerName": "pyhami-scheduler", "terminationGracePeriodSeconds": 0,
                     "automountServiceAccountToken": False,
                     "containers": [{"name": "app", "image": "busybox",
                                     "command": ["sleep", "infinity"],
                                     "resources": {"limits": {"nvidia.com/gpu": "1",
                                                              "nvidia.com/gpumem": "1000"}}}]}}


def transports(kubeconfig: Path) -> dict[str, _transport.ApiTransport]:
    lean = _client.load_kubeconfig(str(kubeconfig), None)
    made = {"default": lean}
    try:
        from scheduler.cluster.kube._aiohttp import AiohttpClient  # noqa: PLC0415
    except ImportError:  # code from before the lean client: one client only
        return made
    endpoint = lean._endpoint
    made["aiohttp"] = _transport.ApiTransport(endpoint, AiohttpClient(endpoint))
    return made


async def bind_all(api: _transport.ApiTransport, pods: list[tuple[str, str]]) -> float:
    """CPU ms a Binding POST, one after the other."""
    await _client.create_binding(api, NAMESPACE, pods[0][0], binding_body(
        NAMESPACE, pods[0][0], pods[0][1], "node-0"))  # the connection opened, not counted
    started = time.process_time()
    for number, (name, uid) in enumerate(pods[1:]):
        await _client.create_binding(api, NAMESPACE, name, binding_body(
            NAMESPACE, name, uid, f"node-{number % 50}", annotations={"pyhami/x": "y"}))
    return (time.process_time() - started) * 1e3 / (len(pods) - 1)


async def watch_all(api: _transport.ApiTransport, version: str, events: int) -> float:
    """CPU ms a watch event, from ``version`` until ``events`` changes were delivered."""
    delivered = 0
    done = asyncio.Event()

    def deliver(_: object) -> None:
        nonlocal delivered
        delivered += 1
        if delivered >= events:
            done.set()

    watcher = _watch.ListWatcher(api, _client.PODS, deliver,
                                 _client.Snapshot([], version), _watch.UnreadableLog())
    started = time.process_time()
    watcher.start()
    await asyncio.wait_for(done.wait(), 120)
    spent = time.process_time() - started
    await watcher.stop()
    return spent * 1e3 / delivered


# Patches each pod named on stdin once, one request after the other, in a process of its
# own: its CPU is not the watch's.
PATCHER = """
import json, sys
from pathlib import Path
from harness.controlplane import KubeApi
job = json.load(sys.stdin)
api = KubeApi(job["server"], job["token"], Path(job["ca"]))
for number, name in enumerate(job["names"]):
    api.request("PATCH", f"/api/v1/namespaces/{job['namespace']}/pods/{name}",
                {"metadata": {"annotations": {"patched": f"{job['tag']}-{number}"}}},
                content_type="application/merge-patch+json")
"""


async def watch_live(plane: ApiServerPlane, api: _transport.ApiTransport,
                     names: list[str]) -> float:
    """CPU ms a watch event as another process patches each of ``names`` once."""
    version = plane.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods", limit="1")["metadata"][
        "resourceVersion"]
    delivered = 0
    done = asyncio.Event()

    def deliver(_: object) -> None:
        nonlocal delivered
        delivered += 1
        if delivered >= len(names):
            done.set()

    watcher = _watch.ListWatcher(api, _client.PODS, deliver,
                                 _client.Snapshot([], version), _watch.UnreadableLog())
    watcher.start()
    await asyncio.sleep(0.5)  # the watch open before the first patch
    patcher = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PATCHER, stdin=subprocess.PIPE)
    started = time.process_time()
    await patcher.communicate(json.dumps({
        "server": plane.server, "token": plane.api.token, "ca": str(plane.ca_file),
        "namespace": NAMESPACE, "names": names, "tag": version}).encode())
    await asyncio.wait_for(done.wait(), 120)
    spent = time.process_time() - started
    await watcher.stop()
    return spent * 1e3 / delivered


async def measure(plane: ApiServerPlane, kubeconfig: Path, pods: int,
                  rounds: int) -> dict[str, dict[str, list[float]]]:
    apis = transports(kubeconfig)
    figures: dict[str, dict[str, list[float]]] = {
        kind: {"bind_ms": [], "watch_event_replayed_ms": [], "watch_event_live_ms": []}
        for kind in apis}
    version = plane.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["metadata"][
        "resourceVersion"]
    created = 0
    names: list[str] = []
    for round_number in range(rounds):
        for kind, api in apis.items():
            names = [f"p-{round_number}-{kind}-{number}" for number in range(pods)]
            uids = [plane.api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod(name))[
                "metadata"]["uid"] for name in names]
            created += pods
            figures[kind]["bind_ms"].append(
                round(await bind_all(api, list(zip(names, uids, strict=True))), 4))
    for _ in range(rounds):
        for kind, api in apis.items():
            # Every creation and every binding of every round, replayed.
            figures[kind]["watch_event_replayed_ms"].append(
                round(await watch_all(api, version, 2 * created), 4))
            figures[kind]["watch_event_live_ms"].append(
                round(await watch_live(plane, api, names), 4))
    for api in apis.values():
        await api.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pyhami-bench-client-") as data:
        plane = ApiServerPlane(bin_dir=binaries_dir(), logs=Path(data), data=Path(data))
        try:
            plane.start_etcd()
            plane.start_apiserver()
            plane.create_namespace(NAMESPACE)
            figures = uvloop.run(measure(plane, plane.admin_kubeconfig, args.pods, args.rounds))
        finally:
            plane.stop()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
