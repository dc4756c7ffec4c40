"""``utilization_scores`` (plain Python, for a node's few cards or one node) gives the
floats ``utilization_score`` (numpy, for the whole fleet) gives, to the last bit: a node's
score and a card's rank must not depend on which of the two computed them."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from common.core.fleet import ratio, utilization_score, utilization_scores
from common.core.policy import Weights

_CAPACITY = st.one_of(st.sampled_from([0, 1, 3, 4, 10, 100, 24576, 81920, 2 * 10**6,
                                        2 * 10**7]),
                      st.integers(0, 10**9))


@st.composite
def _rows(draw: st.DrawFn) -> list[tuple[int, int, int, int, int, int]]:
    rows = []
    for _ in range(draw(st.integers(1, 8))):
        count, cores, memory = draw(_CAPACITY), draw(_CAPACITY), draw(_CAPACITY)
        rows.append((draw(st.integers(0, 2 * max(count, 1))), count,
                     draw(st.integers(0, max(cores, 1))), cores,
                     draw(st.integers(0, max(memory, 1))), memory))
    return rows


@settings(max_examples=500, derandomize=True)
@given(_rows(), st.builds(Weights, *(st.integers(0, 100) for _ in range(3))))
def test_the_same_floats_as_numpy(rows: list[tuple[int, int, int, int, int, int]],
                                  weights: Weights) -> None:
    used, count, usedcores, cores, usedmem, memory = (np.array(c, dtype=np.int64)
                                                      for c in zip(*rows, strict=True))
    expected = utilization_score(ratio(used, count), ratio(usedcores, cores),
                                 ratio(usedmem, memory), weights).tolist()
    assert utilization_scores(rows, weights) == expected


def test_halves_round_to_even_as_numpy_does() -> None:
    # 10 * m / 2e7 * 1e6 = m / 2: odd m lands on a half, which numpy.round sends to even.
    rows = [(0, 0, 0, 0, m, 2 * 10**7) for m in range(1, 200)]
    used, count, usedcores, cores, usedmem, memory = (np.array(c, dtype=np.int64)
                                                      for c in zip(*rows, strict=True))
    expected = utilization_score(ratio(used, count), ratio(usedcores, cores),
                                 ratio(usedmem, memory), Weights()).tolist()
    assert utilization_scores(rows, Weights()) == expected
