"""``pyhami decide`` as a user runs it, good input and bad."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.paths import EXAMPLES


def pyhami(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyhami.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=60, check=False)


def decide(cluster: Path, pod: Path, *extra: str) -> dict[str, Any]:
    done = pyhami("decide", "--cluster", cluster, "--pod", pod, *extra)
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def write(path: Path, content: object) -> Path:
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


class TestWorkedExample:
    def test_mutex_binpack_picks_gpu_2_and_explains_why(self) -> None:
        document = decide(EXAMPLES / "lab-cluster.json", EXAMPLES / "mutex-binpack-pod.yaml",
                          "--explain")
        assert document["scheduled"] is True
        assert document["node"] == "gpu-node-1"
        assert document["devices"] == [[{"uuid": "GPU-2", "index": 2, "type": "NVIDIA",
                                         "usedmem": 1000, "usedcores": 0}]]
        assert document["annotations"]["hami.io/vgpu-devices-allocated"] == (
            "GPU-2,NVIDIA,1000,0:;")
        assert document["annotations"]["hami.io/vgpu-node"] == "gpu-node-1"
        assert document["failed_nodes"] == {}
        assert document["ignored_policies"] == []
        rows = {row["index"]: row for row in document["explain"]}
        assert rows[0]["score"] == 3.302083 and rows[1]["score"] == 1.651042
        assert rows[0]["filtered_by"] == rows[1]["filtered_by"] == (
            "ExclusiveDeviceAllocateConflict")
        assert [rows[i]["rank"] for i in range(4)] == [None, None, 1, 2]

    def test_plain_binpack_picks_gpu_0(self) -> None:
        document = decide(EXAMPLES / "lab-cluster.json", EXAMPLES / "binpack-pod.yaml")
        assert document["devices"][0][0]["uuid"] == "GPU-0"
        assert "explain" not in document

    def test_the_default_policy_flags_apply(self, tmp_path: Path) -> None:
        pod = write(tmp_path / "pod.json", {"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpumem": 1000}}}]}})
        assert decide(EXAMPLES / "lab-cluster.json", pod)["devices"][0][0]["index"] == 2
        binpack = decide(EXAMPLES / "lab-cluster.json", pod, "--gpu-scheduler-policy", "binpack")
        assert binpack["devices"][0][0]["index"] == 0

    def test_unschedulable_lists_every_node(self, tmp_path: Path) -> None:
        pod = write(tmp_path / "pod.yaml", EXAMPLES.joinpath("mutex-binpack-pod.yaml")
                    .read_text().replace("nvidia.com/gpu: 1", "nvidia.com/gpu: 3"))
        document = decide(EXAMPLES / "lab-cluster.json", pod)
        assert document == {
            "scheduled": False, "gpu": True, "node": None, "devices": [], "annotations": {},
            "failed_nodes": {"gpu-node-1": "2/4 AllocatedCardsInsufficientRequest, "
                                           "2/4 ExclusiveDeviceAllocateConflict"},
            "ignored_policies": [],
            "message": "asked for 3 cards with 1000 MiB each; gpu-node-1: "
                       "2/4 AllocatedCardsInsufficientRequest (2 cards fit, 3 needed), "
                       "2/4 ExclusiveDeviceAllocateConflict (in use)",
        }


class TestBadInput:
    @pytest.mark.parametrize(
        ("content", "message"),
        [
            ("{not json", "cluster.json: "),
            ({"nodes": [{"name": "a", "devices": [{"uuid": "x", "index": 0}]}]},
             "Object missing required field `type`"),
            ({"nodes": [{"name": "a", "devices": [{"uuid": "x", "index": 0, "type": "T4",
                                                   "memory": -5}]}]},
             "Expected `int` >= 0 - at `$.nodes[0].devices[0].memory`"),
            ({"nodes": [{"name": "a", "devices": [], "colour": "red"}]},
             "unknown field `colour`"),
            ({"nodes": [{"name": "a", "devices": []}, {"name": "a", "devices": []}]},
             "nodes[1] ('a'): node name is listed twice"),
            ({"nodes": [], "pods": [{"namespace": "d", "name": "p", "node": "x"}]},
             "node 'x' is not among the cluster's nodes"),
            ({"nodes": [{"name": "a", "devices": []}], "pods": [
                {"namespace": "d", "name": "p", "node": "a",
                 "annotations": {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,lots,0:;"}}]},
             "card 'GPU-0,NVIDIA,lots,0' needs"),
        ],
    )
    def test_a_bad_cluster_file_exits_2_naming_it(self, tmp_path: Path, content: object,
                                                  message: str) -> None:
        cluster = write(tmp_path / "cluster.json", content)
        done = pyhami("decide", "--cluster", cluster, "--pod",
                      EXAMPLES / "binpack-pod.yaml")
        assert done.returncode == 2
        assert done.stdout == ""
        assert len(done.stderr.strip().splitlines()) == 1
        assert str(cluster) in done.stderr
        assert message in done.stderr
        assert "Traceback" not in done.stderr

    @pytest.mark.parametrize(
        ("content", "message"),
        [
            ("metadata: [unclosed", "not YAML or JSON"),
            ("- just\n- a list\n", "expected a Pod manifest"),
            ("kind: Deployment\n", "kind is 'Deployment'"),
            ("metadata:\n  annotations:\n    nvidia.com/numa-bind: true\n",
             "Expected `str`, got `bool` - at `$.metadata.annotations[...]`"),
        ],
    )
    def test_a_bad_pod_file_exits_2_naming_it(self, tmp_path: Path, content: str,
                                              message: str) -> None:
        pod = write(tmp_path / "pod.yaml", content)
        done = pyhami("decide", "--cluster", EXAMPLES / "lab-cluster.json", "--pod", pod)
        assert done.returncode == 2
        assert str(pod) in done.stderr and message in done.stderr
        assert "Traceback" not in done.stderr

    def test_a_missing_file_exits_2(self, tmp_path: Path) -> None:
        done = pyhami("decide", "--cluster", tmp_path / "nope.json", "--pod",
                      EXAMPLES / "binpack-pod.yaml")
        assert done.returncode == 2
        assert "nope.json: No such file or directory" in done.stderr

    def test_a_malformed_pod_is_a_decision_not_an_error(self, tmp_path: Path) -> None:
        pod = write(tmp_path / "pod.yaml", EXAMPLES.joinpath("binpack-pod.yaml").read_text()
                    .replace("nvidia.com/gpumem: 1000", "nvidia.com/gpumem: lots"))
        document = decide(EXAMPLES / "lab-cluster.json", pod)
        assert document["scheduled"] is False
        assert document["node"] is None
        assert document["reason"] == (
            "spec.containers[0].resources.limits[nvidia.com/gpumem]: 'lots' is not a quantity")

    def test_a_bad_default_policy_flag_exits_2(self) -> None:
        done = pyhami("decide", "--cluster", EXAMPLES / "lab-cluster.json", "--pod",
                      EXAMPLES / "binpack-pod.yaml", "--gpu-scheduler-policy", "fastest")
        assert done.returncode == 2
        assert "unknown or missing policy name (fastest)" in done.stderr


class TestBench:
    def test_bench_prints_one_json_line_with_the_timings(self) -> None:
        done = pyhami("bench", "decide", "--nodes", "5", "--pods", "20",
                      "--chain", "mutex,binpack,numa")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.strip().splitlines()
        assert len(lines) == 1
        result = json.loads(lines[0])
        assert result["nodes"] == 5 and result["pods"] == 20
        assert 0 < result["median_ms"] <= result["p99_ms"]
        assert result["decisions_per_s"] > 0
