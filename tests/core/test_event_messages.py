"""The messages of the scheduler's Events in HAMi's shapes (``common.core.events``).

Pure: each expected message is written from HAMi v2.10's formats (``genSuccessMsg``,
``recordFilteringFailures``, the summary, ``recordScheduleBindingResultEvent``) and the
inputs the case chose.
"""

from __future__ import annotations

import numpy as np
import pytest

from common.core import NodePolicy, NodeReasons, NodeRefusal, decide, parse_pod
from common.core.decide import FittingNodes
from common.core.events import (
    NODES_LISTED,
    binding_succeed,
    failing_by_reason,
    filtering_failures,
    filtering_succeed,
    no_node_summary,
)
from common.core.fiterror import MESSAGE_LIMIT, SENTENCE_LIMIT, fit_error_message
from common.core.reasons import FailedNode
from pyhami.sandbox import DEFAULTS
from tests.builders import fleet_of, hold, manifest, node


def fitting(scores: dict[str, float], policy: NodePolicy = NodePolicy.BINPACK) -> FittingNodes:
    """The core's mapping over nodes named in order (their positions), with these scores."""
    names = list(scores)
    return FittingNodes(names, np.arange(len(names)), np.array(list(scores.values())), policy)


MANY = {f"n{i:04d}": i / 1000 for i in range(1000)}


@pytest.mark.parametrize(("node", "total", "scores", "policy", "expected"), [
    ("a", 1, {"a": 0.0}, NodePolicy.BINPACK,
     "find fit node(a), 0 nodes not fit, 1 nodes fit(a:0.00)"),
    # Worst first, the chosen node last, as HAMi's sort leaves them.
    ("b", 5, {"a": 1.5, "b": 3.25, "c": 0.125}, NodePolicy.BINPACK,
     "find fit node(b), 2 nodes not fit, 3 nodes fit(c:0.12,a:1.50,b:3.25)"),
    # Spread: the lowest score is the best, listed last.
    ("c", 3, {"a": 1.5, "b": 3.25, "c": 0.125}, NodePolicy.SPREAD,
     "find fit node(c), 0 nodes not fit, 3 nodes fit(b:3.25,a:1.50,c:0.12)"),
    # Ties go to the name sorting first (chosen), so it is listed after the others.
    ("a", 3, {"a": 2.0, "b": 2.0, "c": 2.0}, NodePolicy.BINPACK,
     "find fit node(a), 0 nodes not fit, 3 nodes fit(c:2.00,b:2.00,a:2.00)"),
    # Two decimals, rounded as Go's %.2f rounds these.
    ("a", 1, {"a": 7.456}, NodePolicy.BINPACK,
     "find fit node(a), 0 nodes not fit, 1 nodes fit(a:7.46)"),
    # A thousand nodes: the ten best named, the rest counted where HAMi lists them.
    ("n0999", 1200, MANY, NodePolicy.BINPACK,
     "find fit node(n0999), 200 nodes not fit, 1000 nodes fit(+990 more,"
     + ",".join(f"n{i:04d}:{i / 1000:.2f}" for i in range(990, 1000)) + ")"),
])
def test_filtering_succeed(node: str, total: int, scores: dict[str, float],
                           policy: NodePolicy, expected: str) -> None:
    assert filtering_succeed(node, total, fitting(scores, policy)) == expected


def test_filtering_succeed_from_any_mapping_best_first() -> None:
    assert filtering_succeed("b", 2, {"b": 2.0, "a": 1.0}) == (
        "find fit node(b), 0 nodes not fit, 2 nodes fit(a:1.00,b:2.00)")


def test_a_node_held_for_a_group_member_is_named_alone() -> None:
    assert filtering_succeed("g1", 4, None) == (
        "find fit node(g1), 3 nodes not fit, 1 nodes fit(g1)")


def test_long_node_names_keep_the_message_within_an_event() -> None:
    names = {("x" * 250) + f"{i:03d}": float(i) for i in range(NODES_LISTED + 5)}
    best = max(names, key=names.__getitem__)
    message = filtering_succeed(best, len(names), fitting(names))
    assert len(message.encode()) <= MESSAGE_LIMIT
    assert message.endswith(f"{best}:{names[best]:.2f})")  # the chosen node is named
    listed = message.count(":")
    assert f"fit(+{len(names) - listed} more," in message


@pytest.mark.parametrize("policy", [NodePolicy.BINPACK, NodePolicy.SPREAD])
@pytest.mark.parametrize("count", [1, 3, 10, 333, 334, 335, 1000])
def test_the_head_of_the_order_is_the_order_cut_short(policy: NodePolicy, count: int) -> None:
    """``FittingNodes.best`` without ordering every node: the same as ordering them all,
    ties (a third of the nodes at each score) included."""
    scores = np.round(np.random.default_rng(count).integers(0, 3, 1000) / 3, 6)
    names = [f"n{i:04d}" for i in range(1000)]

    def made() -> FittingNodes:
        return FittingNodes(names, np.arange(1000), scores, policy)

    assert made().best(count) == list(made().items())[:count]


