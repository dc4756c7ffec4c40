"""``pyhami decide`` as a user runs it, good input and bad."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.files import InputFileError
from pyhami.cli import main
from pyhami.decide import decide_files, decide_several
from pyhami.sandbox import DEFAULTS
from tests.builders import gpu_limits
from tests.paths import EXAMPLES
from tests.strategies import json_floats, json_junk


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


class TestMigExample:
    def test_a_mig_pod_gets_the_smallest_profile_at_the_highest_free_slice(self) -> None:
        document = decide(EXAMPLES / "mig-cluster.json", EXAMPLES / "mig-pod.yaml")
        assert document["devices"] == [[{
            "uuid": "GPU-gpu-a100-0", "index": 0, "type": "NVIDIA", "usedmem": 9728,
            "usedcores": 15,
            "mig": {"profile": "1g.10gb", "placement": {"start": 6, "size": 1}}}]]
        assert json.loads(document["annotations"]["hami.io/vgpu-mig-allocations"]) == [{
            "containerIndex": 0, "deviceIndex": 0, "gpuUUID": "GPU-gpu-a100-0",
            "profile": "1g.10gb", "placement": {"start": 6, "size": 1}}]


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
            "warnings": [],
            "message": "asked for 3 cards with 1000 MiB each; gpu-node-1: "
                       "2/4 AllocatedCardsInsufficientRequest (2 cards fit, 3 needed), "
                       "2/4 ExclusiveDeviceAllocateConflict (in use)",
        }


class TestHamiReadings:
    """Issue 46's two readings through the command a user runs."""

    @staticmethod
    def _one_card(cores: int, count: int, processes: int, held_cores: int) -> dict[str, Any]:
        return {"nodes": [{"name": "node-a", "devices": [{
                    "uuid": "GPU-0", "index": 0, "type": "NVIDIA-Tesla T4", "memory": 15360,
                    "cores": cores, "count": count, "processes": processes}]}],
                "pods": [{"namespace": "default", "name": "tenant", "node": "node-a",
                          "annotations": {"hami.io/vgpu-devices-allocated":
                                          f"GPU-0,NVIDIA,1000,{held_cores}:;"}}]}

    @pytest.mark.parametrize(("cores", "placed", "reason"), [
        # Registered with 200 cores (deviceCoreScaling 2): shared, as HAMi's Fit has it.
        (200, True, None),
        (100, False, "1/1 ExclusiveDeviceAllocateConflict"),
    ])
    def test_a_100_core_request_beside_a_50_core_tenant(
            self, tmp_path: Path, cores: int, placed: bool, reason: str | None) -> None:
        cluster = write(tmp_path / "cluster.json",
                        self._one_card(cores, count=10, processes=0, held_cores=50 if
                                       cores == 200 else 0))
        pod = write(tmp_path / "pod.json", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "whole"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": gpu_limits(
                1000, cores=100)}}]}})
        document = decide(cluster, pod)
        assert document["scheduled"] is placed
        if placed:
            assert document["devices"][0][0]["usedcores"] == 100
        else:
            assert document["failed_nodes"] == {"node-a": reason}

    def test_a_pod_running_four_processes_leaves_three_slots(self, tmp_path: Path) -> None:
        # The agent saw four processes of the one tenant on the card: one tenant seen.
        cluster = write(tmp_path / "cluster.json",
                        self._one_card(100, count=4, processes=1, held_cores=0))
        pods = []
        for number in range(4):
            pods.append(write(tmp_path / f"pod-{number}.json", {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{number}"},
                "spec": {"containers": [{"name": "c", "resources": {"limits": gpu_limits(
                    1000, cores=10)}}]}}))
        document = decide_several(cluster, pods, DEFAULTS, explain=False)
        placed = [entry["scheduled"] for entry in document["pods"]]
        assert placed == [True, True, True, False]
        assert document["pods"][3]["failed_nodes"] == {
            "node-a": "1/1 CardTimeSlicingExhausted"}


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
            ({"nodes": [], "quotas": [
                {"metadata": {"name": "q", "namespace": "team-a"}, "spec": {"hard": {}}},
                {"metadata": {"name": "gpu-quota", "namespace": "team-a"},
                 "spec": {"hard": {"limits.nvidia.com/gpumem": "1.5"}}}]},
             "quotas[1]: ResourceQuota team-a/gpu-quota: "
             "spec.hard[limits.nvidia.com/gpumem]: '1.5' is not an integer"),
            ({"nodes": [], "quotas": {"kind": "List", "items": [
                {"metadata": {"name": "gpu-quota", "namespace": "team-a"},
                 "spec": {"hard": {"limits.nvidia.com/gpucores": 100},
                          "scopes": ["Terminating", "NotTerminating"]}}]}},
             "quotas.items[0]: ResourceQuota team-a/gpu-quota: scopes Terminating and "
             "NotTerminating exclude each other"),
            ({"nodes": [], "quotas": [
                {"metadata": {"name": "gpu-quota", "namespace": "team-a"},
                 "spec": {"hard": {"limits.nvidia.com/gpumem": 1000}}},
                {"metadata": {"name": "gpu-quota", "namespace": "team-a"},
                 "spec": {"hard": {"limits.nvidia.com/gpumem": 2000}}}]},
             "quotas[1]: ResourceQuota team-a/gpu-quota is listed twice (first at quotas[0])"),
            ({"nodes": [], "quotas": [{"kind": "Pod", "metadata": {"name": "p"}}]},
             "quotas[0]: kind is 'Pod', expected 'ResourceQuota'"),
            ({"nodes": [], "quotas": [{"metadata": {"name": "q"}, "spec": {
                "hard": {"limits.nvidia.com/gpumem": True}}}]},
             "Expected `int | float | str`, got `bool` - at `$.quotas[0].spec.hard[...]`"),
            ({"nodes": [], "pods": [{"namespace": "d", "name": "p", "node": "x",
                                     "priority_class": "high"}]},
             "unknown field `priority_class`"),
        ],
        ids=["not-json", "a-card-without-type", "negative-memory", "unknown-node-field",
             "node-twice", "pod-on-unknown-node", "bad-allocation", "quota-not-a-whole-number",
             "quota-in-a-list-with-exclusive-scopes", "quota-twice", "not-a-quota",
             "quota-limit-a-boolean", "pod-record-unknown-field"],
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
            "spec.containers[0].resources.limits[nvidia.com/gpumem]: 'lots' is not a quantity; "
            "HAMi would drop container app's GPU request without a word")

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


