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
from pyhami.output import READER_GONE_EXIT, silence_stdout, stdout_reader_gone
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
    try:
        code: int = args.handler(args)
        sys.stdout.flush()  # here, not at exit, where a failure is reported past catching
    except BrokenPipeError:
        if not stdout_reader_gone():
            raise
        # The reader of stdout has gone (`| head -1`): the command has stopped what it
        # started on the way out, as on Ctrl-C; end as a command killed by SIGPIPE would.
        silence_stdout()
        return READER_GONE_EXIT
    return code


if __name__ == "__main__":
    sys.exit(main())
