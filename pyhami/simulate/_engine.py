"""Placeholder for the simulation engine, replaced when it merges: the signature the
command calls."""

from __future__ import annotations

from collections.abc import Callable

from common.core import NodePolicy
from pyhami.simulate._results import PolicyRun
from pyhami.simulate._trace import Trace


def simulate(trace: Trace, *, policy: str, node_policy: NodePolicy,
             inflate: float | None = None,
             progress: Callable[[int, int], None] | None = None) -> PolicyRun:
    raise NotImplementedError("the simulation engine is not merged yet")
