"""The node monitor's host probe (``HostProbe``): each card's figures and its processes, read
through NVML (against the stand-in of ``tests.fakes.nvml``) and from the simulated node."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.monitor.exporter import device_type
from agent.monitor.model import GpuProcess, HostCard, HostProbe
from agent.vendors.nvidia.nvml import NvmlSource
from agent.vendors.nvidia.simulated import MIB, SimulatedProcess, SimulatedSource, profile_cards
from tests.fakes.nvml import NvmlStandIn, StandInCard, StandInProcess, StandInSample

NOW = 1_700_000_000.0
NOW_US = int(NOW * 1_000_000)


def _bus(slot: int) -> str:
    return f"00000000:{slot:02X}:00.0"


@pytest.fixture
def clock() -> list[float]:
    """The monotonic clock of the rate-limited log, moved by hand."""
    return [0.0]


OpenSource = Callable[[NvmlStandIn], NvmlSource]


@pytest.fixture
def open_source(clock: list[float]) -> Iterator[OpenSource]:
    """Opens an ``NvmlSource`` over a stand-in at the fixed wall clock ``NOW``, with a 5 s
    utilization window; every source opened is closed after the test."""
    sources: list[NvmlSource] = []

    def open_(library: NvmlStandIn) -> NvmlSource:
        source = NvmlSource(library, sysfs_root=Path("/nonexistent"), event_wait_ms=20,
                            utilization_window_s=5.0, wall_clock=lambda: NOW,
                            clock=lambda: clock[0])
        source.open()
        sources.append(source)
        return source

    yield open_
    for source in sources:
        source.close()


def test_the_nvml_source_and_the_simulated_node_are_host_probes() -> None:
    # mypy checks both against the port; an NVML source not opened yet knows no card.
    probes: list[HostProbe] = [NvmlSource(NvmlStandIn([StandInCard("GPU-aaa", _bus(0x3B))])),
                               SimulatedSource(profile_cards("t4x4", "n"))]
    assert [len(probe.host_cards()) for probe in probes] == [0, 4]


def test_each_card_gives_its_memory_used_and_utilization(open_source: OpenSource) -> None:
    library = NvmlStandIn([
        StandInCard("GPU-aaa", _bus(0x3B), memory_used_bytes=3 * 1024 * MIB, utilization=(47, 12)),
        StandInCard("GPU-bbb", _bus(0x86), name="NVIDIA H200", memory_used_bytes=0,
                    utilization=(0, 0)),
    ])
    source = open_source(library)
    assert source.host_cards() == [
        HostCard(index=0, uuid="GPU-aaa", name="Tesla T4", memory_used=3 * 1024 * MIB,
                 utilization=47, memory_utilization=12),
        HostCard(index=1, uuid="GPU-bbb", name="NVIDIA H200", memory_used=0, utilization=0,
                 memory_utilization=0)]
    assert source.probe_failures() == {}


NAMES = [("Tesla T4", "NVIDIA-Tesla T4", "NVIDIA-Tesla T4"),
         ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "NVIDIA-NVIDIA A100-SXM4-80GB"),
         ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "NVIDIA-NVIDIA H100 80GB HBM3"),
         ("NVIDIA H200", "NVIDIA H200", "NVIDIA-NVIDIA H200")]
"""NVML's name, the type HAMi's device plugin registers, the monitor's ``device_type``
(``NVIDIA-`` before every name, as HAMi's monitor writes it)."""


@pytest.mark.parametrize(("name", "card_type", "label"), NAMES, ids=["t4", "a100", "h100", "h200"])
def test_the_monitor_labels_nvmls_name_not_the_registered_type(
        open_source: OpenSource, name: str, card_type: str, label: str) -> None:
    source = open_source(NvmlStandIn([StandInCard("GPU-aaa", _bus(0x3B), name=name)]))
    assert [card.type for card in source.read()] == [card_type]
    assert [device_type(card.name) for card in source.host_cards()] == [label]


@pytest.mark.parametrize(("profile", "names"), [
    ("t4x4", NAMES[0]), ("a100x8-nvswitch", NAMES[1]), ("h100x8-islands", NAMES[2]),
    ("h200x8-nvswitch", NAMES[3])])
def test_a_simulated_card_answers_its_models_nvml_name(
        profile: str, names: tuple[str, str, str]) -> None:
    name, card_type, label = names
    source = SimulatedSource(profile_cards(profile, "n"))
    assert {card.type for card in source.read()} == {card_type}
    assert {(card.name, device_type(card.name)) for card in source.host_cards()} == {
        (name, label)}


@pytest.mark.parametrize(("unsupported", "figures"), [
    ("nvmlDeviceGetMemoryInfo", (None, 30, 5)),
    ("nvmlDeviceGetUtilizationRates", (1024, None, None)),
], ids=["memory", "utilization"])
def test_a_figure_nvml_does_not_support_is_none_and_the_card_stays(
        open_source: OpenSource, unsupported: str, figures: tuple[int | None, ...]) -> None:
    # NOT_SUPPORTED for memory at identification gives 0 MiB and keeps the card: so here.
    library = NvmlStandIn([StandInCard("GPU-aaa", _bus(0x3B), memory_used_bytes=1024,
                                       utilization=(30, 5))])
    source = open_source(library)
    library.cards[0].unsupported.add(unsupported)
    (card,) = source.host_cards()
    assert (card.memory_used, card.utilization, card.memory_utilization) == figures
    assert source.probe_failures() == {}


@pytest.mark.parametrize("call", ["nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates"])
def test_a_card_failing_a_call_is_left_out_counted_and_logged_at_a_bounded_rate(
        open_source: OpenSource, clock: list[float], caplog: pytest.LogCaptureFixture,
        call: str) -> None:
    library = NvmlStandIn([StandInCard("GPU-aaa", _bus(0x3B)), StandInCard("GPU-bbb", _bus(0x86)),
                           StandInCard("GPU-ccc", _bus(0x87))])
    source = open_source(library)
    library.cards[1].failing.add(call)
    with caplog.at_level(logging.WARNING, logger="agent.vendors.nvidia.nvml"):
        for _ in range(3):
            assert [card.uuid for card in source.host_cards()] == ["GPU-aaa", "GPU-ccc"]
        clock[0] += 61
        assert [card.uuid for card in source.host_cards()] == ["GPU-aaa", "GPU-ccc"]
    assert source.probe_failures() == {call: 4}
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert "card 1 (GPU-bbb) left out" in lines[0] and call in lines[0]
    assert "(2 more like it not logged)" in lines[1]
    library.cards[1].failing.clear()
    assert len(source.host_cards()) == 3  # back at the next reading


def test_a_card_nvml_cannot_identify_is_in_no_answer(open_source: OpenSource) -> None:
    library = NvmlStandIn([StandInCard("GPU-aaa", _bus(0x3B), failing={"nvmlDeviceGetUUID"},
                                       processes=[StandInProcess(7, 1)]),
                           StandInCard("GPU-bbb", _bus(0x86))])
    source = open_source(library)
    assert [card.uuid for card in source.host_cards()] == ["GPU-bbb"]
    assert source.gpu_processes() == []


def test_processes_carry_their_memory_and_latest_sm_utilization(open_source: OpenSource) -> None:
    library = NvmlStandIn([
        StandInCard("GPU-aaa", _bus(0x3B),
                    processes=[StandInProcess(4242, 512 * MIB), StandInProcess(4343, None),
                               StandInProcess(4444, 100 * MIB)],
                    samples=[StandInSample(4242, sm=10, timestamp=NOW_US - 3_000_000),
                             StandInSample(4242, sm=35, timestamp=NOW_US - 1_000_000),
                             StandInSample(4343, sm=20, timestamp=NOW_US - 2_000_000),
                             # Older than the window: NVML does not return it.
                             StandInSample(4444, sm=90, timestamp=NOW_US - 9_000_000),
                             StandInSample(9999, sm=50, timestamp=NOW_US - 1_000_000)]),
        StandInCard("GPU-bbb", _bus(0x86), processes=[StandInProcess(4242, 1024 * MIB)],
                    samples=[StandInSample(4242, sm=60, timestamp=NOW_US - 500_000)]),
        StandInCard("GPU-ccc", _bus(0x87), processes=[]),
    ])
    source = open_source(library)
    assert source.gpu_processes() == [
        GpuProcess(pid=4242, device_uuid="GPU-aaa", memory_used=512 * MIB, utilization=35),
        GpuProcess(pid=4343, device_uuid="GPU-aaa", memory_used=0, utilization=20),
        GpuProcess(pid=4444, device_uuid="GPU-aaa", memory_used=100 * MIB, utilization=0),
        GpuProcess(pid=4242, device_uuid="GPU-bbb", memory_used=1024 * MIB, utilization=60)]
    # The window asked of NVML: the last 5 s, in microseconds; a card without processes
    # is not asked.
    assert library.utilization_since == [NOW_US - 5_000_000] * 2


@pytest.mark.parametrize(("samples", "unsupported"), [
    (None, False),
    ([], False),
    ([StandInSample(7, sm=80, timestamp=NOW_US)], True),
], ids=["not-found", "no-sample-counted", "not-supported"])
def test_without_utilization_samples_processes_use_0_percent(
        open_source: OpenSource, samples: list[StandInSample] | None, unsupported: bool) -> None:
    card = StandInCard("GPU-aaa", _bus(0x3B), processes=[StandInProcess(7, 64 * MIB)],
                       samples=samples)
    if unsupported:
        card.unsupported.add("nvmlDeviceGetProcessUtilization")
    source = open_source(NvmlStandIn([card]))
    assert source.gpu_processes() == [GpuProcess(pid=7, device_uuid="GPU-aaa",
                                                 memory_used=64 * MIB, utilization=0)]
    assert source.probe_failures() == {}


def test_a_driver_that_cannot_list_processes_gives_none(open_source: OpenSource) -> None:
    library = NvmlStandIn([StandInCard("GPU-aaa", _bus(0x3B), processes=[StandInProcess(7, 1)],
                                       unsupported={"nvmlDeviceGetComputeRunningProcesses"}),
                           StandInCard("GPU-bbb", _bus(0x86), processes=[StandInProcess(8, 2)])])
    source = open_source(library)
    assert [(p.pid, p.device_uuid) for p in source.gpu_processes()] == [(8, "GPU-bbb")]
    assert source.probe_failures() == {}


@pytest.mark.parametrize("call", ["nvmlDeviceGetComputeRunningProcesses",
                                  "nvmlDeviceGetProcessUtilization"])
def test_a_card_failing_a_process_call_has_its_processes_left_out(
        open_source: OpenSource, call: str) -> None:
    library = NvmlStandIn([
        StandInCard("GPU-aaa", _bus(0x3B), processes=[StandInProcess(7, 1)], failing={call}),
        StandInCard("GPU-bbb", _bus(0x86), processes=[StandInProcess(8, 2)])])
    source = open_source(library)
    assert [(p.pid, p.device_uuid) for p in source.gpu_processes()] == [(8, "GPU-bbb")]
    assert source.probe_failures() == {call: 1}


def test_the_probe_and_the_inventory_read_at_once_from_several_threads(
        open_source: OpenSource) -> None:
    library = NvmlStandIn([StandInCard(f"GPU-{n}", _bus(0x10 + n), memory_used_bytes=n,
                                       processes=[StandInProcess(100 + n, n * MIB)])
                           for n in range(8)])
    source = open_source(library)
    failures: list[str] = []

    def keep_reading(read: str) -> None:
        for _ in range(40):
            if read == "read":
                answer: object = [card.uuid for card in source.read()]
            elif read == "host_cards":
                answer = [card.memory_used for card in source.host_cards()]
            else:
                answer = [process.pid for process in source.gpu_processes()]
            expected = {"read": [f"GPU-{n}" for n in range(8)], "host_cards": list(range(8)),
                        "gpu_processes": [100 + n for n in range(8)]}[read]
            if answer != expected:
                failures.append(f"{read}: {answer}")

    threads = [threading.Thread(target=keep_reading, args=(read,))
               for read in ("read", "host_cards", "gpu_processes") * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_the_simulated_node_answers_the_figures_it_is_told() -> None:
    source = SimulatedSource(profile_cards("t4x4", "n"))
    source.set_processes(1, 2, memory_mib=300)
    source.set_usage(2, memory_used=5 * 1024 * MIB, utilization=80, memory_utilization=40)
    source.set_usage(3, memory_used=None, utilization=None, memory_utilization=None)
    assert source.host_cards() == [
        HostCard(index=0, uuid="GPU-n-0", name="Tesla T4", memory_used=0, utilization=0,
                 memory_utilization=0),
        HostCard(index=1, uuid="GPU-n-1", name="Tesla T4", memory_used=300 * MIB,
                 utilization=0, memory_utilization=0),
        HostCard(index=2, uuid="GPU-n-2", name="Tesla T4", memory_used=5 * 1024 * MIB,
                 utilization=80, memory_utilization=40),
        HostCard(index=3, uuid="GPU-n-3", name="Tesla T4", memory_used=None, utilization=None,
                 memory_utilization=None)]
    assert source.gpu_processes() == []


def test_the_simulated_node_lists_the_processes_it_is_told_and_counts_them() -> None:
    source = SimulatedSource(profile_cards("t4x4", "n"))
    source.set_gpu_processes(2, SimulatedProcess(4242, 512 * MIB, utilization=30),
                             SimulatedProcess(4343, 1024 * MIB))
    source.set_gpu_processes(0, SimulatedProcess(77, 3 * MIB, utilization=5))
    assert source.gpu_processes() == [
        GpuProcess(pid=77, device_uuid="GPU-n-0", memory_used=3 * MIB, utilization=5),
        GpuProcess(pid=4242, device_uuid="GPU-n-2", memory_used=512 * MIB, utilization=30),
        GpuProcess(pid=4343, device_uuid="GPU-n-2", memory_used=1024 * MIB, utilization=0)]
    card = source.read()[2]
    assert (card.processes, card.process_memory) == (2, 1536)
    source.set_gpu_processes(2)
    assert [process.pid for process in source.gpu_processes()] == [77]
    assert source.read()[2].processes == 0
    with pytest.raises(KeyError, match="no card with index 9"):
        source.set_gpu_processes(9, SimulatedProcess(1, 1))
    with pytest.raises(KeyError, match="no card with index 9"):
        source.set_usage(9, memory_used=1, utilization=1)
