"""A fleet's snapshot after nodes change (issue 45): only the nodes whose cards changed are
built again and spliced among the others; the result must be the snapshot a fleet of the
same nodes and ledger builds from scratch, attribute for attribute, and decide the same."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.core import Allocation, CardGrant, Fleet, Node
from common.core.annotations import CORDON_ANNOTATION
from common.core.fleet import CardGroups, Snapshot, _static_signature
from common.core.mig import MigInstance, MigPlacement
from tests.builders import card, fleet_of, manifest, mig_node, node, run
from tests.linkgraphs import complete_multipartite, node_of_links

NAMES = [f"n{i}" for i in range(7)]

CACHES = {"changed"}
"""What two equal snapshots may hold differently: the log of cards changed since the snapshot
was built (reservations after a rebuild are logged; a snapshot built from scratch starts empty).
Every other attribute is compared."""


def _same(a: object, b: object, where: str) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), where
        assert a.dtype == b.dtype and np.array_equal(a, b), where
    elif isinstance(a, CardGroups):
        assert isinstance(b, CardGroups), where
        assert_same_attributes(a, b, where)
    elif where.endswith(".devices"):
        # A snapshot reads only the static fields of its cards (uuid, index, type): their
        # health and processes are the arrays'; a node not built again keeps the cards of
        # the report that built it.
        assert isinstance(a, list) and isinstance(b, list), where
        assert list(map(_static_signature, a)) == list(map(_static_signature, b)), where
    else:
        assert type(a) is type(b) and a == b, where


def assert_same_attributes(a: Any, b: Any, where: str = "snapshot",
                           skip: frozenset[str] = frozenset()) -> None:
    """Every attribute of ``a`` and ``b`` equal (arrays by value and dtype), but ``skip``."""
    names = set(vars(a)) | set(vars(b))
    assert set(vars(a)) == set(vars(b)), where
    for name in sorted(names - skip):
        _same(getattr(a, name), getattr(b, name), f"{where}.{name}")


def assert_same_layout(fleet: Fleet) -> None:
    scratch = Fleet()
    for each in fleet.nodes():
        scratch.upsert_node(each)
    for key, allocation in fleet.allocations().items():
        scratch.allocate(key, allocation)
    built = scratch.snapshot
    assert built.node_names == sorted(built.node_names)
    assert_same_attributes(fleet.snapshot, built, skip=frozenset(CACHES))


def _node(name: str, variant: int, sick: int, processes: int, cordon: int) -> Node:
    """A node of a few shapes: plain cards of several sizes and NUMA, unknown links, NVLink
    islands, irregular links, MIG cards, uuids another node lists too; with one card sick,
    busy or cordoned."""
    if variant == 0:
        base = node(name, 2)
    elif variant == 1:
        base = node(name, 3, memory=2000, numa=1)
    elif variant == 2:
        base = Node(name=name, cards=[card(i, name, links=None, numa=-1, type="A10")
                                        for i in (3, 1)])
    elif variant == 3:
        base = node_of_links(name, [0b0010, 0b0001, 0b1000, 0b0100], numa=[0, 0, 1, 1])
    elif variant == 4:
        base = node_of_links(name, complete_multipartite(5, 2))
    elif variant == 5:
        base = mig_node(name, 2)
    else:  # the same uuids on every node of this shape: a uuid at several positions
        base = Node(name=name, cards=[card(i, "shared") for i in range(2)])
    devices = [
        d if i != sick else card(d.index, name, **{**_fields(d), "health": False})
        for i, d in enumerate(base.cards)]
    devices = [card(d.index, name, **{**_fields(d), "processes": processes}) if i == 0 else d
               for i, d in enumerate(devices)]
    annotations = ({CORDON_ANNOTATION: devices[cordon % len(devices)].uuid} if cordon >= 0
                   else {})
    return Node(name=name, cards=devices, annotations=annotations)


def _fields(device: Any) -> dict[str, Any]:
    return {f: getattr(device, f) for f in device.__struct_fields__ if f != "index"}


nodes = st.builds(_node, st.sampled_from(NAMES), st.integers(0, 6), st.integers(-1, 4),
                  st.integers(0, 2), st.integers(-1, 3))


@st.composite
def grants(draw: st.DrawFn) -> tuple[str, Allocation]:
    name = draw(st.sampled_from(NAMES))
    chosen = draw(st.lists(st.integers(0, 4), min_size=1, max_size=2, unique=True))
    with_instance = draw(st.booleans())
    cards = tuple(
        CardGrant(f"GPU-{name}-{i}", 1000, 10,
                  MigInstance("1g.10gb", MigPlacement(6 - i, 1)) if with_instance else None)
        for i in chosen)
    return f"default/p{draw(st.integers(0, 6))}", Allocation(name, (cards,))


operations = st.one_of(
    st.tuples(st.just("upsert"), nodes),
    st.tuples(st.just("remove"), st.sampled_from(NAMES)),
    st.tuples(st.just("allocate"), grants()),
    st.tuples(st.just("release"), st.integers(0, 6).map(lambda i: f"default/p{i}")),
    st.tuples(st.just("look"), st.none()),
    st.tuples(st.just("copy"), st.none()),
)


@settings(max_examples=500, derandomize=True, deadline=None)
@given(st.lists(nodes, min_size=2, max_size=7), st.lists(operations, min_size=4, max_size=30),
       st.booleans())
@pytest.mark.slow  # long fuzzing
def test_the_layout_after_changes_is_the_one_built_from_scratch(
        first: list[Node], steps: list[tuple[str, Any]], splice_always: bool) -> None:
    """Spliced however many nodes changed (or as the fleet chooses, whole past 1 in 4)."""
    with patch("common.core.fleet._SPLICE_MAX_SHARE", 0 if splice_always else 4):
        _check_changes(first, steps)


def _check_changes(first: list[Node], steps: list[tuple[str, Any]]) -> None:
    fleet = fleet_of(*first)
    assert fleet.snapshot.node_names == sorted({n.name for n in first})
    for kind, what in steps:
        if kind == "upsert":
            fleet.upsert_node(what)
        elif kind == "remove":
            fleet.remove_node(what)
        elif kind == "allocate":
            fleet.allocate(*what)
        elif kind == "release":
            fleet.release(what)
        elif kind == "look":
            assert_same_layout(fleet)
        else:
            fleet = fleet.copy()
    assert_same_layout(fleet)


def _grow(fleet: Fleet, total: int) -> list[Node]:
    shapes = [_node(f"m{i:03d}", i % 6, i % 5 - 1, i % 3, i % 4 - 1) for i in range(total)]
    for each in shapes:
        fleet.upsert_node(each)
    return shapes


def test_a_large_fleet_is_spliced_and_decides_the_same() -> None:
    """Past a handful of nodes a change is spliced (fewer than 1 node in 4 changed): one
    node changed, one added, one removed among 80, a decision the same as from scratch."""
    fleet = Fleet()
    shapes = _grow(fleet, 80)
    old = fleet.snapshot
    fleet.upsert_node(_node("m040", 1, -1, 0, -1))
    fleet.upsert_node(_node("m0405", 5, 0, 1, 0))
    fleet.remove_node("m000")
    fleet.remove_node("m079")
    fleet.allocate("default/a", Allocation("m041", ((CardGrant("GPU-m041-0", 500, 5),),)))
    assert fleet.snapshot is not old
    assert_same_layout(fleet)
    scratch = fleet_of(*fleet.nodes())
    scratch.allocate("default/a", fleet.allocations()["default/a"])
    for pod in (manifest("x", gpus=2), manifest("y", gpumem=70000),
                manifest("z", policy="binpack")):
        assert run(fleet, pod, explain=True) == run(scratch, pod, explain=True)
    assert len(shapes) == 80


def test_a_spliced_layout_shares_nothing_that_changes_with_the_old_one() -> None:
    fleet = Fleet()
    _grow(fleet, 40)
    old = fleet.snapshot
    kept = old.copy()
    fleet.upsert_node(_node("m010", 2, -1, 0, -1))
    new = fleet.snapshot
    fleet.allocate("default/a", Allocation("m011", ((CardGrant("GPU-m011-0", 500, 5),),)))
    assert_same_attributes(old, kept, skip=frozenset({"changed", "check_cache"}))
    assert not np.shares_memory(new.tenants, old.tenants)
    assert int(new.usedmem.sum()) == 500


def test_layout_of_nodes_is_built_as_before() -> None:
    """``Snapshot(nodes)`` builds without a fleet (tests and tools construct it directly)."""
    snapshot = Snapshot([node("b", 2), node("a", 1)])
    assert snapshot.node_names == ["a", "b"]
    assert snapshot.card_position[("b", "GPU-b-1")] == 2
