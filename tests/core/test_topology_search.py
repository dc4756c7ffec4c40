"""The linked-set search of topology-aware (issue 45): the same answer as trying every set
in rank order, from the components on a union of cliques, and bounded on any graph.

Bounds are asserted on the steps the search counts, never on the clock."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.core import decide, parse_pod
from common.core.fleet import NodeTopology, _cliques
from common.core.linksets import DECISION_SEARCH_STEPS, SEARCH_STEPS, SearchBudget, linked_set
from pyhami.sandbox import DEFAULTS
from tests.builders import fleet_of, indexes, manifest, run
from tests.linkgraphs import (
    Masks,
    complete_multipartite,
    link,
    linked_pairs,
    mycielski,
    node_of_links,
    random_graph,
    spent_budgets,
)

SEARCH = settings(max_examples=300, deadline=None, derandomize=True)


def oracle(ranked: list[int], size: int, masks: Masks) -> list[int] | None:
    """Every ``size``-set of ranks in lexicographic order: the first pairwise linked one."""
    for ranks in itertools.combinations(range(len(ranked)), size):
        cards = [ranked[r] for r in ranks]
        if linked_pairs(masks, cards):
            return cards
    return None


def topology(masks: Masks) -> NodeTopology:
    return NodeTopology(True, tuple(masks), _cliques(masks))


@st.composite
def searches(draw: st.DrawFn, union: bool = False) -> tuple[Masks, list[int], int]:
    """A graph of up to 11 cards (any, or a union of cliques), some of its cards in a
    random rank order, and a set size."""
    cards = draw(st.integers(1, 11))
    masks = [0] * cards
    if union:
        component = draw(st.lists(st.integers(0, 3), min_size=cards, max_size=cards))
        for a, b in itertools.combinations(range(cards), 2):
            if component[a] == component[b]:
                link(masks, a, b)
    else:
        for a, b in itertools.combinations(range(cards), 2):
            if draw(st.booleans()):
                link(masks, a, b)
    ranked = draw(st.permutations(range(cards)))[:draw(st.integers(0, cards))]
    return masks, ranked, draw(st.integers(1, cards))


@SEARCH
@given(searches())
def test_the_answer_is_the_lexicographically_first_linked_set(
        case: tuple[Masks, list[int], int]) -> None:
    masks, ranked, size = case
    budget = SearchBudget()
    assert linked_set(ranked, size, topology(masks), budget) == oracle(ranked, size, masks)
    assert not budget.exhausted


@SEARCH
@given(searches(union=True))
def test_a_union_of_cliques_is_answered_from_its_components(
        case: tuple[Masks, list[int], int]) -> None:
    masks, ranked, size = case
    shape = topology(masks)
    assert shape.cliques is not None
    budget = SearchBudget()
    assert linked_set(ranked, size, shape, budget) == oracle(ranked, size, masks)
    assert budget.spent == 0  # no search


def test_the_same_answers_on_larger_random_graphs_in_rank_order() -> None:
    rng = random.Random(45)
    for _ in range(40):
        cards = rng.randint(12, 18)
        masks = random_graph(cards, rng.uniform(0.3, 0.9), rng)
        ranked = rng.sample(range(cards), cards)
        for size in (2, 3, 5, 7):
            budget = SearchBudget()
            assert linked_set(ranked, size, topology(masks), budget) == oracle(
                ranked, size, masks)


@pytest.mark.parametrize(("name", "masks", "size", "found", "most_steps"), [
    # A (size-1)-set everywhere, none of size: the colouring proves it at the root, one
    # step per card and one for the root.
    ("complete 7-partite, 56 cards", complete_multipartite(56, 7), 8, False, 57),
    ("complete 7-partite, 256 cards", complete_multipartite(256, 7), 8, False, 257),
    ("complete 7-partite, 7 asked", complete_multipartite(256, 7), 7, True, 7 * 257),
    # No three cards pairwise linked: below each card, its linked later cards colour
    # into one class.
    ("Mycielskian, 191 cards", mycielski(191), 3, False, 4_000),
    ("Mycielskian, 2 asked", mycielski(191), 2, True, 400),
])
def test_hard_shapes_are_settled_in_few_steps(name: str, masks: Masks, size: int,
                                              found: bool, most_steps: int) -> None:
    budget = SearchBudget()
    chosen = linked_set(list(range(len(masks))), size, topology(masks), budget)
    assert (chosen is not None) == found, name
    assert chosen is None or linked_pairs(masks, chosen)
    assert not budget.exhausted
    assert budget.spent <= most_steps, (name, budget.spent)


def adversary() -> Masks:
    """G(256, 0.5): its largest linked sets have about 11 cards, and proving there is no
    set of 13 takes millions of steps."""
    return random_graph(256, 0.5, random.Random(45))


def test_an_adversarial_graph_runs_out_of_steps_and_says_so() -> None:
    budget = SearchBudget()
    assert linked_set(list(range(256)), 13, topology(adversary()), budget) is None
    assert budget.exhausted
    assert budget.spent <= SEARCH_STEPS


def test_a_budget_spent_refuses_the_next_search_unsearched() -> None:
    path = [0b010, 0b101, 0b010]  # 0 - 1 - 2: not a union of cliques
    budget = SearchBudget(0)
    assert linked_set([0, 1, 2], 2, topology(path), budget) is None
    assert budget.exhausted and budget.spent == 0
    # Even a search that would need no step: the node's searches stop together.
    pair = [0b10, 0b01]
    assert linked_set([0, 1], 2, topology(pair), budget) is None


class TestThroughTheDecision:
    def test_a_complete_7_partite_node_is_topology_not_fit_for_8(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        budgets = spent_budgets(monkeypatch)
        fleet = fleet_of(node_of_links("n", complete_multipartite(64, 7)))
        decision = run(fleet, manifest(gpus=8, policy="topology-aware"))
        assert decision.failed_nodes == {"n": "64/64 TopologyNotFit"}
        assert [b.spent for b in budgets] == [65]
        # Seven are there, one from each part.
        assert indexes(run(fleet, manifest(gpus=7, policy="topology-aware"))) == [
            list(range(7))]

    def test_the_search_limit_is_the_nodes_reason(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        budgets = spent_budgets(monkeypatch)
        fleet = fleet_of(node_of_links("n", adversary()), node_of_links("m", [0] * 16))
        decision = run(fleet, manifest(gpus=13, policy="topology-aware"))
        assert decision.failed_nodes == {
            "n": "256/256 TopologyNotFit (search limit reached)",
            "m": "16/16 TopologyNotFit",
        }
        assert [b.exhausted for b in budgets] == [True]
        assert all(b.spent <= SEARCH_STEPS for b in budgets)

    def test_numa_groups_share_the_nodes_budget(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        masks = adversary()
        shape = topology(masks)
        # Each NUMA group of 128 cards alone is proven to hold no 11-set within the budget
        # (about 38,000 and 40,000 steps) ...
        for group in (range(128), range(128, 256)):
            alone = SearchBudget()
            assert linked_set(list(group), 11, shape, alone) is None
            assert not alone.exhausted
        # ... but the node's searches share one budget: both do not fit in it.
        budgets = spent_budgets(monkeypatch)
        fleet = fleet_of(node_of_links("n", masks, [card // 128 for card in range(256)]))
        pod = manifest(gpus=11, policy="topology-aware",
                       annotations={"nvidia.com/numa-bind": "true"})
        assert run(fleet, pod).failed_nodes == {
            "n": "256/256 TopologyNotFit (search limit reached)"}
        assert len(budgets) == 1 and budgets[0].exhausted
        assert budgets[0].spent <= SEARCH_STEPS

    def test_a_decisions_nodes_share_one_budget(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Three agents reporting adversarial links cost a decision two nodes' worth of
        steps, not three; a node of linked islands (no steps) still takes the pod."""
        budgets = spent_budgets(monkeypatch)
        islands = [sum(1 << peer for peer in range(16) if peer != card) for card in range(16)]
        fleet = fleet_of(*(node_of_links(name, adversary()) for name in ("h1", "h2", "h3")),
                         node_of_links("ok", islands))
        decision = run(fleet, manifest(gpus=13, policy="topology-aware"))
        assert decision.node == "ok"
        assert sum(b.spent for b in budgets) <= DECISION_SEARCH_STEPS
        assert [b.exhausted for b in budgets].count(True) == 3

    def test_the_refusal_message_names_the_search_limit(self) -> None:
        fleet = fleet_of(node_of_links("n", adversary()))
        pod = parse_pod(manifest(gpus=13, policy="topology-aware"), DEFAULTS)
        message = decide(fleet, pod, describe=True).message
        assert message == ("asked for 13 cards with 1000 MiB each; "
                           "n: 256/256 TopologyNotFit (search limit reached)")
