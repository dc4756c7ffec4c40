"""HAMi v2.10.0's own table tests, ported as data (``cases/*.yaml``).

Each row names the HAMi test function and the case it comes from (``test``, ``case``;
``source`` the Go file at tag v2.10.0), what the case gives and what HAMi's test wants.
A row read from HAMi's source where no HAMi test covers the case has ``origin: source``:
its ``test`` is then the Go function whose code decides it, ``source`` the file holding
that function, and ``note`` the lines of that function it follows (the case was also run
through that function in Go, on the same inputs, when the row was written).
A row pyhami answers otherwise carries ``difference``: the id of a row of the table
"Differences HAMi's own tests show" in ``docs/migrating-from-hami.md``, and
``pyhami`` with what pyhami answers instead, which the row then asserts (so a
difference is a test too, and a silent drift in either direction fails it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

CASES = Path(__file__).parent / "cases"
MIGRATING = Path(__file__).parents[3] / "docs" / "migrating-from-hami.md"
DIFFERENCES_HEADING = "## Differences HAMi's own tests show"


@dataclass(frozen=True, slots=True)
class Row:
    """One ported case."""

    test: str
    case: str
    source: str
    given: dict[str, Any]
    want: Any
    difference: str | None = None
    pyhami: Any = None
    origin: str = "test"
    """``test``: a case of HAMi's table tests; ``source``: a case read from its code."""
    note: str | None = None

    @property
    def id(self) -> str:
        return f"{self.test}/{self.case}"

    @property
    def expected(self) -> Any:
        """What pyhami must answer: HAMi's ``want``, or, for a documented difference,
        the ``pyhami`` figure."""
        return self.pyhami if self.difference is not None else self.want


def load(name: str) -> list[Row]:
    """The rows of ``cases/<name>.yaml``."""
    rows = yaml.safe_load((CASES / f"{name}.yaml").read_text(encoding="utf-8"))
    return [Row(**row) for row in rows]


def all_rows() -> list[Row]:
    return [row for path in sorted(CASES.glob("*.yaml")) for row in load(path.stem)]


def cases(name: str) -> pytest.MarkDecorator:
    """``pytest.mark.parametrize("row", ...)`` over a table, each row named by its id."""
    rows = load(name)
    return pytest.mark.parametrize("row", rows, ids=[row.id for row in rows])


def documented_differences() -> set[str]:
    """The ids in the first column of the differences table of the migration guide."""
    text = MIGRATING.read_text(encoding="utf-8")
    section = text.split(DIFFERENCES_HEADING, 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.MULTILINE))