def test_the_decisions_fitting_nodes_make_the_message() -> None:
    fleet = fleet_of(node("a", 1), node("b", 1), node("c", 1), node("d", 1))
    hold(fleet, "default/x", "a", "GPU-a-0", memory=15000)  # full: fails
    hold(fleet, "default/y", "c", "GPU-c-0", memory=2000)
    decision = decide(fleet, parse_pod(manifest(gpumem=1000), DEFAULTS))
    assert decision.node == "c" and decision.fitting is not None
    score = decision.fitting["c"]
    assert filtering_succeed("c", 4, decision.fitting) == (
        f"find fit node(c), 1 nodes not fit, 3 nodes fit(d:0.00,b:0.00,c:{score:.2f})")


MEMORY = NodeReasons.of({"CardInsufficientMemory": 4}, 4)
BOTH = NodeReasons.of({"CardInsufficientMemory": 2, "CardNotHealth": 2}, 4)
SEARCH = NodeReasons.of({"TopologyNotFit (search limit reached)": 8}, 8)
STALE = NodeRefusal("NodeInventoryStale", "no inventory for 40s")
UNKNOWN = NodeRefusal("NodeUnknown", "no GPU inventory")


@pytest.mark.parametrize(("failures", "told", "expected"), [
    ({"b": MEMORY}, (), ["1 nodes CardInsufficientMemory(b)"]),
    # Sorted by name; the reason with the most nodes first.
    ({"c": MEMORY, "a": MEMORY, "b": BOTH}, (),
     ["3 nodes CardInsufficientMemory(a,b,c)", "1 nodes CardNotHealth(b)"]),
    # The reason's first word, as HAMi's ParseReason reads it.
    ({"x": SEARCH}, (), ["1 nodes TopologyNotFit(x)"]),
    # A refusal before the core: only those the daemon says are about the node.
    ({"a": STALE, "b": UNKNOWN, "c": MEMORY}, ("NodeInventoryStale",),
     ["1 nodes CardInsufficientMemory(c)", "1 nodes NodeInventoryStale(a)"]),
    ({"a": STALE, "b": UNKNOWN}, (), []),
    # Many nodes: the first ten by name, the rest counted after them.
    ({f"n{i:03d}": MEMORY for i in range(25)}, (),
     ["25 nodes CardInsufficientMemory(" + ",".join(f"n{i:03d}" for i in range(10))
      + ",+15 more)"]),
])
def test_filtering_failures(failures: dict[str, FailedNode], told: tuple[str, ...],
                            expected: list[str]) -> None:
    assert filtering_failures(failures, told) == expected


def test_nodes_by_reason_cover_every_failing_node_under_each_of_its_reasons() -> None:
    fleet = fleet_of(node("a", 2, health=False), node("b", 3), node("c", 1))
    hold(fleet, "default/x", "c", "GPU-c-0", memory=15000)
    decision = decide(fleet, parse_pod(manifest(gpus=2), DEFAULTS))
    assert decision.node == "b"
    assert failing_by_reason(decision.failures or {}) == {
        "CardNotHealth": ["a"], "NodeInsufficientDevice": ["c"]}


@pytest.mark.parametrize(("total", "sentence", "expected"), [
    (3, None, "no available node, 3 nodes do not meet"),
    (1, "asked for 5 cards with 1000 MiB each; n has 4 cards (NodeInsufficientDevice)",
     "no available node, 1 nodes do not meet: asked for 5 cards with 1000 MiB each; "
     "n has 4 cards (NodeInsufficientDevice)"),
])
def test_no_node_summary(total: int, sentence: str | None, expected: str) -> None:
    assert no_node_summary(total, sentence) == expected


def test_the_longest_sentence_fits_after_the_summary() -> None:
    sizes = range(1, 61)  # one part per node: the sentence runs to its bound
    fleet = fleet_of(*(node(f"node-{size:02d}", size) for size in sizes))
    request = parse_pod(manifest(gpus=100), DEFAULTS)
    decision = decide(fleet, request)
    sentence = fit_error_message(fleet, request, decision.failures or {})
    assert SENTENCE_LIMIT - 100 < len(sentence.encode()) <= SENTENCE_LIMIT
    summary = no_node_summary(99_999_999, sentence)
    assert summary.endswith(sentence)  # whole, not cut
    assert len(summary.encode()) <= MESSAGE_LIMIT
    # A longer one (the daemon may add to it) is cut to fit.
    assert len(no_node_summary(5, "x" * 2000).encode()) == MESSAGE_LIMIT


def test_binding_succeed() -> None:
    assert binding_succeed("gpu-2", "ml", "train-1") == (
        "Successfully binding node [gpu-2] to ml/train-1")