# ResourceQuota in the cluster file ------------------------------------------------------

MEMORY = "limits.nvidia.com/gpumem"
CORES = "limits.nvidia.com/gpucores"


def quota(name: str, hard: dict[str, int | str], *, namespace: str = "team-a",
          **spec: object) -> dict[str, object]:
    """A ResourceQuota as ``kubectl get resourcequota NAME -o json`` prints it."""
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "812",
                         "uid": "6f1c0d1e-0000-4000-8000-000000000001"},
            "spec": {"hard": hard, **spec},
            "status": {"hard": hard, "used": {key: "0" for key in hard}}}


def held(name: str, card: int, memory: int, cores: int = 0, **fields: object,
         ) -> dict[str, object]:
    """A team-a pod already holding ``memory`` MiB and ``cores`` % of GPU ``card``."""
    return {"namespace": "team-a", "name": name, "node": "gpu-node-1",
            "annotations": {"hami.io/vgpu-devices-allocated":
                            f"GPU-{card},NVIDIA,{memory},{cores}:;"}, **fields}


def cluster(cards: list[int], pods: list[dict[str, object]],
            quotas: object) -> dict[str, object]:
    """One node, gpu-node-1, whose GPU i has ``cards[i]`` MiB."""
    return {"nodes": [{"name": "gpu-node-1", "devices": [
        {"uuid": f"GPU-{i}", "index": i, "type": "NVIDIA-A100", "memory": memory}
        for i, memory in enumerate(cards)]}], "pods": pods, "quotas": quotas}


def gpu(memory: int | None = None, *, percent: int | None = None, cards: int = 1,
        cores: int | None = None, requests: dict[str, str] | None = None,
        ) -> dict[str, object]:
    resources: dict[str, object] = {
        "limits": gpu_limits(memory, cards=cards, percent=percent, cores=cores)}
    if requests is not None:
        resources["requests"] = requests
    return {"resources": resources}


