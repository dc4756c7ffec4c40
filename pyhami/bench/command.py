"""``pyhami bench``: the benchmarks that run on an installed pyhami, one module each.

``cluster`` needs a checkout of the repository (the control plane's binaries, ``k8s/``,
``charts/``): it is the harness's command ``scripts/bench-cluster``, and
``pyhami bench cluster`` only says so.
"""

from __future__ import annotations

import argparse
import sys

from common.arguments import Subcommands
from pyhami.bench import agent, decide, extender, fleet, monitor

CLUSTER_IN_CHECKOUT = (
    "pyhami bench cluster needs a checkout of the repository: run scripts/bench-cluster "
    "there, with the same flags (k8s/, charts/ and scripts/build-control-plane.sh are not "
    "installed)")


def register(commands: Subcommands) -> None:
    parser = commands.add_parser("bench", help="benchmarks")
    benches = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    decide.register(benches)
    agent.register(benches)
    monitor.register(benches)
    extender.register(benches)
    # Whatever follows (its flags, --help), the answer is the same line: the flags are the
    # harness command's. No prefix character a flag starts with, so argparse takes every
    # word as one of "flags" (a REMAINDER positional stops at a leading option).
    cluster = benches.add_parser(
        "cluster", help="kube-scheduler with pyhami against kube-scheduler alone, on a real "
                        "control plane: in a checkout of the repository, scripts/bench-cluster",
        prefix_chars="+", add_help=False)
    cluster.add_argument("flags", nargs="*", help=argparse.SUPPRESS)
    cluster.set_defaults(handler=_cluster_needs_a_checkout)
    fleet.register(benches)


def _cluster_needs_a_checkout(args: argparse.Namespace) -> int:
    print(CLUSTER_IN_CHECKOUT, file=sys.stderr)
    return 2
