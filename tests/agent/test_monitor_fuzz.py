"""Fuzz targets for the node monitor's doors (hypothesis): whatever a cache file holds,
whatever a process's cgroup file says, whatever a register annotation carries, each is read
or refused with its reason, never raising anything else; and a measured usage on the wire
is decoded whole or refused as the inventory's other fields are."""

from __future__ import annotations

import struct
from pathlib import Path

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.monitor.cache import MAGIC, V0, V1, Refused, Region, read_cache_file
from agent.monitor.processes import CgroupFileError, pod_uid_of_cgroup
from common.core.annotations import AnnotationError
from common.core.registration import decode_register
from common.wire import WireError, decode_inventory
from tests.fakes.hami_core_cache import FakeCache, Proc, Used

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
