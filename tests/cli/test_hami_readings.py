"""Pods written for HAMi whose figures HAMi reads otherwise than written, decided on the
article's lab cluster (GPU 0 holds two 1000 MiB tenants, GPU 1 one, GPUs 2 and 3 none)
as HAMi v2.10.0 places them: the card it chooses, and the warning ``explain`` shows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pyhami.cli import main
from pyhami.decide import decide_files
from pyhami.sandbox import DEFAULTS
from tests.paths import EXAMPLES

BINPACK = {"hami.io/gpu-scheduler-policy": "binpack"}
SHARE = "spec.containers[0].resources.limits[nvidia.com/gpumem-percentage]"


def pod_file(tmp_path: Path, limits: dict[str, int]) -> Path:
    path = tmp_path / "pod.json"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "annotations": BINPACK},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}))
    return path


@pytest.mark.parametrize(("limits", "placed", "warnings"), [
    # HAMi's scheduler clamps 150 to 100 (GenerateResourceRequests): the whole card's
    # memory, so only an idle card holds it; binpack's tie goes to the lower index. The
    # webhook's exclusive default looks for a share of exactly 100: cores stay 0.
    ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 150}, (2, 15360, 0),
     [f"{SHARE}: 150 is above 100: read as 100 (HAMi's scheduler clamps it)"]),
    # Both memory figures: gpumem wins (Fit takes Memreq when above 0). With cores
    # written, the pod shares: 1000 MiB on the busiest card.
    ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpumem-percentage": 100,
      "nvidia.com/gpucores": 30}, (0, 1000, 30), []),
    ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpumem-percentage": 100,
      "nvidia.com/gpucores": 0}, (0, 1000, 0), []),
    # Without cores, HAMi's webhook writes gpucores: 100 (defaultExclusiveCoreIfNeeded
    # judges the share of 100 before it looks at gpumem): exclusive, on an idle card.
    ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpumem-percentage": 100},
     (2, 1000, 100), []),
    # A share of 0 is ignored: the whole card, as HAMi's own case "gpu count + memory
    # percentage of 0 — treated as unset" reads it.
    ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 0}, (2, 15360, 0),
     [f"{SHARE}: 0 is not above 0: ignored, the default memory applies (as HAMi's "
      "scheduler reads it)"]),
], ids=["share-150-clamped", "both-figures-cores-30", "both-figures-cores-0",
        "both-figures-no-cores-exclusive", "share-0-ignored"])
def test_placed_on_the_card_hami_chooses(tmp_path: Path, limits: dict[str, int],
                                         placed: tuple[int, int, int],
                                         warnings: list[str]) -> None:
    """``placed``: the card's index, the MiB and the cores it is charged."""
    document: dict[str, Any] = decide_files(EXAMPLES / "lab-cluster.json",
                                            pod_file(tmp_path, limits), DEFAULTS,
                                            explain=False)
    assert document["scheduled"] and document["node"] == "gpu-node-1"
    [[card]] = document["devices"]
    assert (card["index"], card["usedmem"], card["usedcores"]) == placed
    assert document["warnings"] == warnings


def test_explain_shows_the_clamp_before_the_path(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    pod = pod_file(tmp_path, {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 150})
    assert main(["explain", str(pod), "--cluster", str(EXAMPLES / "lab-cluster.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"warning: {SHARE}: 150 is above 100: read as 100 (HAMi's scheduler " \
                       "clamps it)"
    assert lines[-1] == "-> GPU 2 on gpu-node-1"
