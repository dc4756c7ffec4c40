"""The article's lab against the live daemon: real nats-server, a simulated agent,
the standalone cluster, every step over HTTP."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

from pyhami.demo import lab_pod
from tests.harness import Lab, card_of, eventually

GPU = [f"GPU-gpu-node-1-{i}" for i in range(4)]
BINPACK = {"hami.io/gpu-scheduler-policy": "binpack"}


async def test_default_spread_walks_the_cards(lab: Lab) -> None:
    placed = [card_of(await lab.pods.submit_and_place(lab_pod(f"spread-{i}")))
              for i in range(4)]
    assert placed == GPU


async def test_binpack_stacks_on_one_card(lab: Lab) -> None:
    placed = [await lab.pods.submit_and_place(lab_pod(f"binpack-{i}", BINPACK))
              for i in range(3)]
    assert placed == [f"{GPU[0]},NVIDIA,1000,0:;"] * 3


async def test_mutex_waits_for_a_free_card_then_lands_on_it(lab: Lab) -> None:
    for i in range(4):
        await lab.pods.submit_and_place(lab_pod(f"tenant-{i}"))
    await lab.pods.submit(lab_pod("mutex", {"hami.io/gpu-scheduler-policy": "mutex"}))
    pending = await lab.pods.pending_with("mutex", "FilteringFailed")
    assert pending["node"] is None
    failed = [(e["type"], e["message"]) for e in pending["events"]
              if e["reason"] == "FilteringFailed"]
    # HAMi's per-reason Event, then its summary carrying pyhami's sentence.
    assert failed == [("Warning", "1 nodes ExclusiveDeviceAllocateConflict(gpu-node-1)"),
                      ("Warning", "no available node, 1 nodes do not meet: asked for 1 card "
                       "with 1000 MiB; gpu-node-1: 4/4 ExclusiveDeviceAllocateConflict (in use)")]
    await lab.pods.delete("tenant-1")
    placed = await lab.pods.placed("mutex")
    assert card_of(placed["annotations"]["hami.io/vgpu-devices-allocated"]) == GPU[1]


async def test_mutex_binpack_refuses_the_card_plain_binpack_picks(lab: Lab) -> None:
    await lab.pods.submit_and_place(lab_pod("binpack-a", BINPACK))
    await lab.pods.submit_and_place(lab_pod("binpack-b", BINPACK))
    await lab.pods.submit_and_place(lab_pod("pinned", {"nvidia.com/use-gpuuuid": GPU[1]}))
    composed = {"hami.io/gpu-scheduler-policy": "mutex,binpack"}
    assert card_of(await lab.pods.submit_and_place(lab_pod("mutex-binpack", composed))) == GPU[2]
    await lab.pods.delete("mutex-binpack")
    assert card_of(await lab.pods.submit_and_place(lab_pod("plain-binpack", BINPACK))) == GPU[0]


async def test_bind_writes_the_allocation_annotations(lab: Lab) -> None:
    await lab.pods.submit_and_place(lab_pod("one", limits={"nvidia.com/gpu": 1,
                                                           "nvidia.com/gpumem": 2000,
                                                           "nvidia.com/gpucores": 30}))
    pod = await lab.pods.get("one")
    notes = pod["annotations"]
    assert notes["hami.io/vgpu-devices-allocated"] == f"{GPU[0]},NVIDIA,2000,30:;"
    assert notes["hami.io/vgpu-devices-to-allocate"] == notes["hami.io/vgpu-devices-allocated"]
    assert notes["hami.io/vgpu-node"] == "gpu-node-1"
    assert notes["hami.io/bind-phase"] == "allocating"
    assert notes["hami.io/vgpu-time"].isdigit() and notes["hami.io/bind-time"].isdigit()
    assert pod["node"] == "gpu-node-1"


async def test_explain_against_the_running_daemon_books_nothing(lab: Lab, tmp_path: Path) -> None:
    binpack = {"hami.io/gpu-scheduler-policy": "binpack"}
    await lab.pods.submit_and_place(lab_pod("a", binpack))
    pod = tmp_path / "pod.yaml"
    pod.write_text(json.dumps(lab_pod("question", binpack)))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pyhami.cli", "explain", str(pod), "--daemon", lab.daemon.url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={"COLUMNS": "120", "PATH": "/usr/bin:/bin"})
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    text = out.decode()
    assert re.search(r"GPU 0\s+1\s+1\.651042\s+-\s+1\s+<- chosen", text)
    assert "-> GPU 0 on gpu-node-1" in text
    assert lab.daemon.service is not None
    assert lab.daemon.service.state.cache.reservation("default/question") is None
    assert lab.daemon.service.state.fleet.usage("gpu-node-1", GPU[0]).tenants == 1


async def test_a_pod_refused_again_and_again_has_one_event_whose_count_rises(
        lab: Lab, tmp_path: Path) -> None:
    cards, asked = len(GPU), len(GPU) + 1
    big = lab_pod("big", limits={"nvidia.com/gpu": asked, "nvidia.com/gpumem": 1000})
    await lab.pods.submit(big)
    refusals: list[dict[str, object]] = []

    async def refused_twice() -> bool:
        nonlocal refusals
        pod = await lab.pods.get("big")
        refusals = [e for e in pod["events"] if e["reason"] == "FilteringFailed"]
        return all(int(str(e["count"])) >= 2 for e in refusals) and len(refusals) == 2

    await eventually(refused_twice, "the pending loop to refuse the pod twice")
    by_reason, summary = refusals
    assert by_reason["message"] == "1 nodes NodeInsufficientDevice(gpu-node-1)"
    sentence = (f"asked for {asked} cards with 1000 MiB each; "
                f"gpu-node-1 has {cards} cards (NodeInsufficientDevice)")
    assert summary["message"] == f"no available node, 1 nodes do not meet: {sentence}"
    assert float(str(summary["first_time"])) <= float(str(summary["last_time"]))

    pod = tmp_path / "big.json"
    pod.write_text(json.dumps(big))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pyhami.cli", "explain", str(pod), "--daemon", lab.daemon.url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={"COLUMNS": "500", "PATH": "/usr/bin:/bin"})
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    assert f"-> Pending: {sentence}\n" in out.decode()
