"""The NVML inventory source, run against a stand-in for the NVML library (there is no GPU here).

The stand-in (``tests.fakes.nvml``) answers the same calls as ``pynvml`` and raises
``pynvml``'s own errors, so everything from the library call up is the production code path.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pynvml
import pytest

from agent.registration import registered_cards
from agent.vendors.nvidia.nvml import NvmlSource, sysfs_bus_id
from agent.vendors.port import InventoryError
from common.core.deviceconfig import DeviceConfig, NodeDeviceConfig, NodeSettings
from common.core.model import Node
from common.core.registration import node_register
from common.wire import ReportedCard
from tests.builders import fleet_of, hold, manifest, place
from tests.fakes.nvml import (
    IBMNPU,
    MIB,
    SWITCH,
    Link,
    NvmlStandIn,
    StandInCard,
    StandInProcess,
)
from tests.fakes.proc import HOST_CGROUP, pod_cgroup, unreadable_cgroup, write_cgroup


def _bus(slot: int) -> str:
    return f"00000000:{slot:02X}:00.0"


def _read(library: NvmlStandIn, sysfs: Path | None = None, proc_root: Path | None = None,
          **options: int) -> list[ReportedCard]:
    source = NvmlSource(library, sysfs_root=sysfs or Path("/nonexistent"), event_wait_ms=20,
                        proc_root=proc_root, **options)
    source.open()
    try:
        return source.read()
    finally:
        source.close()


def test_cards_are_read_in_hamis_form_with_their_processes() -> None:
    library = NvmlStandIn([
        StandInCard("GPU-aaa", _bus(0x3B), numa=0, process_memory=[1000 * MIB, 500 * MIB, None]),
        StandInCard("GPU-bbb", _bus(0x86), name="NVIDIA A100-SXM4-80GB",
                    memory_bytes=81920 * MIB, numa=1, sm_count=None),
    ])
    first, second = _read(library)
    assert first == ReportedCard(uuid="GPU-aaa", index=0, type="NVIDIA-Tesla T4", memory=15360,
                                 cores=100, count=10, numa=0, health=True, links={}, processes=3,
                                 sm_count=40, process_memory=1500)
    assert (second.type, second.memory, second.index, second.sm_count, second.processes) == (
        "NVIDIA A100-SXM4-80GB", 81920, 1, None, 0)


def test_each_cards_type_and_register_annotation_are_hamis_for_its_nvml_name() -> None:
    names = ["Tesla T4", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    library = NvmlStandIn([StandInCard(f"GPU-{index}", _bus(0x10 + index), name=name)
                           for index, name in enumerate(names)])
    cards = _read(library)
    types = ["NVIDIA-Tesla T4", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert [card.type for card in cards] == types
    annotation = node_register(Node(name="n", cards=[card.card() for card in cards]))
    assert annotation is not None
    assert [entry["type"] for entry in json.loads(annotation)] == types


def test_a_card_without_a_memory_figure_reads_0_mib_and_stays_in() -> None:
    # NVML answers NOT_SUPPORTED on unified-memory cards (GB10): preConfiguredDeviceMemory
    # gives them a figure (agent.registration); a failing read still leaves a card out.
    library = NvmlStandIn([StandInCard("GPU-aaa", _bus(0x3B),
                                       unsupported={"nvmlDeviceGetMemoryInfo"}),
                           StandInCard("GPU-bbb", _bus(0x86), failing={"nvmlDeviceGetMemoryInfo"}),
                           StandInCard("GPU-ccc", _bus(0x87))])
    assert [(card.uuid, card.memory, card.count) for card in _read(library)] == [
        ("GPU-aaa", 0, 10), ("GPU-ccc", 15360, 10)]


def test_direct_nvlink_peers_resolve_to_uuids_with_lanes_summed() -> None:
    library = NvmlStandIn([
        StandInCard("GPU-0", _bus(0x07), links=[
            Link(_bus(0x0F)), Link("00000000:0f:00.0"), Link(_bus(0x0F), active=False),
            Link(_bus(0x47)), Link("00000000:0A:00.0", remote_type=IBMNPU)]),
        StandInCard("GPU-1", _bus(0x0F), links=[Link(_bus(0x07)), Link(_bus(0x07))]),
        StandInCard("GPU-2", _bus(0x47), links=[Link(_bus(0x07))]),
        StandInCard("GPU-3", _bus(0x4E)),
    ])
    links = {card.uuid: card.links for card in _read(library)}
    assert links == {"GPU-0": {"GPU-1": 2, "GPU-2": 1}, "GPU-1": {"GPU-0": 2},
                     "GPU-2": {"GPU-0": 1}, "GPU-3": {}}


def test_an_nvswitch_node_links_every_pair_of_switch_connected_cards() -> None:
    switch_ports = [Link(_bus(0xC1), remote_type=SWITCH), Link(_bus(0xC2), remote_type=SWITCH)]
    library = NvmlStandIn(
        [StandInCard(f"GPU-{i}", _bus(0x10 + i), links=switch_ports) for i in range(4)]
        + [StandInCard("GPU-pcie", _bus(0x20))])
    links = {card.uuid: card.links for card in _read(library)}
    for i in range(4):
        assert links[f"GPU-{i}"] == {f"GPU-{j}": 2 for j in range(4) if j != i}
    assert links["GPU-pcie"] == {}


def test_without_the_remote_type_a_bus_id_no_card_has_is_a_switch() -> None:
    switch_port = Link(_bus(0xC1), remote_type=SWITCH)
    library = NvmlStandIn([
        StandInCard("GPU-0", _bus(0x10), links=[switch_port, Link(_bus(0x13))]),
        StandInCard("GPU-1", _bus(0x11), links=[switch_port]),
        StandInCard("GPU-2", _bus(0x12), links=[switch_port]),
        StandInCard("GPU-3", _bus(0x13), links=[Link(_bus(0x10))]),
    ], remote_type_known=False)
    links = {card.uuid: card.links for card in _read(library)}
    assert links["GPU-0"] == {"GPU-1": 1, "GPU-2": 1, "GPU-3": 1}
    assert links["GPU-1"] == {"GPU-0": 1, "GPU-2": 1}
    assert links["GPU-3"] == {"GPU-0": 1}


def test_unreadable_nvlink_makes_that_cards_topology_unknown() -> None:
    library = NvmlStandIn([
        StandInCard("GPU-0", _bus(0x07), links=[Link(_bus(0x0F))],
                    failing={"nvmlDeviceGetNvLinkState"}),
        StandInCard("GPU-1", _bus(0x0F), links=[Link(_bus(0x07))]),
    ])
    first, second = _read(library)
    assert first.links is None
    assert second.links == {"GPU-0": 1}
    assert first.health  # topology is information; the card itself still answers


@pytest.mark.parametrize(("nvml_numa", "sysfs_text", "host_nodes", "expected"), [
    (1, "0\n", 2, 1),
    (None, "1\n", 2, 1),
    (None, None, 2, -1),
    (None, "-1\n", 2, -1),
    (None, "garbage", 2, -1),
    (None, "-1\n", 0, -1),
    # One NUMA node: a PCI device without affinity is on it (the H200 of the GPU check:
    # sysfs -1, nvidia-smi topo -m NUMA affinity 0, as HAMi registers it).
    (None, "-1\n", 1, 0),
    (None, None, 1, 0),
])
def test_numa_comes_from_nvml_else_sysfs_else_the_only_node_else_unknown(
        tmp_path: Path, nvml_numa: int | None, sysfs_text: str | None, host_nodes: int,
        expected: int) -> None:
    for node in range(host_nodes):
        (tmp_path / "devices" / "system" / "node" / f"node{node}").mkdir(parents=True)
    if host_nodes:
        (tmp_path / "devices" / "system" / "node" / "possible").write_text("0\n")
    if sysfs_text is not None:
        device = tmp_path / "bus" / "pci" / "devices" / "0000:3b:00.0"
        device.mkdir(parents=True)
        (device / "numa_node").write_text(sysfs_text)
    library = NvmlStandIn([StandInCard("GPU-0", "00000000:3B:00.0", numa=nvml_numa)])
    assert _read(library, sysfs=tmp_path)[0].numa == expected


def test_bus_ids_are_put_in_sysfs_form() -> None:
    assert sysfs_bus_id(b"00000000:3B:00.0\x00") == "0000:3b:00.0"
    assert sysfs_bus_id("00000001:07:00.0") == "0001:07:00.0"
    assert sysfs_bus_id("0000:07:00.0") == "0000:07:00.0"


def test_an_nvml_error_reading_a_card_makes_it_unhealthy_until_it_reads_again() -> None:
    card = StandInCard("GPU-1", _bus(0x0F), failing={"nvmlDeviceGetComputeRunningProcesses"})
    library = NvmlStandIn([StandInCard("GPU-0", _bus(0x07)), card])
    source = NvmlSource(library, event_wait_ms=20)
    source.open()
    try:
        healthy, lost = source.read()
        assert healthy.health and healthy.health_detail == ""
        assert not lost.health
        assert lost.health_detail == "nvmlDeviceGetComputeRunningProcesses: GPU is lost"
        card.failing.clear()
        assert source.read()[1].health
    finally:
        source.close()


def test_a_driver_that_cannot_list_processes_leaves_the_card_healthy() -> None:
    library = NvmlStandIn([StandInCard("GPU-0", _bus(0x07), process_memory=[MIB],
                                       unsupported={"nvmlDeviceGetComputeRunningProcesses"})])
    card = _read(library)[0]
    assert (card.health, card.health_detail, card.processes) == (True, "", 0)


POD_A = "0f6c9a1e-7b2d-4c3e-9a8f-1d2e3f4a5b6c"
POD_B = "11111111-2222-3333-4444-555555555555"
UNREADABLE = None
"""A process whose cgroup file cannot be read."""


@pytest.mark.parametrize(("cgroups", "tenants"), [
    ({1001: pod_cgroup(POD_A), 1002: pod_cgroup(POD_A), 1003: pod_cgroup(POD_A),
      1004: pod_cgroup(POD_A)}, 1),
    ({1001: pod_cgroup(POD_A), 1002: pod_cgroup(POD_A), 1003: pod_cgroup(POD_B)}, 2),
    ({1001: pod_cgroup(POD_A), 1002: pod_cgroup(POD_A), 1003: HOST_CGROUP}, 2),
    ({1001: UNREADABLE}, 1),
    ({1001: pod_cgroup(POD_A), 1002: UNREADABLE, 1003: UNREADABLE}, 3),
], ids=["one-pod-four-processes", "two-pods", "a-pod-and-a-host-process",
        "an-unreadable-cgroup", "a-pod-and-two-unreadable"])
def test_a_cards_processes_are_its_tenants_seen_a_pod_counting_once(
        tmp_path: Path, cgroups: dict[int, str | None], tenants: int) -> None:
    for pid, cgroup in cgroups.items():
        if cgroup is UNREADABLE:
            unreadable_cgroup(tmp_path, pid)
        else:
            write_cgroup(tmp_path, pid, cgroup)
    library = NvmlStandIn([StandInCard("GPU-a", _bus(0x3B), processes=[
        StandInProcess(pid, 100 * MIB) for pid in cgroups])])
    (card,) = _read(library, proc_root=tmp_path)
    assert (card.processes, card.process_memory) == (tenants, 100 * len(cgroups))
    # Without the processes' pods (no proc root), each process is a tenant, as NVML counts.
    assert _read(library)[0].processes == len(cgroups)


def test_one_pods_four_processes_leave_a_split_4_card_three_pods_more(tmp_path: Path) -> None:
    for pid in (1001, 1002, 1003, 1004):
        write_cgroup(tmp_path, pid, pod_cgroup(POD_A))
    library = NvmlStandIn([StandInCard("GPU-a", _bus(0x3B), processes=[
        StandInProcess(pid, 100 * MIB) for pid in (1001, 1002, 1003, 1004)])])
    config = NodeDeviceConfig(DeviceConfig(node=NodeSettings(device_split_count=4)))
    cards = registered_cards(_read(library, proc_root=tmp_path), config)
    assert [(card.count, card.processes) for card in cards] == [(4, 1)]
    # The pod whose processes these are is booked on the card: three more fit, not one.
    fleet = fleet_of(Node(name="n", cards=[card.card() for card in cards]))
    hold(fleet, "default/four-processes", "n", "GPU-a")
    assert [place(fleet, manifest(f"p{i}")).scheduled for i in range(4)] == [
        True, True, True, False]


def test_a_card_whose_uuid_cannot_be_read_is_left_out_until_it_can() -> None:
    card = StandInCard("GPU-1", _bus(0x0F), links=[Link(_bus(0x07))],
                       failing={"nvmlDeviceGetUUID"})
    library = NvmlStandIn([StandInCard("GPU-0", _bus(0x07), links=[Link(_bus(0x0F))]), card])
    source = NvmlSource(library, event_wait_ms=20)
    source.open()
    try:
        assert [c.uuid for c in source.read()] == ["GPU-0"]
        card.failing.clear()
        cards = source.read()
        assert [(c.uuid, c.links) for c in cards] == [("GPU-0", {"GPU-1": 1}),
                                                      ("GPU-1", {"GPU-0": 1})]
    finally:
        source.close()


def _wait_for(condition: object, source: NvmlSource, seconds: float = 5.0) -> list[ReportedCard]:
    deadline = time.monotonic() + seconds
    while True:
        cards = source.read()
        if callable(condition) and condition(cards):
            return cards
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {seconds} s: {cards}")
        time.sleep(0.01)


def test_a_critical_xid_makes_its_card_unhealthy_and_application_xids_do_not() -> None:
    cards = [StandInCard(f"GPU-{i}", _bus(0x10 + i)) for i in range(3)]
    library = NvmlStandIn(cards)
    source = NvmlSource(library, event_wait_ms=20)
    source.open()
    try:
        assert library.registered == ["GPU-0", "GPU-1", "GPU-2"]
        library.raise_xid(cards[0], 43)  # an application fault: events arrive in order,
        library.raise_xid(cards[1], 79)  # so once 79 is seen, 43 was seen before it
        read = _wait_for(lambda now: not now[1].health, source)
        assert read[1].health_detail == "critical XID 79"
        assert read[0].health and read[2].health
    finally:
        source.close()


def test_a_critical_xid_that_names_no_card_makes_every_card_unhealthy() -> None:
    library = NvmlStandIn([StandInCard(f"GPU-{i}", _bus(0x10 + i)) for i in range(2)])
    source = NvmlSource(library, event_wait_ms=20)
    source.open()
    try:
        library.raise_xid(None, 48)
        read = _wait_for(lambda now: not any(card.health for card in now), source)
        assert [card.health_detail for card in read] == ["critical XID 48"] * 2
    finally:
        source.close()


def test_close_stops_the_event_watcher_and_shuts_nvml_down() -> None:
    library = NvmlStandIn([StandInCard("GPU-0", _bus(0x10))])
    source = NvmlSource(library, event_wait_ms=20)
    source.open()
    assert any(thread.name == "nvml-xid-events" for thread in threading.enumerate())
    source.close()
    assert library.freed and library.shut_down
    assert not any(thread.name == "nvml-xid-events" for thread in threading.enumerate())


def test_nvml_that_cannot_start_is_an_inventory_error_with_nvmls_reason() -> None:
    library = NvmlStandIn([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(InventoryError, match="NVML could not start: Driver Not Loaded"):
        NvmlSource(library).open()
