"""Check 2, stream and decide: ``pyhami agent --inventory nvml`` on the real card publishes
its inventory over a local nats-server, received as the daemon receives it
(``pyhami.inventory.>``, ``decode_inventory``); that node, written as a cluster file, is
given to ``pyhami decide`` with a small pod, which must be placed on the real card.

Everything between NVML and a decision runs as in production, in separate processes: the
agent's command line, its NATS client, the wire format, the decision command.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import nats

from agent.vendors.nvidia.nvml import NvmlSource
from common.core.cluster import ClusterFile
from common.wire import INVENTORY_SUBJECTS, Inventory, decode_inventory
from pyhami.natsserver import LocalNatsServer
from tests.gpu.machine import gpu_marks
from tests.gpu.report import CheckLog

pytestmark = gpu_marks()

NODE = "gpu-check"
FIRST_INVENTORY_S = 60.0
POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: gpu-check
  namespace: default
spec:
  containers:
    - name: cuda
      image: none
      resources:
        limits:
          nvidia.com/gpu: 1
          nvidia.com/gpumem: 1000
          nvidia.com/gpucores: 30
"""


def _environment(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}


async def _first_inventory(url: str) -> tuple[Inventory, int | None, str]:
    """Runs the agent on the real NVML until its first inventory arrives, then stops it
    with SIGTERM as Kubernetes does: that inventory, the exit code, its log."""
    client = await nats.connect(url)
    subscription = await client.subscribe(INVENTORY_SUBJECTS)
    await client.flush()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pyhami.cli", "agent", "--node", NODE, "--inventory", "nvml",
        "--poll-interval", "1", env=_environment(PYHAMI_NATS=url),
        stderr=asyncio.subprocess.PIPE)
    try:
        message = await subscription.next_msg(timeout=FIRST_INVENTORY_S)
        inventory = decode_inventory(message.data, message.subject)
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 20)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await client.close()
    return inventory, process.returncode, stderr.decode(errors="replace")


def test_the_agent_streams_the_card_and_decide_places_a_pod_on_it(
        seen: CheckLog, tmp_path: Path) -> None:
    direct = NvmlSource()
    direct.open()
    try:
        expected = {card.uuid: card for card in direct.read()}
    finally:
        direct.close()
    with LocalNatsServer() as server:
        inventory, returncode, log = asyncio.run(_first_inventory(server.url))
    seen.saw("agent_log_tail", log.splitlines()[-20:])
    seen.saw("inventory", {"node": inventory.node, "reason": inventory.reason,
                           "cards": [card.uuid for card in inventory.cards],
                           "slices_enforced": inventory.slices_enforced})
    seen.compare("the agent's exit code after SIGTERM", returncode, 0, theirs_name="expected")
    seen.compare("the node", inventory.node, NODE, ours_name="the inventory",
                 theirs_name="--node")
    for card in inventory.cards:
        direct_card = expected.get(card.uuid)
        if direct_card is None:
            seen.differs(f"card {card.uuid} streamed, but NVML does not list it")
            continue
        for field in ("index", "type", "memory", "numa", "links", "sm_count", "health"):
            seen.compare(f"GPU {card.index} {field}", getattr(card, field),
                         getattr(direct_card, field), ours_name="streamed",
                         theirs_name="read in this process")
    seen.compare("the cards streamed", sorted(c.uuid for c in inventory.cards),
                 sorted(expected), ours_name="streamed", theirs_name="NVML")

    cluster, pod = tmp_path / "cluster.json", tmp_path / "pod.yaml"
    cluster.write_bytes(msgspec.json.encode(ClusterFile(nodes=[inventory.to_node()])))
    pod.write_text(POD)
    done = subprocess.run([sys.executable, "-m", "pyhami.cli", "decide", "--cluster",
                           str(cluster), "--pod", str(pod), "-o", "json"],
                          capture_output=True, text=True, timeout=60, check=False,
                          env=_environment())
    seen.saw("decide_exit", done.returncode)
    assert done.returncode == 0, done.stderr
    decision = json.loads(done.stdout)
    seen.saw("decision", decision)
    assert decision["scheduled"], decision["failed_nodes"]
    chosen = [card["uuid"] for container in decision["devices"] for card in container]
    seen.compare("the node chosen", decision["node"], NODE, ours_name="decide",
                 theirs_name="the agent's")
    seen.saw("chosen", chosen)
    if len(chosen) != 1 or chosen[0] not in expected:
        seen.differs(f"decide chose {chosen}, not one of NVML's cards {sorted(expected)}")
    granted = decision["devices"][0][0]
    seen.compare("the memory granted (MiB)", granted["usedmem"], 1000, ours_name="decide",
                 theirs_name="the pod's")
    seen.compare("the cores granted", granted["usedcores"], 30, ours_name="decide",
                 theirs_name="the pod's")
    seen.assert_same()
