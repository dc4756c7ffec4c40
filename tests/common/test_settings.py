"""Settings by one rule: a field's flag, default and help make its option, and the parsed
options make the dataclass back, the environment rule included."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from common.arguments import CommandParser, positive_seconds, use_environment
from common.settings import add_settings, setting, settings_from


@dataclass(frozen=True)
class Example:
    name: str
    wait: float = setting(2.5, parse=positive_seconds, help="wait this long (default {default})")
    label: str = setting("x", flag="--example-label", metavar="NAME", help="a label")


def _parser(environ: dict[str, str]) -> CommandParser:
    parser = CommandParser(prog="example")
    add_settings(parser, Example)
    use_environment(parser, environ)
    return parser


def test_the_field_gives_the_option_its_default_and_help() -> None:
    options = {action.dest: action for action in _parser({})._actions}
    assert options["wait"].option_strings == ["--wait"]
    assert options["wait"].default == 2.5
    assert options["wait"].help == "wait this long (default 2.5) [$PYHAMI_WAIT]"
    assert options["example_label"].option_strings == ["--example-label"]
    assert options["example_label"].metavar == "NAME"


def test_the_parsed_options_build_the_settings() -> None:
    args = _parser({"PYHAMI_EXAMPLE_LABEL": "from-env"}).parse_args(["--wait", "4"])
    assert settings_from(Example, args, name="n") == Example("n", 4.0, "from-env")
    assert settings_from(Example, args, name="n", wait=1.0).wait == 1.0


def test_the_parser_of_a_setting_refuses_as_on_the_command_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser({}).parse_args(["--wait", "0"])
    assert "argument --wait: '0' must be above 0" in capsys.readouterr().err
