"""Settings by one rule: a setting's flag, parser, default and help are declared once, on
its field of a frozen settings dataclass; ``add_settings`` makes the argparse options of
those fields and ``settings_from`` builds the dataclass back from the parsed namespace.
The PYHAMI_<FLAG> environment fallback then comes with every option, as for any other
(``common.arguments.use_environment``).

A new setting goes on the dataclass that uses it, as ``setting(...)``; nothing else needs
to name its default or its help.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
Options = argparse.ArgumentParser | argparse._ArgumentGroup

_SETTING = "pyhami.setting"


@dataclass(frozen=True)
class Setting:
    """How one field is set from the command line."""

    help: str
    """What it does; ``{default}`` in it is replaced by the default (a float with ``:g``)."""
    flag: str | None = None
    """The long option; None: the field's name, dashes for underscores."""
    parse: Callable[[str], Any] = str
    """Turns the option's text into the value (argparse's ``type``), raising
    ``argparse.ArgumentTypeError`` for text it refuses."""
    metavar: str | None = None

    def option(self, name: str) -> str:
        return self.flag or "--" + name.replace("_", "-")

    def dest(self, name: str) -> str:
        """Where argparse keeps the value: the option's name, as argparse would put it."""
        return self.option(name).removeprefix("--").replace("-", "_")


def setting(default: T, *, help: str, flag: str | None = None,
            parse: Callable[[str], Any] = str, metavar: str | None = None) -> T:
    """A dataclass field that is also a command-line option."""
    declared = Setting(help, flag, parse, metavar)
    return dataclasses.field(default=default, metadata={_SETTING: declared})


def _settings_of(settings: type[Any]) -> list[tuple[dataclasses.Field[Any], Setting]]:
    return [(field, field.metadata[_SETTING]) for field in dataclasses.fields(settings)
            if _SETTING in field.metadata]


def _shown(default: object) -> str:
    return f"{default:g}" if isinstance(default, float) else str(default)


def add_settings(options: Options, settings: type[Any], *only: str) -> None:
    """Add an option for each declared setting of ``settings`` (those named in ``only``,
    in that order, when given)."""
    declared = dict((field.name, (field, spec)) for field, spec in _settings_of(settings))
    for name in only or tuple(declared):
        field, spec = declared[name]
        options.add_argument(spec.option(name), type=spec.parse, default=field.default,
                             metavar=spec.metavar,
                             help=spec.help.format(default=_shown(field.default)))


def settings_from(settings: type[T], args: argparse.Namespace, **given: Any) -> T:
    """``settings`` built from the parsed options of its declared settings; ``given`` sets
    its other fields, or overrides an option's value."""
    values = {field.name: getattr(args, spec.dest(field.name))
              for field, spec in _settings_of(settings)}
    return settings(**(values | given))
