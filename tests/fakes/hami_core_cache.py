"""Real HAMi-core cache files, written as HAMi-core lays them out, for the monitor's tests.

The offsets are the reference's (``hami-v2.10-reference.md`` 2.3), written out here on
their own rather than taken from ``agent.monitor.cache``, so a wrong table in the reader
cannot agree with itself.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from common.wire import HoldingPod

MAGIC = 19920718

# Byte offsets per layout: header fields, tables, the proc slots and their inner fields.
OFFSETS: dict[str, dict[str, int]] = {
    "v1": {
        "size": 2_008_952, "major": 4, "minor": 8, "sm_init_flag": 12, "owner_pid": 16,
        "device_num": 56, "uuids": 64, "limit": 1600, "sm_limit": 1728, "procs": 1856,
        "slot": 1960, "slot_pid": 0, "slot_hostpid": 4, "slot_used": 8, "used": 64,
        "slot_monitorused": 1032, "slot_util": 1160, "util": 48, "slot_status": 1928,
        "proc_num": 2_008_896, "utilization_switch": 2_008_900, "recent_kernel": 2_008_904,
        "priority": 2_008_908, "last_kernel_time": 2_008_912,
    },
    "v0": {
        "size": 1_197_896, "sm_init_flag": 4, "owner_pid": 8,
        "device_num": 48, "uuids": 56, "limit": 1592, "sm_limit": 1720, "procs": 1848,
        "slot": 1168, "slot_pid": 0, "slot_hostpid": 4, "slot_used": 8, "used": 40,
        "slot_monitorused": 648, "slot_util": 776, "util": 24, "slot_status": 1160,
        "proc_num": 1_197_880, "utilization_switch": 1_197_884, "recent_kernel": 1_197_888,
        "priority": 1_197_892,
    },
}


@dataclass
class Used:
    """One process's memory on one card (bytes)."""

    context: int = 0
    module: int = 0
    buffer: int = 0
    offset: int = 0
    total: int = 0


@dataclass
class Proc:
    """One process slot: its memory and SM utilization per card index."""

    pid: int = 100
    hostpid: int = 0
    status: int = 1
    used: dict[int, Used] = field(default_factory=dict)
    sm_util: dict[int, int] = field(default_factory=dict)
    monitorused: dict[int, int] = field(default_factory=dict)


@dataclass
class FakeCache:
    """A whole region; every field HAMi-core sets, with its values at start-up."""

    layout: Literal["v0", "v1"] = "v1"
    magic: int = MAGIC
    major: int = 1
    minor: int = 2
    device_num: int = 1
    uuids: dict[int, bytes] = field(default_factory=dict)
    limits: dict[int, int] = field(default_factory=dict)
    sm_limits: dict[int, int] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    proc_num: int | None = None
    """None: the number of ``procs``."""
    utilization_switch: int = 1
    recent_kernel: int = 2
    priority: int = 1
    last_kernel_time: int = 0
    size: int | None = None
    """None: the layout's size; else the file is cut or padded to it."""

    def to_bytes(self) -> bytes:
        at = OFFSETS[self.layout]
        data = bytearray(at["size"])
        struct.pack_into("<i", data, 0, self.magic)
        if self.layout == "v1":
            struct.pack_into("<II", data, at["major"], self.major, self.minor)
            struct.pack_into("<Q", data, at["owner_pid"], 4242)
        else:
            struct.pack_into("<I", data, at["owner_pid"], 4242)
        struct.pack_into("<i", data, at["sm_init_flag"], 1)
        struct.pack_into("<Q", data, at["device_num"], self.device_num)
        for index, uuid in self.uuids.items():
            start = at["uuids"] + index * 96
            data[start:start + len(uuid)] = uuid
        for index, limit in self.limits.items():
            struct.pack_into("<Q", data, at["limit"] + index * 8, limit)
        for index, sm_limit in self.sm_limits.items():
            struct.pack_into("<Q", data, at["sm_limit"] + index * 8, sm_limit)
        for number, proc in enumerate(self.procs):
            slot = at["procs"] + number * at["slot"]
            struct.pack_into("<ii", data, slot, proc.pid, proc.hostpid)
            for index, used in proc.used.items():
                struct.pack_into("<5Q", data, slot + at["slot_used"] + index * at["used"],
                                 used.context, used.module, used.buffer, used.offset,
                                 used.total)
            for index, value in proc.monitorused.items():
                struct.pack_into("<Q", data, slot + at["slot_monitorused"] + index * 8, value)
            for index, sm in proc.sm_util.items():
                # dec and enc first; the monitor reads only sm.
                struct.pack_into("<3Q", data, slot + at["slot_util"] + index * at["util"],
                                 7, 9, sm)
            struct.pack_into("<i", data, slot + at["slot_status"], proc.status)
        proc_num = len(self.procs) if self.proc_num is None else self.proc_num
        struct.pack_into("<4i", data, at["proc_num"], proc_num, self.utilization_switch,
                         self.recent_kernel, self.priority)
        if self.layout == "v1":
            struct.pack_into("<q", data, at["last_kernel_time"], self.last_kernel_time)
        if self.size is not None:
            data = data[:self.size] + bytes(max(self.size - len(data), 0))
        return bytes(data)


def gpu_uuid(number: int) -> bytes:
    """An NVML-like card uuid, 40 bytes: ``GPU-`` and a UUID."""
    return f"GPU-{number:08x}-0000-4000-8000-000000000000".encode()


def write_cache(path: Path, cache: FakeCache) -> Path:
    """Write ``cache`` to ``path`` (its folder made); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(cache.to_bytes())
    return path


def read_int32(path: Path, offset: int) -> int:
    """The int32 at ``offset`` of the file, as HAMi-core would read it."""
    with path.open("rb") as file:
        file.seek(offset)
        (value,) = struct.unpack("<i", file.read(4))
    return int(value)


class HoldingPodsByHand:
    """The daemon's list of the pods holding cards on the node (the node monitor's
    ``HoldingSource``), as the test says: whose folders these files are in, and which cards
    each container was given."""

    def __init__(self, *pods: HoldingPod) -> None:
        self.pods = list(pods)

    async def holding_pods(self, node: str) -> list[HoldingPod]:
        return list(self.pods)
