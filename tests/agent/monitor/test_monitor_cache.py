"""HAMi-core's cache files read as HAMi v2.10's node monitor reads them: both layouts at
the reference's offsets, every figure it reports, and every bad file or folder skipped
with its counted reason, never raising."""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.deviceplugin.plugin import DEFAULT_HAMI_CORE_DIR
from agent.monitor import cache as cache_module
from agent.monitor import containers as containers_module
from agent.monitor.cache import V0, V1, Refused, Region, read_cache_file
from agent.monitor.containers import (
    DEFAULT_CONTAINERS_DIR,
    Allocation,
    CacheSettings,
    ContainerCaches,
)
from agent.monitor.model import DeviceUsage
from agent.vendors.nvidia.hamicore import CONTAINERS_FOLDER
from tests.fakes.clock import Clock
from tests.fakes.hami_core_cache import OFFSETS, FakeCache, Proc, Used, gpu_uuid, write_cache

POD = "0b6f9a52-6f4e-4c1e-9d2a-000000000001"
OTHER = "0b6f9a52-6f4e-4c1e-9d2a-000000000002"
GIB = 1 << 30


def read(path: Path) -> Region:
    region = read_cache_file(path)
    assert isinstance(region, Region), region
    return region


def refused(path: Path) -> Refused:
    region = read_cache_file(path)
    assert isinstance(region, Refused), region
    return region


# --- the layouts ---------------------------------------------------------------------

@pytest.mark.parametrize(("layout", "size"), [("v1", 2_008_952), ("v0", 1_197_896)],
                         ids=["v1", "v0"])
def test_the_files_have_the_reference_sizes(tmp_path: Path, layout: str, size: int) -> None:
    path = write_cache(tmp_path / "a.cache", FakeCache(layout=layout))  # type: ignore[arg-type]
    assert path.stat().st_size == size
    assert (V1 if layout == "v1" else V0).size == size


def field_at(data: bytes, fmt: str, offset: int) -> int:
    (value,) = struct.unpack_from(fmt, data, offset)
    return int(value)


def test_each_v1_field_lands_at_the_reference_offset() -> None:
    proc = Proc(pid=11, hostpid=22, used={3: Used(1, 2, 3, 4, 5)}, sm_util={3: 66},
                monitorused={3: 77})
    data = FakeCache(layout="v1", major=1, minor=2, device_num=4, uuids={3: gpu_uuid(3)},
                     limits={3: 8 * GIB}, sm_limits={3: 30}, procs=[Proc(), proc],
                     utilization_switch=5, recent_kernel=6, priority=7,
                     last_kernel_time=1_700_000_000).to_bytes()
    slot = 1856 + 1 * 1960
    assert [field_at(data, "<i", 0), field_at(data, "<I", 4), field_at(data, "<I", 8),
            field_at(data, "<Q", 56)] == [19920718, 1, 2, 4]
    assert data[64 + 3 * 96:64 + 3 * 96 + 40] == gpu_uuid(3)
    assert [field_at(data, "<Q", 1600 + 3 * 8), field_at(data, "<Q", 1728 + 3 * 8)] == \
        [8 * GIB, 30]
    assert [field_at(data, "<i", slot), field_at(data, "<i", slot + 4)] == [11, 22]
    assert [field_at(data, "<Q", slot + 8 + 3 * 64 + 8 * k) for k in range(5)] == \
        [1, 2, 3, 4, 5]
    assert field_at(data, "<Q", slot + 1032 + 3 * 8) == 77
    assert field_at(data, "<Q", slot + 1160 + 3 * 48 + 16) == 66
    assert field_at(data, "<i", slot + 1928) == 1
    assert [field_at(data, "<i", 2_008_896 + 4 * k) for k in range(4)] == [2, 5, 6, 7]
    assert field_at(data, "<q", 2_008_912) == 1_700_000_000


