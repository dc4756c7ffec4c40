"""A decision's failures, worked out only when first read (``NodeFailures``): every way of
reading them gives the nodes and reasons built, built once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from common.core import NodeRefusal
from common.core.decide import NodeFailures
from common.core.reasons import FailedNode

STALE = NodeRefusal("NodeStale", "no inventory for 300s")
UNKNOWN = NodeRefusal("NoInventory", "no agent has reported this node")
BUILT: dict[str, FailedNode] = {"n1": STALE, "n2": UNKNOWN, "n3": STALE}


@pytest.mark.parametrize(("read", "expected"), [
    pytest.param(lambda failures: dict(failures.items()), BUILT, id="items"),
    pytest.param(lambda failures: list(failures.keys()), ["n1", "n2", "n3"], id="keys"),
    pytest.param(lambda failures: list(failures.values()), [STALE, UNKNOWN, STALE],
                 id="values"),
    pytest.param(list, ["n1", "n2", "n3"], id="iteration"),
    pytest.param(lambda failures: ("n2" in failures, "n9" in failures), (True, False),
                 id="membership"),
    pytest.param(lambda failures: (failures["n3"], failures.get("n9")), (STALE, None),
                 id="lookups"),
    pytest.param(dict, BUILT, id="copied"),
])
def test_every_reading_gives_what_was_built_building_it_once(
        read: Callable[[NodeFailures], Any], expected: Any) -> None:
    builds = []

    def build() -> dict[str, FailedNode]:
        builds.append(1)
        return dict(BUILT)

    failures = NodeFailures(build, len(BUILT))
    assert len(failures) == 3 and builds == []  # counted without building
    assert read(failures) == expected
    assert read(failures) == expected
    assert builds == [1]
