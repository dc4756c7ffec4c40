"""Placeholder for the trace formats, replaced when they merge: the signature the command
calls."""

from __future__ import annotations

from pathlib import Path

from pyhami.simulate._trace import Trace


def load_trace(cluster: Path, workload: Path) -> Trace:
    raise NotImplementedError("the trace formats are not merged yet")