def test_each_v0_field_lands_at_the_reference_offset() -> None:
    proc = Proc(pid=11, hostpid=22, used={3: Used(1, 2, 3, 4, 5)}, sm_util={3: 66},
                monitorused={3: 77})
    data = FakeCache(layout="v0", device_num=4, uuids={3: gpu_uuid(3)},
                     limits={3: 8 * GIB}, sm_limits={3: 30}, procs=[Proc(), proc],
                     utilization_switch=5, recent_kernel=6, priority=7).to_bytes()
    slot = 1848 + 1 * 1168
    assert [field_at(data, "<i", 0), field_at(data, "<Q", 48)] == [19920718, 4]
    assert data[56 + 3 * 96:56 + 3 * 96 + 40] == gpu_uuid(3)
    assert [field_at(data, "<Q", 1592 + 3 * 8), field_at(data, "<Q", 1720 + 3 * 8)] == \
        [8 * GIB, 30]
    assert [field_at(data, "<i", slot), field_at(data, "<i", slot + 4)] == [11, 22]
    assert [field_at(data, "<Q", slot + 8 + 3 * 40 + 8 * k) for k in range(5)] == \
        [1, 2, 3, 4, 5]
    assert field_at(data, "<Q", slot + 648 + 3 * 8) == 77
    assert field_at(data, "<Q", slot + 776 + 3 * 24 + 16) == 66
    assert field_at(data, "<i", slot + 1160) == 1
    assert [field_at(data, "<i", 1_197_880 + 4 * k) for k in range(4)] == [2, 5, 6, 7]


@pytest.mark.parametrize("layout", [V1, V0], ids=["v1", "v0"])
def test_the_readers_table_is_the_references(layout: cache_module.Layout) -> None:
    at = OFFSETS[layout.version]
    assert (layout.size, layout.device_num, layout.uuids, layout.limit, layout.sm_limit,
            layout.procs, layout.slot_size, layout.slot_used, layout.used_size,
            layout.slot_device_util, layout.util_size, layout.slot_status,
            layout.proc_num, layout.utilization_switch, layout.recent_kernel,
            layout.priority, layout.last_kernel_time) == (
        at["size"], at["device_num"], at["uuids"], at["limit"], at["sm_limit"],
        at["procs"], at["slot"], at["slot_used"], at["used"], at["slot_util"], at["util"],
        at["slot_status"], at["proc_num"], at["utilization_switch"], at["recent_kernel"],
        at["priority"], at.get("last_kernel_time"))


# --- what is read ---------------------------------------------------------------------

def busy_cache(layout: str) -> FakeCache:
    """Two cards, three processes in use and a freed slot between them."""
    return FakeCache(
        layout=layout, device_num=2,  # type: ignore[arg-type]
        uuids={0: gpu_uuid(0), 1: gpu_uuid(1)}, limits={0: 4 * GIB, 1: 2 * GIB},
        procs=[
            Proc(used={0: Used(10, 20, 30, 40, 100), 1: Used(1, 2, 3, 4, 10)},
                 sm_util={0: 25, 1: 5}),
            Proc(status=0, used={0: Used(1000, 1000, 1000, 1000, 9000)},
                 sm_util={0: 90}),
            Proc(used={0: Used(5, 6, 7, 8, 50)}, sm_util={0: 30}),
            Proc(status=2, used={1: Used(100, 200, 300, 400, 1000)}, sm_util={1: 80}),
        ],
        priority=0, recent_kernel=2, utilization_switch=1, last_kernel_time=1_700_000_000)


@pytest.mark.parametrize("layout", ["v1", "v0"])
def test_every_figure_of_both_layouts(tmp_path: Path, layout: str) -> None:
    region = read(write_cache(tmp_path / "a.cache", busy_cache(layout)))
    assert region.layout.version == layout
    assert region.devices == (
        DeviceUsage(vdevice_index=0, device_uuid=gpu_uuid(0).decode(), memory_used=150,
                    utilization=55, memory_limit=4 * GIB, context=15, module=26, buffer=37),
        DeviceUsage(vdevice_index=1, device_uuid=gpu_uuid(1).decode(), memory_used=1010,
                    utilization=85, memory_limit=2 * GIB, context=101, module=202,
                    buffer=303),
    )
    assert (region.priority, region.recent_kernel, region.utilization_switch) == (0, 2, 1)
    assert region.last_kernel_time == (1_700_000_000 if layout == "v1" else None)
    assert (region.major, region.minor) == ((1, 2) if layout == "v1" else (None, None))
    usage = region.usage(POD, "main")
    assert (usage.pod_uid, usage.container, usage.source, usage.devices) == \
        (POD, "main", "hami-core", region.devices)


