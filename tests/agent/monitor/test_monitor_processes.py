"""NVML's processes measured where HAMi-core is absent: each pid's pod from its cgroup file in
a /proc tree written by the test, then the containers holding the cards."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agent.monitor.model import ContainerUsage, DeviceUsage, GpuProcess
from agent.monitor.processes import (
    CgroupFileError,
    ProcessScan,
    Skipped,
    attribute,
    container_usage,
    pod_uid_of_cgroup,
    read_pod_uid,
    tenants_per_card,
    tenants_seen,
)
from common.messaging import RateLimitedLog
from common.wire import HoldingContainer, HoldingPod
from tests.fakes.proc import unreadable_cgroup, write_cgroup

UID = "0f6c9a1e-7b2d-4c3e-9a8f-1d2e3f4a5b6c"
SYSTEMD_UID = UID.replace("-", "_")
STATIC_UID = "6a1f0c3e9b8d7a6f5e4d3c2b1a0f9e8d"
OTHER_UID = "11111111-2222-3333-4444-555555555555"
CID = "3f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b0a1f2e3d4c5b6a7f8e9d0c1b2a3f4e"
MIB = 1024 * 1024


def _v1(path: str) -> str:
    """A cgroup v1 file: one line per hierarchy, the same path in each."""
    controllers = ["cpuset", "cpu,cpuacct", "memory", "devices", "pids", "name=systemd"]
    lines = [f"{12 - n}:{controller}:{path}" for n, controller in enumerate(controllers)]
    return "\n".join(lines) + "\n"


def _v2(path: str) -> str:
    return f"0::{path}\n"


@pytest.mark.parametrize(("text", "uid"), [
    (_v1(f"/kubepods/burstable/pod{UID}/{CID}"), UID),
    (_v1(f"/kubepods/besteffort/pod{UID}/{CID}"), UID),
    (_v1(f"/kubepods/pod{UID}/{CID}"), UID),
    (_v1(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/"
         f"docker-{CID}.scope"), UID),
    (_v1(f"/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope"), UID),
    (_v2(f"/kubepods/burstable/pod{UID}/{CID}"), UID),
    (_v2(f"/kubepods/pod{UID}/{CID}"), UID),
    (_v2(f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice/"
         f"cri-containerd-{CID}.scope"), UID),
    (_v2(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/"
         f"crio-{CID}.scope"), UID),
    (_v2(f"/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/crio-{CID}.scope"), UID),
    # kind: the node's kubelet in a container names its slices kubelet-kubepods-...
    (_v2(f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
         f"kubelet-kubepods-besteffort-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope"), UID),
    # Seen from the agent's own cgroup namespace: the path climbs out of its cgroup.
    (_v2(f"/../../kubepods-burstable-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope"), UID),
    # A static pod's UID is kubelet's hash of its manifest.
    (_v2(f"/kubepods/burstable/pod{STATIC_UID}/{CID}"), STATIC_UID),
    # Hybrid hierarchy: the v1 lines name the pod, the v2 line is the root.
    (_v1(f"/kubepods/burstable/pod{UID}/{CID}") + "0::/\n", UID),
    # No pod: host processes and containers outside Kubernetes.
    (_v2("/user.slice/user-1000.slice/session-3.scope"), None),
    (_v1("/system.slice/docker-" + CID + ".scope"), None),
    (_v2("/"), None),
    (_v2(f"/kubepods/burstable/pod{UID[:-1]}/{CID}"), None),  # no UID: one digit short
    (_v2(f"/kubepods/burstable/pod{UID.upper()}/{CID}"), None),  # UIDs are lower case
    (_v2(f"/kubepods.slice/kubepods-burstable-pod{UID}.slice/{CID}"), None),  # - in a slice
], ids=["v1-cgroupfs-burstable", "v1-cgroupfs-besteffort", "v1-cgroupfs-guaranteed",
        "v1-systemd-burstable-docker", "v1-systemd-guaranteed-containerd",
        "v2-cgroupfs-burstable", "v2-cgroupfs-guaranteed", "v2-systemd-besteffort-containerd",
        "v2-systemd-burstable-crio", "v2-systemd-guaranteed-crio", "v2-systemd-kind",
        "v2-cgroup-namespace", "v2-static-pod", "hybrid", "host-session",
        "docker-outside-kubernetes", "root", "uid-too-short", "uid-upper-case",
        "systemd-uid-with-dashes"])
def test_the_pod_uid_is_found_in_the_cgroup_paths(text: str, uid: str | None) -> None:
    assert pod_uid_of_cgroup(text) == uid


@pytest.mark.parametrize(("text", "why"), [
    ("", "empty"),
    ("\n\n", "empty"),
    ("hello world\n", "not a cgroup line"),
    ("0::relative/path\n", "not a cgroup line"),
    (_v2(f"/kubepods/pod{UID}/{CID}") + "x:memory:/\n", "not a cgroup line"),
    (f"3:memory:/kubepods/pod{UID}/{CID}\n2:cpu:/kubepods/pod{OTHER_UID}/{CID}\n",
     "names several pods"),
], ids=["empty", "blank-lines", "prose", "relative-path", "bad-hierarchy-id", "two-pods"])
def test_a_file_that_is_no_cgroup_file_is_refused(text: str, why: str) -> None:
    with pytest.raises(CgroupFileError, match=why):
        pod_uid_of_cgroup(text)


def test_a_process_is_read_from_its_cgroup_file_or_skipped_with_its_reason(
        tmp_path: Path) -> None:
    write_cgroup(tmp_path, 100, _v2(f"/kubepods/burstable/pod{UID}/{CID}"))
    write_cgroup(tmp_path, 101, _v2("/system.slice/sshd.service"))
    write_cgroup(tmp_path, 102, b"\xff\xfe\x00garbage")
    write_cgroup(tmp_path, 103, "0::/" + "x" * 200 + "\n")
    unreadable_cgroup(tmp_path, 104)
    assert read_pod_uid(tmp_path, 100) == UID
    assert read_pod_uid(tmp_path, 101) == Skipped("no_pod", f"{tmp_path}/101/cgroup names no pod")
    assert read_pod_uid(tmp_path, 102) == Skipped("garbage", f"{tmp_path}/102/cgroup: not text")
    assert read_pod_uid(tmp_path, 103, read_max=100) == Skipped(
        "oversized", f"{tmp_path}/103/cgroup is longer than 100 bytes")
    assert read_pod_uid(tmp_path, 103, read_max=205) == Skipped(
        "no_pod", f"{tmp_path}/103/cgroup names no pod")  # 205 bytes: exactly the bound
    unreadable = read_pod_uid(tmp_path, 104)
    assert isinstance(unreadable, Skipped) and unreadable.reason == "unreadable"
    assert read_pod_uid(tmp_path, 105) == Skipped("gone", f"{tmp_path}/105/cgroup is gone")
    assert read_pod_uid(tmp_path, 0) == Skipped("invalid_pid", "NVML gives no pid")


def _container(name: str, *cards: str, init: bool = False) -> HoldingContainer:
    return HoldingContainer(name=name, init=init, cards=cards)


def _pod(uid: str, *containers: HoldingContainer) -> HoldingPod:
    return HoldingPod(namespace="lab", name=f"pod-{uid[:4]}", uid=uid, containers=containers)


def _process(pid: int, card: str, memory_mib: int, utilization: int = 0) -> GpuProcess:
    return GpuProcess(pid=pid, device_uuid=card, memory_used=memory_mib * MIB,
                      utilization=utilization)


def _usage(container: str, *devices: tuple[int, str, int, int],
           uid: str = UID) -> ContainerUsage:
    return ContainerUsage(pod_uid=uid, container=container, source="nvml", devices=tuple(
        DeviceUsage(vdevice_index=index, device_uuid=card, memory_used=memory * MIB,
                    utilization=utilization)
        for index, card, memory, utilization in devices))


@pytest.mark.parametrize(("holding", "found", "usages"), [
    ([_pod(UID, _container("main", "GPU-a"))],
     [(UID, _process(1, "GPU-a", 100, 30))],
     [_usage("main", (0, "GPU-a", 100, 30))]),
    ([_pod(UID, _container("trainer", "GPU-a"), _container("sidecar", "GPU-b"))],
     [(UID, _process(1, "GPU-a", 100, 30)), (UID, _process(2, "GPU-b", 50, 5))],
     [_usage("sidecar", (0, "GPU-b", 50, 5)), _usage("trainer", (0, "GPU-a", 100, 30))]),
    ([_pod(UID, _container("one", "GPU-a"), _container("two", "GPU-a"))],
     [(UID, _process(1, "GPU-a", 100, 30)), (UID, _process(2, "GPU-a", 50, 5))],
     [_usage("", (0, "GPU-a", 150, 35))]),
    ([_pod(UID, _container("setup", "GPU-a", init=True), _container("main", "GPU-a"))],
     [(UID, _process(1, "GPU-a", 100, 30))],
     [_usage("main", (0, "GPU-a", 100, 30))]),
    ([_pod(UID, _container("main", "GPU-a", "GPU-b", "GPU-c"))],
     [(UID, _process(1, "GPU-c", 10)), (UID, _process(1, "GPU-a", 20)),
      (UID, _process(2, "GPU-c", 5, 7))],
     [_usage("main", (0, "GPU-a", 20, 0), (2, "GPU-c", 15, 7))]),
    ([_pod(UID, _container("main", "GPU-a"))],
     [(UID, _process(1, "GPU-b", 100, 30))],
     [_usage("", (0, "GPU-b", 100, 30))]),
    ([_pod(UID)],
     [(UID, _process(1, "GPU-a", 100, 30))],
     [_usage("", (0, "GPU-a", 100, 30))]),
    ([_pod(UID, _container("main", "GPU-a")), _pod(OTHER_UID, _container("main", "GPU-a"))],
     [(OTHER_UID, _process(9, "GPU-a", 1)), (UID, _process(1, "GPU-a", 2))],
     [_usage("main", (0, "GPU-a", 2, 0)), _usage("main", (0, "GPU-a", 1, 0), uid=OTHER_UID)]),
], ids=["one-container", "two-containers-two-cards", "two-containers-one-card",
        "init-container-ignored", "vdevice-index-and-sum", "card-no-container-holds",
        "daemon-names-no-container", "two-pods-one-card"])
def test_processes_go_to_the_container_holding_their_card(
        holding: list[HoldingPod], found: list[tuple[str, GpuProcess]],
        usages: list[ContainerUsage]) -> None:
    assert attribute(found, holding) == (tuple(usages), 0)


def test_processes_of_a_pod_holding_no_card_are_counted_apart() -> None:
    usages, unknown = attribute([(OTHER_UID, _process(1, "GPU-a", 1)),
                                 (UID, _process(2, "GPU-a", 3))],
                                [_pod(UID, _container("main", "GPU-a"))])
    assert (usages, unknown) == ((_usage("main", (0, "GPU-a", 3, 0)),), 1)


def test_a_scan_measures_containers_and_counts_what_it_skips(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_cgroup(tmp_path, 100, _v1(f"/kubepods/burstable/pod{UID}/{CID}"))
    write_cgroup(tmp_path, 101, _v2(f"/kubepods.slice/kubepods-burstable.slice/"
                                    f"kubepods-burstable-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope"))
    write_cgroup(tmp_path, 200, _v2(f"/kubepods/pod{OTHER_UID}/{CID}"))
    write_cgroup(tmp_path, 300, _v2("/system.slice/nvidia-persistenced.service"))
    write_cgroup(tmp_path, 301, _v2("/user.slice"))
    write_cgroup(tmp_path, 400, "not a cgroup file")
    holding = [_pod(UID, _container("main", "GPU-a", "GPU-b"))]
    processes = [_process(100, "GPU-b", 100, 20), _process(101, "GPU-b", 50, 10),
                 _process(100, "GPU-b", 100, 20),  # listed twice by NVML
                 _process(101, "GPU-a", 7), _process(200, "GPU-a", 1), _process(300, "GPU-a", 1),
                 _process(301, "GPU-a", 1), _process(400, "GPU-a", 1), _process(500, "GPU-a", 1)]
    clock = [0.0]
    with caplog.at_level(logging.WARNING, logger="agent.monitor.processes"):
        scan = container_usage(processes, holding, tmp_path,
                               skips_log=RateLimitedLog(lambda: clock[0],
                                                        logging.getLogger("agent.monitor.processes")))
    assert scan == ProcessScan(
        usages=(_usage("main", (0, "GPU-a", 7, 0), (1, "GPU-b", 150, 30)),),
        skipped={"duplicate": 1, "no_pod": 2, "garbage": 1, "gone": 1, "unknown_pod": 1})
    # One line per reason: the second host process is counted, not logged.
    assert sorted(record.getMessage().split("(")[1].split(")")[0]
                  for record in caplog.records if "not measured (" in record.getMessage()) == [
        "garbage", "gone", "no_pod"]
    assert any("1 processes of pods holding no card" in record.getMessage()
               for record in caplog.records)


def test_a_scan_looks_at_a_bounded_number_of_processes(tmp_path: Path) -> None:
    for pid in range(100, 110):
        write_cgroup(tmp_path, pid, _v2(f"/kubepods/pod{UID}/{CID}"))
    holding = [_pod(UID, _container("main", "GPU-a"))]
    processes = [_process(pid, "GPU-a", 1, 1) for pid in range(100, 110)]
    scan = container_usage(processes, holding, tmp_path, max_processes=4)
    assert scan == ProcessScan(usages=(_usage("main", (0, "GPU-a", 4, 4)),),
                               skipped={"too_many": 6})


def test_a_process_on_several_cards_counts_on_each(tmp_path: Path) -> None:
    write_cgroup(tmp_path, 100, _v2(f"/kubepods/pod{UID}/{CID}"))
    holding = [_pod(UID, _container("main", "GPU-a", "GPU-b"))]
    processes = [_process(100, "GPU-a", 1), _process(100, "GPU-b", 2)]
    assert container_usage(processes, holding, tmp_path).usages == (
        _usage("main", (0, "GPU-a", 1, 0), (1, "GPU-b", 2, 0)),)
    (tmp_path / "100" / "cgroup").unlink()  # the process ended
    assert container_usage(processes, holding, tmp_path) == ProcessScan(
        usages=(), skipped={"gone": 2})


@pytest.mark.parametrize(("processes", "tenants"), [
    ([("GPU-a", pid, UID) for pid in (1, 2, 3, 4)], {"GPU-a": 1}),
    ([("GPU-a", 1, UID), ("GPU-a", 2, UID), ("GPU-a", 3, OTHER_UID)], {"GPU-a": 2}),
    ([("GPU-a", 1, UID), ("GPU-a", 2, UID), ("GPU-a", 3, None)], {"GPU-a": 2}),
    ([("GPU-a", 1, None), ("GPU-a", 2, None)], {"GPU-a": 2}),
    ([("GPU-a", 1, None), ("GPU-a", 1, None)], {"GPU-a": 1}),
    ([("GPU-a", 0, None), ("GPU-a", 0, None)], {"GPU-a": 2}),
    ([("GPU-a", 1, UID), ("GPU-b", 1, UID), ("GPU-b", 2, UID)], {"GPU-a": 1, "GPU-b": 1}),
    ([("GPU-a", 1, UID), ("GPU-b", 2, None), ("GPU-b", 3, OTHER_UID)],
     {"GPU-a": 1, "GPU-b": 2}),
    ([], {}),
], ids=["one-pod-four-processes", "two-pods", "a-pod-and-a-process-no-pod-owns",
        "two-processes-no-pod-owns", "one-process-listed-twice", "no-pid-each-counts",
        "a-pod-on-two-cards-once-on-each", "each-card-its-own", "no-process"])
def test_a_pod_is_one_tenant_of_a_card_and_a_process_no_pod_owns_is_one(
        processes: list[tuple[str, int, str | None]], tenants: dict[str, int]) -> None:
    assert tenants_per_card(processes) == tenants


def test_tenants_seen_read_each_pod_from_its_cgroup_and_count_the_rest_once(
        tmp_path: Path) -> None:
    for pid in (100, 101, 102):
        write_cgroup(tmp_path, pid, _v2(f"/kubepods/pod{UID}/{CID}"))
    write_cgroup(tmp_path, 200, _v2("/system.slice/nvidia-persistenced.service"))
    write_cgroup(tmp_path, 201, "not a cgroup file")
    unreadable_cgroup(tmp_path, 202)
    processes = [("GPU-a", 100), ("GPU-a", 101), ("GPU-a", 102), ("GPU-b", 100),
                 ("GPU-b", 200), ("GPU-b", 201), ("GPU-b", 202), ("GPU-b", 203)]  # 203: gone
    assert tenants_seen(processes, tmp_path) == {"GPU-a": 1, "GPU-b": 5}
    # No proc root (nothing attributed): each process NVML lists is one, as NVML counts.
    assert tenants_seen(processes, None) == {"GPU-a": 3, "GPU-b": 5}
    # Past the bound, a process is not read: it counts once, whoever owns it.
    assert tenants_seen(processes, tmp_path, max_processes=2) == {"GPU-a": 2, "GPU-b": 5}
