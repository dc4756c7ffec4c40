"""``pyhami simulate`` with groups: a distributed job's pods placed all or nothing, or one at
a time as kube-scheduler alone places them, on small traces worked out by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from common.core import Card, Node, NodePolicy, PodManifest
from common.core.groups import KUEUE_COUNT_ANNOTATION, KUEUE_GROUP_LABEL, GroupRef, GroupSource
from common.core.pod import Container, ObjectMeta, PodSpec, ResourceRequirements
from pyhami.simulate._engine import GROUP_INCOMPLETE, GROUP_NOT_FIT, simulate
from pyhami.simulate._results import GroupTally, PolicyRun
from pyhami.simulate._trace import SimPod, Trace
from tests.simulate_groups_example import write

HOUR = 3600.0


def node(name: str, cards: int) -> Node:
    return Node(name=name, cards=[Card(uuid=f"{name}-GPU-{i}", index=i, type="NVIDIA",
                                         memory=16000) for i in range(cards)])


def member(name: str, group: str | None, count: int, arrival: float, *,
           duration: float | None = 2 * HOUR, gpus: int = 1) -> SimPod:
    """A pod of ``gpus`` whole cards, in Kueue's group ``group`` of ``count`` members."""
    labels = None if group is None else {KUEUE_GROUP_LABEL: group}
    annotations = None if group is None else {KUEUE_COUNT_ANNOTATION: str(count)}
    limits: dict[str, str | int | float] = {"nvidia.com/gpu": gpus}
    manifest = PodManifest(
        metadata=ObjectMeta(name=name, namespace="lab", labels=labels,
                            annotations=annotations),
        spec=PodSpec(containers=[Container(name="main",
                                           resources=ResourceRequirements(limits=limits))]))
    ref = None if group is None else GroupRef("lab", group, GroupSource.KUEUE, count)
    return SimPod(manifest, arrival, duration, ref)


