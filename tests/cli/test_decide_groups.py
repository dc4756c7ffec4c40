"""``pyhami decide`` given several pods: decided in order, a group's members together, all
placed or none, the group's sentence when it does not fit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from common.core.groups import COSCHEDULING_GROUP_LABEL, KUEUE_COUNT_ANNOTATION, KUEUE_GROUP_LABEL
from pyhami.decide import decide_several
from pyhami.sandbox import DEFAULTS


def cluster(folder: Path) -> Path:
    """One node, four cards of 16000 MiB."""
    path = folder / "cluster.json"
    path.write_text(json.dumps({"nodes": [{"name": "a", "devices": [
        {"uuid": f"GPU-{i}", "index": i, "type": "NVIDIA", "memory": 16000}
        for i in range(4)]}]}))
    return path


def pod(folder: Path, name: str, cards: int = 1, group: str | None = None, *,
        count: str | None = None, label: str = KUEUE_GROUP_LABEL) -> Path:
    metadata: dict[str, Any] = {"name": name, "namespace": "lab"}
    if group is not None:
        metadata["labels"] = {label: group}
    if count is not None:
        metadata["annotations"] = {KUEUE_COUNT_ANNOTATION: count}
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
                                "spec": {"containers": [{"name": "c", "resources": {
                                    "limits": {"nvidia.com/gpu": cards}}}]}}))
    return path


def members(folder: Path, group: str, size: int, cards: int, count: int | None = None,
            ) -> list[Path]:
    """``size`` pods of ``cards`` whole cards in Kueue's group ``group`` (count: ``size``
    unless given)."""
    return [pod(folder, f"{group}-{i}", cards, group, count=str(count or size))
            for i in range(size)]


def scheduled(document: dict[str, Any]) -> dict[str, bool]:
    return {entry["pod"]: entry["scheduled"] for entry in document["pods"]}


def test_a_group_that_fits_is_placed_whole(tmp_path: Path) -> None:
    paths = [*members(tmp_path, "train-a", 3, 1), pod(tmp_path, "solo")]
    document = decide_several(cluster(tmp_path), paths, DEFAULTS, explain=False)
    assert document["groups"] == [{"group": "lab/train-a", "source": "kueue",
                                   "members": ["lab/train-a-0", "lab/train-a-1",
                                               "lab/train-a-2"],
                                   "placed": True, "fitting": 3, "message": None}]
    assert scheduled(document) == dict.fromkeys(
        ["lab/train-a-0", "lab/train-a-1", "lab/train-a-2", "lab/solo"], True)
    # Each saw the cards the ones before it took: four pods, four different cards.
    cards = {entry["devices"][0][0]["index"] for entry in document["pods"]}
    assert cards == {0, 1, 2, 3}
    assert [entry["group"] for entry in document["pods"]] == ["lab/train-a"] * 3 + [None]


@pytest.mark.parametrize(("paths", "message"), [
    pytest.param(lambda folder: members(folder, "train-a", 3, 2),
                 "group train-a: 2 of 3 members fit; train-a-2: ", id="does-not-fit"),
    pytest.param(lambda folder: members(folder, "train-a", 2, 1, count=4),
                 "group train-a: 2 of 4 members given: a group is placed whole, so every "
                 "member's manifest is needed; no member is placed", id="members-missing"),
    pytest.param(lambda folder: [pod(folder, "w0", 1, "train-a", count="2"),
                                 pod(folder, "w1", 1, "train-a", count="3")],
                 "group train-a: its members disagree on the member count (2, 3): no member "
                 "is placed", id="counts-disagree"),
])
def test_a_group_that_cannot_be_placed_holds_no_card(
        tmp_path: Path, paths: Any, message: str) -> None:
    # A one-card pod after the group: every card the group would have held is free for it,
    # and it takes card 0.
    given = [*paths(tmp_path), pod(tmp_path, "after")]
    document = decide_several(cluster(tmp_path), given, DEFAULTS, explain=False)
    (group,) = document["groups"]
    assert group["placed"] is False
    assert group["message"].startswith(message)
    for entry in document["pods"][:-1]:
        assert (entry["scheduled"], entry["node"], entry["message"]) == (False, None,
                                                                         group["message"])
    assert document["pods"][-1]["devices"][0][0]["index"] == 0


def test_the_coscheduling_label_groups_the_pods_given(tmp_path: Path) -> None:
    paths = [pod(tmp_path, f"w{i}", 2, "job", label=COSCHEDULING_GROUP_LABEL)
             for i in range(2)]
    document = decide_several(cluster(tmp_path), paths, DEFAULTS, explain=False)
    assert [(g["source"], g["placed"]) for g in document["groups"]] == [("coscheduling", True)]


def test_a_bad_declaration_is_that_pods_refusal(tmp_path: Path) -> None:
    paths = [pod(tmp_path, "w0", 1, "job", count="0"), pod(tmp_path, "solo")]
    document = decide_several(cluster(tmp_path), paths, DEFAULTS, explain=False)
    bad, solo = document["pods"]
    assert bad["reason"] == (f"metadata.annotations[{KUEUE_COUNT_ANNOTATION}]: '0' is not a "
                             "member count: a whole number from 1 to 1024")
    assert (solo["scheduled"], document["groups"]) == (True, [])


def pyhami(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyhami.cli", "decide", *map(str, args)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_command_with_several_pods(tmp_path: Path) -> None:
    paths = members(tmp_path, "train-a", 3, 2)
    flags = [part for path in paths for part in ("--pod", path)]
    done = pyhami("--cluster", cluster(tmp_path), *flags, "-o", "table")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("group train-a: 2 of 3 members fit; train-a-2: ")
    assert lines[1:3] == ["", "lab/train-a-0"]
    document = json.loads(pyhami("--cluster", cluster(tmp_path), *flags).stdout)
    assert [entry["scheduled"] for entry in document["pods"]] == [False] * 3
