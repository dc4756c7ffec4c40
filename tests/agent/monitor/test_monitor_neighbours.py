"""Bad neighbours (issue 45), on real HAMi-core cache files and monitor rounds: a container's
cache file speaks only for the cards it was given (the rest counted as lies, never acted
on), and nothing in a tenant's folder is opened unless it is a regular file, shown by the
kernel's own report of opens (inotify)."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.monitor import cache as cache_module
from agent.monitor.cache import Refused, Region, open_regular, read_cache_file
from agent.monitor.containers import Allocation, CacheSettings, ContainerCaches, vouch
from agent.monitor.monitor import MonitorSettings, NodeMonitor
from agent.vendors.nvidia.simulated import SimulatedSource, profile_cards
from common.wire import HoldingContainer, HoldingPod
from tests.agent.monitor.inotify import OpenWatch
from tests.fakes.hami_core_cache import (
    OFFSETS,
    FakeCache,
    HoldingPodsByHand,
    Proc,
    Used,
    read_int32,
    write_cache,
)

NODE = "gpu-node-1"
MIB = 1024 * 1024
CARDS = profile_cards("t4x4", NODE)
X, Y = CARDS[0].uuid, CARDS[1].uuid
A = "a0000000-0000-4000-8000-00000000000a"
B = "b0000000-0000-4000-8000-00000000000b"
V1 = OFFSETS["v1"]


def holding(uid: str, name: str, *cards: str) -> HoldingPod:
    return HoldingPod(namespace="lab", name=name, uid=uid, containers=(
        HoldingContainer(name="main", cards=cards),))


def monitor(root: Path, pods: HoldingPodsByHand) -> NodeMonitor:
    return NodeMonitor(NODE, MonitorSettings(
        proc_root=root / "proc", caches=CacheSettings(containers_dir=root / "containers")),
        SimulatedSource(list(CARDS)), pods, wall_clock=lambda: 1_700_000_000.0)


def folder(root: Path, uid: str) -> Path:
    return root / "containers" / f"{uid}_main"


def samples(text: bytes) -> dict[tuple[str, str, str], float]:
    """(metric, pod, device_uuid) -> value."""
    return {(sample.name, sample.labels.get("pod", ""), sample.labels.get("device_uuid", "")):
            sample.value
            for family in text_string_to_metric_families(text.decode())
            for sample in family.samples}


# --- a cache file speaks only for the container's cards -------------------------------

@pytest.mark.parametrize(("names", "given", "held", "lies"), [
    ((X.encode(),), {X}, (X,), ()),
    ((X.encode(), Y.encode()), {X}, (X,), (Y.encode(),)),
    ((Y.encode(), Y.encode()), {X}, (), (Y.encode(),)),
    ((X.encode(), X.encode()), {X}, (X, X), ()),
    ((b"\xff\xfe", X.encode()), {X}, (X,), (b"\xff\xfe",)),
    ((X.encode(),), set(), (), (X.encode(),)),
    ((), {X, Y}, (), ()),
], ids=["its-own", "a-neighbours-too", "only-a-neighbours-twice", "its-own-twice-as-hami",
        "not-utf8", "given-none", "names-none"])
def test_a_file_speaks_for_the_cards_given_only(names: tuple[bytes, ...], given: set[str],
                                               held: tuple[str, ...],
                                               lies: tuple[bytes, ...]) -> None:
    assert vouch(names, given) == (held, lies)


def liar_and_neighbour(root: Path) -> tuple[Path, Path]:
    """A on card X names card Y too, at priority 0 with recent kernels and memory on both;
    B on card Y is idle at priority 1, its fields as the loop leaves an idle container."""
    liar = write_cache(folder(root, A) / "a.cache", FakeCache(
        device_num=2, uuids={0: X.encode(), 1: Y.encode()}, limits={0: MIB, 1: MIB},
        priority=0, recent_kernel=2, utilization_switch=0,
        procs=[Proc(used={0: Used(total=100 * MIB), 1: Used(total=900 * MIB)},
                    sm_util={0: 10, 1: 90})]))
    neighbour = write_cache(folder(root, B) / "b.cache", FakeCache(
        uuids={0: Y.encode()}, limits={0: MIB}, priority=1, recent_kernel=0,
        utilization_switch=0, procs=[Proc(used={0: Used(total=500 * MIB)}, sm_util={0: 20})]))
    return liar, neighbour


@pytest.mark.parametrize(("a_holds", "b_paused", "lies"), [
    ((X,), False, 1),
    ((X, Y), True, 0),
], ids=["a-lies-about-y", "a-really-holds-y-too"])
async def test_a_container_listing_a_neighbours_card_leaves_it_untouched(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, a_holds: tuple[str, ...],
        b_paused: bool, lies: int) -> None:
    _, neighbour = liar_and_neighbour(tmp_path)
    before = neighbour.read_bytes()
    watcher = monitor(tmp_path, HoldingPodsByHand(holding(A, "pod-a", *a_holds),
                                                  holding(B, "pod-b", Y)))
    with caplog.at_level(logging.WARNING, logger="agent.monitor.containers"):
        await watcher.round()
    found = samples(await watcher.exposition())
    if b_paused:  # the control: where A does hold Y, HAMi's loop pauses B, as it should
        assert read_int32(neighbour, V1["recent_kernel"]) == -1
        assert found[("hami_vgpu_memory_used_bytes", "pod-a", Y)] == 900 * MIB
        return
    assert neighbour.read_bytes() == before
    assert read_int32(neighbour, V1["recent_kernel"]) == 0
    assert ("hami_vgpu_memory_used_bytes", "pod-a", Y) not in found
    assert ("hami_container_device_utilization_ratio", "pod-a", Y) not in found
    assert found[("hami_vgpu_memory_used_bytes", "pod-a", X)] == 100 * MIB
    assert found[("hami_vgpu_memory_used_bytes", "pod-b", Y)] == 500 * MIB
    assert found[("pyhami_monitor_cache_lies_total", "", "")] == lies
    measured = watcher.measured()
    assert measured is not None
    assert {(c.pod_uid, c.device_uuid) for c in measured.containers} == {(A, X), (B, Y)}
    told = [r.getMessage() for r in caplog.records if "not given" in r.getMessage()]
    assert len(told) == 1 and "lab/pod-a" in told[0] and A in told[0]


@pytest.mark.parametrize("a_is", ["listed-without-containers", "a-container-not-listed"])
async def test_a_container_whose_cards_are_not_known_acts_on_nothing(tmp_path: Path,
                                                                    a_is: str) -> None:
    liar, neighbour = liar_and_neighbour(tmp_path)
    before = {path: path.read_bytes() for path in (liar, neighbour)}
    a_pod = (HoldingPod(namespace="lab", name="pod-a", uid=A)
             if a_is == "listed-without-containers" else
             HoldingPod(namespace="lab", name="pod-a", uid=A, containers=(
                 HoldingContainer(name="other", cards=(X,)),)))
    watcher = monitor(tmp_path, HoldingPodsByHand(a_pod, holding(B, "pod-b", Y)))
    await watcher.round()
    found = samples(await watcher.exposition())
    # Neither A's file nor B's is written: A is not counted, and B is idle.
    assert {path: path.read_bytes() for path in (liar, neighbour)} == before
    assert not any(key[1] == "pod-a" for key in found if key[0].startswith("hami_vgpu"))
    assert found[("pyhami_monitor_skipped_total", "", "")] == 1  # no_allocation
    assert watcher.snapshot().skipped["no_allocation"] == 1


def test_a_daemon_not_heard_yet_means_no_feedback_at_all(tmp_path: Path) -> None:
    """A scan told no allocations (the daemon never answered) writes into no file."""
    liar, neighbour = liar_and_neighbour(tmp_path)
    before = {path: path.read_bytes() for path in (liar, neighbour)}
    lister = ContainerCaches(CacheSettings(containers_dir=tmp_path / "containers"))
    scan = lister.scan()
    result = lister.feedback(scan)
    assert result.written == () and scan.usage == []
    assert {path: path.read_bytes() for path in (liar, neighbour)} == before
    assert lister.skipped["no_allocation"] == 2


# --- nothing opened unless it is a regular file ---------------------------------------

def make_fifo(path: Path) -> None:
    os.mkfifo(path)


def make_null_device(path: Path) -> None:
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD")


@pytest.mark.parametrize("make", [make_fifo, make_null_device], ids=["fifo", "char-device"])
async def test_a_fifo_or_a_device_in_a_containers_folder_is_never_opened(
        tmp_path: Path, make: Callable[[Path], None]) -> None:
    target = folder(tmp_path, A)
    target.mkdir(parents=True)
    watcher = monitor(tmp_path, HoldingPodsByHand(holding(A, "pod-a", X)))
    with OpenWatch(target) as opens:
        make(target / "a.cache")
        for _ in range(2):
            await watcher.round()
        assert opens.opened() == []
        assert watcher.snapshot().skipped["not_a_file"] == 2
        # The watch sees what the monitor opens: the same name, a regular file now.
        (target / "a.cache").unlink()
        write_cache(target / "a.cache", FakeCache(uuids={0: X.encode()}))
        opens.opened()  # the test's own open, writing it
        await watcher.round()
        assert "a.cache" in opens.opened()
    assert watcher.snapshot().containers[0].pod_uid == A


@pytest.mark.parametrize("link", ["file", "folder"])
async def test_a_link_to_a_neighbours_cache_file_is_not_followed(tmp_path: Path,
                                                                link: str) -> None:
    theirs = write_cache(folder(tmp_path, B) / "b.cache", FakeCache(uuids={0: X.encode()}))
    if link == "file":
        folder(tmp_path, A).mkdir(parents=True)
        (folder(tmp_path, A) / "a.cache").symlink_to(theirs)
    else:
        folder(tmp_path, A).symlink_to(folder(tmp_path, B))
    # B's pod is not one the node runs: only A's link could lead to B's file.
    pods = HoldingPodsByHand(holding(A, "pod-a", X))
    watcher = monitor(tmp_path, pods)
    with OpenWatch(folder(tmp_path, B)) as opens:
        await watcher.round()
        assert opens.opened() == []
        assert watcher.snapshot().containers == ()
        # The watch sees B's file opened once B is a pod of the node.
        pods.pods.append(holding(B, "pod-b", X))
        await watcher.round()
        assert "b.cache" in opens.opened()
    skipped = watcher.snapshot().skipped
    assert skipped.get("not_a_file" if link == "file" else "not_a_folder") == 2


@pytest.mark.parametrize("swapped_in", ["fifo", "link", "other-file"])
def test_a_file_swapped_between_the_look_and_the_open_is_not_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swapped_in: str) -> None:
    path = write_cache(tmp_path / "a.cache", FakeCache(uuids={0: X.encode()}))
    swap = tmp_path / "swap"
    if swapped_in == "fifo":
        os.mkfifo(swap)
    elif swapped_in == "link":
        swap.symlink_to(write_cache(tmp_path / "elsewhere", FakeCache()))
    else:
        write_cache(swap, FakeCache(uuids={0: X.encode()}))
    real_look = cache_module._look

    def look_then_swap(folder: int, name: str) -> os.stat_result:
        seen = real_look(folder, name)
        path.rename(tmp_path / "old")  # kept: its inode is not given to the new one
        swap.rename(path)
        return seen

    monkeypatch.setattr(cache_module, "_look", look_then_swap)
    with OpenWatch(tmp_path) as opens:
        opens.opened()  # the test's own writes
        refused = read_cache_file(path)
        assert opens.opened() == []
    assert isinstance(refused, Refused)
    assert refused.reason == ("changed" if swapped_in == "other-file" else "not_a_file")


def test_without_proc_the_file_is_opened_by_name_with_the_same_checks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "_PROC_FD", tmp_path / "no-proc")
    regular = write_cache(tmp_path / "a.cache", FakeCache(uuids={0: X.encode()}))
    os.mkfifo(tmp_path / "b.cache")
    assert isinstance(read_cache_file(regular), Region)
    refused = open_regular(tmp_path / "b.cache", os.O_RDONLY)
    assert isinstance(refused, Refused) and refused.reason == "not_a_file"


@pytest.mark.parametrize(("make", "reason"), [
    (lambda path: path.mkdir(), "not_a_file"),
    (lambda path: path.symlink_to("/dev/null"), "not_a_file"),
    (lambda path: None, "unreadable"),
], ids=["a-folder", "a-link-to-a-device", "gone"])
def test_anything_but_a_regular_file_is_refused_with_its_reason(
        tmp_path: Path, make: Callable[[Path], None], reason: str) -> None:
    make(tmp_path / "a.cache")
    refused = read_cache_file(tmp_path / "a.cache")
    assert isinstance(refused, Refused) and refused.reason == reason


def test_a_lie_is_counted_at_every_scan_and_logged_at_a_bounded_rate(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    liar_and_neighbour(tmp_path)
    given = {(A, "main"): Allocation("lab/pod-a", frozenset({X})),
             (B, "main"): Allocation("lab/pod-b", frozenset({Y}))}
    lister = ContainerCaches(CacheSettings(containers_dir=tmp_path / "containers"),
                             clock=lambda: 100.0)
    with caplog.at_level(logging.WARNING, logger="agent.monitor.containers"):
        scans = [lister.scan(allocations=given) for _ in range(3)]
    assert [scan.lies for scan in scans] == [1, 1, 1] and lister.lies == 3
    assert len([r for r in caplog.records if "not given" in r.getMessage()]) == 1
