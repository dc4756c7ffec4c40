"""One output policy for every command: a terminal's width, or in a pipe and a file tables as
wide as their content and rules as wide as the tables; a reader that leaves ends the
command quietly."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.table import Table

from pyhami.demo import lab_pod
from pyhami.natsserver import free_port
from pyhami.output import (
    PLAIN_RULE_WIDTH,
    READER_GONE_EXIT,
    ContentWidthConsole,
    OutputPolicy,
)
from tests.cli.test_demo import assert_the_lab_played_on, port_is_closed
from tests.harness import Lab, card_of
from tests.paths import EXAMPLES, REPO

SIMULATE = ("simulate", "--cluster", str(EXAMPLES / "simulate" / "nodes.csv"), "--workload",
            str(EXAMPLES / "simulate" / "pods.csv"), "--policy", "binpack", "--policy",
            "mutex,binpack,numa")
LONGEST_LINE = 400


def environment(**extra: str) -> dict[str, str]:
    """This process's environment as a user's shell would pass it to a pipe: no COLUMNS
    unless given, no PYHAMI_ settings."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("PYHAMI_") and name not in ("COLUMNS", "NO_COLOR", "TERM")}
    env["PYTHONPATH"] = str(REPO)
    return {**env, **extra}


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "pyhami.cli", *args]


# The policy -------------------------------------------------------------------------------


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("tty", "env", "expected"), [
    (True, {}, OutputPolicy(terminal=True, interactive=True, color=True, columns=None)),
    (True, {"NO_COLOR": "1"},
     OutputPolicy(terminal=True, interactive=True, color=False, columns=None)),
    (True, {"NO_COLOR": ""},
     OutputPolicy(terminal=True, interactive=True, color=True, columns=None)),
    (True, {"TERM": "dumb"},
     OutputPolicy(terminal=True, interactive=False, color=False, columns=None)),
    (True, {"COLUMNS": "132"},
     OutputPolicy(terminal=True, interactive=True, color=True, columns=132)),
    (False, {}, OutputPolicy(terminal=False, interactive=False, color=False, columns=None)),
    (False, {"TERM": "xterm-256color", "FORCE_COLOR": "1"},
     OutputPolicy(terminal=False, interactive=False, color=False, columns=None)),
    (False, {"COLUMNS": "100"},
     OutputPolicy(terminal=False, interactive=False, color=False, columns=100)),
    (False, {"COLUMNS": "wide"},
     OutputPolicy(terminal=False, interactive=False, color=False, columns=None)),
    (False, {"COLUMNS": "0"},
     OutputPolicy(terminal=False, interactive=False, color=False, columns=None)),
], ids=["terminal", "no-color", "empty-no-color", "dumb-terminal", "terminal-columns", "pipe",
        "pipe-force-color", "pipe-columns", "columns-not-a-number", "columns-zero"])
def test_the_policy_follows_the_stream_and_the_environment(
        tty: bool, env: dict[str, str], expected: OutputPolicy) -> None:
    stream = Tty() if tty else io.StringIO()
    assert OutputPolicy.for_stream(stream, env) == expected


def wide_table(width: int) -> Table:
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(no_wrap=True)
    table.add_row("x" * width)
    return table


def printed(draw: Callable[[ContentWidthConsole], None], rule_width: int = PLAIN_RULE_WIDTH,
            ) -> list[str]:
    out = io.StringIO()
    draw(ContentWidthConsole(out, rule_width))
    return out.getvalue().splitlines()


@pytest.mark.parametrize(("draw", "widths"), [
    (lambda c: c.rule("first"), [PLAIN_RULE_WIDTH]),
    (lambda c: (c.print(wide_table(50)), c.rule("after a narrow table")), [50, PLAIN_RULE_WIDTH]),
    (lambda c: (c.print(wide_table(300)), c.rule("after a wide one")), [300, 300]),
    (lambda c: (c.print("y" * 900), c.rule("text is not a table")), [900, PLAIN_RULE_WIDTH]),
    (lambda c: c.print("a short line"), [len("a short line")]),
], ids=["rule-alone", "rule-after-narrow-table", "rule-after-wide-table",
        "long-text-whole", "short-text"])
def test_in_a_pipe_content_is_whole_and_rules_follow_the_tables(
        draw: Callable[[ContentWidthConsole], None], widths: list[int]) -> None:
    assert [len(line.rstrip()) for line in printed(draw)] == widths


def test_in_a_pipe_columns_sets_the_width_of_rules_not_of_tables() -> None:
    lines = printed(lambda c: (c.print(wide_table(150)), c.rule("t")), rule_width=40)
    assert [len(line) for line in lines] == [150, 150]
    assert [len(line) for line in printed(lambda c: c.rule("t"), rule_width=40)] == [40]


def test_in_a_pipe_nothing_is_coloured() -> None:
    lines = printed(lambda c: c.print("[bold green]<- chosen[/]"))
    assert lines == ["<- chosen"]


# Every command to a file ------------------------------------------------------------------


@dataclass(frozen=True)
class Printing:
    args: tuple[str, ...]
    bound: int  # bytes the output stays under
    holds: tuple[str, ...]  # what the output must say


PRINTING = {
    "decide-table": Printing(("decide", "--cluster", str(EXAMPLES / "lab-cluster.json"), "--pod",
                              str(EXAMPLES / "mutex-binpack-pod.yaml"), "--explain", "-o",
                              "table"), 2_000, ("-> GPU 2 on gpu-node-1",)),
    "explain": Printing(("explain", str(EXAMPLES / "mutex-binpack-pod.yaml"), "--cluster",
                         str(EXAMPLES / "lab-cluster.json")), 2_000,
                        ("ExclusiveDeviceAllocateConflict", "<- chosen",
                         "-> GPU 2 on gpu-node-1")),
    "simulate": Printing(SIMULATE, 4_000, ("20 nodes, 80 cards; 104 pods", "binpack",
                                           "mutex,binpack,numa")),
    "bench-decide": Printing(("bench", "decide", "--nodes", "10", "--pods", "50"), 1_000,
                             ('"nodes": 10', '"pods": 50')),
}