@pytest.mark.parametrize(("layout", "kernel_time", "expected"), [
    ("v1", 1_700_000_000, 1_700_000_000),
    ("v1", 0, None),
    ("v1", -5, None),
    ("v0", 1_700_000_000, None),
], ids=["v1-set", "v1-unset", "v1-negative", "v0-never"])
def test_last_kernel_time_only_from_v1_and_above_0(tmp_path: Path, layout: str,
                                                   kernel_time: int,
                                                   expected: int | None) -> None:
    fake = FakeCache(layout=layout, last_kernel_time=kernel_time,  # type: ignore[arg-type]
                     uuids={0: gpu_uuid(0)})
    assert read(write_cache(tmp_path / "a.cache", fake)).last_kernel_time == expected


@pytest.mark.parametrize("layout", ["v1", "v0"])
def test_more_than_16_cards_are_clamped(tmp_path: Path, layout: str) -> None:
    fake = FakeCache(layout=layout, device_num=40,  # type: ignore[arg-type]
                     uuids={i: gpu_uuid(i) for i in range(16)},
                     procs=[Proc(used={15: Used(total=7)})])
    region = read(write_cache(tmp_path / "a.cache", fake))
    assert [device.vdevice_index for device in region.devices] == list(range(16))
    assert region.devices[15].memory_used == 7


@pytest.mark.parametrize(("proc_num", "expected_memory"), [
    (-3, 0), (0, 0), (1, 1), (2, 3), (5000, 3 + 1000),
], ids=["negative", "zero", "first-slot", "both-slots", "huge-clamped-to-1024"])
def test_proc_num_is_clamped(tmp_path: Path, proc_num: int, expected_memory: int) -> None:
    procs = [Proc(used={0: Used(total=1)}), Proc(used={0: Used(total=2)})]
    procs += [Proc(status=0)] * 1021 + [Proc(used={0: Used(total=1000)})]  # slot 1023
    fake = FakeCache(uuids={0: gpu_uuid(0)}, procs=procs, proc_num=proc_num)
    region = read(write_cache(tmp_path / "a.cache", fake))
    assert region.devices[0].memory_used == expected_memory


def test_cards_without_a_uuid_or_with_a_bad_one_are_left_out(tmp_path: Path) -> None:
    fake = FakeCache(device_num=4, uuids={0: gpu_uuid(0), 2: gpu_uuid(2), 3: b"\xff\xfeGPU"},
                     procs=[Proc(used={i: Used(total=i + 1) for i in range(4)})])
    region = read(write_cache(tmp_path / "a.cache", fake))
    assert [(d.vdevice_index, d.memory_used) for d in region.devices] == [(0, 1), (2, 3)]
    assert region.bad_uuids == 1
    # The feedback loop keys its census on every uuid set, cut at its NUL (then checked
    # against the container's cards).
    assert region.card_uuids == (gpu_uuid(0), gpu_uuid(2), b"\xff\xfeGPU")
    assert region.device_cards == (gpu_uuid(0), gpu_uuid(2))


def test_a_short_uuid_is_cut_at_its_nul(tmp_path: Path) -> None:
    fake = FakeCache(uuids={0: b"GPU-short"})
    assert read(write_cache(tmp_path / "a.cache", fake)).devices[0].device_uuid == "GPU-short"


# --- bad files ------------------------------------------------------------------------

@pytest.mark.parametrize(("fake", "reason", "says"), [
    (FakeCache(size=8), "bad_size", "cache file size 8 too small"),
    (FakeCache(size=1000), "bad_size", "unknown cache file size 1000 version 1.2"),
    (FakeCache(magic=12345), "bad_magic", "magic flag not matched"),
    (FakeCache(major=2, minor=0), "unknown_version",
     "unknown cache file size 2008952 version 2.0"),
    (FakeCache(layout="v0", magic=0), "bad_magic", "magic flag not matched"),
], ids=["under-header", "under-v0", "wrong-magic", "major-2", "v0-wrong-magic"])
def test_bad_files_are_refused_with_their_reason(tmp_path: Path, fake: FakeCache,
                                                 reason: str, says: str) -> None:
    answer = refused(write_cache(tmp_path / "a.cache", fake))
    assert answer.reason == reason
    assert says in answer.detail and "a.cache" in answer.detail


