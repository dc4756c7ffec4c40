"""Hypothesis strategies for JSON documents, shared by the tests that fuzz a reader."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

json_floats = st.floats(allow_nan=False, allow_infinity=False)
"""The numbers JSON can hold that are not integers."""


def json_junk(max_leaves: int) -> st.SearchStrategy[Any]:
    """Any JSON value of at most ``max_leaves`` scalars: the shape a reader must refuse."""
    return st.recursive(
        st.none() | st.booleans() | st.integers() | json_floats | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6),
                                                                    inner, max_size=3),
        max_leaves=max_leaves)
