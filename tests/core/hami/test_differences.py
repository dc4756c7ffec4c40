"""The ported HAMi tables and the migration guide name the same differences."""

from __future__ import annotations

from collections import Counter

from tests.core.hami.tables import all_rows, documented_differences


def test_every_row_names_hami_s_test_and_case_once() -> None:
    rows = all_rows()
    assert rows
    assert all(row.test.startswith("Test") and row.case and row.source.endswith("_test.go")
               for row in rows)
    repeated = [key for key, count in Counter(row.id for row in rows).items() if count > 1]
    assert not repeated


def test_the_differences_are_the_documented_ones_no_others() -> None:
    used = {row.difference for row in all_rows() if row.difference is not None}
    assert used == documented_differences()


def test_a_difference_says_what_pyhami_answers() -> None:
    assert all(row.pyhami is not None for row in all_rows() if row.difference is not None)
