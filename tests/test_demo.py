"""``pyhami demo`` replays the article's lab with the article's placements."""

from __future__ import annotations

import io
import re

from rich.console import Console

from pyhami.demo import run
from tests.builders import DEFAULTS


def test_the_demo_shows_the_articles_placements() -> None:
    out = io.StringIO()
    assert run(DEFAULTS, Console(file=out, width=200, color_system=None)) == 0
    lines = out.getvalue().splitlines()

    def landed(pod: str) -> list[str]:
        return [m.group(1) for line in lines
                if (m := re.match(rf"\s+{re.escape(pod)}\s+\S+\s+-> (.*)$", line))]

    assert [landed(f"spread-{i}") for i in range(4)] == [
        [f"GPU {i} on gpu-node-1"] for i in range(4)]
    assert [landed(f"binpack-{i}") for i in range(3)] == [["GPU 0 on gpu-node-1"]] * 3
    assert landed("mutex") == ["Pending (gpu-node-1: 4/4 ExclusiveDeviceAllocateConflict)",
                               "GPU 1 on gpu-node-1"]
    assert landed("mutex-binpack") == ["GPU 2 on gpu-node-1"]
    assert landed("plain-binpack") == ["GPU 0 on gpu-node-1"]
    assert any(re.search(r"GPU 0 .*3\.302083 .*ExclusiveDeviceAllocateConflict", line)
               for line in lines)
