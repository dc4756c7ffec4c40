"""Check 3, the node monitor on real NVML: a real CUDA process (``tests.gpu.cuda_worker``,
512 MiB and a small kernel in a loop) must be seen by ``NvmlSource.gpu_processes`` under
its own pid with at least the memory it took, and the node monitor (``NodeMonitor``, as the
agent runs it) must attribute it to the pod and container holding the card, through the
process's cgroup, as it does on a Kubernetes node.

Where cgroup v2 is writable here (root, no container runtime needed), the worker is moved
into a cgroup laid out as the kubelet lays a pod's (``kubepods/besteffort/pod<uid>/
cri-containerd-<id>.scope``) and the monitor reads the real ``/proc``. Where it is not, the
monitor reads a ``/proc`` of the check's own holding that cgroup line for the worker's pid:
the pid NVML gives is still the real one, only the cgroup is written by hand. The report
says which.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import secrets
import select
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pynvml
import pytest

from agent.monitor.containers import CacheSettings
from agent.monitor.model import ContainerUsage, GpuProcess
from agent.monitor.monitor import MonitorSettings, NodeMonitor
from agent.vendors.nvidia.nvml import NvmlSource
from common.wire import HoldingContainer, HoldingPod
from tests.gpu.machine import gpu_marks
from tests.gpu.report import CheckLog

pytestmark = gpu_marks()

MIB = 1024 * 1024
ALLOCATED_MIB = 512
CONTEXT_ALLOWANCE_MIB = 3072
"""What a CUDA context (and a framework's own buffers) may hold beside the allocation."""
BACKENDS = ("cupy", "torch", "driver")
READY_S = 120.0
SEEN_WITHIN_S = 30.0
CGROUP_ROOT = Path("/sys/fs/cgroup")
POD, NAMESPACE, CONTAINER = "cuda-worker", "gpu-check", "cuda"


class Holding:
    """Plays the daemon's list of the pods holding cards on the node (``HoldingSource``)."""

    def __init__(self, pods: list[HoldingPod]) -> None:
        self._pods = pods

    async def holding_pods(self, node: str) -> list[HoldingPod]:
        return list(self._pods)


def _ready_line(process: subprocess.Popen[str]) -> dict[str, Any]:
    """The worker's first line (it writes it whole, at once); {"ready": false, ...} when it
    ended or said nothing in time."""
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], READY_S)
    if not readable:
        return {"ready": False, "error": f"not ready within {READY_S:.0f} s"}
    line = process.stdout.readline()
    if not line:
        return {"ready": False, "error": f"exited {process.wait()} saying nothing"}
    answer: dict[str, Any] = json.loads(line)
    return answer


@contextmanager
def cuda_worker(seen: CheckLog, device: int) -> Iterator[dict[str, Any]]:
    """The first backend that starts; the worker killed on the way out."""
    attempts = []
    for backend in BACKENDS:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.gpu.cuda_worker", "--backend", backend,
             "--mib", str(ALLOCATED_MIB), "--device", str(device)],
            stdout=subprocess.PIPE, text=True)
        try:
            ready = _ready_line(process)
            attempts.append(ready)
            if ready.get("ready"):
                seen.saw("cuda_worker", attempts)
                yield ready
                return
        finally:
            process.kill()
            process.wait()
    seen.saw("cuda_worker", attempts)
    pytest.fail(f"no CUDA backend started: {attempts}")


def _remove_cgroups(top: Path) -> None:
    """rmdir from the leaf up: a cgroup's folder goes once its processes have left."""
    for folder, _, _ in sorted(os.walk(top), key=lambda entry: -len(entry[0])):
        with suppress(OSError):
            os.rmdir(folder)


def in_pod_cgroup(pid: int, uid: str, scratch: Path) -> tuple[Path, str, Path | None]:
    """The proc root to read, how the worker was placed, and the cgroups made (to remove
    once the worker is gone): moved into a real cgroup v2 of the kubelet's layout when this
    machine lets root make one, else described in a proc root of the check's own."""
    leaf_path = (f"kubepods/besteffort/pod{uid}/"
                 f"cri-containerd-{secrets.token_hex(32)}.scope")
    top = CGROUP_ROOT / f"pyhami-gpu-check-{os.getpid()}"
    why = "cgroup v2 is not mounted at /sys/fs/cgroup"
    if (CGROUP_ROOT / "cgroup.controllers").is_file():
        try:
            leaf = top / leaf_path
            leaf.mkdir(parents=True)
            (leaf / "cgroup.procs").write_text(f"{pid}\n")
        except OSError as error:
            why = f"cgroup v2 is not writable here: {error}"
            _remove_cgroups(top)
        else:
            return Path("/proc"), f"moved into the real cgroup {leaf}", top
    fake = scratch / "proc"
    (fake / str(pid)).mkdir(parents=True)
    (fake / str(pid) / "cgroup").write_text(f"0::/{leaf_path}\n")
    return fake, f"described in a proc root of the check's own ({why})", None


def _mine(processes: list[GpuProcess], pid: int) -> GpuProcess | None:
    return next((process for process in processes if process.pid == pid), None)


