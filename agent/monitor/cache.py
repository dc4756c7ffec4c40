"""HAMi-core's shared cache file: its two layouts, and one file read into what the monitor
reports and what the priority feedback loop needs.

HAMi-core keeps one region per container, ``shared_region_t``, in a file it maps shared
(``CUDA_DEVICE_MEMORY_SHARED_CACHE``): the memory each of its processes uses per card, the
cards' SM utilization, and the fields the node monitor writes back (``recent_kernel``,
``utilization_switch``). HAMi v2.10's monitor (``pkg/monitor/nvidia``) knows two layouts,
told apart by the file's size and major version; both are described once below as offset
tables (little-endian, x86-64).

The file is never mapped here: a file truncated under a mapping kills the reader with
SIGBUS. Only the parts needed are read with ``os.pread`` (the header up to the process
slots, the tail fields, then the slots in use), so a file cut short or rewritten while it
is read gives a short read, refused with a reason, never a crash.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from agent.monitor.model import ContainerUsage, DeviceUsage
from common.files import file_kind

MAGIC = 19920718
"""HAMi-core's ``initialized_flag``: the region was set up."""
MAX_DEVICES = 16
MAX_PROCS = 1024
UUID_BYTES = 96
UUID_LABEL_BYTES = 40
"""HAMi's ``device_uuid`` label is the first 40 bytes of the field (``GPU-`` and a UUID)."""
HEADER = struct.Struct("<iii")
"""What HAMi reads before choosing a layout: the magic, then v1's major and minor version
(in v0 those bytes are ``sm_init_flag`` and ``owner_pid``)."""
HEADER_SIZE = HEADER.size

Version = Literal["v0", "v1"]

Reason = Literal[
    "not_a_folder",       # an entry of the containers folder that is not a folder
    "no_separator",       # a folder name without '_' (HAMi: "unexpected name format")
    "bad_name",           # '<uid>_<container>' that cannot be a pod uid and a container
    "pod_not_live",       # a folder of a pod the node does not run (HAMi does not load it)
    "no_cache_file",      # no '*.cache' yet: the container has not initialised CUDA
    "too_many_files",     # more than 2 '*libvgpu.so*' or '*.cache' (HAMi: cache num not matched)
    "too_many_entries",   # a folder with more entries than pyhami looks at
    "unreadable",         # the folder or the file cannot be listed or opened
    "not_a_file",         # the cache file is a link, a FIFO, a device, a folder: never opened
    "no_allocation",      # a container whose cards are not known: its file speaks for none
    "bad_size",           # smaller than either layout
    "bad_magic",          # initialized_flag is not 19920718
    "unknown_version",    # large enough for v1 but its major version is not 1
    "short_read",         # the file ended before a part the layout places there
    "changed",            # the file changed size (or was replaced) while it was read
    "unwritable",         # the feedback loop could not write into the file
    "bad_uuid",           # a card's uuid is not UTF-8: that card is left out
    "over_limit",         # a folder beyond the scan's folder bound: read at a later scan
    "over_time",          # a folder the scan's time bound left: read at a later scan
    "listing_truncated",  # the containers folder has more entries than are listed
]
"""Why a folder, a file or one card of it was skipped; counted, and logged at a bounded
rate."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each field lies in one version of ``shared_region_t`` (byte offsets from the
    start of the file, or of a process slot for the ``slot_`` ones)."""

    version: Version
    size: int
    """``sizeof(shared_region_t)``: HAMi's ``MinSize``."""
    device_num: int
    """uint64, the number of cards HAMi-core set up (clamped to 16 when read)."""
    uuids: int
    """16 x char[96], NUL-terminated NVML UUIDs."""
    limit: int
    """16 x uint64, each card's memory limit in bytes."""
    sm_limit: int
    """16 x uint64, each card's core percent."""
    procs: int
    """1024 process slots of ``slot_size`` bytes."""
    slot_size: int
    slot_used: int
    """16 entries of ``used_size`` bytes: context, module, data ("buffer"), offset, total
    (uint64 each; v1 adds 3 unused)."""
    used_size: int
    slot_device_util: int
    """16 entries of ``util_size`` bytes: dec, enc, sm utilization (uint64 each; v1 adds 3
    unused)."""
    util_size: int
    slot_status: int
    """int32: 0 is a free slot, skipped."""
    proc_num: int
    """int32, the slots in use (clamped to 0..1024 when read)."""
    utilization_switch: int
    """int32, written by the feedback loop."""
    recent_kernel: int
    """int32, written by the feedback loop (-1 pauses kernel launches)."""
    priority: int
    """int32, lower is higher priority."""
    last_kernel_time: int | None
    """int64 Unix seconds (v1 only)."""

    @property
    def tail_size(self) -> int:
        """Bytes from ``proc_num`` through the last field read."""
        end = self.priority + 4 if self.last_kernel_time is None else self.last_kernel_time + 8
        return end - self.proc_num


