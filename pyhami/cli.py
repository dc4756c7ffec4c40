"""pyhami: a GPU-sharing scheduler for Kubernetes, speaking HAMi's annotations."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

from agent import cli as agent_cli
from common.arguments import CommandParser, use_environment
from common.version import package_version
from pyhami import bench, certs, decide, demo, explain, natsauth, simulate, watch
from scheduler import cli as scheduler_cli


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """Every subcommand, each option falling back to its PYHAMI_<FLAG> variable in
    ``environ`` (default: the process environment)."""
    parser = CommandParser(prog="pyhami", description=__doc__)
    parser.add_argument("--version", action="version", version=f"pyhami {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (decide, explain, simulate, bench, demo, watch, certs, natsauth,
                   agent_cli, scheduler_cli):
        module.register(commands)
    use_environment(parser, os.environ if environ is None else environ)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