def pod(*containers: dict[str, object], init: list[dict[str, object]] | None = None,
        namespace: str = "team-a", **spec: object) -> dict[str, object]:
    named = [{"name": f"c{i}", **c} for i, c in enumerate(containers)]
    body: dict[str, object] = {"containers": named, **spec}
    if init:
        body["initContainers"] = [{"name": f"init{i}", **c} for i, c in enumerate(init)]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "new", "namespace": namespace}, "spec": body}


def sentence(used: int, limit: int, asked: int, name: str = "gpu-quota",
             resource: str = "nvidia.com/gpumem") -> str:
    unit = " MiB" if resource == "nvidia.com/gpumem" else ""
    return (f"team-a would use {used} of {limit}{unit} {resource} under ResourceQuota "
            f"{name} (asked {asked})")


TWO_CARDS = [16384, 16384]
ONE_CARD = [16384]
HIGH_ONLY = {"matchExpressions": [
    {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}

class QuotaCase(NamedTuple):
    cards: list[int]
    pods: list[dict[str, object]]
    """Pods holding cards."""
    quotas: object
    new: dict[str, object]
    """The pod decided."""
    outcome: tuple[int | tuple[int, ...], int] | str
    """Where it is placed and what it is charged (the cards' indexes, MiB), else the
    refusal's sentence."""


def case(cards: list[int], pods: list[dict[str, object]], quotas: object,
         new: dict[str, object], outcome: tuple[int | tuple[int, ...], int] | str, *,
         id: str) -> Any:
    return pytest.param(QuotaCase(cards, pods, quotas, new, outcome), id=id)


QUOTA_CASES = [
    case(TWO_CARDS, [held("old", 0, 12384)], [quota("gpu-quota", {MEMORY: 16384})],
                 pod(gpu(4000)), (1, 4000), id="fits-exactly-12384+4000=16384"),
    case(TWO_CARDS, [held("old", 0, 12384)], [quota("gpu-quota", {MEMORY: 16384})],
                 pod(gpu(4001)), sentence(16385, 16384, 4001), id="one-mib-over"),
    # The quota in kubectl's List, as `kubectl get resourcequota -A -o json` prints it.
    case(TWO_CARDS, [held("old", 0, 12384)],
                 {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
                  "items": [quota("gpu-quota", {MEMORY: "16Ki"})]},
                 pod(gpu(4001)), sentence(16385, 16384, 4001), id="kubectl-list-16Ki"),
    # 25% of a 16384 MiB card is 4096 MiB.
    case(ONE_CARD, [], [quota("gpu-quota", {MEMORY: 4096})], pod(gpu(percent=25)),
                 (0, 4096), id="percentage-fits"),
    case(ONE_CARD, [], [quota("gpu-quota", {MEMORY: 4095})], pod(gpu(percent=25)),
                 sentence(4096, 4095, 4096), id="percentage-one-mib-over"),
    # 25% is 4096 MiB on GPU 0, past the quota, and 2048 on GPU 1, within it.
    case([16384, 8192], [], [quota("gpu-quota", {MEMORY: 3000})],
                 pod(gpu(percent=25)), (1, 2048), id="percentage-on-the-chosen-card"),
    # Two cards of 25%: 2 x 2048 on the 8192 MiB cards, within 5000; 2 x 4096 on the
    # 16384 one would not be.
    case([16384, 8192, 8192], [], [quota("gpu-quota", {MEMORY: 5000})],
                 pod(gpu(percent=25, cards=2)), ((1, 2), 4096),
                 id="percentage-two-cards-on-the-smaller"),
    # The per-card rule: a container of several cards is charged, on each card, as if all
    # its cards were that one (GPU 0: 2 x 4096 = 8192), so a set that passes never goes
    # past the quota. GPU 0 and GPU 1 together would cost 4096 + 2048 = 6144, no more than
    # the quota, yet GPU 0 is refused, and the sentence gives the per-card figure.
    case([16384, 8192], [], [quota("gpu-quota", {MEMORY: 6144})],
                 pod(gpu(percent=25, cards=2)), sentence(8192, 6144, 8192),
                 id="percentage-two-cards-judged-per-card"),
    case([16384, 8192], [], [quota("gpu-quota", {MEMORY: 8192})],
                 pod(gpu(percent=25, cards=2)), ((0, 1), 6144),
                 id="percentage-two-cards-charged-what-they-cost"),
    # Two app containers on the one card: 3000 + 2000.
    case(ONE_CARD, [], [quota("gpu-quota", {MEMORY: 5000})],
                 pod(gpu(3000), gpu(2000)), (0, 5000), id="two-containers-summed-fit"),
    case(ONE_CARD, [], [quota("gpu-quota", {MEMORY: 4999})],
                 pod(gpu(3000), gpu(2000)), sentence(5000, 4999, 5000),
                 id="two-containers-summed-over"),
    # An init container runs before them: the card is charged max(6000, 3000 + 2000).
    case(ONE_CARD, [], [quota("gpu-quota", {MEMORY: 6000})],
                 pod(gpu(3000), gpu(2000), init=[gpu(6000)]), (0, 6000),
                 id="init-at-peak-fits"),
    case(ONE_CARD, [], [quota("gpu-quota", {MEMORY: 5999})],
                 pod(gpu(3000), gpu(2000), init=[gpu(6000)]), sentence(6000, 5999, 6000),
                 id="init-at-peak-over"),
    # max(4000, 3000 + 2000) = 5000.
    case(ONE_CARD, [], [quota("gpu-quota", {MEMORY: 5000})],
                 pod(gpu(3000), gpu(2000), init=[gpu(4000)]), (0, 5000),
                 id="apps-above-init-fit"),
    case(TWO_CARDS, [], [quota("gpu-quota", {CORES: 100})],
                 pod(gpu(1000, cores=60)), (0, 1000), id="cores-first-pod-of-60-fits"),
    case(TWO_CARDS, [held("old", 0, 1000, 60)], [quota("gpu-quota", {CORES: 100})],
                 pod(gpu(1000, cores=60)),
                 sentence(120, 100, 60, resource="nvidia.com/gpucores"),
                 id="cores-second-pod-of-60-over-100"),
    case(TWO_CARDS, [held("old", 0, 4000)],
                 [quota("big", {MEMORY: 16384}), quota("small", {MEMORY: 8000})],
                 pod(gpu(4000)), (1, 4000), id="two-quotas-fit-the-smaller"),
    case(TWO_CARDS, [held("old", 0, 4000)],
                 [quota("big", {MEMORY: 16384}), quota("small", {MEMORY: 8000})],
                 pod(gpu(4001)), sentence(8001, 8000, 4001, "small"),
                 id="two-quotas-the-smaller-refuses"),
    # The held pod of class high is charged to high-only; a pod of no class is not.
    case(TWO_CARDS, [held("old", 0, 4000, priority_class_name="high")],
                 [quota("high-only", {MEMORY: 4000}, scopeSelector=HIGH_ONLY)],
                 pod(gpu(1000), priorityClassName="high"),
                 sentence(5000, 4000, 1000, "high-only"), id="priority-class-in-scope"),
    case(TWO_CARDS, [held("old", 0, 4000, priority_class_name="high")],
                 [quota("high-only", {MEMORY: 4000}, scopeSelector=HIGH_ONLY)],
                 pod(gpu(1000)), (1, 1000), id="priority-class-out-of-scope"),
    case(TWO_CARDS, [held("old", 0, 2000, active_deadline_seconds=600)],
                 [quota("jobs", {MEMORY: 2000}, scopes=["Terminating"])],
                 pod(gpu(1000), activeDeadlineSeconds=60),
                 sentence(3000, 2000, 1000, "jobs"), id="terminating-in-scope"),
    case(TWO_CARDS, [held("old", 0, 2000, active_deadline_seconds=600)],
                 [quota("jobs", {MEMORY: 2000}, scopes=["Terminating"])],
                 pod(gpu(1000)), (1, 1000), id="not-terminating-out-of-scope"),
    case(TWO_CARDS, [held("old", 0, 4000, best_effort=True)],
                 [quota("best-effort", {MEMORY: 4000}, scopes=["BestEffort"])],
                 pod(gpu(1000)), sentence(5000, 4000, 1000, "best-effort"),
                 id="best-effort-in-scope"),
    case(TWO_CARDS, [held("old", 0, 4000, best_effort=True)],
                 [quota("best-effort", {MEMORY: 4000}, scopes=["BestEffort"])],
                 pod(gpu(1000, requests={"cpu": "500m"})), (1, 1000),
                 id="a-cpu-request-is-out-of-best-effort-scope"),
    # A hard 0 blocks team-a, not team-b.
    case(TWO_CARDS, [], [quota("gpu-quota", {MEMORY: 0})],
                 pod(gpu(1000), namespace="team-b"), (0, 1000), id="another-namespace"),
    case(TWO_CARDS, [], [quota("gpu-quota", {MEMORY: 0})],
                 pod(gpu(1000)), sentence(1000, 0, 1000), id="a-hard-zero"),
]


def decide_quietly(capsys: pytest.CaptureFixture[str], tmp_path: Path, cluster_file: object,
                   pod_file: object, command: str = "decide", *extra: str) -> str:
    """``pyhami decide`` (or ``explain``) run in this process; its stdout."""
    cluster_path = write(tmp_path / "cluster.json", cluster_file)
    pod_path = write(tmp_path / "pod.json", pod_file)
    argv = (["decide", "--cluster", str(cluster_path), "--pod", str(pod_path)]
            if command == "decide" else ["explain", str(pod_path), "--cluster",
                                         str(cluster_path)])
    assert main([*argv, *extra]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


def charged(devices: list[list[dict[str, Any]]], init: int) -> int:
    """What a decision's cards charge its namespace: per card, the init containers at
    their peak against the app containers summed."""
    peak: dict[str, int] = {}
    summed: dict[str, int] = {}
    for position, cards in enumerate(devices):
        for card in cards:
            if position < init:
                peak[card["uuid"]] = max(peak.get(card["uuid"], 0), card["usedmem"])
            else:
                summed[card["uuid"]] = summed.get(card["uuid"], 0) + card["usedmem"]
    return sum(max(peak.get(uuid, 0), summed.get(uuid, 0)) for uuid in {*peak, *summed})


class TestQuotas:
    @pytest.mark.parametrize("case", QUOTA_CASES)
    def test_decide_under_quota(self, capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                case: QuotaCase) -> None:
        outcome = case.outcome
        document = json.loads(decide_quietly(
            capsys, tmp_path, cluster(case.cards, case.pods, case.quotas), case.new))
        if isinstance(outcome, str):
            assert document["scheduled"] is False
            assert document["message"].startswith(f"{outcome}; asked for ")
            assert f"ResourceQuotaNotFit ({outcome})" in document["failed_nodes"]["gpu-node-1"]
            return
        where, memory = outcome
        assert document["scheduled"] is True, document.get("message")
        assert document["node"] == "gpu-node-1"
        indexes = {c["index"] for cards_of in document["devices"] for c in cards_of}
        assert indexes == ({where} if isinstance(where, int) else set(where))
        spec = case.new["spec"]
        assert isinstance(spec, dict)
        assert charged(document["devices"], len(spec.get("initContainers", ()))) == memory


    def test_the_whole_document_of_a_refusal(self, capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
        document = json.loads(decide_quietly(
            capsys, tmp_path,
            cluster(TWO_CARDS, [held("old", 0, 12384)], [quota("gpu-quota", {MEMORY: 16384})]),
            pod(gpu(4001))))
        refusal = sentence(16385, 16384, 4001)
        assert document == {
            "scheduled": False, "gpu": True, "node": None, "devices": [], "annotations": {},
            "failed_nodes": {"gpu-node-1": f"2/2 ResourceQuotaNotFit ({refusal})"},
            "ignored_policies": [],
            "warnings": [],
            "message": f"{refusal}; asked for 1 card with 4001 MiB; gpu-node-1: "
                       "2/2 ResourceQuotaNotFit",
        }

    def test_explain_shows_resource_quota_not_fit_per_card(
            self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        # 25% is 4096 MiB on GPU 0, past team-a's 3000, and 2048 on GPU 1.
        out = decide_quietly(capsys, tmp_path,
                             cluster([16384, 8192], [], [quota("gpu-quota", {MEMORY: 3000})]),
                             pod(gpu(percent=25)), "explain")
        rows = [line.split() for line in out.splitlines()]
        assert rows[0] == ["card", "tenants", "score", "filtered", "by", "rank"]
        assert rows[1][:2] == ["GPU", "0"] and rows[1][-2:] == ["ResourceQuotaNotFit", "-"]
        assert rows[2][:2] == ["GPU", "1"] and rows[2][-4:] == ["-", "1", "<-", "chosen"]
        assert rows[3] == ["->", "GPU", "1", "on", "gpu-node-1"]

    def test_explain_prints_the_sentence_of_a_refusal(
            self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        out = decide_quietly(capsys, tmp_path,
                             cluster([16384, 8192], [], [quota("gpu-quota", {MEMORY: 2047})]),
                             pod(gpu(percent=25)), "explain")
        lines = out.splitlines()
        assert [line.split()[-2] for line in lines[1:3]] == ["ResourceQuotaNotFit"] * 2
        # The smallest card the quota refused prices the percentage: 25% of 8192.
        assert lines[3] == (f"-> Pending: {sentence(2048, 2047, 2048)}; asked for 1 card "
                            "with 25% memory; gpu-node-1: 2/2 ResourceQuotaNotFit")


# Any quota entry: applied, or one error naming the file --------------------------------

_finite = json_floats
_junk = json_junk(max_leaves=6)


def _mostly(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(*[strategy] * 6, _junk)


_quantities = st.one_of(
    st.integers(0, 20000), st.integers(-(2**70), 2**70), _finite, st.text(max_size=8),
    st.sampled_from(["4k", "16Gi", "1.5", "-1", "1e10000000", "nan", "", "100m", "1e3"]),
    st.integers(0, 20000).map(str))
_scope_names = st.sampled_from(["Terminating", "NotTerminating", "BestEffort",
                                "NotBestEffort", "PriorityClass", "CrossNamespacePodAffinity",
                                ""])
_expressions = st.fixed_dictionaries(
    {"scopeName": _mostly(_scope_names),
     "operator": _mostly(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "="]))},
    optional={"values": _mostly(st.lists(st.sampled_from(["high", "low", ""]), max_size=3))})
_quota_entries = st.fixed_dictionaries(
    {"metadata": _mostly(st.fixed_dictionaries(
        {"name": _mostly(st.sampled_from(["gpu-quota", "small", "", "Bad_Name", "a" * 300]))},
        optional={"namespace": _mostly(st.sampled_from(["team-a", "team-b", "", "a.b"]))}))},
    optional={
        "kind": st.sampled_from(["ResourceQuota", "ResourceQuota", "Pod"]),
        "spec": _mostly(st.fixed_dictionaries({}, optional={
            "hard": _mostly(st.dictionaries(
                st.sampled_from([MEMORY, CORES, "pods", "requests.nvidia.com/gpumem"]),
                _quantities, max_size=3)),
            "scopes": _mostly(st.lists(_scope_names, max_size=3)),
            "scopeSelector": _mostly(st.fixed_dictionaries({}, optional={
                "matchExpressions": _mostly(st.lists(_expressions, max_size=3))}))})),
        "status": _junk})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=st.one_of(st.lists(_quota_entries, max_size=4),
                         st.fixed_dictionaries({"kind": st.just("List"),
                                                "items": st.lists(_quota_entries, max_size=4)}),
                         _junk))
@pytest.mark.slow  # long fuzzing
def test_any_quotas_are_applied_or_refused_in_one_line_naming_the_file(entries: Any) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = write(Path(folder) / "cluster.json", cluster(TWO_CARDS, [], entries))
        pod_path = write(Path(folder) / "pod.json", pod(gpu(1000)))
        try:
            document = decide_files(path, pod_path, DEFAULTS, explain=False)
        except InputFileError as error:
            message = str(error)
            assert message.startswith(f"{path}: ")
            assert "\n" not in message
            assert "quotas" in message
            return
        assert document["scheduled"] in (True, False)
        if not document["scheduled"]:
            assert "ResourceQuotaNotFit" in document["message"]
