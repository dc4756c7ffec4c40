"""The ported HAMi tables and the migration guide name the same differences."""

from __future__ import annotations

from collections import Counter

from tests.core.hami.tables import all_rows, documented_differences


def test_every_row_names_hami_s_test_and_case_once() -> None:
    rows = all_rows()
    assert rows
    tests = [row for row in rows if row.origin == "test"]
    read = [row for row in rows if row.origin == "source"]
    assert len(tests) + len(read) == len(rows)
    assert all(row.test.startswith("Test") and row.case and row.source.endswith("_test.go")
               for row in tests)
    # A case read from the code names the function, its file and the lines it follows.
    assert all(not row.test.startswith("Test") and row.case and row.note
               and row.source.endswith(".go") and not row.source.endswith("_test.go")
               for row in read)
    repeated = [key for key, count in Counter(row.id for row in rows).items() if count > 1]
    assert not repeated


def test_the_differences_are_the_documented_ones_no_others() -> None:
    used = {row.difference for row in all_rows() if row.difference is not None}
    assert used == documented_differences()


def test_a_difference_says_what_pyhami_answers() -> None:
    assert all(row.pyhami is not None for row in all_rows() if row.difference is not None)
