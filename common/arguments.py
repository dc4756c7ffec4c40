"""Command-line pieces every ``pyhami`` subcommand shares: the parser class and the
environment rule it applies, the subparser type and value types."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from common.core import Defaults, NodePolicy, parse_default_chain
from common.core.deviceconfig import DeviceConfig

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


# The environment rule: every option of every subcommand falls back to PYHAMI_<FLAG>.

ENV_PREFIX = "PYHAMI_"
TRUE_WORDS = ("true", "1", "yes")
FALSE_WORDS = ("false", "0", "no")
# Variables whose name broke the rule and changed with it; still set, they are refused
# rather than ignored, so that a component does not start with a default instead.
RENAMED_VARIABLES = {"PYHAMI_NATS_URL": "PYHAMI_NATS"}
ENVIRONMENT_EPILOG = (
    f"Every option falls back to the environment variable {ENV_PREFIX}<OPTION>: its long name "
    "upper-cased, dashes as underscores (--node-timeout: PYHAMI_NODE_TIMEOUT). The command "
    "line wins over the variable; an empty variable counts as unset. Switches take "
    f"{'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)} (any case).")


def variable_for(flag: str) -> str:
    """``--node-timeout`` -> ``PYHAMI_NODE_TIMEOUT``."""
    return ENV_PREFIX + flag.removeprefix("--").upper().replace("-", "_")


def switch_value(text: str) -> bool:
    """A switch's variable: true/1/yes or false/0/no, in any case."""
    word = text.strip().lower()
    if word in TRUE_WORDS or word in FALSE_WORDS:
        return word in TRUE_WORDS
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a switch value (use {'/'.join(TRUE_WORDS)} or "
        f"{'/'.join(FALSE_WORDS)})")


@dataclass(frozen=True)
class Fallback:
    """One option and the variable it falls back to."""

    action: argparse.Action
    flag: str
    variable: str

    @property
    def repeated(self) -> bool:
        """An option given once per value (``action="append"``): its variable holds the
        values separated by spaces."""
        return isinstance(self.action, argparse._AppendAction)

    def convert(self, text: str) -> Any:
        """The variable's text as the option's value; raises ``ArgumentTypeError`` with the
        message argparse gives for the same text on the command line."""
        if isinstance(self.action, argparse._StoreTrueAction):
            return switch_value(text)
        if self.repeated:
            return [self.convert_one(word) for word in text.split()]
        return self.convert_one(text)

    def convert_one(self, text: str) -> Any:
        convert = self.action.type
        if convert is None:
            value: Any = text
        else:
            assert callable(convert)  # checked when the rule was applied
            try:
                value = convert(text)
            except (TypeError, ValueError):  # as argparse words them; ArgumentTypeError passes
                name = getattr(convert, "__name__", repr(convert))
                raise argparse.ArgumentTypeError(f"invalid {name} value: {text!r}") from None
        choices = self.action.choices
        if choices is not None and value not in choices:
            shown = ", ".join(repr(choice) for choice in choices)
            raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {shown})")
        return value

    def named(self) -> str:
        return f"{self.flag} (or {self.variable})"


