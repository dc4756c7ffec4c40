"""The node monitor's rounds and scrape, on real cache files and a simulated node: the cache
files measured and fed back, NVML's processes for the pods without one, the daemon's names,
and the bounds (a slow NVML, a failing round, a daemon not heard)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.deviceplugin.source import AllocationSourceError
from agent.monitor.containers import CacheSettings
from agent.monitor.model import GpuProcess, HostCard
from agent.monitor.monitor import MonitorSettings, NodeMonitor
from agent.vendors.nvidia.simulated import SimulatedProcess, SimulatedSource, profile_cards
from common.wire import HoldingContainer, HoldingPod
from tests.fakes.hami_core_cache import OFFSETS, FakeCache, Proc, Used, read_int32, write_cache

NODE = "gpu-node-1"
MIB = 1024 * 1024
CARDS = profile_cards("t4x4", NODE)
HIGH = "7d6c2f4e-1b5a-4c3d-9e8f-0a1b2c3d4e5f"
LOW = "0f1e2d3c-4b5a-4697-8887-96a5b4c3d2e1"
BARE = "5a5a5a5a-6b6b-4c7c-8d8d-9e9e9e9e9e9e"
"""A pod on a card without HAMi-core in its container: measured through NVML."""


class Pods:
    """The daemon's list of pods holding cards, as the test says; unreachable on demand."""

    def __init__(self, *pods: HoldingPod) -> None:
        self.pods = list(pods)
        self.unreachable = False

    async def holding_pods(self, node: str) -> list[HoldingPod]:
        if self.unreachable:
            raise AllocationSourceError("no answer")
        return self.pods


def pod(uid: str, name: str, card: int) -> HoldingPod:
    return HoldingPod(namespace="lab", name=name, uid=uid, containers=(
        HoldingContainer(name="main", cards=(CARDS[card].uuid,)),))


def cache(card: int, priority: int, memory_mib: int, recent_kernel: int = 2) -> FakeCache:
    return FakeCache(device_num=1, uuids={0: CARDS[card].uuid.encode()},
                     limits={0: 4000 * MIB}, priority=priority, recent_kernel=recent_kernel,
                     procs=[Proc(used={0: Used(total=memory_mib * MIB)}, sm_util={0: 30})])


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, SimulatedSource, Pods]:
    containers = tmp_path / "containers"
    # Two HAMi-core containers on card 0: the high-priority one launched kernels recently.
    write_cache(containers / f"{HIGH}_main" / "a.cache", cache(0, priority=0, memory_mib=3000))
    write_cache(containers / f"{LOW}_main" / "b.cache", cache(0, priority=1, memory_mib=1000))
    source = SimulatedSource(list(CARDS))
    source.set_usage(0, memory_used=4000 * MIB, utilization=60, memory_utilization=20)
    source.set_gpu_processes(2, SimulatedProcess(pid=4321, memory_used=700 * MIB,
                                                 utilization=15))
    proc = tmp_path / "proc" / "4321"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(f"0::/kubepods/besteffort/pod{BARE}/0123abcd\n")
    return tmp_path, source, Pods(pod(HIGH, "high", 0), pod(LOW, "low", 0),
                                  pod(BARE, "bare", 2))


def monitor(root: Path, source: SimulatedSource, pods: Pods, *,
            scrape_timeout: float = 2.0) -> NodeMonitor:
    return NodeMonitor(NODE, MonitorSettings(
        scrape_timeout=scrape_timeout, proc_root=root / "proc",
        caches=CacheSettings(containers_dir=root / "containers")), source, pods,
        wall_clock=lambda: 1_700_000_000.0)


def samples(text: bytes) -> dict[tuple[str, str, str], float]:
    """(metric, pod, device_uuid) -> value, for the container and host gauges."""
    found = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            found[(sample.name, sample.labels.get("pod", ""),
                   sample.labels.get("device_uuid", ""))] = sample.value
    return found


