"""The harness's cluster benchmark (``scripts/bench-cluster``) at a small size: every pod of
every phase bound where it should be, and the figures it reports consistent with each other
(no figure is judged: they depend on the machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.paths import REPO

NODES, PODS = 20, 40
PHASES = ("pyhami_default_limits", "default_default_limits", "pyhami_raised_limits",
          "default_raised_limits")
COMPONENTS = {"etcd", "kube-apiserver", "kube-scheduler", "pyhami-scheduler", "nats-server"}
KEYS = {"nodes", "pods", "pyhami_pods_per_s", "default_pods_per_s", "ratio", "pyhami_p50_ms",
        "pyhami_p99_ms", "default_p50_ms", "default_p99_ms", "pyhami_pods_per_s_default_limits",
        "default_pods_per_s_default_limits", "ratio_default_limits", "created_per_s",
        "cpu_ms_per_pod", "kernel_ms_per_pod", "pyhami_idle_ms", "default_idle_ms", "phases"}


# k8s/'s plain HTTP over loopback, both limits, one run; and the chart's mutual TLS, raised
# limits only, two runs reported as their medians.
@pytest.mark.parametrize("flags", [[], ["--extender-tls", "--limits", "raised", "--runs", "2"]],
                         ids=["plain", "tls-two-runs"])
def test_bench_cluster_binds_every_pod_of_every_phase(control_plane_binaries: Path,
                                                      flags: list[str]) -> None:
    done = subprocess.run(
        [str(REPO / "scripts" / "bench-cluster"), "--nodes", str(NODES),
         "--pods", str(PODS), "--idle-pods", "3", *flags],
        env={**os.environ, "PYHAMI_CONTROL_PLANE_DIR": str(control_plane_binaries),
             "PYTHON": sys.executable},
        capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    *summaries, last = done.stdout.strip().splitlines()
    result = json.loads(last)
    # One human line per phase, each saying every pod was bound.
    assert len(summaries) == 4
    assert all(f": {PODS} bound," in line for line in summaries)
    if not flags:
        assert set(result) >= KEYS
        check_run(result, PHASES)
        assert result["ratio_default_limits"] == round(
            result["pyhami_pods_per_s_default_limits"]
            / result["default_pods_per_s_default_limits"], 3)
        return
    raised = tuple(name for name in PHASES if name.endswith("_raised_limits"))
    assert [line.split(":")[0] for line in summaries] == ["run 1 of 2"] * 2 + ["run 2 of 2"] * 2
    assert result["median_of_runs"] == 2 and len(result["runs"]) == 2
    for run in result["runs"]:
        check_run(run, raised)
        assert not any(key.endswith("_default_limits") for key in run)
    # Each figure the median of the runs' (of two: their mean), ratios within each run.
    for key in ("pyhami_pods_per_s", "default_p99_ms", "ratio", "cpu_ratio"):
        assert result[key] == pytest.approx(
            sum(run[key] for run in result["runs"]) / 2, abs=0.001), key
    assert result["cpu_ms_per_pod"]["pyhami_raised_limits"]["total"] == pytest.approx(
        sum(run["cpu_ms_per_pod"]["pyhami_raised_limits"]["total"]
            for run in result["runs"]) / 2, abs=0.001)


def check_run(result: dict[str, Any], phases: tuple[str, ...]) -> None:
    """One run's report: each phase's pods bound where they should be, its figures
    consistent with each other."""
    assert (result["nodes"], result["pods"]) == (NODES, PODS)
    assert set(result["phases"]) == set(phases)
    for name, phase in result["phases"].items():
        assert phase["bound"] == PODS, name
        assert phase["on_bench_nodes"] == PODS, name
        # pyhami's pods carry its allocation when bound; kube-scheduler alone writes none.
        assert phase["annotated"] == (PODS if name.startswith("pyhami") else 0), name
        # kube-scheduler's own histograms saw the phase's pods scheduled; its Bind extension
        # point runs only without an extender that binds.
        own = phase["kube_scheduler"]
        assert own["algorithm_ms"] > 0 and own["attempt_ms"] > 0, name
        if name.startswith("pyhami"):
            assert own["bind_ms"] is None, name
        else:
            assert own["bind_ms"] > 0, name
        cpu = result["cpu_ms_per_pod"][name]
        assert set(cpu) == {*COMPONENTS, "total"}
        # The total is the phase's own cluster's: kube-scheduler alone's leaves out the
        # daemon and nats-server idling beside it.
        counted = COMPONENTS if name.startswith("pyhami") else COMPONENTS - {
            "pyhami-scheduler", "nats-server"}
        assert abs(cpu["total"] - sum(cpu[component] for component in counted)) < 0.011
        kernel = result["kernel_ms_per_pod"][name]
        assert set(kernel) == COMPONENTS
        assert all(0 <= kernel[component] <= cpu[component] + 0.011 for component in COMPONENTS)
    assert result["ratio"] == round(result["pyhami_pods_per_s"] / result["default_pods_per_s"], 3)
    assert result["cpu_ratio"] == round(result["pyhami_cpu_ms_per_pod"]
                                        / result["default_cpu_ms_per_pod"], 3)
    assert result["pyhami_pods_per_s"] == result["phases"]["pyhami_raised_limits"]["pods_per_s"]
    assert result["pyhami_cpu_ms_per_pod"] == (
        result["cpu_ms_per_pod"]["pyhami_raised_limits"]["total"])
    assert result["default_p99_ms"] == result["phases"]["default_raised_limits"]["p99_ms"]
    assert result["pyhami_idle_ms"] > 0 and result["default_idle_ms"] > 0
