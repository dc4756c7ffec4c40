"""The cluster benchmark, a command of the repository's harness (``scripts/bench-cluster``):
refusing to start (one line saying why, exit 2, no traceback) and how it reads
kube-scheduler's histograms; and ``pyhami bench cluster``, which names it and stops."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.bench_cluster import histogram_mean_ms, limit_settings, medians
from tests.paths import REPO

BENCH_CLUSTER = REPO / "scripts" / "bench-cluster"


def bench_cluster(binaries: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``scripts/bench-cluster`` from elsewhere than the checkout, on this interpreter."""
    return subprocess.run(
        [str(BENCH_CLUSTER), *args], cwd=binaries,
        env={**os.environ, "PYHAMI_CONTROL_PLANE_DIR": str(binaries), "PYTHON": sys.executable},
        capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("args", [["--nodes", "2", "--pods", "2"], [], ["--help"]],
                         ids=["flags", "none", "help"])
def test_pyhami_bench_cluster_names_the_checkout_command(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "pyhami.cli", "bench", "cluster", *args],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == ("pyhami bench cluster needs a checkout of the repository: run "
                           "scripts/bench-cluster there, with the same flags (k8s/, charts/ "
                           "and scripts/build-control-plane.sh are not installed)\n")


def test_missing_binaries_are_named_with_the_script_that_builds_them(tmp_path: Path) -> None:
    (tmp_path / "kube-scheduler").touch(mode=0o755)
    done = bench_cluster(tmp_path, "--nodes", "2", "--pods", "2")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (f"bench-cluster: no etcd, kube-apiserver, helm in {tmp_path}; "
                           "build them with scripts/build-control-plane.sh\n")


def test_more_pods_than_slots_is_refused(tmp_path: Path) -> None:
    for name in ("etcd", "kube-apiserver", "kube-scheduler", "helm"):
        (tmp_path / name).touch(mode=0o755)
    done = bench_cluster(tmp_path, "--nodes", "2", "--cards", "4", "--pods", "81")
    assert done.returncode == 2
    assert done.stderr == ("bench-cluster: --pods 81 do not fit on --nodes 2 x "
                           "--cards 4 x 10 slots\n")


@pytest.mark.parametrize(("chosen", "settings"), [
    ("both", ("default", "raised")),
    ("default", ("default",)),
    ("raised", ("raised",)),
])
def test_limit_settings(chosen: str, settings: tuple[str, ...]) -> None:
    assert limit_settings(chosen) == settings


def test_several_runs_report_the_median_of_each_figure_and_every_run() -> None:
    runs = [{"nodes": 4, "success_events": True, "pyhami_pods_per_s": pods, "ratio": ratio,
             "cpu_ms_per_pod": {"pyhami_raised_limits": {"total": cpu}},
             "phases": {"pyhami_raised_limits": {"bound": 40}}}
            for pods, ratio, cpu in ((10.0, 1.5, 3.0), (30.5, 0.5, 2.0), (20.0, 1.0, 9.0))]
    result = medians(runs)
    assert result == {"nodes": 4, "success_events": True, "pyhami_pods_per_s": 20.0,
                      "ratio": 1.0, "cpu_ms_per_pod": {"pyhami_raised_limits": {"total": 3.0}},
                      "median_of_runs": 3, "runs": runs}


def test_a_profile_with_no_directory_to_go_to_is_refused(tmp_path: Path) -> None:
    for name in ("etcd", "kube-apiserver", "kube-scheduler", "helm"):
        (tmp_path / name).touch(mode=0o755)
    profile = tmp_path / "missing" / "daemon.prof"
    done = bench_cluster(tmp_path, "--nodes", "2", "--pods", "2", "--profile-daemon",
                         str(profile))
    assert done.returncode == 2
    assert done.stderr == (f"bench-cluster: --profile-daemon {profile}: no directory "
                           f"{tmp_path / 'missing'} to write it in\n")


def test_a_histogram_mean_sums_the_series_holding_the_label() -> None:
    exposition = "\n".join([
        "# HELP x_seconds a histogram",
        'x_seconds_bucket{le="1",point="Bind"} 3',
        'x_seconds_sum{point="Bind",profile="a"} 0.006',
        'x_seconds_count{point="Bind",profile="a"} 3',
        'x_seconds_sum{point="Bind",profile="b"} 0.004',
        'x_seconds_count{point="Bind",profile="b"} 1',
        'x_seconds_sum{point="Filter",profile="a"} 9',
        'x_seconds_count{point="Filter",profile="a"} 1',
    ])
    # (0.006 + 0.004) s over 4 observations: 2.5 ms; Filter's series left out.
    assert histogram_mean_ms(exposition, "x_seconds", 'point="Bind"') == 2.5
    assert histogram_mean_ms(exposition, "x_seconds") == 1802.0  # 9.01 s over 5
    assert histogram_mean_ms(exposition, "y_seconds") is None
