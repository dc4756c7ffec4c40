"""``pyhami COMMAND`` builds a parser of that command alone (pyhami.cli.COMMANDS): the
table names every command, and each alone parses and helps as among all of them."""

from __future__ import annotations

import argparse

import pytest

from pyhami.cli import COMMANDS, build_parser


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_table_names_every_command_in_order() -> None:
    assert list(subcommands(build_parser({}))) == list(COMMANDS)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_command_alone_helps_as_among_all(name: str) -> None:
    alone = subcommands(build_parser({}, only=name))
    assert list(alone) == [name]
    assert alone[name].format_help() == subcommands(build_parser({}))[name].format_help()