def _metric_line(text: str, name: str, pod: str, card: str) -> str | None:
    return next((line for line in text.splitlines()
                 if line.startswith(name + "{") and f'pod="{pod}"' in line
                 and f'device_uuid="{card}"' in line), None)


def test_a_real_cuda_process_is_seen_and_attributed_to_its_container(
        seen: CheckLog, tmp_path: Path) -> None:
    pynvml.nvmlInit()
    try:
        card = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    uid = str(uuid.uuid4())
    pod = HoldingPod(namespace=NAMESPACE, name=POD, uid=uid,
                     containers=(HoldingContainer(name=CONTAINER, cards=(card,)),))
    source = NvmlSource()
    source.open()
    made: Path | None = None
    try:
        with cuda_worker(seen, 0) as ready:
            pid = int(ready["pid"])
            proc_root, placed, made = in_pod_cgroup(pid, uid, tmp_path)
            seen.saw("placement", placed)
            seen.saw("cgroup_file", (proc_root / str(pid) / "cgroup").read_text().strip())
            monitor = NodeMonitor("gpu-check", MonitorSettings(
                caches=CacheSettings(containers_dir=tmp_path / "containers"),
                proc_root=proc_root), source, Holding([pod]))
            usage, mine, text = asyncio.run(_watch(monitor, source, uid, pid))
            host = source.host_cards()
            measured = monitor.measured()
            seen.saw("probe_failures", source.probe_failures())
            seen.saw("skipped", monitor.snapshot().skipped)
    finally:
        source.close()
        if made is not None:  # the worker is gone: its cgroups are empty
            _remove_cgroups(made)
    _judge(seen, card, pid, usage=usage, mine=mine, text=text)
    seen.saw("host_cards", [dataclasses.asdict(host_card) for host_card in host])
    host_used = next((h.memory_used for h in host if h.uuid == card), None)
    if host_used is None or host_used < ALLOCATED_MIB * MIB:
        seen.differs(f"NVML's memory used on the card ({host_used}) is below the "
                     f"{ALLOCATED_MIB} MiB the worker holds")
    entries = [entry for entry in (measured.containers if measured else [])
               if entry.pod_uid == uid]
    seen.saw("measured", [repr(entry) for entry in entries])
    if mine is not None:
        seen.compare("the inventory's measured container (MiB)",
                     [(e.container, e.device_uuid, e.memory_used) for e in entries],
                     [(CONTAINER, card, mine.memory_used // MIB)],
                     ours_name="measured", theirs_name="NVML")
    seen.assert_same()


async def _watch(monitor: NodeMonitor, source: NvmlSource, uid: str, pid: int
                 ) -> tuple[ContainerUsage | None, GpuProcess | None, str]:
    """Monitor rounds until the worker's pod is measured (NVML may list a new process and
    its samples a moment late), then one scrape."""
    deadline = time.monotonic() + SEEN_WITHIN_S
    usage = mine = None
    while time.monotonic() < deadline:
        await monitor.round()
        usage = next((u for u in monitor.snapshot().containers if u.pod_uid == uid), None)
        mine = _mine(await asyncio.to_thread(source.gpu_processes), pid)
        if usage is not None and mine is not None and mine.utilization > 0:
            break
        await asyncio.sleep(1.0)
    text = (await monitor.exposition()).decode()
    return usage, mine, text


def _judge(seen: CheckLog, card: str, pid: int, *, usage: ContainerUsage | None,
           mine: GpuProcess | None, text: str) -> None:
    if mine is None:
        pynvml.nvmlInit()
        try:
            listed = [process.pid for process in pynvml.nvmlDeviceGetComputeRunningProcesses(
                pynvml.nvmlDeviceGetHandleByUUID(card))]
        finally:
            pynvml.nvmlShutdown()
        seen.differs(f"NVML lists no compute process with the worker's pid {pid} (it lists "
                     f"{listed}; another pid namespace, or a runtime that hides processes)")
        return
    seen.saw("nvml_process", dataclasses.asdict(mine))
    seen.saw("nvml_process_mib", mine.memory_used / MIB)
    seen.saw("nvml_process_utilization", mine.utilization)
    low, high = ALLOCATED_MIB * MIB, (ALLOCATED_MIB + CONTEXT_ALLOWANCE_MIB) * MIB
    if not low <= mine.memory_used <= high:
        seen.differs(f"NVML's memory for the worker {mine.memory_used / MIB:.0f} MiB, "
                     f"expected {ALLOCATED_MIB} to {ALLOCATED_MIB + CONTEXT_ALLOWANCE_MIB}")
    if usage is None:
        seen.differs("the monitor attributed the worker to no container of its pod")
        return
    seen.saw("container_usage", repr(usage))
    seen.compare("the container attributed", (usage.container, usage.source),
                 (CONTAINER, "nvml"), ours_name="monitor", theirs_name="expected")
    seen.compare("the container's cards (index, uuid, bytes)",
                 [(d.vdevice_index, d.device_uuid, d.memory_used) for d in usage.devices],
                 [(0, card, mine.memory_used)], ours_name="monitor", theirs_name="NVML")
    line = _metric_line(text, "hami_container_device_memory_bytes", POD, card)
    seen.saw("metric", line)
    if line is None:
        seen.differs("no hami_container_device_memory_bytes series for the worker's pod")