async def test_a_round_measures_both_paths_and_feeds_back(
        node: tuple[Path, SimulatedSource, Pods]) -> None:
    root, source, pods = node
    watcher = monitor(root, source, pods)
    await watcher.round()
    found = samples(await watcher.exposition())
    card0, card2 = CARDS[0].uuid, CARDS[2].uuid
    assert found[("hami_vgpu_memory_used_bytes", "high", card0)] == 3000 * MIB
    assert found[("hami_vgpu_memory_used_bytes", "low", card0)] == 1000 * MIB
    assert found[("hami_vgpu_memory_limit_bytes", "high", card0)] == 4000 * MIB
    assert found[("hami_vgpu_memory_used_bytes", "bare", card2)] == 700 * MIB
    assert found[("hami_container_device_utilization_ratio", "bare", card2)] == 15
    assert ("hami_vgpu_memory_limit_bytes", "bare", card2) not in found  # NVML has none
    assert found[("hami_host_gpu_memory_used_bytes", "", card0)] == 4000 * MIB
    assert found[("hami_host_gpu_utilization_ratio", "", card0)] == 60
    # The feedback loop paused the low-priority container while the high one is busy.
    low_file = root / "containers" / f"{LOW}_main" / "b.cache"
    assert read_int32(low_file, OFFSETS["v1"]["recent_kernel"]) == -1
    high_file = root / "containers" / f"{HIGH}_main" / "a.cache"
    assert read_int32(high_file, OFFSETS["v1"]["recent_kernel"]) == 1
    # What goes to the daemon with the next inventory.
    measured = watcher.measured()
    assert measured is not None and measured.at == 1_700_000_000.0
    assert sorted((c.pod_uid, c.memory_used, c.memory_limit, c.source)
                  for c in measured.containers) == sorted([
        (HIGH, 3000, 4000, "hami-core"), (LOW, 1000, 4000, "hami-core"),
        (BARE, 700, None, "nvml")])
    assert {(c.uuid, c.memory_used) for c in measured.cards if c.uuid == card0} == {
        (card0, 4000)}


async def test_a_pod_the_daemon_does_not_list_is_not_reported(
        node: tuple[Path, SimulatedSource, Pods]) -> None:
    root, source, pods = node
    pods.pods = [pod(HIGH, "high", 0)]
    watcher = monitor(root, source, pods)
    await watcher.round()
    reported = {key[1] for key in samples(await watcher.exposition()) if key[1]}
    assert reported == {"high"}
    assert watcher.snapshot().skipped.get("pod_not_live") == 1


async def test_the_last_list_of_pods_is_kept_while_the_daemon_is_not_heard(
        node: tuple[Path, SimulatedSource, Pods]) -> None:
    root, source, pods = node
    watcher = monitor(root, source, pods)
    await watcher.round()
    pods.unreachable = True
    await watcher.round()
    snapshot = watcher.snapshot()
    assert set(snapshot.pods) == {HIGH, LOW, BARE}
    assert snapshot.skipped["pods_unknown"] == 1


class SlowProbe(SimulatedSource):
    """NVML stuck in a call: ``host_cards`` waits until released."""

    def __init__(self) -> None:
        super().__init__(list(CARDS))
        self.release = threading.Event()
        self.stuck = False

    def host_cards(self) -> list[HostCard]:
        if self.stuck:
            self.release.wait(10)
        return super().host_cards()


async def test_a_scrape_waits_a_bounded_time_for_nvml_and_serves_the_last_figures(
        tmp_path: Path) -> None:
    probe = SlowProbe()
    probe.set_usage(1, memory_used=123 * MIB, utilization=9)
    watcher = monitor(tmp_path, probe, Pods(), scrape_timeout=0.2)
    await watcher.round()
    probe.stuck = True
    try:
        found = samples(await watcher.exposition())
    finally:
        probe.release.set()
    assert found[("hami_host_gpu_memory_used_bytes", "", CARDS[1].uuid)] == 123 * MIB
    assert found[("pyhami_monitor_skipped_total", "", "")] == 1  # scrape_timeout


class FailingProbe(SimulatedSource):
    def gpu_processes(self) -> list[GpuProcess]:
        raise RuntimeError("driver gone")


async def test_a_failing_round_keeps_the_last_snapshot_and_says_so(
        node: tuple[Path, SimulatedSource, Pods], caplog: pytest.LogCaptureFixture) -> None:
    root, _, pods = node
    watcher = monitor(root, FailingProbe(list(CARDS)), pods)
    await watcher.round()
    assert watcher.snapshot().containers == ()
    assert watcher.rounds == 1
    assert "the node's monitor round failed, the last figures kept: driver gone" in caplog.text