V1 = Layout(
    version="v1", size=2_008_952,
    device_num=56, uuids=64, limit=1600, sm_limit=1728, procs=1856,
    slot_size=1960, slot_used=8, used_size=64, slot_device_util=1160, util_size=48,
    slot_status=1928,
    proc_num=2_008_896, utilization_switch=2_008_900, recent_kernel=2_008_904,
    priority=2_008_908, last_kernel_time=2_008_912,
)
"""HAMi-core 1.x (``MAJOR_VERSION 1``, ``MINOR_VERSION 2``): magic, major and minor at 0,
4, 8, ``sm_init_flag`` at 12, ``owner_pid`` (uint64) at 16, a 32-byte ``sem_t`` at 24, then
the fields above; 32 bytes (``sem_postinit``) close it."""

V0 = Layout(
    version="v0", size=1_197_896,
    device_num=48, uuids=56, limit=1592, sm_limit=1720, procs=1848,
    slot_size=1168, slot_used=8, used_size=40, slot_device_util=776, util_size=24,
    slot_status=1160,
    proc_num=1_197_880, utilization_switch=1_197_884, recent_kernel=1_197_888,
    priority=1_197_892, last_kernel_time=None,
)
"""The layout before versions: magic at 0, ``sm_init_flag`` at 4, ``owner_pid`` (uint32)
at 8, a 32-byte ``sem_t`` at 12; no version fields and no ``last_kernel_time``."""

LAYOUTS = (V0, V1)


def choose_layout(size: int, major: int) -> Layout | None:
    """HAMi's choice: v0 when ``v0 size <= size < v1 size`` (whatever the bytes where v1
    keeps its version say), v1 when the major version is 1 and the file holds a whole v1
    region; None otherwise."""
    if V0.size <= size < V1.size:
        return V0
    if major == 1 and size >= V1.size:
        return V1
    return None


