"""Fuzz targets for the node monitor's doors (hypothesis): whatever a cache file holds,
whatever a process's cgroup file says, whatever a register annotation carries, each is read
or refused with its reason, never raising anything else; whatever cards a cache file names,
it speaks only for its container's, and whatever a tenant puts in its folder (FIFOs,
devices, links), nothing but a regular file is opened; and a measured usage on the wire
is decoded whole or refused as the inventory's other fields are."""

from __future__ import annotations

import os
import stat
import struct
import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.monitor.cache import MAGIC, V0, V1, Refused, Region, card_name, read_cache_file
from agent.monitor.containers import Allocation, CacheSettings, ContainerCaches, vouch
from agent.monitor.processes import CgroupFileError, pod_uid_of_cgroup
from common.core.annotations import AnnotationError
from common.core.registration import decode_register
from common.wire import WireError, decode_inventory
from tests.agent.monitor.inotify import OpenWatch
from tests.fakes.hami_core_cache import FakeCache, Proc, Used, gpu_uuid, write_cache

pytestmark = pytest.mark.slow  # long fuzzing

FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# A real region with bytes overwritten at random places: the header, the counts, the tables.
_V1 = FakeCache(device_num=2, uuids={0: b"GPU-a", 1: b"GPU-b"}, limits={0: 1, 1: 2},
                procs=[Proc(used={0: Used(total=5)}, sm_util={0: 3})]).to_bytes()
_HOT = [0, 4, 8, V1.device_num, V1.uuids, V1.limit, V1.procs, V1.proc_num,
        V1.proc_num + 4, V1.proc_num + 8, V1.priority]


@FUZZ
@given(patches=st.lists(st.tuples(st.sampled_from(_HOT) | st.integers(0, V1.size - 8),
                                  st.binary(min_size=1, max_size=8)), max_size=6),
       size=st.sampled_from([V1.size, V0.size, V0.size - 1, V1.size + 7, 12, 11, 0]))
def test_any_cache_file_is_read_or_refused_with_a_reason(tmp_path: Path,
                                                         patches: list[tuple[int, bytes]],
                                                         size: int) -> None:
    data = bytearray(_V1)
    for offset, value in patches:
        data[offset:offset + len(value)] = value
    path = tmp_path / "region.cache"
    path.write_bytes(bytes(data[:size]) + bytes(max(size - len(data), 0)))
    read = read_cache_file(path)
    assert isinstance(read, Region | Refused)
    if isinstance(read, Region):
        assert struct.unpack_from("<i", data)[0] == MAGIC
        for device in read.usage("uid", "c").devices:
            assert device.memory_used >= 0 and len(device.device_uuid) <= 40


_A = "a0000000-0000-4000-8000-00000000000a"
_B = "b0000000-0000-4000-8000-00000000000b"
_X, _Y, _Z = (gpu_uuid(number) for number in range(3))
_GIVEN = {(_A, "main"): Allocation("lab/a", frozenset({_X.decode()})),
          (_B, "main"): Allocation("lab/b", frozenset({_Y.decode()}))}
"""A holds card X and B card Y: they share no card, so neither's file can change the
other's."""
_REGIONS = st.builds(
    lambda uuids, device_num, priority, recent, switch: FakeCache(
        layout="v0", device_num=device_num, uuids=dict(enumerate(uuids)), priority=priority,
        recent_kernel=recent, utilization_switch=switch,
        procs=[Proc(used={i: Used(total=i + 1) for i in range(len(uuids))})]),
    st.lists(st.sampled_from([_X, _Y, _Z, _X + b"\0junk", b"\xff\xfeGPU", b"GPU-"]),
             max_size=4),
    st.integers(0, 5), st.sampled_from([-1, 0, 1, 2]), st.sampled_from([-1, 0, 1, 2, 3]),
    st.sampled_from([0, 1]))


def _feedback(root: Path, files: dict[str, FakeCache]) -> tuple[int, dict[str, bytes],
                                                                 list[tuple[str, str]]]:
    """One scan and one feedback round over ``files`` (by pod uid): the lies counted, each
    file's bytes after, and the (pod, card) of each usage reported."""
    paths = {uid: write_cache(root / f"{uid}_main" / "a.cache", cache)
             for uid, cache in files.items()}
    lister = ContainerCaches(CacheSettings(containers_dir=root))
    scan = lister.scan(allocations=_GIVEN)
    lister.feedback(scan)
    reported = [(usage.pod_uid, device.device_uuid) for usage in scan.usage
                for device in usage.devices]
    return scan.lies, {uid: path.read_bytes() for uid, path in paths.items()}, reported


@FUZZ
@given(a=_REGIONS, b=_REGIONS)
def test_a_cache_file_speaks_for_its_containers_cards_only(tmp_path: Path, a: FakeCache,
                                                          b: FakeCache) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        lies, together, reported = _feedback(Path(scratch, "both"), {_A: a, _B: b})
        _, alone_a, _ = _feedback(Path(scratch, "a"), {_A: a})
        _, alone_b, _ = _feedback(Path(scratch, "b"), {_B: b})
    # Each container's file ends as it would with no neighbour at all.
    assert together == {**alone_a, **alone_b}
    for uid, card in reported:
        assert card in _GIVEN[uid, "main"].cards
    expected = 0
    for uid, cache in ((_A, a), (_B, b)):
        names = tuple(card_name(uuid.ljust(96, b"\0")) for uuid in cache.uuids.values()
                      if uuid[:1] != b"\0")
        expected += len(vouch(names, _GIVEN[uid, "main"].cards)[1])
    assert lies == expected


