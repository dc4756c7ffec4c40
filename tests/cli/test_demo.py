"""``pyhami demo`` and ``pyhami explain`` as a newcomer runs them."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from pyhami.demo import DEMO_NAMESPACE, DEMO_SCHEDULER, lab_pod
from pyhami.natsserver import free_port
from pyhami.sandbox import SimulatedAgent
from tests.harness import Lab
from tests.paths import EXAMPLES

pytestmark = pytest.mark.slow  # the demo replayed end to end, in processes


def pyhami(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyhami.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env={"COLUMNS": "120", "PATH": "/usr/bin:/bin"})


def landed(output: str, pod: str) -> list[str]:
    """Every 'pod policy -> result' line printed for ``pod``, in order."""
    return [m.group(1) for line in output.splitlines()
            if (m := re.match(rf"\s+{re.escape(pod)}\s+\S+\s+-> (.*)$", line))]


def assert_the_lab_played_on(out: str, node: str) -> None:
    """The article's four steps, as the demo prints them, on ``node``."""
    assert [landed(out, f"spread-{i}") for i in range(4)] == [
        [f"GPU {i} on {node}"] for i in range(4)]
    assert [landed(out, f"binpack-{i}") for i in range(3)] == [[f"GPU 0 on {node}"]] * 3
    assert landed(out, "mutex") == [
        f"Pending ({node}: 4/4 ExclusiveDeviceAllocateConflict)", f"GPU 1 on {node}"]
    assert "mutex was waiting and is now placed, without being submitted again" in out
    assert out.index("deleted tenant-1") < out.index("mutex was waiting")
    assert landed(out, "mutex-binpack") == [f"GPU 2 on {node}"]
    assert landed(out, "plain-binpack") == [f"GPU 0 on {node}"]