def _slot_type(layout: Layout) -> np.dtype[np.void]:
    """One process slot as numpy reads it: only the fields aggregated."""
    return np.dtype({
        "names": ["used", "util", "status"],
        "formats": [("<u8", (MAX_DEVICES, layout.used_size // 8)),
                    ("<u8", (MAX_DEVICES, layout.util_size // 8)), "<i4"],
        "offsets": [layout.slot_used, layout.slot_device_util, layout.slot_status],
        "itemsize": layout.slot_size,
    })


_SLOT_TYPES = {layout.version: _slot_type(layout) for layout in LAYOUTS}
# Positions inside one used[i] and one device_util[i] entry (uint64 words).
_CONTEXT, _MODULE, _BUFFER, _TOTAL = 0, 1, 2, 4
_SM_UTIL = 2


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What tells the file read from one put in its place at the same path."""

    device: int
    inode: int
    size: int


@dataclass(frozen=True, slots=True)
class Refused:
    """A file, or a folder, skipped: why, and a one-line detail naming it."""

    reason: Reason
    detail: str


@dataclass(frozen=True, slots=True)
class Region:
    """One container's cache file as read at a scan: its figures, and what the feedback
    loop decides from and writes to."""

    path: Path
    identity: FileIdentity
    layout: Layout
    major: int | None
    """v1's version (None for v0)."""
    minor: int | None
    devices: tuple[DeviceUsage, ...]
    """One per card ``i < min(device_num, 16)`` with a uuid set and readable."""
    device_cards: tuple[bytes, ...]
    """Each of ``devices``' uuid whole, cut at its first NUL (the label keeps 40 bytes):
    what the container's allocation is checked against."""
    bad_uuids: int
    """Cards left out because their uuid is not UTF-8."""
    card_uuids: tuple[bytes, ...]
    """The uuid of every one of the 16 places that has one set, in order, cut at its first
    NUL: what HAMi's feedback loop keys its census on (it looks at all 16, not
    ``device_num``), once checked against the container's allocation."""
    priority: int
    recent_kernel: int
    utilization_switch: int
    last_kernel_time: int | None
    """Unix seconds of the last kernel launch, when set (v1 only)."""

    def usage(self, pod_uid: str, container: str,
              cards: Collection[str] | None = None) -> ContainerUsage:
        """The container's figures in the monitor's model; given ``cards`` (the cards the
        container was given), only theirs."""
        devices = self.devices if cards is None else tuple(
            device for device, card in zip(self.devices, self.device_cards, strict=True)
            if _text(card) in cards)
        return ContainerUsage(pod_uid=pod_uid, container=container, devices=devices,
                              source="hami-core", last_kernel_time=self.last_kernel_time)


def card_name(field: bytes) -> bytes:
    """A uuid field of the region, cut at its first NUL."""
    return field.split(b"\0", 1)[0]


def _text(card: bytes) -> str | None:
    try:
        return card.decode("utf-8")
    except UnicodeDecodeError:
        return None


_PROC_FD = Path("/proc/self/fd")
"""Where a descriptor opened ``O_PATH`` is opened again for reading or writing: the very
file it holds, with no lookup by name in between."""
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _same_inode(first: os.stat_result, second: os.stat_result) -> bool:
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def open_folder(path: Path) -> int | Refused:
    """A descriptor of the folder ``path`` (a container's folder, writable from inside the
    container): looked at without following a link (``lstat``), opened only when it is a
    folder, never through a link, and refused when what was opened is not what was looked
    at."""
    try:
        seen = os.lstat(path)
    except OSError as error:
        return _unreadable(path, error)
    if not stat.S_ISDIR(seen.st_mode):
        return Refused("not_a_folder", f"{path}: {file_kind(seen.st_mode)}, not a folder")
    try:
        fd = os.open(path, _FOLDER_FLAGS)
    except OSError as error:
        return _unreadable(path, error)
    try:
        opened = os.fstat(fd)
    except OSError as error:
        os.close(fd)
        return _unreadable(path, error)
    if not (stat.S_ISDIR(opened.st_mode) and _same_inode(seen, opened)):
        os.close(fd)
        return Refused("changed", f"{path}: replaced while it was opened")
    return fd


def open_regular(path: Path, flags: int) -> int | Refused:
    """A descriptor of ``path`` opened with ``flags``, when it is a regular file in a folder
    that is one: nothing in a container's folder is opened otherwise (opening a FIFO or a
    device made there would run its open code on the host), and no link is followed (the
    agent writes back into the file)."""
    folder = open_folder(path.parent)
    if isinstance(folder, Refused):
        return folder
    try:
        return open_regular_at(folder, path.name, flags, path)
    finally:
        os.close(folder)


def open_regular_at(folder: int, name: str, flags: int, path: Path) -> int | Refused:
    """``name`` in the open ``folder`` (``path`` names it in details), opened with ``flags``
    when it is a regular file.

    Looked at first without following a link (``lstat``): anything but a regular file is
    refused unopened. Then pinned with ``O_PATH | O_NOFOLLOW`` (which runs no open code:
    a FIFO or a device swapped in meanwhile is held, not opened), checked again on the
    pinned descriptor, and only then opened for ``flags`` through ``/proc/self/fd``, the
    same file with no second lookup by name; the descriptor is checked once more
    (regular, the inode looked at). Without ``/proc`` it is opened by name with
    ``O_NOFOLLOW | O_NONBLOCK`` and the same checks after.
    """
    try:
        seen = _look(folder, name)
    except OSError as error:
        return _unreadable(path, error)
    if not stat.S_ISREG(seen.st_mode):
        return Refused("not_a_file", f"{path}: {file_kind(seen.st_mode)}, not a regular file")
    opened_flags = flags | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        pinned = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    except OSError as error:
        return _unreadable(path, error)
    try:
        refused = _check_opened(pinned, seen, path)
        if refused is not None:
            return refused
        try:
            fd = os.open(_PROC_FD / str(pinned), opened_flags)
        except FileNotFoundError:
            if _PROC_FD.is_dir():
                raise
            fd = os.open(name, opened_flags | os.O_NOFOLLOW, dir_fd=folder)
    except OSError as error:
        return _unreadable(path, error)
    finally:
        os.close(pinned)
    try:
        refused = _check_opened(fd, seen, path)
    except OSError as error:
        refused = _unreadable(path, error)
    if refused is not None:
        os.close(fd)
        return refused
    return fd


def _look(folder: int, name: str) -> os.stat_result:
    """``name`` in ``folder`` as it is (``lstat``): a link is not followed."""
    return os.stat(name, dir_fd=folder, follow_symlinks=False)


def _check_opened(fd: int, seen: os.stat_result, path: Path) -> Refused | None:
    """Refused unless ``fd`` is a regular file and the inode ``seen`` before opening."""
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode):
        return Refused("not_a_file", f"{path}: became {file_kind(opened.st_mode)} while opened")
    if not _same_inode(seen, opened):
        return Refused("changed", f"{path}: replaced while it was opened")
    return None


def _unreadable(path: Path, error: OSError) -> Refused:
    if isinstance(error, FileNotFoundError):
        return Refused("unreadable", f"{path}: gone")
    if error.errno == errno.ELOOP:  # a link put there after it was looked at
        return Refused("not_a_file", f"{path}: a link, not followed")
    return Refused("unreadable", f"{path}: {error.strerror or error}")


def identity_of(fd: int) -> FileIdentity:
    status = os.fstat(fd)
    return FileIdentity(status.st_dev, status.st_ino, status.st_size)


def read_exactly(fd: int, size: int, offset: int, path: Path, what: str) -> bytes | Refused:
    """``size`` bytes at ``offset``, or a short read refused."""
    data = os.pread(fd, size, offset)
    if len(data) < size:
        return Refused("short_read", f"{path}: {what} at byte {offset} cut short "
                                     f"({len(data)} of {size} bytes)")
    return data


def check_header(path: Path, fd: int, size: int) -> tuple[Layout, int, int] | Refused:
    """The layout of the file (and the two header words after the magic), as HAMi
    chooses it; refused as HAMi refuses it."""
    if size < HEADER_SIZE:
        return Refused("bad_size", f"{path}: cache file size {size} too small")
    header = read_exactly(fd, HEADER_SIZE, 0, path, "the header")
    if isinstance(header, Refused):
        return header
    magic, major, minor = HEADER.unpack(header)
    if magic != MAGIC:
        return Refused("bad_magic", f"{path}: cache file magic flag not matched ({magic})")
    layout = choose_layout(size, major)
    if layout is None:
        reason: Reason = "bad_size" if size < V0.size else "unknown_version"
        return Refused(reason, f"{path}: unknown cache file size {size} "
                               f"version {major}.{minor}")
    return layout, major, minor


def read_cache_file(path: Path) -> Region | Refused:
    """The region in the cache file at ``path``; a file that cannot be one is refused with
    its reason. Never raises for what is in, or happens to, the file."""
    fd = open_regular(path, os.O_RDONLY)
    if isinstance(fd, Refused):
        return fd
    try:
        return _read(path, fd)
    except OSError as error:
        return Refused("unreadable", f"{path}: {error.strerror or error}")
    finally:
        os.close(fd)


def _read(path: Path, fd: int) -> Region | Refused:
    identity = identity_of(fd)
    checked = check_header(path, fd, identity.size)
    if isinstance(checked, Refused):
        return checked
    layout, major, minor = checked
    top = read_exactly(fd, layout.procs, 0, path, "the header and cards")
    if isinstance(top, Refused):
        return top
    tail = read_exactly(fd, layout.tail_size, layout.proc_num, path, "the tail fields")
    if isinstance(tail, Refused):
        return tail
    proc_num, utilization_switch, recent_kernel, priority = struct.unpack_from("<4i", tail)
    last_kernel_time = None
    if layout.last_kernel_time is not None:
        (kernel_time,) = struct.unpack_from("<q", tail, layout.last_kernel_time - layout.proc_num)
        last_kernel_time = kernel_time if kernel_time > 0 else None
    slots_in_use = min(max(proc_num, 0), MAX_PROCS)
    slots = read_exactly(fd, slots_in_use * layout.slot_size, layout.procs, path,
                         f"{slots_in_use} process slots")
    if isinstance(slots, Refused):
        return slots
    # A file replaced or resized while it was read mixes two regions: read it next time.
    if identity_of(fd) != identity:
        return Refused("changed", f"{path}: changed while it was read")
    (device_num,) = struct.unpack_from("<Q", top, layout.device_num)
    uuids = [top[layout.uuids + i * UUID_BYTES:layout.uuids + (i + 1) * UUID_BYTES]
             for i in range(MAX_DEVICES)]
    limits = struct.unpack_from(f"<{MAX_DEVICES}Q", top, layout.limit)
    devices, bad_uuids = _devices(layout, min(device_num, MAX_DEVICES), uuids, limits, slots)
    return Region(
        path=path, identity=identity, layout=layout,
        major=major if layout is V1 else None, minor=minor if layout is V1 else None,
        devices=devices, bad_uuids=bad_uuids,
        device_cards=tuple(card_name(uuids[device.vdevice_index]) for device in devices),
        card_uuids=tuple(card_name(uuid) for uuid in uuids if uuid[0] != 0),
        priority=priority, recent_kernel=recent_kernel,
        utilization_switch=utilization_switch, last_kernel_time=last_kernel_time)


def _devices(layout: Layout, device_num: int, uuids: list[bytes], limits: tuple[int, ...],
             slots: bytes) -> tuple[tuple[DeviceUsage, ...], int]:
    """HAMi's ``Spec`` sums over the slots in use whose status is not 0, per card."""
    table = np.frombuffer(slots, dtype=_SLOT_TYPES[layout.version])
    active = table[table["status"] != 0]
    # Sums of uint64 wrap as Go's do.
    used: npt.NDArray[np.uint64] = active["used"].sum(axis=0, dtype=np.uint64)
    util: npt.NDArray[np.uint64] = active["util"].sum(axis=0, dtype=np.uint64)
    devices, bad = [], 0
    for index in range(device_num):
        if uuids[index][0] == 0:
            continue  # not set up yet
        try:
            label = uuids[index][:UUID_LABEL_BYTES].split(b"\0", 1)[0].decode("utf-8")
        except UnicodeDecodeError:
            bad += 1
            continue
        devices.append(DeviceUsage(
            vdevice_index=index, device_uuid=label,
            memory_used=int(used[index, _TOTAL]),
            utilization=int(util[index, _SM_UTIL]),
            memory_limit=limits[index],
            context=int(used[index, _CONTEXT]), module=int(used[index, _MODULE]),
            buffer=int(used[index, _BUFFER])))
    return tuple(devices), bad
