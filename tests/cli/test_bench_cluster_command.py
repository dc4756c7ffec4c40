"""``pyhami bench cluster`` refusing to start: one line saying why, exit 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def bench_cluster(binaries: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pyhami.cli", "bench", "cluster", *args],
        env={**os.environ, "PYHAMI_CONTROL_PLANE_DIR": str(binaries)},
        capture_output=True, text=True, timeout=60, check=False)


def test_missing_binaries_are_named_with_the_script_that_builds_them(tmp_path: Path) -> None:
    (tmp_path / "kube-scheduler").touch(mode=0o755)
    done = bench_cluster(tmp_path, "--nodes", "2", "--pods", "2")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (f"pyhami bench cluster: no etcd, kube-apiserver, helm in {tmp_path}; "
                           "build them with scripts/build-control-plane.sh\n")


def test_more_pods_than_cards_is_refused(tmp_path: Path) -> None:
    for name in ("etcd", "kube-apiserver", "kube-scheduler", "helm"):
        (tmp_path / name).touch(mode=0o755)
    done = bench_cluster(tmp_path, "--nodes", "2", "--cards", "4", "--pods", "9")
    assert done.returncode == 2
    assert done.stderr == ("pyhami bench cluster: --pods 9 do not fit on --nodes 2 x "
                           "--cards 4\n")
