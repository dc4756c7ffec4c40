"""The GPU check's report: what each check saw on the real card, and where that differs from
what pyhami assumed (its fakes, its tables, nvidia-smi's own answer).

A GPU machine is lent for minutes, so a run must leave everything it learnt behind, not
only pass or fail: each check records its observations and its differences as it goes
(``CheckLog``), and the run ends with one JSON document and one readable summary
(``Report``), written where ``PYHAMI_GPU_REPORT`` says (``scripts/gpu-check.sh`` sets it).
Nothing here touches the GPU; the plumbing into pytest is in ``tests/gpu/conftest.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

REPORT_ENV = "PYHAMI_GPU_REPORT"
"""The folder the report is written into; no report without it."""
MIG_WRITE_ENV = "PYHAMI_GPU_MIG_WRITE"
"""``1``: the MIG check may switch an idle GPU into MIG mode, make and destroy an instance,
and switch it back (``--mig-write``)."""
JSON_NAME = "gpu-check.json"
TEXT_NAME = "gpu-check.txt"

Outcome = Literal["passed", "failed", "skipped", "error"]


class CheckLog:
    """What one check saw. ``compare`` records a difference instead of failing at once, so
    that a run reports every field that differs, not the first; ``assert_same`` fails the
    check at its end if any was recorded."""

    def __init__(self) -> None:
        self.observations: dict[str, Any] = {}
        self.differences: list[str] = []

    def saw(self, key: str, value: Any) -> None:
        self.observations[key] = _plain(value)

    def differs(self, what: str) -> None:
        self.differences.append(what)

    def compare(self, what: str, ours: Any, theirs: Any, *, ours_name: str = "pyhami",
                theirs_name: str = "nvidia-smi") -> bool:
        """Whether ``ours`` equals ``theirs``; a difference is recorded naming both sides."""
        if ours == theirs:
            return True
        self.differs(f"{what}: {ours_name} {ours!r}, {theirs_name} {theirs!r}")
        return False

    def assert_same(self) -> None:
        assert not self.differences, "; ".join(self.differences)


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it: tuples and sets as lists, anything odd as its text."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [_plain(item) for item in items]
    return str(value)


@dataclass
class CheckResult:
    """One check as the report tells it."""

    name: str
    outcome: Outcome
    seconds: float
    reason: str = ""
    """Why it was skipped, or the line it failed on."""
    observations: dict[str, Any] = field(default_factory=dict)
    differences: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "outcome": self.outcome, "seconds": round(self.seconds, 2),
                "reason": self.reason, "observations": self.observations,
                "differences": self.differences}


@dataclass
class Report:
    machine: dict[str, Any]
    checks: Sequence[CheckResult]
    seconds: float

    @property
    def passed(self) -> bool:
        """Every check passed, or was skipped for a stated reason."""
        return all(check.outcome == "passed" or (check.outcome == "skipped" and check.reason)
                   for check in self.checks)

    def as_dict(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for check in self.checks:
            counts[check.outcome] = counts.get(check.outcome, 0) + 1
        return {"passed": self.passed, "seconds": round(self.seconds, 1), "counts": counts,
                "machine": self.machine, "checks": [check.as_dict() for check in self.checks]}

    def summary(self) -> str:
        """The report for a person: one line per check, then what each one saw differ."""
        counts = self.as_dict()["counts"]
        told = ", ".join(f"{counts[outcome]} {outcome}" for outcome in
                         ("passed", "failed", "error", "skipped") if outcome in counts)
        lines = [f"pyhami GPU check: {'PASSED' if self.passed else 'FAILED'} "
                 f"in {self.seconds:.1f} s ({told or 'no check ran'})"]
        for key in ("gpus", "driver", "cuda_driver", "kernel", "python"):
            if key in self.machine:
                lines.append(f"  {key}: {self.machine[key]}")
        lines.append("")
        width = max((len(check.name) for check in self.checks), default=0)
        for check in self.checks:
            lines.append(f"{check.outcome.upper():8} {check.name:{width}} "
                         f"{check.seconds:6.1f} s  {check.reason}".rstrip())
        for check in self.checks:
            if check.differences:
                lines.append("")
                lines.append(f"{check.name} differs:")
                lines.extend(f"  - {difference}" for difference in check.differences)
        return "\n".join(lines) + "\n"

    def write(self, folder: Path) -> tuple[Path, Path]:
        folder.mkdir(parents=True, exist_ok=True)
        document, text = folder / JSON_NAME, folder / TEXT_NAME
        document.write_text(json.dumps(self.as_dict(), indent=2) + "\n")
        text.write_text(self.summary())
        return document, text