@pytest.mark.parametrize(("fake", "version"), [
    (FakeCache(size=V1.size + 4096), "v1"),
    (FakeCache(size=V1.size - 1), "v0"),
    (FakeCache(layout="v0", major=7, size=V0.size + 10), "v0"),
], ids=["v1-larger", "v1-cut-reads-as-v0", "v0-whatever-its-words"])
def test_the_layout_is_chosen_as_hami_chooses_it(tmp_path: Path, fake: FakeCache,
                                                 version: str) -> None:
    assert read(write_cache(tmp_path / "a.cache", fake)).layout.version == version


def shrinking_pread(path: Path, after_calls: int, size: int
                    ) -> Callable[[int, int, int], bytes]:
    real = os.pread
    calls = [0]

    def pread(fd: int, length: int, offset: int) -> bytes:
        calls[0] += 1
        if calls[0] == after_calls + 1:
            os.truncate(path, size)
        return real(fd, length, offset)
    return pread


@pytest.mark.parametrize(("after_calls", "size", "reason"), [
    (0, 100, "short_read"),
    (1, 1500, "short_read"),
    (2, V1.proc_num + 4, "short_read"),
    (3, V1.size + 8, "changed"),
], ids=["before-header", "before-cards", "before-tail", "after-all-grown"])
def test_a_file_changing_between_reads_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  after_calls: int, size: int,
                                                  reason: str) -> None:
    path = write_cache(tmp_path / "a.cache", busy_cache("v1"))
    monkeypatch.setattr(os, "pread", shrinking_pread(path, after_calls, size))
    assert refused(path).reason == reason


def test_a_link_or_a_fifo_is_never_followed(tmp_path: Path) -> None:
    target = write_cache(tmp_path / "real.cache", busy_cache("v1"))
    (tmp_path / "link.cache").symlink_to(target)
    os.mkfifo(tmp_path / "pipe.cache")
    assert refused(tmp_path / "link.cache").reason == "not_a_file"
    assert refused(tmp_path / "pipe.cache").reason == "not_a_file"
    assert refused(tmp_path / "gone.cache").reason == "unreadable"


# --- the containers folder ------------------------------------------------------------

def caches(root: Path, clock: Callable[[], float] | None = None,
           **settings: object) -> ContainerCaches:
    configured = CacheSettings(containers_dir=root, **settings)  # type: ignore[arg-type]
    return ContainerCaches(configured) if clock is None else ContainerCaches(configured, clock)


def given(*containers: tuple[str, str]) -> dict[tuple[str, str], Allocation]:
    """Each (pod uid, container) given the two cards ``busy_cache`` names."""
    cards = frozenset(gpu_uuid(number).decode() for number in (0, 1))
    return {key: Allocation(f"lab/{key[0][-4:]}", cards) for key in containers}


def test_the_default_folder_is_the_device_plugins() -> None:
    assert DEFAULT_CONTAINERS_DIR == DEFAULT_HAMI_CORE_DIR / CONTAINERS_FOLDER


def test_a_scan_reads_every_container_named_by_its_folder(tmp_path: Path) -> None:
    write_cache(tmp_path / f"{POD}_main" / "1f2e.cache", busy_cache("v1"))
    write_cache(tmp_path / f"{OTHER}_side" / "9a.cache", busy_cache("v0"))
    (tmp_path / f"{POD}_main" / "libvgpu.so").write_bytes(b"\x7fELF")
    scan = caches(tmp_path).scan(allocations=given((POD, "main"), (OTHER, "side")))
    assert [(u.pod_uid, u.container, len(u.devices)) for u in scan.usage] == \
        [(POD, "main", 2), (OTHER, "side", 2)]
    assert [c.region.layout.version for c in scan.containers] == ["v1", "v0"]
    assert scan.skipped == {} and scan.listed == 2


def build_folders(root: Path) -> None:
    write_cache(root / f"{POD}_good" / "a.cache", busy_cache("v1"))
    (root / "nounderscore").mkdir(parents=True)
    (root / f"{POD}_").mkdir()
    (root / "bad uid_main").mkdir()
    for name in ("a.cache", "b.cache", "c.cache"):
        write_cache(root / f"{POD}_three" / name, busy_cache("v1"))
    (root / f"{POD}_empty").mkdir()
    write_cache(root / f"{POD}_magic" / "a.cache", FakeCache(magic=1))
    write_cache(root / f"{POD}_small" / "a.cache", FakeCache(size=4))
    write_cache(root / f"{POD}_version" / "a.cache", FakeCache(major=3))
    crowded = root / f"{POD}_crowded"
    crowded.mkdir()
    for number in range(70):
        (crowded / f"note{number}").write_text("x")
    (root / "stray-file").write_text("x")
    write_cache(root / f"{OTHER}_dead" / "a.cache", busy_cache("v1"))


