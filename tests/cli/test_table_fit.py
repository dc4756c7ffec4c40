"""Tables on a terminal narrower than they are: stacked, every cell whole, never cut short
(``mutex,bi…``, ``0.0…``); as wide as the window allows, or wider, unchanged.

The commands run as a user runs them, on a pseudo-terminal of COLUMNS columns
(``TERM=dumb``: no colours, the same layout), against the same command in a pipe, where
every table is printed whole at its natural width.
"""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pyhami.output import fitted, stacked
from tests.cli.test_output_policy import command, environment
from tests.paths import EXAMPLES

ELLIPSIS = "…"
# The documented example (docs/simulate.md, "An example"), without its plot.
SIMULATE_EXAMPLE = ("simulate", "--cluster", str(EXAMPLES / "simulate" / "nodes.csv"),
                    "--workload", str(EXAMPLES / "simulate" / "pods.csv"),
                    "--policy", "spread", "--policy", "binpack", "--policy", "mutex,binpack")


def on_a_terminal(args: tuple[str, ...], columns: int) -> str:
    """What ``pyhami ARGS`` prints on a terminal ``columns`` wide."""
    leader, follower = pty.openpty()
    with subprocess.Popen(command(*args), stdout=follower, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL,
                          env=environment(COLUMNS=str(columns), TERM="dumb")) as process:
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the follower's last holder closed it
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert process.wait(timeout=120) == 0, process.stderr.read() if process.stderr else ""
    os.close(leader)
    return b"".join(chunks).decode().replace("\r\n", "\n")


def in_a_pipe(args: tuple[str, ...]) -> str:
    done = subprocess.run(command(*args), capture_output=True, text=True, check=True,
                          timeout=120, env=environment())
    return done.stdout


