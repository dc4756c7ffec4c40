"""The GPU check's own parts that need no GPU: nvidia-smi's parsers, the report, and the MIG
table's comparison and paste-ready text. These run everywhere (not marked ``gpu``): a check
that cannot tell a difference would pass on any card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.mig import tables
from agent.mig.tables import H200_141GB, GpuInstanceProfileInfo, MigCardTable
from tests.gpu.machine import SmiCard, parse_query, parse_topology
from tests.gpu.migtable import Profile, as_python, compare_with_table
from tests.gpu.report import CheckLog, CheckResult, Outcome, Report

H200_QUERY = ("0, GPU-2f6e0e39-8a6b-11ee-b9d1-0242ac120002, NVIDIA H200, 143771, "
              "00000000:18:00.0, 9.0\n")
ONE_GPU_TOPOLOGY = ("\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
                    "GPU0\t X \t0-15\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n")
HGX_TOPOLOGY = (
    "\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV18\tNV18\tSYS\t0-47\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tNV18\tSYS\t0-47\t0\t\tN/A\n"
    "GPU2\tNV18\tNV18\t X \tPIX\t48-95\t1\t\tN/A\n"
    "NIC0\tSYS\tSYS\tPIX\t X \n")


@pytest.mark.parametrize(("text", "fields", "expected"), [
    (H200_QUERY, None, [SmiCard(0, "GPU-2f6e0e39-8a6b-11ee-b9d1-0242ac120002", "NVIDIA H200",
                                143771, "00000000:18:00.0", "9.0")]),
    ("1, GPU-b, Tesla T4, 15360, 00000000:3B:00.0, [N/A]\n\n", None,
     [SmiCard(1, "GPU-b", "Tesla T4", 15360, "00000000:3B:00.0", None)]),
    # An nvidia-smi without compute_cap is asked without it.
    ("0, GPU-c, NVIDIA A100-SXM4-80GB, [N/A], 00000000:07:00.0\n",
     ("index", "uuid", "name", "memory.total", "pci.bus_id"),
     [SmiCard(0, "GPU-c", "NVIDIA A100-SXM4-80GB", None, "00000000:07:00.0", None)]),
])
def test_nvidia_smis_query_is_read_field_by_field(
        text: str, fields: tuple[str, ...] | None, expected: list[SmiCard]) -> None:
    assert (parse_query(text) if fields is None else parse_query(text, fields)) == expected


@pytest.mark.parametrize(("text", "nvlinks", "numa"), [
    (ONE_GPU_TOPOLOGY, {0: {}}, {0: "0"}),
    (HGX_TOPOLOGY, {0: {1: 18, 2: 18}, 1: {0: 18, 2: 18}, 2: {0: 18, 1: 18}},
     {0: "0", 1: "0", 2: "1"}),
    ("No devices were found\n", {}, {}),
])
def test_nvidia_smis_topology_gives_nvlink_peers_and_numa(
        text: str, nvlinks: dict[int, dict[int, int]], numa: dict[int, str]) -> None:
    topology = parse_topology(text)
    assert (topology.nvlinks, topology.numa) == (nvlinks, numa)


def test_a_difference_is_recorded_and_fails_the_check_at_its_end() -> None:
    log = CheckLog()
    assert log.compare("memory", 143771, 143771)
    assert not log.compare("GPU 0 memory (MiB)", 143771, 143360, theirs_name="NVML")
    log.saw("links", {"GPU-a": 18, "peers": (1, 2)})
    assert log.differences == ["GPU 0 memory (MiB): pyhami 143771, NVML 143360"]
    assert log.observations == {"links": {"GPU-a": 18, "peers": [1, 2]}}
    with pytest.raises(AssertionError, match="GPU 0 memory"):
        log.assert_same()


@pytest.mark.parametrize(("outcomes", "passed"), [
    ([("passed", "")], True),
    ([("passed", ""), ("skipped", "no NVIDIA driver: NVMLError_LibraryNotFound")], True),
    ([("skipped", "")], False),  # a skip must say why
    ([("passed", ""), ("failed", "assert 1 == 2")], False),
    ([("error", "fixture failed")], False),
])
def test_a_run_passes_when_every_check_passed_or_was_skipped_for_a_reason(
        outcomes: list[tuple[Outcome, str]], passed: bool) -> None:
    checks = [CheckResult(f"c{i}", outcome, 1.0, reason)
              for i, (outcome, reason) in enumerate(outcomes)]
    assert Report({}, checks, 2.0).passed is passed


def test_the_report_is_written_as_json_and_as_a_summary(tmp_path: Path) -> None:
    checks = [CheckResult("inventory::test_x", "failed", 1.25, "memory differs",
                          {"nvidia_smi": [{"uuid": "GPU-a"}]},
                          ["GPU 0 memory (MiB): pyhami 1, nvidia-smi 2"]),
              CheckResult("mig::test_y", "skipped", 0.0, "read-only")]
    document, text = Report({"driver": "580.159.04"}, checks, 3.5).write(tmp_path / "out")
    written = json.loads(document.read_text())
    assert (written["passed"], written["counts"]) == (False, {"failed": 1, "skipped": 1})
    assert written["checks"][0]["observations"] == {"nvidia_smi": [{"uuid": "GPU-a"}]}
    summary = text.read_text()
    assert summary.startswith("pyhami GPU check: FAILED in 3.5 s (1 failed, 1 skipped)\n"
                              "  driver: 580.159.04\n")
    assert "\nFAILED   inventory::test_x    1.2 s  memory differs\n" in summary
    assert "\nSKIPPED  mig::test_y          0.0 s  read-only\n" in summary
    assert summary.endswith("inventory::test_x differs:\n"
                            "  - GPU 0 memory (MiB): pyhami 1, nvidia-smi 2\n")


def _nvml_answers(table: MigCardTable) -> list[Profile]:
    """What NVML would answer if the table were exactly right, with NVIDIA's names."""
    names = {19: "MIG 1g.18gb", 14: "MIG 2g.35gb", 9: "MIG 3g.71gb", 5: "MIG 4g.71gb",
             0: "MIG 7g.141gb", 20: "MIG 1g.18gb+me", 15: "MIG 1g.35gb"}
    return [Profile(info.constant, info, names[info.id]) for info in table.profiles]


