"""A decision's failures, worked out only when first read (``NodeFailures``): every way of
reading them gives the nodes and reasons built, built once."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from common.core import NodeRefusal
from common.core.decide import NodeFailures
from common.core.reasons import FailedNode
from tests.builders import fleet_of, hold, manifest, node, run

decide_module = sys.modules["common.core.decide"]  # the package exports decide, the function

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


@pytest.mark.parametrize("nodes", [3, 40], ids=["few", "forty"])
def test_the_reasons_are_the_same_grouped_by_dict_or_by_numpy(
        nodes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Nodes failing in a few distinct ways: too few cards, cards too small, cards full.
    fleet = fleet_of(*(node(f"n{i:02d}", cards=1 + i % 3, memory=4000 + 4000 * (i % 2))
                       for i in range(nodes)))
    for i in range(0, nodes, 4):
        hold(fleet, f"default/h{i}", f"n{i:02d}", f"GPU-n{i:02d}-0", memory=4000)
    pod = manifest(gpus=2, gpumem=6000)

    def failures() -> dict[str, FailedNode]:
        decision = run(fleet, pod)
        assert decision.failures is not None
        return dict(decision.failures.items())

    by_dict = failures()
    monkeypatch.setattr(decide_module, "FEW_FAILING", 0)
    by_numpy = failures()
    assert by_dict == by_numpy
    assert len({reason.text() for reason in by_dict.values()}) >= 2  # distinct ways
    # Nodes failing the same way share one reasons object either way.
    assert len({id(reason) for reason in by_dict.values()}) == \
        len({id(reason) for reason in by_numpy.values()})
