"""pyhami: a GPU-sharing scheduler for Kubernetes, speaking HAMi's annotations."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Mapping, Sequence

from common.arguments import CommandParser, use_environment
from pyhami.output import READER_GONE_EXIT, silence_stdout, stdout_reader_gone

COMMANDS = {
    "decide": "pyhami.decide",
    "explain": "pyhami.explain",
    "simulate": "pyhami.simulate",
    "bench": "pyhami.bench.command",
    "demo": "pyhami.demo",
    "watch": "pyhami.watch",
    "certs": "pyhami.certs",
    "nats-auth": "pyhami.natsauth",
    "preflight": "pyhami.preflight",
    "agent": "agent.cli",
    "scheduler": "scheduler.cli",
}
"""Each subcommand and the module that registers it, in the order ``pyhami --help`` lists
them. The modules are imported when their command is built: all of them take about 0.8 s
to import (the agent's and the daemon's NATS and HTTP clients), which a command such as
``pyhami simulate`` that needs none of them need not pay (a test holds that this table
names every command the modules register)."""


def build_parser(environ: Mapping[str, str] | None = None,
                 only: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand (or ``only`` that one, a name of ``COMMANDS``), each option falling
    back to its PYHAMI_<FLAG> variable in ``environ`` (default: the process environment)."""
    parser = CommandParser(prog="pyhami", description=__doc__)
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).register(commands)
    use_environment(parser, os.environ if environ is None else environ)
    return parser


class _Version(argparse._VersionAction):
    """argparse's ``version`` action, the version read when asked for: reading the
    package metadata (``importlib.metadata``) on every command cost a tenth of
    ``pyhami simulate --help``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[object] | None,
                 option_string: str | None = None) -> None:
        from common.version import package_version  # noqa: PLC0415 (when asked for)

        self.version = f"pyhami {package_version()}"
        super().__call__(parser, namespace, values, option_string)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    # A command named first is parsed by a parser of that command alone: the same
    # options, help and errors, without importing the others.
    only = arguments[0] if arguments and arguments[0] in COMMANDS else None
    args = build_parser(only=only).parse_args(arguments)
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
