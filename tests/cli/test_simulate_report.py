"""``pyhami simulate``'s command line and reports: the JSON document, the table, the plot
and the progress bars, on runs built by hand."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from pyhami.cli import build_parser
from pyhami.output import stdout_console
from pyhami.simulate import PolicyRun, Sample
from pyhami.simulate._report import (
    allocation_at_arrived,
    axis_to,
    coinciding,
    duration,
    namespace_table,
    nice_ceiling,
    plot_html,
    plot_svg,
    progress_bars,
    shows_namespaces,
    simulation_document,
    summary_table,
    top_reasons,
)
from pyhami.simulate._results import NamespaceTally, percentile, thinned
from tests.paths import EXAMPLES
from tests.simulate_example import write_example

SVG = "{http://www.w3.org/2000/svg}"


def sample(arrived: float, allocation: float, fragmentation: float) -> Sample:
    return Sample(time=arrived * 100, arrived=arrived, allocation=allocation,
                  fragmentation=fragmentation)


def policy_run(policy: str = "binpack", samples: list[Sample] | None = None,
               waits: list[float] | None = None, **totals: Any) -> PolicyRun:
    fields: dict[str, Any] = {"node_policy": "binpack", "pods": 4, "placed": 3, "refused": 1,
                              "refused_by_reason": {"NodeInsufficientDevice": 1},
                              "peak_allocation": 0.75,
                              "by_namespace": {"default": NamespaceTally(4, 3, 0, 1)}}
    fields.update(totals)
    return PolicyRun(policy=policy, samples=samples or [], waits=waits or [], **fields)


# Two runs small enough to place on the plot by hand.
FILLING = policy_run("binpack", [sample(0.25, 0.25, 0.0), sample(0.5, 0.5, 0.1),
                                 sample(1.0, 0.75, 0.2)], waits=[0.0, 10.0, 20.0, 30.0])
STALLING = policy_run("mutex,spread", [sample(0.25, 0.25, 0.05), sample(0.5, 0.25, 0.2)],
                      placed=1, refused=3, peak_allocation=0.25,
                      refused_by_reason={"ExclusiveDeviceAllocateConflict": 2,
                                         "limits[nvidia.com/gpu] is not a number": 1})
# Two namespaces under quota: team-a's two pods kept out by its quota, team-b's one for
# want of memory.
QUOTAED = policy_run("spread", [sample(0.5, 0.25, 0.0)], pods=6, placed=3, refused=3,
                     refused_by_reason={"ResourceQuotaNotFit": 2, "CardInsufficientMemory": 1},
                     by_namespace={"team-a": NamespaceTally(4, 2, 2, 0),
                                   "team-b": NamespaceTally(2, 1, 0, 1)})


class TestDocument:
    def test_a_run_as_json(self) -> None:
        assert FILLING.document() == {
            "policy": "binpack", "node_policy": "binpack", "pods": 4, "placed": 3,
            "refused": 1, "refused_by_reason": {"NodeInsufficientDevice": 1},
            "by_namespace": {"default": {"pods": 4, "placed": 3, "refused_for_quota": 0,
                                         "refused_otherwise": 1}},
            # A workload without groups: no job, all or nothing by default.
            "groups": {"placement": "all-or-nothing", "jobs": 0, "started": 0, "waiting": 0,
                       "holding_cards": 0, "idle_gpu_hours": 0.0},
            "mig_instances": {},  # no MIG card
            "peak_allocation": 0.75,
            "allocation_at_arrived": [[0.25, 0.25], [0.5, 0.5], [1.0, 0.75]],
            "fragmentation_at_arrived": [[0.25, 0.0], [0.5, 0.1], [1.0, 0.2]],
            "allocation_over_time": [[25.0, 0.25], [50.0, 0.5], [100.0, 0.75]],
            # 0, 10, 20, 30: the median halfway between 10 and 20; p95 at rank 2.85.
            "wait_seconds": {"p50": 15.0, "p95": 28.5, "max": 30.0},
        }

    def test_no_waits_and_long_series(self) -> None:
        many = [sample(i / 1000, i / 2000, 0.0) for i in range(1001)]
        document = policy_run(samples=many).document()
        assert document["wait_seconds"] == {"p50": None, "p95": None, "max": None}
        series = document["allocation_at_arrived"]
        assert isinstance(series, list) and len(series) == 200
        assert series[0] == [0.0, 0.0] and series[-1] == [1.0, 0.5]

    def test_thinning_keeps_the_ends_and_spreads_evenly(self) -> None:
        assert thinned(list(range(9)), 5) == [0, 2, 4, 6, 8]
        assert thinned(list(range(10)), 4) == [0, 3, 6, 9]
        assert thinned([1, 2], 5) == [1, 2]

    def test_percentile(self) -> None:
        assert percentile([7.0], 0.95) == 7.0
        assert percentile([4.0, 1.0, 3.0, 2.0, 5.0], 0.5) == 3.0
        assert percentile([], 0.5) is None

    def test_the_whole_document(self) -> None:
        assert simulation_document(3, 12, 40, [FILLING, STALLING]) == {
            "cluster": {"nodes": 3, "cards": 12, "quotas": 0}, "workload": {"pods": 40},
            "policies": [FILLING.document(), STALLING.document()]}

    def test_pods_by_namespace(self) -> None:
        document = simulation_document(1, 4, 6, [QUOTAED], quotas=2)
        assert document["cluster"] == {"nodes": 1, "cards": 4, "quotas": 2}
        assert QUOTAED.document()["by_namespace"] == {
            "team-a": {"pods": 4, "placed": 2, "refused_for_quota": 2, "refused_otherwise": 0},
            "team-b": {"pods": 2, "placed": 1, "refused_for_quota": 0, "refused_otherwise": 1},
        }


class TestTable:
    def test_one_row_per_policy(self) -> None:
        out = io.StringIO()
        stdout_console(out).print(summary_table([FILLING, STALLING]))
        header, filling, stalling = (line.split("  ") for line in out.getvalue().splitlines())
        cells = [[cell.strip() for cell in row if cell.strip()]
                 for row in (header, filling, stalling)]
        assert cells[0] == ["policy", "node policy", "pods", "placed", "refused", "refused for",
                            "peak allocation", "allocation at 100% arrived",
                            "fragmented at end", "wait p50", "wait p95"]
        assert cells[1] == ["binpack", "binpack", "4", "3", "1", "NodeInsufficientDevice (1)",
                            "75.0%", "75.0%", "20.0%", "15.0 s", "28.5 s"]
        # Arrivals stopped at half the capacity: no allocation at 100%; nothing placed
        # waited (no waits).
        assert cells[2] == ["mutex,spread", "binpack", "4", "1", "3",
                            "ExclusiveDeviceAllocateConflict (2), "
                            "limits[nvidia.com/gpu] is not a number (1)",
                            "25.0%", "-", "20.0%", "-", "-"]

    def test_pods_by_namespace_one_row_per_policy_and_namespace(self) -> None:
        out = io.StringIO()
        stdout_console(out).print(namespace_table([FILLING, QUOTAED]))
        rows = [[cell.strip() for cell in line.split("  ") if cell.strip()]
                for line in out.getvalue().splitlines()]
        assert rows == [
            ["policy", "namespace", "pods", "placed", "refused for quota",
             "refused otherwise"],
            ["binpack", "default", "4", "3", "0", "1"],
            ["spread", "team-a", "4", "2", "2", "0"],
            ["spread", "team-b", "2", "1", "0", "1"],
        ]

    @pytest.mark.parametrize(
        ("runs", "quotas", "shown"),
        [
            ([FILLING], 0, False),
            ([FILLING], 1, True),
            ([FILLING, QUOTAED], 0, True),
        ],
        ids=["one-namespace-no-quota", "a-quota", "several-namespaces"],
    )
    def test_the_namespace_table_is_shown_with_quotas_or_several_namespaces(
            self, runs: list[PolicyRun], quotas: int, shown: bool) -> None:
        assert shows_namespaces(runs, quotas) is shown

    def test_allocation_at_a_share_of_capacity_is_read_between_samples(self) -> None:
        samples = [sample(0.5, 0.4, 0.0), sample(1.5, 0.8, 0.0)]
        assert allocation_at_arrived(samples, 1.0) == pytest.approx(0.6)
        assert allocation_at_arrived(samples, 1.5) == 0.8
        assert allocation_at_arrived(samples, 1.6) is None
        # Before the first sample: from nothing arrived, nothing allocated.
        assert allocation_at_arrived([sample(2.0, 0.5, 0.0)], 1.0) == 0.25
        # Pods with no GPU add nothing to the arrived share: the later sample counts.
        assert allocation_at_arrived([sample(1.0, 0.5, 0.0), sample(1.0, 0.6, 0.0)],
                                     1.0) == 0.5
        assert allocation_at_arrived([], 1.0) is None

    def test_refusal_reasons_commonest_first(self) -> None:
        assert top_reasons({}) == "-"
        assert top_reasons({"b": 2, "a": 2, "c": 5, "d": 1, "e": 1}) == (
            "c (5), a (2), b (2), 2 more")

    def test_durations(self) -> None:
        assert [duration(s) for s in (None, 0.0, 59.94, 90.0, 5400.0)] == [
            "-", "0.0 s", "59.9 s", "1.5 min", "1.5 h"]


def polylines(svg: ET.Element) -> dict[str, list[str]]:
    """Each panel's title and its lines' points, in order."""
    return {panel.attrib["data-title"]: [line.attrib["points"]
                                         for line in panel.iter(f"{SVG}polyline")]
            for panel in svg.iter(f"{SVG}g") if panel.get("class") == "panel"}


class TestPlot:
    def test_the_lines_map_the_samples_onto_the_panels(self) -> None:
        svg = ET.fromstring(plot_svg([FILLING, STALLING], "two policies"))
        # The panels are 440 wide: a 60-pixel margin, then 360 for arrived 0..100%;
        # 216 high from y = 252 (nothing) up to y = 36 (the axis' top).
        # Allocation, 0..100%: x = 60 + 360 * arrived, y = 252 - 216 * allocation.
        # Fragmentation, 0..20% (the nearest round top above 0.2):
        # x = 500 + 360 * arrived, y = 252 - 216 * fragmentation / 0.2.
        assert polylines(svg) == {
            "GPU allocation": ["150.0,198.0 240.0,144.0 420.0,90.0",
                               "150.0,198.0 240.0,198.0"],
            "Fragmentation": ["590.0,252.0 680.0,144.0 860.0,36.0",
                              "590.0,198.0 680.0,36.0"],
        }

    def test_axes_ticks_labels_and_colours(self) -> None:
        svg = ET.fromstring(plot_svg([FILLING, STALLING], "two policies"))
        panels = [g for g in svg.iter(f"{SVG}g") if g.get("class") == "panel"]

        def ticks(panel: ET.Element, kind: str) -> list[str | None]:
            return [t.text for t in panel.iter(f"{SVG}text") if t.get("class") == kind]

        percents = ["0%", "20%", "40%", "60%", "80%", "100%"]
        assert ticks(panels[0], "x-tick") == ticks(panels[1], "x-tick") == percents
        assert ticks(panels[0], "y-tick") == percents
        assert ticks(panels[1], "y-tick") == ["0%", "4%", "8%", "12%", "16%", "20%"]
        texts = [t.text for t in svg.iter(f"{SVG}text")]
        assert texts.count("arrived workload, % of GPU capacity") == 2
        assert "allocated cores, % of all cards" in texts
        assert "fragmented, % of GPU capacity" in texts
        colours = [[line.attrib["stroke"] for line in panel.iter(f"{SVG}polyline")]
                   for panel in panels]
        assert colours[0] == colours[1] and len(set(colours[0])) == 2
        legend = next(g for g in svg.iter(f"{SVG}g") if g.get("class") == "legend")
        assert [t.text for t in legend.iter(f"{SVG}text")] == [
            "binpack (nodes: binpack)", "mutex,spread (nodes: binpack)"]
        assert [line.attrib["stroke"] for line in legend.iter(f"{SVG}line")] == colours[0]

    def test_beyond_the_palette_lines_are_dashed(self) -> None:
        runs = [policy_run(f"p{i}", [sample(0.5, 0.5, 0.0)]) for i in range(9)]
        lines = list(ET.fromstring(plot_svg(runs, "nine")).iter(f"{SVG}polyline"))[:9]
        styles = [(line.attrib["stroke"], line.get("stroke-dasharray")) for line in lines]
        assert len(set(styles)) == 9
        assert [dash is None for _, dash in styles] == [True] * 7 + [False] * 2

    def test_the_x_axis_reaches_past_capacity_for_an_inflated_workload(self) -> None:
        tops = [nice_ceiling(v) for v in (0.0, 0.0031, 0.2, 0.21, 0.13, 1.0, 1.3, 2.6, 7.0, 9.0)]
        assert tops == pytest.approx([1.0, 0.004, 0.2, 0.25, 0.15, 1.0, 1.5, 3.0, 8.0, 10.0])
        run = policy_run(samples=[sample(1.0, 0.5, 0.0), sample(1.3, 0.6, 0.0)])
        svg = ET.fromstring(plot_svg([run], "inflated"))
        # Arrived up to 130%: the round top, 150%, would leave the right of the panel
        # empty; the axis ends 4% past the data, at 135.2%: x = 60 + 360 * arrived / 1.352,
        # the last point 4% short of the right edge (420), with the round top's ticks.
        assert polylines(svg)["GPU allocation"] == ["326.3,144.0 406.2,122.4"]
        x_ticks = [t.text for t in svg.iter(f"{SVG}text") if t.get("class") == "x-tick"]
        assert x_ticks[:6] == ["0%", "30%", "60%", "90%", "120%", "0%"]  # then panel two
        axes = [g.find(f"{SVG}path") for g in svg.iter(f"{SVG}g") if g.get("class") == "panel"]
        assert [axis.attrib["d"] for axis in axes if axis is not None] == [
            "M60,36 V252 H420", "M500,36 V252 H860"]

    @pytest.mark.parametrize(("value", "cap", "end", "ticks"), [
        (0.0, None, 1.0, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),  # nothing: 0 to 100%
        (1.0, None, 1.0, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),  # a round last value ends it
        (0.97, None, 1.0, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),  # the round top within 4%
        (1.26, None, 1.3104, [0, 0.3, 0.6, 0.9, 1.2]),  # the example's: 150% is far
        (0.13, None, 0.1352, [0, 0.03, 0.06, 0.09, 0.12]),
        (0.9, 1.0, 0.936, [0, 0.2, 0.4, 0.6, 0.8]),  # under the cap, 4% past the data
        (0.99, 1.0, 1.0, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),  # never past the cap
    ])
    def test_an_axis_ends_at_its_data(self, value: float, cap: float | None, end: float,
                                      ticks: list[float]) -> None:
        axis = axis_to(value, cap)
        assert axis.end == pytest.approx(end)
        assert list(axis.ticks) == pytest.approx(ticks)
        assert value <= axis.end <= max(value * 1.04, 1.0 if value == 0 else 0.0)

    def test_lines_drawn_over_others_are_said_in_the_legend(self) -> None:
        twin = policy_run("spread", FILLING.samples)
        # The same allocation as FILLING, another fragmentation; a different time does
        # not matter (the x axis is the arrived workload).
        half = policy_run("numa", [sample(s.arrived, s.allocation, s.fragmentation / 2)
                                   for s in FILLING.samples])
        svg = ET.fromstring(plot_svg([FILLING, STALLING, twin, half], "twins"))
        legend = next(g for g in svg.iter(f"{SVG}g") if g.get("class") == "legend")
        assert [t.text for t in legend.iter(f"{SVG}text")] == [
            "binpack (nodes: binpack)", "mutex,spread (nodes: binpack)",
            "spread (nodes: binpack): the same lines as binpack, drawn over them",
            "numa (nodes: binpack): the same allocation line as binpack, drawn over it"]
        # Drawn on top of each other, as said: the same points.
        lines = polylines(svg)
        assert lines["GPU allocation"][3] == lines["GPU allocation"][2] == \
            lines["GPU allocation"][0] != lines["GPU allocation"][1]
        assert lines["Fragmentation"][2] == lines["Fragmentation"][0] != \
            lines["Fragmentation"][3]

    @pytest.mark.parametrize(("runs", "notes"), [
        ([FILLING, STALLING], ["", ""]),
        ([FILLING, FILLING, FILLING], ["", "the same lines as binpack, drawn over them",
                                       "the same lines as binpack, drawn over them"]),
        ([FILLING, policy_run("a", [sample(0.25, 0.25, 0.05), sample(0.5, 0.5, 0.2),
                                    sample(1.0, 0.75, 0.2)])],
         ["", "the same allocation line as binpack, drawn over it"]),
        ([STALLING, policy_run("f", [sample(0.25, 0.1, 0.05), sample(0.5, 0.1, 0.2)])],
         ["", "the same fragmentation line as mutex,spread, drawn over it"]),
        ([FILLING, STALLING, policy_run("m", [sample(0.25, 0.25, 0.05),
                                               sample(0.5, 0.5, 0.2),
                                               sample(1.0, 0.75, 0.2)]),
          policy_run("both", [sample(0.25, 0.25, 0.05), sample(0.5, 0.5, 0.2),
                              sample(1.0, 0.75, 0.2)])],
         ["", "", "the same allocation line as binpack, drawn over it",
          # The first run each line is the same as: binpack's allocation, m's
          # fragmentation.
          "the same allocation line as binpack and fragmentation line as m, drawn over "
          "them"]),
    ])
    def test_which_lines_coincide(self, runs: list[PolicyRun], notes: list[str]) -> None:
        assert coinciding(runs) == notes

    def test_text_is_escaped(self) -> None:
        title = "a<b & 'c' \"d\""
        odd = policy_run("<script>&", [sample(0.5, 0.5, 0.0)], node_policy="x\"y")
        svg = ET.fromstring(plot_svg([odd], title))
        assert svg.find(f"{SVG}title") is not None
        assert svg.findtext(f"{SVG}title") == title
        assert "<script>& (nodes: x\"y)" in [t.text for t in svg.iter(f"{SVG}text")]
        page = plot_html([odd], title)
        assert "<script>" not in page and "<title>a&lt;b &amp; &#x27;c&#x27; &quot;d&quot;" \
            "</title>" in page
        # The page holds the same picture, and a legend with each run's totals.
        inline = re.search(r"<svg xmlns=.*?</svg>", page, re.DOTALL)
        assert inline is not None and ET.fromstring(inline.group()).findtext(
            f"{SVG}title") == title
        assert "<td>&lt;script&gt;&amp;</td><td>x&quot;y</td><td>3 of 4</td>" in page

    def test_the_page_adds_pods_by_namespace_when_asked(self) -> None:
        assert "Pods by namespace" not in plot_html([QUOTAED], "t")
        page = plot_html([QUOTAED], "t", namespaces=True)
        table = re.search(r'<table class="namespaces">.*?</table>', page, re.DOTALL)
        assert table is not None
        rows = [re.findall(r"<t[dh]>(.*?)</t[dh]>", row)
                for row in re.findall(r"<tr>(.*?)</tr>", table.group())]
        assert rows == [["policy", "namespace", "pods", "placed", "refused for quota",
                         "refused otherwise"],
                        ["spread", "team-a", "4", "2", "2", "0"],
                        ["spread", "team-b", "2", "1", "0", "1"]]


class TestProgress:
    def test_one_bar_per_policy_moved_by_its_callback(self) -> None:
        out = io.StringIO()
        console = Console(file=out, force_terminal=True, width=100)
        with progress_bars(["spread", "mutex,binpack"], console) as callbacks:
            first, second = callbacks
            assert first is not None and second is not None
            first(5, 10)
            second(7, 7)
        lines = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line) for line in
                 out.getvalue().splitlines()]
        assert any("spread" in line and "5/10" in line for line in lines)
        assert any("mutex,binpack" in line and "7/7" in line for line in lines)

    def test_no_console_no_bars(self) -> None:
        with progress_bars(["spread", "binpack"], None) as callbacks:
            assert callbacks == [None, None]


def pyhami(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyhami.cli", "simulate", *map(str, args)],
                          capture_output=True, text=True, timeout=60, check=False)


FILES = ("--cluster", EXAMPLES / "lab-cluster.json", "--workload", EXAMPLES / "lab-cluster.json")


class TestArguments:
    @pytest.mark.parametrize(("argv", "error"), [
        (["--policy", "fastest"], "argument --policy: gpu scheduler policy 'fastest': "
                                  "unknown or missing policy name (fastest)"),
        (["--policy", "spread", "--policy", "mutex,fast"],
         "argument --policy: gpu scheduler policy 'mutex,fast': unknown or missing policy "
         "name (fast)"),
        ([], "the following arguments are required: --policy (or PYHAMI_POLICY)"),
        (["--policy", "spread", "--node-policy", "pack"],
         "argument --node-policy: invalid choice: 'pack' (choose from 'binpack', 'spread')"),
        (["--policy", "spread", "--inflate", "0"], "argument --inflate: '0' must be a "
                                                   "finite number above 0"),
        (["--policy", "spread", "--inflate", "inf"], "argument --inflate: 'inf' must be a "
                                                     "finite number above 0"),
        (["--policy", "spread", "--inflate", "nan"], "argument --inflate: 'nan' must be a "
                                                     "finite number above 0"),
        (["--policy", "spread", "--inflate", "twice"], "argument --inflate: 'twice' is not "
                                                       "a number"),
        (["--policy", "spread", "--plot", "out.png"],
         "argument --plot: 'out.png': PNG needs a plotting library, which pyhami does not "
         "ship; write .html or .svg (a browser opens either, and can save it as an image)"),
        (["--policy", "spread", "--plot", "out.pdf"],
         "argument --plot: 'out.pdf': a plot is written as .html or .svg"),
    ])
    def test_bad_arguments_are_refused_by_name(self, argv: list[str], error: str) -> None:
        done = pyhami(*FILES, *argv)
        assert done.returncode == 2
        assert done.stderr.splitlines()[-1] == f"pyhami simulate: error: {error}"
        assert done.stdout == ""

    def test_several_policies_from_the_command_line_or_the_environment(self) -> None:
        argv = ["simulate", "--cluster", "c", "--workload", "w"]
        args = build_parser({}).parse_args([*argv, "--policy", "spread", "--policy",
                                            "mutex,binpack", "--plot", "OUT.SVG"])
        assert args.policy == ["spread", "mutex,binpack"]
        assert (args.node_policy, args.inflate, args.output) == ("binpack", None, "table")
        assert args.plot == Path("OUT.SVG")
        args = build_parser({"PYHAMI_POLICY": "binpack numa,spread"}).parse_args(argv)
        assert args.policy == ["binpack", "numa,spread"]

    @pytest.mark.parametrize("which", ["--cluster", "--workload"])
    def test_a_missing_file_is_one_line(self, tmp_path: Path, which: str) -> None:
        files = {"--cluster": EXAMPLES / "lab-cluster.json",
                 "--workload": EXAMPLES / "lab-cluster.json", which: tmp_path / "gone.csv"}
        done = pyhami(*[part for pair in files.items() for part in pair], "--policy", "spread")
        assert done.returncode == 2
        assert done.stderr == f"pyhami simulate: {tmp_path / 'gone.csv'}: no such file\n"
        done = pyhami("--cluster", tmp_path, "--workload", tmp_path, "--policy", "spread")
        assert (done.returncode, done.stderr) == (2, f"pyhami simulate: {tmp_path}: not a file\n")


def write_two_cards(folder: Path) -> list[str]:
    """One node with two cards, and the workload binpack places whole but spread cannot:
    two half-card pods, then one whole-card pod."""
    cards = [{"uuid": f"GPU-{i}", "index": i, "type": "NVIDIA", "memory": 16000}
             for i in range(2)]
    (folder / "cluster.json").write_text(json.dumps({"nodes": [{"name": "a",
                                                                "devices": cards}]}))

    def pod(name: str, percent: int) -> dict[str, Any]:
        limits = {"nvidia.com/gpu": 1, "nvidia.com/gpucores": percent,
                  "nvidia.com/gpumem-percentage": percent}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}

    pods = [{"arrival": 0, "pod": pod("half-1", 50)}, {"arrival": 1, "pod": pod("half-2", 50)},
            {"arrival": 2, "pod": pod("whole", 100)}]
    (folder / "workload.json").write_text(json.dumps({"pods": pods}))
    return ["simulate", "--cluster", str(folder / "cluster.json"),
            "--workload", str(folder / "workload.json")]


class TestCommand:
    """The command end to end: the real formats and engine, as a user runs it."""

    def test_json_and_the_plot(self, tmp_path: Path) -> None:
        plot = tmp_path / "out.html"
        done = pyhami(*write_two_cards(tmp_path)[1:], "--policy", "binpack",
                      "--policy", "spread", "-o", "json", "--plot", plot)
        assert (done.returncode, done.stderr) == (0, "")
        document = json.loads(done.stdout)
        assert document["cluster"] == {"nodes": 1, "cards": 2, "quotas": 0}
        assert document["workload"] == {"pods": 3}
        binpack, spread = document["policies"]
        # binpack: both halves on card 0, the whole pod on card 1: all cores booked.
        assert (binpack["policy"], binpack["placed"], binpack["refused"],
                binpack["peak_allocation"]) == ("binpack", 3, 0, 1.0)
        # spread: one half on each card, no card left whole: half the cores booked.
        assert (spread["policy"], spread["placed"], spread["refused"],
                spread["peak_allocation"]) == ("spread", 2, 1, 0.5)
        assert sum(spread["refused_by_reason"].values()) == 1
        page = plot.read_text()
        assert page.startswith("<!DOCTYPE html>")
        assert page.count("<polyline") == 4  # two policies, two panels

    def test_the_table(self, tmp_path: Path) -> None:
        done = pyhami(*write_two_cards(tmp_path)[1:], "--policy", "binpack")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0] == "1 nodes, 2 cards; 3 pods"
        assert lines[2].split()[:5] == ["binpack", "binpack", "3", "3", "0"]

    def test_refusals_by_namespace_under_a_quota(self, tmp_path: Path) -> None:
        # Two cards of 16384 MiB; team-a may use 8000 MiB. team-a's four pods of 3000 MiB:
        # two fit (6000), the third would make 9000: it and the fourth wait, and are
        # refused at the end for the quota. team-b's three pods of 3000 fit; its pod of
        # 20000 MiB fits no card.
        cluster = tmp_path / "cluster.json"
        cluster.write_text(json.dumps({
            "nodes": [{"name": "a", "devices": [
                {"uuid": f"GPU-{i}", "index": i, "type": "NVIDIA", "memory": 16384}
                for i in range(2)]}],
            "quotas": [{"apiVersion": "v1", "kind": "ResourceQuota",
                        "metadata": {"name": "gpu-quota", "namespace": "team-a"},
                        "spec": {"hard": {"limits.nvidia.com/gpumem": "8000"}}}]}))

        def pod(name: str, namespace: str, memory: int) -> dict[str, Any]:
            limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory}
            return {"metadata": {"name": name, "namespace": namespace},
                    "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}

        workload = tmp_path / "workload.json"
        workload.write_text(json.dumps({"pods": [
            *({"arrival": i, "pod": pod(f"a{i}", "team-a", 3000)} for i in range(4)),
            *({"arrival": 10 + i, "pod": pod(f"b{i}", "team-b", 3000)} for i in range(3)),
            {"arrival": 20, "pod": pod("big", "team-b", 20000)}]}))
        table = pyhami("--cluster", cluster, "--workload", workload, "--policy", "binpack")
        assert (table.returncode, table.stderr) == (0, "")
        lines = table.stdout.splitlines()
        assert lines[0] == "1 nodes, 2 cards, 1 ResourceQuota; 8 pods"
        assert "ResourceQuotaNotFit (2), CardInsufficientMemory (1)" in lines[2]
        assert lines[4] == "Pods by namespace"
        assert [line.split() for line in lines[5:]] == [
            ["policy", "namespace", "pods", "placed", "refused", "for", "quota", "refused",
             "otherwise"],
            ["binpack", "team-a", "4", "2", "2", "0"],
            ["binpack", "team-b", "4", "3", "0", "1"],
        ]
        done = pyhami("--cluster", cluster, "--workload", workload, "--policy", "binpack",
                      "-o", "json")
        document = json.loads(done.stdout)
        assert document["cluster"] == {"nodes": 1, "cards": 2, "quotas": 1}
        run = document["policies"][0]
        assert run["refused_by_reason"] == {"CardInsufficientMemory": 1,
                                            "ResourceQuotaNotFit": 2}
        assert run["by_namespace"] == {
            "team-a": {"pods": 4, "placed": 2, "refused_for_quota": 2, "refused_otherwise": 0},
            "team-b": {"pods": 4, "placed": 3, "refused_for_quota": 0, "refused_otherwise": 1},
        }

    def test_a_file_the_formats_refuse_is_one_line(self, tmp_path: Path) -> None:
        argv = write_two_cards(tmp_path)
        (tmp_path / "pods.csv").write_text(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
            "creation_time,deletion_time,scheduled_time\n"
            "p1,1000,1024,two,0,,LS,Running,0,10,1\n")
        done = pyhami("--cluster", argv[2], "--workload", tmp_path / "pods.csv",
                      "--policy", "spread")
        assert done.returncode == 2
        assert done.stderr.startswith(f"pyhami simulate: {tmp_path / 'pods.csv'}: line 2")
        assert "num_gpu" in done.stderr and done.stderr.count("\n") == 1

    def test_an_unwritable_plot_is_one_line(self, tmp_path: Path) -> None:
        plot = tmp_path / "missing-folder" / "out.svg"
        done = pyhami(*write_two_cards(tmp_path)[1:], "--policy", "spread", "--plot", plot)
        assert (done.returncode, done.stderr) == (
            2, f"pyhami simulate: {plot}: No such file or directory\n")


def test_the_example_files_hold_the_cluster_and_workload_described() -> None:
    folder = EXAMPLES / "simulate"
    nodes = (folder / "nodes.csv").read_text().splitlines()
    # 4 nodes of 8 V100M32, 8 of 4 T4, 8 of 2 P100: 80 cards.
    assert len(nodes) == 1 + 20
    assert sum(int(row.split(",")[3]) for row in nodes[1:]) == 80
    pods = [row.split(",") for row in (folder / "pods.csv").read_text().splitlines()[1:]]
    arrivals = [int(row[8]) for row in pods]
    assert arrivals == sorted(arrivals)
    # Past the cards' capacity by at most one pod's demand.
    demand = sum(int(row[3]) * int(row[4]) for row in pods) / 1000
    assert 1.25 * 80 <= demand < 1.25 * 80 + 4


def test_the_generator_writes_the_committed_example(tmp_path: Path) -> None:
    for written in write_example(tmp_path):
        assert written.read_text() == (EXAMPLES / "simulate" / written.name).read_text()
