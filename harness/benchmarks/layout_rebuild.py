"""The layout's rebuild after one node changes, as the daemon's loop pays it (issue 45).

    python harness/benchmarks/layout_rebuild.py [--nodes 1000,5000] [--repeat 7] [--before REV]

A fleet of ``--nodes`` nodes of 8 cards (``tests.builders.node``), the garbage collector
frozen after building it as the daemon does (``gc.freeze()``); timed, best of
``--repeat``: the first build of ``fleet.layout``, and ``fleet.layout`` again after one
node's static change (its cards' memory), one node added, one node removed. Each is timed
for the fleet of this tree ("after") and for ``common/core/fleet.py`` as it was at git
revision ``--before`` ("before", default the commit before the splice), loaded beside it.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from common.core import Fleet  # noqa: E402
from tests.builders import node  # noqa: E402

BEFORE = "421b8c0"
"""The last commit whose fleet threw the whole layout away on a node's static change."""


def old_fleet_module(revision: str) -> ModuleType:
    """``common/core/fleet.py`` at ``revision``, as a module of its own."""
    source = subprocess.run(["git", "show", f"{revision}:common/core/fleet.py"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("fleet_before", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    exec(compile(source, f"{revision}:common/core/fleet.py", "exec"), module.__dict__)
    return module


def best(repeat: int, prepare: Callable[[int], None], measured: Callable[[], Any]) -> float:
    times = []
    for attempt in range(repeat):
        prepare(attempt)
        start = time.perf_counter()
        measured()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(fleet_class: type[Any], total: int, repeat: int) -> dict[str, float]:
    fleet = fleet_class()
    for i in range(total):
        fleet.upsert_node(node(f"n{i:05d}", 8))
    gc.collect()
    gc.freeze()
    try:
        def drop(_: int) -> None:
            fleet._layout = None  # what a first build starts from

        figures = {"first build": best(repeat, drop, lambda: fleet.layout)}
        _ = fleet.layout  # built, then one node changed at a time
        middle = f"n{total // 2:05d}"
        figures["one node's static change"] = best(
            repeat, lambda a: fleet.upsert_node(node(middle, 8, memory=16000 + a)),
            lambda: fleet.layout)
        figures["one node added"] = best(
            repeat, lambda a: fleet.upsert_node(node(f"n{total // 3:05d}-{a}", 8)),
            lambda: fleet.layout)
        figures["one node removed"] = best(
            repeat, lambda a: fleet.remove_node(f"n{total // 4 + a:05d}"),
            lambda: fleet.layout)
        return figures
    finally:
        gc.unfreeze()


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,5000")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--before", default=BEFORE)
    args = parser.parse_args()
    before = old_fleet_module(args.before).Fleet
    print(f"{cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"best of {args.repeat}, ms")
    print(f"{'nodes':>6}  {'what':<26} {'before':>8} {'after':>8}")
    for total in (int(n) for n in args.nodes.split(",")):
        old = measure(before, total, args.repeat)
        new = measure(Fleet, total, args.repeat)
        for what, seconds in new.items():
            print(f"{total:>6}  {what:<26} {old[what] * 1000:>8.1f} {seconds * 1000:>8.1f}")


if __name__ == "__main__":
    main()