def table_rows(text: str, header_starts: str) -> list[list[str]]:
    """The rows of the table whose header line starts ``header_starts`` in a pipe's output
    (cells apart by two spaces or more; every cell of these tables holds something)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_starts))
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def spaced(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("columns", [80, 100])
def test_simulate_s_documented_example_is_whole_at_80_and_100_columns(columns: int) -> None:
    whole = table_rows(in_a_pipe(SIMULATE_EXAMPLE), "policy")
    header, *rows = whole
    assert len(header) == 11 and len(rows) == 3  # the table as docs/simulate.md shows it
    shown = on_a_terminal(SIMULATE_EXAMPLE, columns)
    assert ELLIPSIS not in shown
    assert max(len(line) for line in shown.splitlines()) <= columns
    # Each cell whole, beside its column's name: "refused for" wraps at its spaces, so
    # it is read with the lines' spaces made one.
    text = spaced(shown)
    for row in rows:
        assert len(row) == len(header)
        for name, cell in zip(header, row, strict=True):
            assert f"{name} {cell}" in text, (name, cell)
    # One block per policy, in order.
    assert [line.split()[1] for line in shown.splitlines() if line.startswith("policy ")] \
        == ["spread", "binpack", "mutex,binpack"]


def test_a_terminal_wide_enough_shows_the_table_as_a_pipe_does() -> None:
    piped = in_a_pipe(SIMULATE_EXAMPLE).splitlines()
    shown = on_a_terminal(SIMULATE_EXAMPLE, 400).splitlines()
    assert [line.rstrip() for line in shown] == [line.rstrip() for line in piped]


def test_explain_at_80_columns_shows_each_card_whole(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"nodes": [
        {"name": name, "devices": [
            {"uuid": f"{name}-{i}", "index": i, "type": "NVIDIA-Tesla T4", "memory": 15360}
            for i in range(cards)]}
        for name, cards in (("gpu-node-with-a-long-name-1", 2), ("gpu-node-2", 4))]}))
    pod = tmp_path / "pod.json"
    pod.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "three"},
        "spec": {"containers": [{"name": "app", "resources": {"limits": {
            "nvidia.com/gpu": 3, "nvidia.com/gpumem": 1000}}}]}}))
    args = ("explain", str(pod), "--cluster", str(cluster))
    decided = json.loads(in_a_pipe(("decide", "--cluster", str(cluster), "--pod", str(pod),
                                    "--explain")))
    shown = on_a_terminal(args, 80)
    assert ELLIPSIS not in shown
    assert max(len(line) for line in shown.splitlines()) <= 80
    text = spaced(shown)
    for row in decided["explain"]:
        block = (f"node {row['node']} card GPU {row['index']} tenants {row['used']} "
                 f"score {row['score']:.6f} filtered by {row['filtered_by'] or '-'} "
                 f"rank {'-' if row['rank'] is None else row['rank']}")
        assert block in text
    assert "<- chosen" in text
    assert text.endswith("-> GPU 0, GPU 1, GPU 2 on gpu-node-2")


class TestStacked:
    """The stacked layout itself, on tables built here."""

    @staticmethod
    def table() -> Table:
        table = Table(title="runs")
        for name in ("policy", "count", ""):
            table.add_column(name, no_wrap=True)
        table.add_row(Text("spread"), "123456789", "[bold]<- best[/]")
        table.add_row("[dim]binpack[/]", "0.000001", "")
        return table

    def test_a_block_per_row_blank_cells_left_out_markup_read_as_the_table_reads_it(
            self) -> None:
        out = io.StringIO()
        Console(file=out, width=80, color_system=None).print(*stacked(self.table()))
        assert [line.rstrip() for line in out.getvalue().splitlines()] == [
            "runs",
            "policy  spread",
            "count   123456789",
            "        <- best",
            "",
            "policy  binpack",
            "count   0.000001",
        ]

    # 17 columns: the longest name, two spaces and the longest value.
    @pytest.mark.parametrize("width", [17, 20, 30])
    def test_narrower_than_the_table_every_value_is_whole(self, width: int) -> None:
        out = io.StringIO()
        Console(file=out, width=width, color_system=None).print(fitted(self.table()))
        text = out.getvalue()
        assert ELLIPSIS not in text
        assert "123456789" in text and "0.000001" in text and "policy  spread" in text

    def test_a_word_longer_than_the_line_is_folded_not_cut(self) -> None:
        out = io.StringIO()
        Console(file=out, width=12, color_system=None).print(fitted(self.table()))
        values = [line[8:].rstrip() for line in out.getvalue().splitlines()
                  if line.startswith(("count", "        "))]
        assert ELLIPSIS not in out.getvalue()
        assert "123456789" in "".join(values)

    def test_as_wide_as_the_table_it_is_the_table(self) -> None:
        fit, plain = io.StringIO(), io.StringIO()
        Console(file=fit, width=40, color_system=None).print(fitted(self.table()))
        Console(file=plain, width=40, color_system=None).print(self.table())
        assert fit.getvalue() == plain.getvalue()

    def test_a_table_that_fits_by_wrapping_at_spaces_stays_a_table(self) -> None:
        table = Table(box=None, pad_edge=False, show_edge=False)
        table.add_column("policy", no_wrap=True)
        table.add_column("refused for")
        table.add_column("wait", justify="right", no_wrap=True)
        table.add_row("mutex,binpack", "ExclusiveDeviceAllocateConflict (16), "
                      "CardTypeMismatch (11)", "12.4 s")
        out = io.StringIO()
        Console(file=out, width=60, color_system=None).print(fitted(table))
        lines = [line.rstrip() for line in out.getvalue().splitlines()]
        assert lines[0].split() == ["policy", "refused", "for", "wait"]
        assert lines[1].split() == ["mutex,binpack", "ExclusiveDeviceAllocateConflict",
                                    "(16),", "12.4", "s"]
        assert lines[2].split() == ["CardTypeMismatch", "(11)"]
        assert all(len(line) <= 60 for line in lines)