def assert_fits_a_file(path: Path, bound: int) -> str:
    data = path.read_bytes()
    assert len(data) < bound, f"{path.name} is {len(data)} bytes"
    text = data.decode()
    longest = max(map(len, text.splitlines()))
    assert longest <= LONGEST_LINE, f"a line of {longest} characters"
    assert "\x1b[" not in text
    return text


@pytest.mark.parametrize("name", PRINTING)
def test_a_command_to_a_file_holds_its_results_in_lines_a_file_can_hold(
        name: str, tmp_path: Path) -> None:
    case = PRINTING[name]
    path = tmp_path / "out.log"
    with path.open("w") as out:
        done = subprocess.run(command(*case.args), stdout=out, stderr=subprocess.PIPE,
                              text=True, timeout=120, check=False, env=environment())
    assert done.returncode == 0, done.stderr
    text = assert_fits_a_file(path, case.bound)
    for needle in case.holds:
        assert needle in text


def test_the_demo_to_a_file_is_under_50_kb_and_holds_the_lab(tmp_path: Path) -> None:
    path = tmp_path / "demo.log"
    with path.open("w") as out:
        done = subprocess.run(command("demo"), stdout=out, stderr=subprocess.PIPE, text=True,
                              timeout=120, check=False, env=environment())
    assert done.returncode == 0, done.stderr
    text = assert_fits_a_file(path, 50_000)
    assert_the_lab_played_on(text, "gpu-node-1")
    rules = [line for line in text.splitlines() if line.startswith("─")]
    assert len(rules) == 5
    assert {len(rule) for rule in rules} == {PLAIN_RULE_WIDTH}


async def test_watch_once_to_a_file_shows_the_node_and_the_decision(
        lab: Lab, tmp_path: Path) -> None:
    path = tmp_path / "watch.log"
    with path.open("w") as out:
        watch = await asyncio.create_subprocess_exec(
            *command("watch", "--nats", lab.nats.url, "--once", "--wait", "3"), stdout=out,
            stderr=asyncio.subprocess.PIPE, env=environment())
        await asyncio.sleep(1.5)  # subscribed by then: the decision is heard
        card = card_of(await lab.pods.submit_and_place(lab_pod("watched")))
        _, err = await asyncio.wait_for(watch.communicate(), 30)
    assert watch.returncode == 0, err.decode()
    text = assert_fits_a_file(path, 10_000)
    assert "gpu-node-1" in text and "default/watched" in text
    assert f"gpu-node-1 GPU {card[-1]}" in text


@pytest.mark.parametrize("args", [
    ("decide", "--cluster", str(EXAMPLES / "lab-cluster.json"), "--pod",
     str(EXAMPLES / "mutex-binpack-pod.yaml"), "--explain"),
    ("explain", str(EXAMPLES / "mutex-binpack-pod.yaml"), "--cluster",
     str(EXAMPLES / "lab-cluster.json"), "-o", "json"),
    (*SIMULATE, "-o", "json"),
], ids=["decide", "explain", "simulate"])
@pytest.mark.parametrize("columns", ["20", "100000"])
def test_json_is_one_document_whatever_the_width(args: tuple[str, ...], columns: str) -> None:
    done = subprocess.run(command(*args), capture_output=True, text=True, timeout=120,
                          check=False, env=environment(COLUMNS=columns))
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout), dict)


# A reader that leaves ---------------------------------------------------------------------


def children_of(pid: int) -> set[int]:
    """The processes whose parent is ``pid``, from /proc."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state == "Z"


@pytest.fixture
def reader_leaves() -> Iterator[Callable[[list[str]], tuple[int, str, set[int]]]]:
    """Runs a command with its stdout read by this test, which takes one line and closes the
    pipe as `| head -1` does; returns the exit status, stderr and the children it had."""
    started: list[subprocess.Popen[bytes]] = []

    def run(args: list[str]) -> tuple[int, str, set[int]]:
        process = subprocess.Popen(command(*args), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=environment())
        started.append(process)
        assert process.stdout is not None and process.stderr is not None
        first = process.stdout.readline()
        assert first.strip(), "nothing printed before the reader left"
        children = children_of(process.pid)
        process.stdout.close()
        code = process.wait(timeout=60)
        return code, process.stderr.read().decode(), children

    yield run
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()


def test_the_demo_piped_to_head_ends_quietly_and_stops_its_sandbox(
        reader_leaves: Callable[[list[str]], tuple[int, str, set[int]]]) -> None:
    nats_port = free_port()
    code, err, children = reader_leaves(["demo", "--nats-port", str(nats_port)])
    assert code == READER_GONE_EXIT
    assert err == ""
    assert children, "the demo's nats-server was not seen"
    deadline = time.monotonic() + 10
    while not all(gone(pid) for pid in children):
        assert time.monotonic() < deadline, f"left running: {children}"
        time.sleep(0.05)
    assert port_is_closed(nats_port)


def test_simulate_piped_to_head_ends_quietly(
        reader_leaves: Callable[[list[str]], tuple[int, str, set[int]]]) -> None:
    code, err, _ = reader_leaves(list(SIMULATE))
    # The whole table may already sit in the pipe when the reader leaves.
    assert code in (0, READER_GONE_EXIT)
    assert err == ""
