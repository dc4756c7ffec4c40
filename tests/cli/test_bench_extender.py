"""The figures ``pyhami bench extender`` reads about the daemon from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyhami.bench.extender import cpu_seconds, daemon_memory
from pyhami.cli import main

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")


def test_memory_is_read_in_mebibytes_and_the_peak_is_at_least_the_current() -> None:
    # A child holding 64 MiB it has written to (so resident), waiting to be read.
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; held = b'x' * (64 << 20); print('held', flush=True);"
                               " sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"held\n"
        memory = daemon_memory(child.pid)
    finally:
        child.kill()
        child.wait()
    assert memory["daemon_rss_mb"] is not None and memory["daemon_rss_mb"] >= 64
    assert memory["daemon_peak_rss_mb"] is not None
    assert memory["daemon_peak_rss_mb"] >= memory["daemon_rss_mb"]


def test_a_process_that_is_gone_has_no_figures() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert daemon_memory(child.pid) == {"daemon_rss_mb": None, "daemon_peak_rss_mb": None}
    assert cpu_seconds(child.pid) is None


def test_cpu_time_counts_work_done() -> None:
    before = cpu_seconds(os.getpid())
    total = 0
    while (cpu_seconds(os.getpid()) or 0) - (before or 0) < 0.05:
        total += sum(range(10000))
    after = cpu_seconds(os.getpid())
    assert before is not None and after is not None
    assert after - before >= 0.05


def test_a_profile_with_no_directory_to_go_to_is_refused_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nowhere = tmp_path / "missing" / "daemon.prof"
    assert main(["bench", "extender", "--profile-daemon", str(nowhere)]) == 2
    assert capsys.readouterr().err == (
        f"pyhami bench extender: --profile-daemon {nowhere}: no directory "
        f"{nowhere.parent} to write it in\n")
