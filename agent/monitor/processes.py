"""Usage measured where HAMi-core is absent: NVML's processes mapped to pods through their
cgroups, then to the containers holding the cards, from the daemon's list of pods holding
cards on the node (``HoldingPod``).

HAMi's monitor has no such path: without HAMi-core's cache files it reports no container.
Here every node is measured, enforced or not. ``container_usage`` is the whole path:

1. At most ``max_processes`` of NVML's processes are looked at in one scan (the rest are
   skipped, ``too_many``); a process NVML lists twice on one card counts once.
2. Each pid's ``<proc root>/<pid>/cgroup`` is read once per scan, at most ``read_max``
   bytes, and the pod UID found in its paths (``pod_uid_of_cgroup``: cgroup v1 and v2,
   the cgroupfs and systemd drivers, any runtime's container scope below the pod).
3. The processes of one pod on one card go to the one app container of the pod that holds
   the card; where none or several do, to the container ``""`` (``attribute``).

A process skipped is counted by reason in the scan and logged at a bounded rate, never
raised: ``invalid_pid`` (NVML gave no usable pid), ``gone`` (it ended meanwhile),
``unreadable`` (its cgroup file cannot be read), ``oversized`` (a file longer than
``read_max``), ``garbage`` (not a cgroup file, or one naming two pods), ``no_pod`` (a host
process, or a container of no Kubernetes pod), ``unknown_pod`` (a pod holding no card the
daemon knows of), ``too_many`` and ``duplicate``.

The inventory counts the tenants each card has with the same attribution
(``tenants_seen``): a pod once, however many processes it runs on the card, and a
process no pod is found for once (see there).
"""

from __future__ import annotations

import logging
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent.errors import AgentError
from agent.monitor.model import ContainerUsage, DeviceUsage, GpuProcess
from common.core.errors import InvalidInput
from common.messaging import RateLimitedLog
from common.wire import HoldingPod

logger = logging.getLogger(__name__)

DEFAULT_PROC_ROOT = Path("/proc")
# A process's cgroup file is one line per v1 hierarchy (about a dozen, each well under
# 512 bytes) or one line on v2: 16 KiB holds any real one with room to spare.
CGROUP_READ_MAX = 16 * 1024
# Far more compute processes than any node runs on its cards (NVML lists at most a few
# dozen per card); each costs one small file read.
PROCESSES_PER_SCAN_MAX = 4096

SkipReason = Literal["invalid_pid", "gone", "unreadable", "oversized", "garbage", "no_pod",
                     "unknown_pod", "too_many", "duplicate"]


def _uid_pattern(dash: str) -> str:
    """A pod's UID, its dashes written ``dash``: a UUID, or 32 hex digits (the hash kubelet
    gives a static pod)."""
    hexes = "[0-9a-f]"
    return (f"{hexes}{{8}}{dash}{hexes}{{4}}{dash}{hexes}{{4}}{dash}{hexes}{{4}}{dash}"
            f"{hexes}{{12}}|{hexes}{{32}}")


# cgroupfs driver: /kubepods[/burstable|/besteffort]/pod<uid>/<container id>.
_CGROUPFS_POD = re.compile(f"pod({_uid_pattern('-')})")
# systemd driver: kubepods[-burstable|-besteffort]-pod<uid, - as _>.slice, under any
# prefix (kind's kubelet-kubepods-...).
_SYSTEMD_POD = re.compile(
    rf"(?:.*-)?kubepods(?:-burstable|-besteffort)?-pod({_uid_pattern('_')})\.slice")
# hierarchy-ID:controller-list:cgroup-path (v2: 0::path).
_LINE = re.compile(r"(\d+):([^:]*):(/.*)")

_SKIPS_LOG = RateLimitedLog(log=logger)


class CgroupFileError(AgentError, InvalidInput):
    """A process's cgroup file is no cgroup file, or names two pods."""


@dataclass(frozen=True, slots=True)
class ProcessScan:
    """What one scan measured of NVML's processes."""

    usages: tuple[ContainerUsage, ...]
    """One per (pod, container), ``source="nvml"``, ordered by pod UID then container."""
    skipped: Mapping[SkipReason, int]
    """How many of NVML's processes were left out, by reason (only reasons that occurred)."""


