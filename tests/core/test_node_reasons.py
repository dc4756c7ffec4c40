"""A node's reasons stay data until shown: HAMi's text is written from them, unchanged."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from common.core.reasons import (
    CARD_REASON,
    INSUFFICIENT_CARDS,
    NODE_INSUFFICIENT_DEVICE,
    NodeReasons,
    NodeRefusal,
    failed_node_texts,
    removed_most,
)

NAMES = sorted({*CARD_REASON.values(), INSUFFICIENT_CARDS, NODE_INSUFFICIENT_DEVICE})


@given(st.dictionaries(st.sampled_from(NAMES), st.integers(0, 300)), st.integers(0, 300))
def test_the_text_is_hamis_tokens_sorted_as_strings(counts: dict[str, int], cards: int) -> None:
    expected = ", ".join(sorted(f"{n}/{cards} {name}" for name, n in counts.items() if n > 0))
    assert NodeReasons.of(counts, cards).text() == expected


def test_equal_reasons_are_equal_whatever_order_they_were_counted_in() -> None:
    one = NodeReasons.of({"CardNotHealth": 2, INSUFFICIENT_CARDS: 10}, 12)
    other = NodeReasons.of({INSUFFICIENT_CARDS: 10, "CardNotHealth": 2, "CardCordoned": 0}, 12)
    assert one == other
    assert one.counts == ((INSUFFICIENT_CARDS, 10), ("CardNotHealth", 2))


def test_a_refusal_reads_reason_then_detail() -> None:
    refusal = NodeRefusal("NodeUnknown", "pyhami has no GPU inventory for this node")
    assert failed_node_texts({"a": refusal, "b": NodeReasons.of({"CardNotHealth": 1}, 1)}) == {
        "a": "NodeUnknown: pyhami has no GPU inventory for this node",
        "b": "1/1 CardNotHealth"}


def test_the_reason_that_removed_most_cards_over_the_nodes() -> None:
    memory = NodeReasons.of({"CardInsufficientMemory": 4, "CardNotHealth": 1}, 5)
    health = NodeReasons.of({"CardNotHealth": 2}, 2)
    unknown = NodeRefusal("NodeUnknown", "x")
    assert removed_most([memory, health, unknown]) == "CardInsufficientMemory"
    assert removed_most([memory, health, health]) == "CardNotHealth"
    assert removed_most([unknown]) == "NodeUnknown"
    assert removed_most([]) is None