def port_is_closed(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_the_demo_replays_the_article() -> None:
    nats_port = free_port()
    done = pyhami("demo", "--nats-port", str(nats_port))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert_the_lab_played_on(out, "gpu-node-1")
    # The selection path of mutex-binpack: GPU 0 and 1 removed with their scores.
    path = out[out.index("mutex-binpack   mutex,binpack"):]
    assert re.search(r"GPU 0\s+2\s+3\.302083\s+ExclusiveDeviceAllocateConflict\s+-", path)
    assert re.search(r"GPU 1\s+1\s+1\.651042\s+ExclusiveDeviceAllocateConflict\s+-", path)
    assert re.search(r"GPU 2\s+0\s+0\.000000\s+-\s+1\s+<- chosen", path)
    assert "summary" in out
    assert port_is_closed(nats_port), "the demo left its nats-server running"


def test_a_scenario_file_plays_the_users_steps(tmp_path: Path) -> None:
    (tmp_path / "pod.yaml").write_text(EXAMPLES.joinpath("binpack-pod.yaml").read_text())
    (tmp_path / "scenario.yaml").write_text("""
- title: my own steps
- submit: pod.yaml
- submit:
    metadata: {name: exclusive, annotations: {hami.io/gpu-scheduler-policy: mutex}}
    spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: 2}}}]}
- delete: plain-binpack
""")
    done = pyhami("demo", "--scenario", tmp_path / "scenario.yaml")
    assert done.returncode == 0, done.stderr
    assert "my own steps" in done.stdout
    assert landed(done.stdout, "plain-binpack") == ["GPU 0 on gpu-node-1"]
    assert landed(done.stdout, "exclusive") == ["GPU 1, GPU 2 on gpu-node-1"]
    assert "deleted plain-binpack" in done.stdout


def test_a_bad_scenario_is_named(tmp_path: Path) -> None:
    (tmp_path / "scenario.yaml").write_text("- launch: rockets\n")
    done = pyhami("demo", "--scenario", tmp_path / "scenario.yaml")
    assert done.returncode == 2
    assert "scenario.yaml: step 1: 'launch' with str is not a step" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_taken_port_gets_a_clear_message_and_nothing_is_left() -> None:
    nats_port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = pyhami("demo", "--port", str(port), "--nats-port", str(nats_port))
    assert done.returncode == 1
    assert "is the port taken? choose another with --port" in done.stderr
    assert "Traceback" not in done.stderr
    assert port_is_closed(nats_port)


def test_ctrl_c_stops_everything() -> None:
    nats_port = free_port()
    demo = subprocess.Popen([sys.executable, "-m", "pyhami.cli", "demo", "--nats-port",
                             str(nats_port), "--nodes", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while port_is_closed(nats_port) and demo.poll() is None:
        assert time.monotonic() < deadline, "the demo never started nats-server"
        time.sleep(0.02)
    demo.send_signal(signal.SIGINT)
    _, err = demo.communicate(timeout=60)
    assert demo.returncode in (0, 130), err
    if demo.returncode == 130:
        assert "interrupted; everything it started is stopped" in err
    assert "Traceback" not in err
    assert port_is_closed(nats_port)


def test_explain_draws_the_selection_path_from_a_cluster_file() -> None:
    done = pyhami("explain", EXAMPLES / "mutex-binpack-pod.yaml", "--cluster",
                  EXAMPLES / "lab-cluster.json")
    assert done.returncode == 0, done.stderr
    assert re.search(r"GPU 0\s+2\s+3\.302083\s+ExclusiveDeviceAllocateConflict", done.stdout)
    assert re.search(r"GPU 2\s+0\s+0\.000000\s+-\s+1\s+<- chosen", done.stdout)
    assert "-> GPU 2 on gpu-node-1" in done.stdout


# The demo on a running stack (the compose `demo` service) -----------------------------


async def test_the_demo_drives_a_running_daemon_and_leaves_its_pods_alone(
        lab: Lab, tmp_path: Path) -> None:
    # A second node the lab must not spill onto, and a user's pod the daemon's own loop
    # places, as in the compose stack.
    second = SimulatedAgent.start("sim-a100", lab.nats.url, "a100x8-nvswitch")
    try:
        user_pod = lab_pod("users-own", {"nvidia.com/use-gputype": "A100"})
        await lab.pods.submit(user_pod)
        assert (await lab.pods.placed("users-own"))["node"] == "sim-a100"
        # What an aborted run left behind is cleared first.
        leftover = lab_pod("spread-0")
        leftover["metadata"]["namespace"] = DEMO_NAMESPACE
        leftover["spec"]["schedulerName"] = DEMO_SCHEDULER
        await lab.pods.submit(leftover)

        done = await asyncio.to_thread(
            pyhami, "demo", "--daemon", lab.daemon.url, "--lab-node", "gpu-node-1")
        assert done.returncode == 0, done.stderr
        out = done.stdout
        # The lab's results, on the named node only.
        assert_the_lab_played_on(out, "gpu-node-1")
        assert "sim-a100" not in out
        remaining = await lab.pods.pods()
        assert [p["name"] for p in remaining if p["namespace"] == DEMO_NAMESPACE] == []
        assert (await lab.pods.get("users-own"))["node"] == "sim-a100"
    finally:
        await second.halt()


async def test_the_daemon_leaves_pods_naming_another_scheduler_to_it(lab: Lab) -> None:
    theirs = lab_pod("theirs")
    theirs["spec"]["schedulerName"] = "someone-else"
    ours = lab_pod("ours")
    ours["spec"]["schedulerName"] = "pyhami-scheduler"
    await lab.pods.submit(theirs)
    await lab.pods.submit(ours)
    # One round of the daemon's loop takes the pending pods in the order they came.
    await lab.pods.placed("ours")
    assert (await lab.pods.get("theirs"))["node"] is None


def test_a_daemon_that_never_gets_ready_is_named() -> None:
    port = free_port()
    done = pyhami("demo", "--daemon", f"http://127.0.0.1:{port}", "--ready-timeout", "1")
    assert done.returncode == 1
    assert done.stderr.startswith(f"pyhami demo: http://127.0.0.1:{port}: not ready for the "
                                  "demo after 1 s (")


async def test_explain_offers_only_the_nodes_named_in_the_query(
        lab: Lab, http: aiohttp.ClientSession) -> None:
    pod = lab_pod("looker")
    async with http.post(f"{lab.daemon.url}/explain?node=elsewhere", json=pod) as response:
        assert response.status == 200
        document = await response.json()
    assert document["node"] is None
    assert list(document["failed_nodes"]) == ["elsewhere"]  # gpu-node-1 was not offered
    assert document["failed_nodes"]["elsewhere"].startswith("NodeUnknown")
    async with http.post(f"{lab.daemon.url}/explain?node=gpu-node-1", json=pod) as response:
        assert (await response.json())["node"] == "gpu-node-1"
    async with http.post(f"{lab.daemon.url}/explain?node=Not_A_Node", json=pod) as response:
        assert response.status == 400
        assert "node" in await response.text()


QUOTA_SENTENCE = ("{namespace} would use 6000 of 4000 MiB nvidia.com/gpumem under "
                  "ResourceQuota gpu-quota (asked 3000)")


def assert_the_quota_scenario_played_on(out: str, node: str, namespace: str) -> None:
    sentence = QUOTA_SENTENCE.format(namespace=namespace)
    waited = f"Pending ({node}: 4/4 ResourceQuotaNotFit ({sentence}))"
    assert landed(out, "first") == [f"GPU 0 on {node}"]
    assert landed(out, "second") == [waited, f"GPU 0 on {node}"]
    assert landed(out, "third") == [waited, f"GPU 1 on {node}"]
    assert f"ResourceQuota gpu-quota in {namespace}: limits.nvidia.com/gpumem 8000" in out
    assert out.index("gpumem 8000") < out.index("third was waiting and is now placed")


def test_the_quota_scenario_caps_a_namespace_until_the_quota_is_raised() -> None:
    done = pyhami("demo", "--scenario", EXAMPLES / "quota-scenario.yaml")
    assert done.returncode == 0, done.stderr
    assert_the_quota_scenario_played_on(done.stdout, "gpu-node-1", "default")


async def test_the_demo_clears_the_quotas_of_its_namespace_on_a_running_daemon(
        lab: Lab, http: aiohttp.ClientSession) -> None:
    quotas = f"{lab.daemon.url}/api/resourcequotas"
    leftover = {"kind": "ResourceQuota", "metadata": {"name": "leftover",
                                                      "namespace": DEMO_NAMESPACE},
                "spec": {"hard": {"limits.nvidia.com/gpumem": "1"}}}
    async with http.post(quotas, json=leftover) as response:
        assert response.status == 201

    done = await asyncio.to_thread(pyhami, "demo", "--daemon", lab.daemon.url, "--scenario",
                                   EXAMPLES / "quota-scenario.yaml")
    assert done.returncode == 0, done.stderr
    assert_the_quota_scenario_played_on(done.stdout, "gpu-node-1", DEMO_NAMESPACE)
    async with http.get(quotas) as response:
        assert (await response.json())["items"] == []