def test_every_bad_folder_is_skipped_with_its_counted_reason(tmp_path: Path) -> None:
    build_folders(tmp_path)
    lister = caches(tmp_path)
    scan = lister.scan(live_pods={POD}, allocations=given((POD, "good")))
    assert [c.container for c in scan.containers] == ["good"]
    assert scan.skipped == {"no_separator": 2, "bad_name": 1, "too_many_files": 1,
                            "no_cache_file": 1, "bad_magic": 1, "bad_size": 1,
                            "unknown_version": 1, "too_many_entries": 1, "not_a_folder": 1,
                            "pod_not_live": 1}
    lister.scan(live_pods={POD})
    assert lister.skipped["bad_magic"] == 2  # counted over the agent's life


def test_the_skips_are_logged_at_a_bounded_rate(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    for number in range(5):
        write_cache(tmp_path / f"{POD}_c{number}" / "a.cache", FakeCache(magic=1))
    (tmp_path / f"{POD}_quiet").mkdir()
    clock = Clock(100.0)
    with caplog.at_level(logging.WARNING, logger="agent.monitor.containers"):
        caches(tmp_path, clock).scan()
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1 and "bad_magic" in lines[0]


def test_ten_thousand_stale_folders_keep_a_scan_bounded(tmp_path: Path) -> None:
    for number in range(10_000):
        (tmp_path / f"{number:08d}-0000-4000-8000-000000000000_c").mkdir()
    live = f"{9_999:08d}-0000-4000-8000-000000000000"
    write_cache(tmp_path / f"{live}_c" / "a.cache", busy_cache("v1"))
    lister = caches(tmp_path)
    first = lister.scan()
    assert first.listed == 10_000
    assert first.skipped == {"no_cache_file": 4096, "over_limit": 10_000 - 4096}
    second = lister.scan()  # in turn: the next 4096
    assert second.skipped == {"no_cache_file": 4096, "over_limit": 10_000 - 4096}
    third = lister.scan()  # the last 1808 and, wrapping, the first ones again
    assert [c.pod_uid for c in third.containers] == [live]
    # Told the pods the node runs, a scan reads only theirs.
    told = caches(tmp_path).scan(live_pods={live}, allocations=given((live, "c")))
    assert told.skipped == {"pod_not_live": 9_999}


def test_a_scan_stops_reading_at_its_time_bound(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for number in range(6):
        write_cache(tmp_path / f"{POD}_c{number}" / "a.cache", busy_cache("v0"))
    clock = Clock(0.0)
    lister = caches(tmp_path, clock, cache_scan_time=2.0)
    real_read = cache_module.read_cache_file

    def slow_read(path: Path) -> Region | Refused:
        clock.now += 1.0
        return real_read(path)

    monkeypatch.setattr(containers_module, "read_cache_file", slow_read)
    known = given(*((POD, f"c{number}") for number in range(6)))
    first = lister.scan(allocations=known)
    second = lister.scan(allocations=known)
    assert [c.container for c in first.containers] == ["c0", "c1", "c2"]
    assert first.skipped == {"over_time": 3}
    assert [c.container for c in second.containers] == ["c3", "c4", "c5"]


def test_a_recreated_folder_is_read_again_by_its_path(tmp_path: Path) -> None:
    folder = tmp_path / f"{POD}_main"
    write_cache(folder / "a.cache", busy_cache("v1"))
    lister = caches(tmp_path)
    known = given((POD, "main"))
    assert lister.scan(allocations=known).usage[0].devices[0].memory_used == 150
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    write_cache(folder / "b.cache", FakeCache(uuids={0: gpu_uuid(0)},
                                              procs=[Proc(used={0: Used(total=7)})]))
    assert lister.scan(allocations=known).usage[0].devices[0].memory_used == 7


def test_a_missing_containers_folder_is_no_error(tmp_path: Path) -> None:
    scan = caches(tmp_path / "absent").scan()
    assert scan.containers == () and scan.skipped == {}