def test_nvml_answering_the_table_shows_no_difference() -> None:
    log = CheckLog()
    compared = compare_with_table(log, "GPU 0", H200_141GB, H200_141GB.memory_mib,
                                  _nvml_answers(H200_141GB))
    assert log.differences == []
    assert compared == 6 * len(H200_141GB.profiles)


def test_every_field_nvml_answers_otherwise_is_a_difference() -> None:
    answers = _nvml_answers(H200_141GB)
    one = answers[0].info
    assert one is not None
    answers[0].info = GpuInstanceProfileInfo(one.constant, one.id, 16000, one.slices,
                                             one.instances, one.multiprocessors, one.placements)
    answers[1].placements_error = "NVMLError_NotSupported"  # MIG mode off: not compared
    answers[2].name = "MIG 3g.70gb"
    del answers[4]  # the 7g
    answers.append(Profile(10, GpuInstanceProfileInfo(10, 35, 16384, 1, 4, 16, ()),
                           "MIG 1g.18gb+gfx"))
    log = CheckLog()
    compare_with_table(log, "GPU 0", H200_141GB, 143772, answers)
    assert log.differences == [
        "GPU 0 card memory (MiB): tables.py 143771, NVML 143772",
        "GPU 0 GI_PROFILE_1_SLICE memory_mib: tables.py 16384, NVML 16000",
        "GPU 0 GI_PROFILE_3_SLICE name: profile_name '3g.71gb', NVML '3g.70gb'",
        "GPU 0 GI_PROFILE_7_SLICE: in tables.py, NVML has none",
        "GPU 0 constant 10 (MIG 1g.18gb+gfx): NVML has it, tables.py does not",
    ]


def test_the_table_nvml_answers_is_printed_ready_to_paste() -> None:
    text = "\n".join(as_python("NVIDIA H200", H200_141GB.memory_mib,
                               [*_nvml_answers(H200_141GB), Profile(8, error="NotSupported")]))
    pasted = eval(text, vars(tables))  # our own text, in the tables' names
    assert pasted == H200_141GB