_KINDS = ["regular", "fifo", "link-to-neighbour", "link-to-device", "folder",
          "link-to-folder", *(["device"] if os.geteuid() == 0 else [])]
"""What a tenant can put in its folder (a device node needs CAP_MKNOD)."""


def _make(path: Path, kind: str, neighbour: Path) -> None:
    if kind == "regular":
        write_cache(path, FakeCache(uuids={0: _X}))
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    elif kind == "link-to-neighbour":
        path.symlink_to(neighbour)
    elif kind == "link-to-device":
        path.symlink_to("/dev/null")
    elif kind == "folder":
        path.mkdir()
        write_cache(path / "inner.cache", FakeCache(uuids={0: _X}))
    else:
        path.symlink_to(neighbour.parent, target_is_directory=True)


@FUZZ
@given(entries=st.dictionaries(st.sampled_from(["a.cache", "b.cache", "libvgpu.so", "notes"]),
                               st.sampled_from(_KINDS), max_size=4))
def test_nothing_but_a_regular_file_is_opened_in_a_containers_folder(
        tmp_path: Path, entries: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        root = Path(scratch)
        neighbour = write_cache(root / f"{_B}_main" / "b.cache", FakeCache(uuids={0: _Y}))
        mine = root / f"{_A}_main"
        mine.mkdir()
        lister = ContainerCaches(CacheSettings(containers_dir=root))
        with OpenWatch(mine) as opens, OpenWatch(neighbour.parent) as theirs:
            for name, kind in entries.items():
                _make(mine / name, kind, neighbour)
            opens.opened()
            theirs.opened()  # the test's own writes
            # B is not a pod of the node: only a link of A's could lead to B's file.
            scan = lister.scan(live_pods={_A}, allocations=_GIVEN)
            lister.feedback(scan)
            opened = opens.opened()
            assert theirs.opened() == []
    assert all(entries[name] == "regular" for name in opened)
    if scan.containers:
        assert entries[scan.containers[0].region.path.name] == "regular"


@FUZZ
@given(text=st.text(max_size=300) | st.lists(st.sampled_from([
    "0::/kubepods/pod", "0::/kubepods.slice/kubepods-pod", "12:memory:/kubepods/burstable/pod",
    "1:name=systemd:/", "0::/", "-", "_", ".slice", "0123456789abcdef", "\n"]),
    max_size=8).map("".join))
def test_any_cgroup_file_names_a_pod_none_or_is_refused(text: str) -> None:
    try:
        uid = pod_uid_of_cgroup(text)
    except CgroupFileError as error:
        assert "\n" not in str(error)
        return
    assert uid is None or (len(uid) in (32, 36) and uid == uid.lower())


@FUZZ
@given(text=st.text(max_size=200) | st.from_regex(
    r"\[\{\"id\":\"[^\"]{0,8}\"(,\"index\":-?\d{1,3})?(,\"count\":\d{1,12})?\}\]",
    fullmatch=True) | st.from_regex(r"([A-Za-z0-9-]{0,6},){6,9}[a-z]{0,5}:", fullmatch=True))
def test_any_register_annotation_is_read_or_refused(text: str) -> None:
    try:
        cards = decode_register(text)
    except AnnotationError:
        return
    assert cards


_INVENTORY = {"schema": 1, "node": "node-a", "agent_version": "1", "instance": "i",
              "sequence": 1, "timestamp": 1.0, "reason": "start", "heartbeat_interval": 10.0,
              "cards": []}
_NUMBERS = st.one_of(st.integers(-(2**40), 2**40), st.floats(allow_nan=True), st.none(),
                     st.text(max_size=4))


@FUZZ
@given(measured=st.fixed_dictionaries({
    "at": _NUMBERS,
    "cards": st.lists(st.fixed_dictionaries({"uuid": st.text(max_size=50),
                                             "memory_used": _NUMBERS,
                                             "utilization": _NUMBERS}), max_size=3),
    "containers": st.lists(st.fixed_dictionaries({
        "pod_uid": st.text(max_size=10), "container": st.text(max_size=10),
        "device_uuid": st.text(max_size=10), "memory_used": _NUMBERS,
        "utilization": _NUMBERS, "memory_limit": _NUMBERS,
        "source": st.sampled_from(["hami-core", "nvml", "other", ""])}), max_size=3),
    "dropped": _NUMBERS}))
def test_any_measured_usage_is_decoded_whole_or_refused(measured: dict[str, object]) -> None:
    data = msgspec.msgpack.encode({**_INVENTORY, "measured": measured})
    try:
        inventory = decode_inventory(data)
    except WireError as error:
        assert "\n" not in str(error)
        return
    assert inventory.measured is not None
    assert all(0 <= card.utilization <= 100 for card in inventory.measured.cards
               if card.utilization is not None)
