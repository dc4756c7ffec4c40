"""The harness's cluster benchmark (``scripts/bench-cluster``) at a small size: every pod of
every phase bound where it should be, and the figures it reports consistent with each other
(no figure is judged: they depend on the machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


# k8s/'s plain HTTP over loopback, and the chart's mutual TLS.
@pytest.mark.parametrize("flags", [[], ["--extender-tls"]], ids=["plain", "tls"])
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
    assert set(result) >= KEYS
    assert (result["nodes"], result["pods"]) == (NODES, PODS)
    # One human line per phase, each saying every pod was bound.
    assert len(summaries) == 4
    assert all(f": {PODS} bound," in line for line in summaries)
    assert set(result["phases"]) == set(PHASES)
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
        assert abs(cpu["total"] - sum(cpu[component] for component in COMPONENTS)) < 0.011
        kernel = result["kernel_ms_per_pod"][name]
        assert set(kernel) == COMPONENTS
        assert all(0 <= kernel[component] <= cpu[component] + 0.011 for component in COMPONENTS)
    assert result["ratio"] == round(result["pyhami_pods_per_s"] / result["default_pods_per_s"], 3)
    assert result["ratio_default_limits"] == round(
        result["pyhami_pods_per_s_default_limits"] / result["default_pods_per_s_default_limits"],
        3)
    assert result["pyhami_pods_per_s"] == result["phases"]["pyhami_raised_limits"]["pods_per_s"]
    assert result["default_p99_ms"] == result["phases"]["default_raised_limits"]["p99_ms"]
    assert result["pyhami_idle_ms"] > 0 and result["default_idle_ms"] > 0
