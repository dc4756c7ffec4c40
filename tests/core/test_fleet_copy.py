"""``Fleet.copy``: a copy books apart from its fleet, and its snapshot (copied arrays, not
built afresh) is the snapshot a fleet built from scratch with the same cards and reservations
would have."""

from __future__ import annotations

import numpy as np
import pytest

from common.core import Allocation, CardGrant, Fleet
from common.core.fleet import _DYNAMIC_ARRAYS
from tests.builders import fleet_of, hold, node


def usage_arrays(fleet: Fleet) -> dict[str, list[int]]:
    snapshot = fleet.snapshot
    return {name: np.asarray(getattr(snapshot, name)).tolist() for name in _DYNAMIC_ARRAYS}


def rebuilt(fleet: Fleet) -> Fleet:
    """The same nodes and ledger, its snapshot built from nothing."""
    fresh = fleet_of(*fleet.nodes())
    for key, allocation in fleet.allocations().items():
        fresh.allocate(key, allocation)
    return fresh


@pytest.mark.parametrize("layout_built_first", [True, False])
def test_a_copy_books_apart_and_matches_a_layout_built_afresh(layout_built_first: bool) -> None:
    fleet = fleet_of(node("a", 4), node("b", 2))
    hold(fleet, "default/held", "a", "GPU-a-0", "GPU-a-1", memory=3000, cores=20)
    if layout_built_first:
        fleet.snapshot.node_scores()  # arrays and scores built, then copied
    before = usage_arrays(fleet)
    trial = fleet.copy()
    trial.allocate("default/new", Allocation("b", ((CardGrant("GPU-b-1", 5000, 30),),)))
    trial.release("default/held")
    assert usage_arrays(fleet) == before  # the fleet itself is untouched
    assert usage_arrays(trial) == usage_arrays(rebuilt(trial))
    assert np.allclose(trial.snapshot.node_scores(), rebuilt(trial).snapshot.node_scores())
    assert np.allclose(fleet.snapshot.node_scores(), rebuilt(fleet).snapshot.node_scores())