def run(pods: list[SimPod], all_or_nothing: bool, cards: int = 4) -> PolicyRun:
    """``cards`` whole cards over two nodes, binpack."""
    nodes = [node("a", cards // 2), node("b", cards - cards // 2)]
    return simulate(Trace(nodes=nodes, pods=pods), policy="binpack",
                    node_policy=NodePolicy.BINPACK, all_or_nothing=all_or_nothing)


# Two jobs of three one-card workers on four cards, their workers arriving in turn, an hour
# apart. One at a time, each job gets two cards and waits for a third that never frees:
# both hold their cards until the end (a0 5 h, b0 4 h, a1 3 h, b1 2 h: 14 GPU-hours idle).
# All or nothing, job a starts whole at 4 h; b, whole at 5 h, waits with no card until a
# leaves at 6 h, then starts whole.
INTERLEAVED = [member(f"{job}{i}", job, 3, (2 * i + offset) * HOUR)
               for i in range(3) for offset, job in enumerate("ab")]


@pytest.mark.parametrize(("all_or_nothing", "placed", "tally", "refused"), [
    pytest.param(True, 6, GroupTally("all-or-nothing", 2, 2, 0, 0, 0.0), {},
                 id="all-or-nothing-both-start"),
    pytest.param(False, 4, GroupTally("one-at-a-time", 2, 0, 2, 2, 14.0),
                 {"CardInsufficientMemory": 2}, id="one-at-a-time-both-stuck"),
])
def test_two_jobs_on_cards_that_fit_one(all_or_nothing: bool, placed: int, tally: GroupTally,
                                        refused: dict[str, int]) -> None:
    result = run(INTERLEAVED, all_or_nothing)
    assert result.groups == tally
    assert (result.placed, result.refused_by_reason) == (placed, refused)


def test_all_or_nothing_a_job_waits_holding_nothing_then_starts_whole() -> None:
    result = run(INTERLEAVED, True)
    # a's workers wait for a2 (4 h, 2 h, 0); b's for a to leave at 6 h (5 h, 3 h, 1 h).
    assert sorted(result.waits) == sorted(w * HOUR for w in (4, 2, 0, 5, 3, 1))
    # While b waits (5 h to 6 h) a holds three cards and b none: the allocation after b's
    # last arrival is a's alone.
    assert result.samples[-1].allocation == 0.75


@pytest.mark.parametrize(("pods", "all_or_nothing", "placed", "tally", "refused"), [
    pytest.param([member(f"w{i}", "big", 5, i) for i in range(5)], True, 0,
                 GroupTally("all-or-nothing", 1, 0, 1, 0, 0.0), {GROUP_NOT_FIT: 5},
                 id="too-big-all-or-nothing-holds-nothing"),
    # Four workers, an hour apart, hold a card each until the last arrival at 4 h:
    # 4 + 3 + 2 + 1 GPU-hours.
    pytest.param([member(f"w{i}", "big", 5, i * HOUR) for i in range(5)], False, 4,
                 GroupTally("one-at-a-time", 1, 0, 1, 1, 10.0), {"CardInsufficientMemory": 1},
                 id="too-big-one-at-a-time-holds-four"),
    pytest.param([member("w0", "short", 3, 0), member("w1", "short", 3, 1)], True, 0,
                 GroupTally("all-or-nothing", 1, 0, 1, 0, 0.0), {GROUP_INCOMPLETE: 2},
                 id="a-member-never-comes"),
    pytest.param([member("w0", "pair", 2, 0, gpus=2), member("solo", None, 0, 1),
                  member("w1", "pair", 2, 2, gpus=2)], True, 3,
                 GroupTally("all-or-nothing", 1, 1, 0, 0, 0.0), {},
                 id="a-waiting-member-leaves-its-cards-to-a-single-pod"),
])
def test_jobs_tallied(pods: list[SimPod], all_or_nothing: bool, placed: int,
                      tally: GroupTally, refused: dict[str, int]) -> None:
    result = run(pods, all_or_nothing, cards=5 if len(pods) == 3 else 4)
    assert result.groups == tally
    assert (result.placed, result.refused_by_reason) == (placed, refused)


def test_a_higher_priority_job_is_served_first_when_cards_free() -> None:
    # A one-card pod holds a card for an hour; then two jobs of four one-card workers each
    # arrive whole and wait. low's members arrive first, high's have the higher priority:
    # when the card frees, high starts and low waits.
    def prioritised(pod: SimPod, priority: int) -> SimPod:
        spec = pod.manifest.spec
        manifest = PodManifest(metadata=pod.manifest.metadata,
                               spec=PodSpec(containers=spec.containers, priority=priority))
        return SimPod(manifest, pod.arrival, pod.duration, pod.group)

    pods = [member("holder", None, 0, 0, duration=HOUR)]
    pods += [prioritised(member(f"low{i}", "low", 4, 1 + i), 0) for i in range(4)]
    pods += [prioritised(member(f"high{i}", "high", 4, 10 + i), 100) for i in range(4)]
    result = run(pods, True)
    assert (result.groups.started, result.groups.waiting) == (2, 0)
    # high starts at 1 h (its first member waited from 10 s); low after high's 2 h, at
    # 3 h (its first member waited from 1 s).
    assert max(result.waits) == 3 * HOUR - 1
    assert sorted(result.waits)[4:] == [HOUR - 10, 3 * HOUR - 4, 3 * HOUR - 3,
                                        3 * HOUR - 2, 3 * HOUR - 1]


def test_inflated_repeats_are_separate_jobs() -> None:
    pods = [member(f"w{i}", "job", 2, i, duration=None) for i in range(2)]
    result = simulate(Trace(nodes=[node("a", 4)], pods=pods), policy="binpack",
                      node_policy=NodePolicy.BINPACK, inflate=1.0)
    assert (result.groups.jobs, result.groups.started) == (2, 2)


# The command, end to end.

def pyhami(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyhami.cli", "simulate", *map(str, args)],
                          capture_output=True, text=True, timeout=60, check=False)


def pod_entry(name: str, arrival: float, labels: dict[str, str] | None = None,
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "lab"}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return {"arrival": arrival, "duration": 7200, "pod": {
        "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}


def kueue(group: str, count: str) -> tuple[dict[str, str], dict[str, str]]:
    return {KUEUE_GROUP_LABEL: group}, {KUEUE_COUNT_ANNOTATION: count}


def write_files(folder: Path, pods: list[dict[str, Any]]) -> list[str]:
    cards = [{"uuid": f"GPU-{i}", "index": i, "type": "NVIDIA", "memory": 16000}
             for i in range(4)]
    (folder / "cluster.json").write_text(json.dumps({"nodes": [{"name": "a", "devices": cards}]}))
    (folder / "workload.json").write_text(json.dumps({"pods": pods}))
    return ["--cluster", str(folder / "cluster.json"), "--workload", str(folder / "workload.json")]


def interleaved_entries() -> list[dict[str, Any]]:
    return [pod_entry(f"{job}{i}", (2 * i + offset) * HOUR, *kueue(job, "3"))
            for i in range(3) for offset, job in enumerate("ab")]


@pytest.mark.parametrize(("flags", "groups", "placed"), [
    pytest.param([], {"placement": "all-or-nothing", "jobs": 2, "started": 2, "waiting": 0,
                      "holding_cards": 0, "idle_gpu_hours": 0.0}, 6, id="all-or-nothing"),
    pytest.param(["--one-at-a-time"], {"placement": "one-at-a-time", "jobs": 2, "started": 0,
                                       "waiting": 2, "holding_cards": 2,
                                       "idle_gpu_hours": 14.0}, 4, id="one-at-a-time"),
])
def test_the_command_reports_jobs(tmp_path: Path, flags: list[str], groups: dict[str, Any],
                                  placed: int) -> None:
    files = write_files(tmp_path, interleaved_entries())
    done = pyhami(*files, "--policy", "binpack", "-o", "json", *flags)
    assert (done.returncode, done.stderr) == (0, "")
    (policy,) = json.loads(done.stdout)["policies"]
    assert (policy["groups"], policy["placed"]) == (groups, placed)
    table = pyhami(*files, "--policy", "binpack", *flags)
    lines = table.stdout.splitlines()
    assert lines[0] == "1 nodes, 4 cards; 6 pods (2 groups)"
    assert lines[1].split()[-9:] == ["groups", "placed", "jobs", "jobs", "started", "jobs",
                                     "waiting", "idle", "GPU-hours"]
    row = lines[2].split()
    assert row[-4:] == [str(groups["jobs"]), str(groups["started"]), str(groups["waiting"]),
                        f"{groups['idle_gpu_hours']:.1f}"]


@pytest.mark.parametrize(("pods", "error"), [
    pytest.param([pod_entry("w0", 0, *kueue("job", "0"))],
                 f"$.pods[0].pod: lab/w0: metadata.annotations[{KUEUE_COUNT_ANNOTATION}]: '0' "
                 "is not a member count: a whole number from 1 to 1024", id="count-0"),
    pytest.param([pod_entry("w0", 0, {KUEUE_GROUP_LABEL: "job"})],
                 f"$.pods[0].pod: lab/w0: metadata.annotations[{KUEUE_COUNT_ANNOTATION}] is "
                 "missing: Kueue's group 'job' needs its member count on every member",
                 id="count-missing"),
    pytest.param([pod_entry("w0", 0, *kueue("job", "2")), pod_entry("w1", 0, *kueue("job", "3"))],
                 f"$.pods[1].pod: lab/w1: metadata.annotations[{KUEUE_COUNT_ANNOTATION}]: 3 "
                 "members, but lab/w0 of the same group job says 2", id="counts-disagree"),
    pytest.param([pod_entry(f"w{i}", 0, *kueue("job", "2")) for i in range(3)],
                 f"$.pods[2].pod: lab/w2: metadata.annotations[{KUEUE_COUNT_ANNOTATION}]: group "
                 "job counts 2 members, and this is member 3", id="more-members-than-count"),
    pytest.param([pod_entry("w0", 0, {"scheduling.x-k8s.io/pod-group": "job"})],
                 "$.pods[0].pod: lab/w0: metadata.labels[scheduling.x-k8s.io/pod-group]: a "
                 f"workload file declares groups with Kueue's label {KUEUE_GROUP_LABEL} and "
                 f"annotation {KUEUE_COUNT_ANNOTATION}, which carry the member count on the pod",
                 id="coscheduling-has-no-count-here"),
])
def test_a_bad_group_declaration_is_refused_in_one_line(
        tmp_path: Path, pods: list[dict[str, Any]], error: str) -> None:
    done = pyhami(*write_files(tmp_path, pods), "--policy", "binpack")
    assert done.returncode == 2
    assert done.stderr == f"pyhami simulate: {tmp_path / 'workload.json'}: {error}\n"
    assert done.stdout == ""


def test_the_shipped_group_example_is_what_its_generator_writes(tmp_path: Path) -> None:
    shipped = Path(__file__).parents[2] / "examples" / "simulate" / "groups"
    write(tmp_path)
    for name in ("cluster.json", "workload.json"):
        assert (tmp_path / name).read_text() == (shipped / name).read_text(), name
    pods = json.loads((shipped / "workload.json").read_text())["pods"]
    grouped = [p for p in pods if KUEUE_GROUP_LABEL in p["pod"]["metadata"].get("labels", {})]
    assert len(grouped) / len(pods) == pytest.approx(0.2, abs=0.01)