def pod_uid_of_cgroup(text: str) -> str | None:
    """The UID of the pod whose cgroup ``text`` (a ``/proc/<pid>/cgroup``) places the
    process in; None for a process in no pod's cgroup.

    Every line's path is searched, its last pod segment counting: ``pod<uid>`` (cgroupfs)
    or ``…kubepods[-qos]-pod<uid with _>.slice`` (systemd), whatever the container scope
    below it (``cri-containerd-…``, ``crio-…``, ``docker-…``, a bare id). Raises
    ``CgroupFileError`` for text that is no cgroup file, or that names two pods.
    """
    uids = set()
    lines = [line for line in text.splitlines() if line]
    if not lines:
        raise CgroupFileError("an empty cgroup file")
    for line in lines:
        match = _LINE.fullmatch(line)
        if match is None:
            raise CgroupFileError(f"not a cgroup line: {line[:80]!r}")
        uid = _pod_in_path(match.group(3))
        if uid is not None:
            uids.add(uid)
    if len(uids) > 1:
        raise CgroupFileError(f"names several pods: {', '.join(sorted(uids))}")
    return uids.pop() if uids else None


def _pod_in_path(path: str) -> str | None:
    found = None
    for segment in path.split("/"):
        if match := _CGROUPFS_POD.fullmatch(segment):
            found = match.group(1)
        elif match := _SYSTEMD_POD.fullmatch(segment):
            found = match.group(1).replace("_", "-")
    return found


@dataclass(frozen=True, slots=True)
class Skipped:
    """Why a process is not measured: the reason counted, the detail logged."""

    reason: SkipReason
    detail: str


def read_pod_uid(proc_root: Path, pid: int, read_max: int = CGROUP_READ_MAX) -> str | Skipped:
    """The pod UID of process ``pid`` from ``<proc_root>/<pid>/cgroup``, or why none."""
    if pid <= 0:
        return Skipped("invalid_pid", "NVML gives no pid")
    path = proc_root / str(pid) / "cgroup"
    try:
        with path.open("rb") as file:
            # procfs files report no size: read one byte past the bound to see it exceeded.
            raw = file.read(read_max + 1)
    except (FileNotFoundError, ProcessLookupError):
        return Skipped("gone", f"{path} is gone")
    except OSError as error:
        return Skipped("unreadable", f"{path}: {error.strerror or error}")
    if len(raw) > read_max:
        return Skipped("oversized", f"{path} is longer than {read_max} bytes")
    try:
        uid = pod_uid_of_cgroup(raw.decode())
    except UnicodeDecodeError:
        return Skipped("garbage", f"{path}: not text")
    except CgroupFileError as error:
        return Skipped("garbage", f"{path}: {error}")
    if uid is None:
        return Skipped("no_pod", f"{path} names no pod")
    return uid


def attribute(found: Iterable[tuple[str, GpuProcess]], holding: Sequence[HoldingPod],
              ) -> tuple[tuple[ContainerUsage, ...], int]:
    """Processes with their pod's UID, summed per (pod, container, card): the usages, and
    how many processes belong to no pod of ``holding`` (``unknown_pod``). Pure.

    A pod's processes on a card go to the app container of the pod that holds that card,
    where exactly one does, at the card's place among that container's cards
    (``vdevice_index``); where none or several do (NVML cannot tell a pod's containers
    apart), to the container ``""`` at ``vdevice_index`` 0. Init containers are not
    counted, as HAMi's monitor reports app containers only.
    """
    pods = {pod.uid: pod for pod in holding}
    memory: Counter[tuple[str, str, str]] = Counter()
    utilization: Counter[tuple[str, str, str]] = Counter()
    vdevice: dict[tuple[str, str, str], int] = {}
    unknown = 0
    for uid, process in found:
        pod = pods.get(uid)
        if pod is None:
            unknown += 1
            continue
        card = process.device_uuid
        holders = [container for container in pod.containers
                   if not container.init and card in container.cards]
        if len(holders) == 1:
            key = (uid, holders[0].name, card)
            vdevice[key] = holders[0].cards.index(card)
        else:
            key = (uid, "", card)
            vdevice[key] = 0
        memory[key] += process.memory_used
        utilization[key] += process.utilization
    devices: defaultdict[tuple[str, str], list[DeviceUsage]] = defaultdict(list)
    for key, index in vdevice.items():
        uid, container, card = key
        devices[uid, container].append(DeviceUsage(
            vdevice_index=index, device_uuid=card, memory_used=memory[key],
            utilization=utilization[key]))
    usages = tuple(
        ContainerUsage(pod_uid=uid, container=container, source="nvml",
                       devices=tuple(sorted(cards, key=lambda d: (d.vdevice_index,
                                                                  d.device_uuid))))
        for (uid, container), cards in sorted(devices.items()))
    return usages, unknown


