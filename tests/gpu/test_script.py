"""``scripts/gpu-check.sh`` on a machine without an NVIDIA driver (every CI machine): each
check skipped with its reason, the report written, exit 0, in seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.machine import driver_absent
from tests.paths import REPO

CHECKS = 7
"""The checks the script runs: inventory, stream, monitor, two device plugin variants, the
MIG table and the MIG write."""


@pytest.mark.slow  # the GPU check script's seven checks, in processes
@pytest.mark.skipif(driver_absent() is None, reason="a GPU is here: the script checks it")
def test_without_a_driver_every_check_is_skipped_with_its_reason(tmp_path: Path) -> None:
    absent = driver_absent()
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu-check.sh"), "--out", str(tmp_path)],
        cwd=REPO, env={**os.environ, "PYTHON": sys.executable}, capture_output=True,
        text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["passed"] is True
    assert report["counts"] == {"skipped": CHECKS}
    assert [check["reason"] for check in report["checks"]] == [absent] * CHECKS
    summary = (tmp_path / "gpu-check.txt").read_text()
    assert summary.startswith("pyhami GPU check: PASSED in ") and "(7 skipped)" in summary
