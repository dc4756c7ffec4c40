"""A pyhami command run in this process as a user runs it: its exit code and output."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyhami.cli import build_parser


def run_command(capsys: pytest.CaptureFixture[str], *argv: str | Path,
                environ: dict[str, str] | None = None,
                only: str | None = None) -> tuple[int, str, str]:
    """The exit code, stdout and stderr of ``pyhami ARGV`` (in a pipe), with only
    ``environ``'s PYHAMI_* variables; an argparse refusal (exit 2) included. ``only``:
    build that one command's parser (``build_parser``'s)."""
    try:
        args = build_parser(environ or {}, only=only).parse_args(list(map(str, argv)))
        code: int = args.handler(args)
    except SystemExit as stopped:
        assert isinstance(stopped.code, int)
        code = stopped.code
    out, err = capsys.readouterr()
    return code, out, err
