"""How long one pod group's placement holds the daemon's loop: all at once (before issue
45, one /filter placed the whole group in one call) against in slices (``in_slices``: a
member a step, the loop served every ``SLICE_SECONDS``).

    .venv/bin/python harness/benchmarks/group_slices.py [--nodes 4 1000 5000] [--members 1024]

Prints, per fleet size, the time to place the group in one call, the longest single step
(one member's decision, the least the loop can be held), and the number of steps.
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.core import parse_pod
from common.core.groups import idle_placement_steps, place_group, placement_steps
from pyhami.sandbox import DEFAULTS
from tests.builders import fleet_of, gpu_limits, manifest, node


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 1000, 5000])
    parser.add_argument("--members", type=int, default=1024)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print("| nodes of 8 cards | members | one call | longest step | steps | idle placement, "
          "one call |")
    print("|---|---|---|---|---|---|")
    members = [parse_pod(manifest(f"m{i:04d}", containers=[gpu_limits(percent=100)]), DEFAULTS)
               for i in range(args.members)]
    for count in args.nodes:
        fleet = fleet_of(*(node(f"n{i:05d}", 8) for i in range(count)))
        fleet.layout  # noqa: B018 (built before timing, as the daemon has it)
        gc.freeze()  # as the daemon does once started: its fleet is not walked by the GC
        started = time.perf_counter()
        place_group(fleet, "g", members)
        whole = time.perf_counter() - started
        steps = placement_steps(fleet, "g", members)
        longest, taken = 0.0, 0
        while True:
            before = time.perf_counter()
            try:
                next(steps)
            except StopIteration:
                break
            longest = max(longest, time.perf_counter() - before)
            taken += 1
        started = time.perf_counter()
        for _ in idle_placement_steps(fleet, "g", members):
            pass
        idle = time.perf_counter() - started
        print(f"| {count:,} | {args.members:,} | {whole * 1e3:.0f} ms | {longest * 1e3:.2f} ms "
              f"| {taken:,} | {idle * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