def container_usage(processes: Sequence[GpuProcess], holding: Sequence[HoldingPod],
                    proc_root: Path = DEFAULT_PROC_ROOT, *,
                    max_processes: int = PROCESSES_PER_SCAN_MAX,
                    read_max: int = CGROUP_READ_MAX,
                    skips_log: RateLimitedLog = _SKIPS_LOG) -> ProcessScan:
    """The usage of the containers of ``holding`` measured from NVML's ``processes``
    (``HostProbe.gpu_processes``), each mapped to its pod through ``<proc_root>/<pid>/
    cgroup``. Blocks on file reads: call it from a worker thread. Never raises for a
    process: a skipped one is counted by reason and logged at a bounded rate (one line per
    reason a minute)."""
    skipped: Counter[SkipReason] = Counter()
    if len(processes) > max_processes:
        skipped["too_many"] = len(processes) - max_processes
        skips_log.warning("too_many", "%d processes on the cards, only %d looked at in "
                          "one scan", len(processes), max_processes)
    pods_of: dict[int, str | Skipped] = {}
    seen: set[tuple[int, str]] = set()
    found: list[tuple[str, GpuProcess]] = []
    for process in processes[:max_processes]:
        if (process.pid, process.device_uuid) in seen:
            skipped["duplicate"] += 1
            continue
        seen.add((process.pid, process.device_uuid))
        if process.pid not in pods_of:
            pods_of[process.pid] = read_pod_uid(proc_root, process.pid, read_max)
        pod = pods_of[process.pid]
        if isinstance(pod, Skipped):
            skipped[pod.reason] += 1
            skips_log.warning(pod.reason, "process %d on %s not measured (%s): %s",
                              process.pid, process.device_uuid, pod.reason, pod.detail)
            continue
        found.append((pod, process))
    usages, unknown = attribute(found, holding)
    if unknown:
        skipped["unknown_pod"] += unknown
        skips_log.warning("unknown_pod", "%d processes of pods holding no card on this "
                          "node not measured", unknown)
    return ProcessScan(usages=usages, skipped=dict(skipped))


def tenants_per_card(processes: Iterable[tuple[str, int, str | None]]) -> dict[str, int]:
    """How many tenants each card has, from its processes as (card UUID, pid, pod UID or
    None). Pure.

    A pod counts once on a card, however many processes it runs there (a tenant is a pod,
    as the scheduler books one). A process no pod is found for counts once: something
    started outside the scheduler still takes a slot, and so does a process whose pod
    cannot be read; listed twice on one card, it is still one. A process without a usable
    pid (0: NVML does not say) counts once each, as nothing tells two of them apart.
    Cards with no process are absent.
    """
    tenants: defaultdict[str, set[str | int]] = defaultdict(set)
    unnamed: Counter[str] = Counter()
    for card, pid, pod in processes:
        if pod is not None:
            tenants[card].add(pod)
        elif pid > 0:
            tenants[card].add(pid)  # a str and an int never compare equal: no clash
        else:
            unnamed[card] += 1
    return {card: len(tenants[card]) + unnamed[card] for card in {*tenants, *unnamed}}


def tenants_seen(processes: Sequence[tuple[str, int]], proc_root: Path | None, *,
                 max_processes: int = PROCESSES_PER_SCAN_MAX,
                 read_max: int = CGROUP_READ_MAX) -> dict[str, int]:
    """How many tenants each card has (``tenants_per_card``), from NVML's processes as
    (card UUID, pid), each pid's pod read from ``<proc_root>/<pid>/cgroup`` as the
    monitor reads it (``read_pod_uid``). Blocks on file reads: call it from a worker
    thread.

    At most ``max_processes`` distinct pids are read, each once, at most ``read_max``
    bytes; a process not read (beyond the bound, or with no ``proc_root``: no attribution
    wired) and one whose file gives no pod (gone, unreadable, garbage, no pod in its
    cgroup) counts once, as NVML's own count did. Without the host's processes, then,
    the figure is NVML's count: never fewer tenants than the card may have. Nothing is
    logged here: the monitor's round reads the same processes and counts why it skipped
    any (``container_usage``).
    """
    pods: dict[int, str | None] = {}
    owned = []
    for card, pid in processes:
        if pid not in pods and proc_root is not None and pid > 0 and len(pods) < max_processes:
            found = read_pod_uid(proc_root, pid, read_max)
            pods[pid] = None if isinstance(found, Skipped) else found
        owned.append((card, pid, pods.get(pid)))
    return tenants_per_card(owned)
