"""Fuzz target for the linked-set search (issue 45): link graphs of up to 256 cards, random
and built to be hard (G(n, p), complete multipartite, Mycielskian, islands with links
across), through the whole decision. ``decide`` never raises, a set it picks is pairwise
linked, a node it refuses carries a topology reason, and no node's searches take more
steps than ``SEARCH_STEPS``."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.core import Fleet, decide, parse_pod
from common.core.linksets import SEARCH_STEPS, SearchBudget
from pyhami.sandbox import DEFAULTS
from tests.builders import hold, manifest
from tests.linkgraphs import (
    Masks,
    cliques_crossed,
    complete_multipartite,
    linked_pairs,
    mycielski,
    node_of_links,
    random_graph,
    spent_budgets,
)

FUZZ = settings(max_examples=100, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
FAMILIES = ("random", "multipartite", "mycielski", "islands")


@st.composite
def link_graphs(draw: st.DrawFn) -> tuple[str, Masks]:
    cards = draw(st.one_of(st.integers(2, 24), st.sampled_from([64, 128, 200, 256])))
    family = draw(st.sampled_from(FAMILIES))
    rng = random.Random(draw(st.integers(0, 2**32)))
    if family == "random":
        masks = random_graph(cards, draw(st.sampled_from([0.5, 0.7, 0.9, 0.95])), rng)
    elif family == "multipartite":
        masks = complete_multipartite(cards, draw(st.integers(1, 9)))
    elif family == "mycielski":
        masks = mycielski(cards)
    else:
        masks = cliques_crossed(cards, draw(st.integers(1, 9)),
                                draw(st.sampled_from([0.1, 0.3, 0.6])), rng)
    return family, masks


@pytest.fixture
def budgets(monkeypatch: pytest.MonkeyPatch) -> list[SearchBudget]:
    """Every budget ``place_pod`` opens: one a node placed in full."""
    return spent_budgets(monkeypatch)


@FUZZ
@given(graph=link_graphs(), asked=st.one_of(st.integers(2, 8), st.integers(9, 40)),
       numa_bind=st.booleans(), busy=st.integers(0, 40), exhaustive=st.booleans(),
       seed=st.integers(0, 2**16))
def test_any_link_graph_is_decided_within_the_budget(
        budgets: list[SearchBudget], *, graph: tuple[str, Masks], asked: int,
        numa_bind: bool, busy: int, exhaustive: bool, seed: int) -> None:
    family, masks = graph
    cards = len(masks)
    rng = random.Random(seed)
    numa = [rng.randrange(2) for _ in range(cards)] if numa_bind else None
    fleet = Fleet()
    fleet.upsert_node(node_of_links("n", masks, numa))
    for card in rng.sample(range(cards), min(busy, cards)):
        hold(fleet, f"default/u{card}", "n", f"GPU-n-{card}")
    notes = {"nvidia.com/numa-bind": "true"} if numa_bind else {}
    pod = parse_pod(manifest(gpus=asked, policy="topology-aware,binpack", annotations=notes),
                    DEFAULTS)
    budgets.clear()
    decision = decide(fleet, pod, exhaustive=exhaustive, describe=True)
    assert all(b.spent <= SEARCH_STEPS for b in budgets), (family, cards, asked)
    if decision.scheduled:
        (chosen,) = decision.cards
        positions = [card.index for card in chosen]
        assert len(set(positions)) == asked
        assert linked_pairs(masks, positions), (family, cards, asked)
        if numa is not None:
            assert len({numa[p] for p in positions}) == 1
        return
    reasons = (decision.failed_nodes or {})["n"]
    assert any(name in reasons for name in (
        "TopologyNotFit", "AllocatedCardsInsufficientRequest", "NodeInsufficientDevice",
        "NumaNotFit")), reasons
    if "search limit reached" in reasons:
        assert any(b.exhausted for b in budgets)
    assert decision.message is not None and "\n" not in decision.message