def fallback_for(action: argparse.Action) -> Fallback | None:
    """The option's fallback; None for positionals, --help, --version and subcommands.
    Raises ``TypeError`` for an option the rule cannot serve, so that a new flag of such a
    kind fails every test rather than going without its variable."""
    if not action.option_strings or isinstance(
            action, argparse._HelpAction | argparse._VersionAction):
        return None
    long_names = [name for name in action.option_strings if name.startswith("--")]
    if not long_names:
        raise TypeError(f"{action.option_strings[0]}: an option needs a --long name, which "
                        "names its environment variable")
    flag = long_names[0]
    one_value = type(action) in (argparse._StoreAction, argparse._AppendAction)
    if not ((one_value and action.nargs is None)
            or isinstance(action, argparse._StoreTrueAction)):
        raise TypeError(f"{flag}: the environment rule serves options with one value, "
                        f"repeatable or not, and store_true switches, not "
                        f"{type(action).__name__}")
    if action.type is not None and not callable(action.type):
        raise TypeError(f"{flag}: type must be a callable")
    return Fallback(action, flag, variable_for(flag))


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that, once ``use_environment`` has been applied to it, takes
    every option it lacks on the command line from the option's PYHAMI_<FLAG> variable.

    The variable's value goes through the option's own type and choices, and a bad one
    gets argparse's error naming the variable. Required options and required groups may
    be met by a variable; a variable and a command-line option of one mutually exclusive
    group are refused together, as two command-line options are.
    """

    environ: Mapping[str, str] | None = None
    fallbacks: tuple[Fallback, ...] = ()
    required_options: tuple[Fallback, ...] = ()
    required_groups: tuple[tuple[Fallback, ...], ...] = ()
    exclusive_groups: tuple[tuple[Fallback, ...], ...] = ()

    def parse_known_args(
            self, args: Iterable[str] | None = None, namespace: Any = None,
    ) -> tuple[Any, list[str]]:
        if self.environ is None:
            return super().parse_known_args(args, namespace)
        # Set before parsing: argparse then skips these defaults, and the command line
        # overwrites them. A repeatable option's values would be added to the variable's,
        # so its variable fills in after parsing, only where the command line gave none.
        from_environment = self._from_environment(self.environ)
        repeated = {f.action.dest: f.action.default for f in self.fallbacks if f.repeated}
        seeded = namespace if namespace is not None else argparse.Namespace()
        for dest, value in from_environment.items():
            if dest not in repeated:
                setattr(seeded, dest, value)
        parsed, extras = super().parse_known_args(args, seeded)
        for dest, default in repeated.items():
            if dest in from_environment and getattr(parsed, dest) is default:
                setattr(parsed, dest, from_environment[dest])
        self._check_requirements(parsed)
        return parsed, extras

    def _from_environment(self, environ: Mapping[str, str]) -> dict[str, Any]:
        variables = {fallback.variable for fallback in self.fallbacks}
        for old, new in RENAMED_VARIABLES.items():
            if environ.get(old) and new in variables:
                self.error(f"{old} is no longer read: set {new} instead")
        values: dict[str, Any] = {}
        for fallback in self.fallbacks:
            text = environ.get(fallback.variable, "")
            blank = not text.strip() if fallback.repeated else not text
            if blank:
                continue
            try:
                values[fallback.action.dest] = fallback.convert(text)
            except argparse.ArgumentTypeError as error:
                self.error(f"{fallback.variable} (for {fallback.flag}): {error}")
        return values

    def _check_requirements(self, namespace: argparse.Namespace) -> None:
        def given(fallback: Fallback) -> bool:
            return bool(getattr(namespace, fallback.action.dest) != fallback.action.default)

        missing = [f.named() for f in self.required_options if not given(f)]
        if missing:
            self.error(f"the following arguments are required: {', '.join(missing)}")
        for group in self.required_groups:
            if not any(given(f) for f in group):
                self.error(f"one of the arguments {' '.join(f.flag for f in group)} is "
                           f"required (or one of {', '.join(f.variable for f in group)})")
        environ = self.environ or {}
        for group in self.exclusive_groups:
            chosen = [f for f in group if given(f)]
            if len(chosen) > 1:  # two on the command line stopped argparse already
                shown = [f"{f.flag} (from {f.variable})" if environ.get(f.variable) else f.flag
                         for f in chosen]
                self.error(f"{shown[0]}: not allowed with {' and '.join(shown[1:])}")


def use_environment(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Apply the environment rule to ``parser`` and every subcommand under it (after they
    are all registered): each option's help names its variable, and parsing reads them
    from ``environ``."""
    if not isinstance(parser, CommandParser):
        raise TypeError(f"{parser.prog}: build it as a CommandParser")
    fallbacks = {action: fallback for action in parser._actions
                 if (fallback := fallback_for(action)) is not None}
    for fallback in fallbacks.values():
        action = fallback.action
        if action.help is not argparse.SUPPRESS:
            note = f"[{'required; ' if action.required else ''}${fallback.variable}]"
            action.help = f"{action.help} {note}" if action.help else note
    required = [f for f in fallbacks.values() if f.action.required]
    for fallback in required:
        fallback.action.required = False  # met by the variable too: checked after parsing
    exclusive, required_groups = [], []
    for group in parser._mutually_exclusive_groups:
        members = tuple(fallbacks[a] for a in group._group_actions if a in fallbacks)
        exclusive.append(members)
        if group.required:
            group.required = False
            required_groups.append(members)
    parser.environ = environ
    parser.fallbacks = tuple(fallbacks.values())
    parser.required_options = tuple(required)
    parser.required_groups = tuple(required_groups)
    parser.exclusive_groups = tuple(exclusive)
    if fallbacks and ENVIRONMENT_EPILOG not in (parser.epilog or ""):
        parser.epilog = f"{parser.epilog}\n\n{ENVIRONMENT_EPILOG}" if parser.epilog \
            else ENVIRONMENT_EPILOG
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in dict.fromkeys(action.choices.values()):  # aliases repeat
                use_environment(subparser, environ)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
    return seconds


def seconds_or_off(text: str) -> float:
    """Seconds, 0 meaning off: a finite number, 0 or above."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 (off) or above")
    return seconds


def policy_chain(text: str) -> str:
    """A cluster default chain: every name in it must be known."""
    try:
        parse_default_chain(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def address(text: str) -> tuple[str, int]:
    """``HOST:PORT``; an empty host listens on every interface."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host or "0.0.0.0", int(port)


def add_policy_defaults(parser: argparse.ArgumentParser, *, gpu_policy: str = "spread",
                        node_policy: str = "binpack") -> None:
    """The cluster defaults, as HAMi's chart sets them (``defaultSchedulerPolicy``)."""
    parser.add_argument("--gpu-scheduler-policy", type=policy_chain, default=gpu_policy,
                        help=f"cluster default card policy chain (default: {gpu_policy})")
    parser.add_argument("--node-scheduler-policy", choices=[p.value for p in NodePolicy],
                        default=node_policy,
                        help=f"cluster default node policy (default: {node_policy})")


def defaults_from(args: argparse.Namespace, device: DeviceConfig | None = None) -> Defaults:
    """The cluster defaults of the policy flags, holding ``device`` (HAMi's chart values
    when None)."""
    return Defaults(parse_default_chain(args.gpu_scheduler_policy),
                    NodePolicy(args.node_scheduler_policy),
                    DeviceConfig() if device is None else device)
