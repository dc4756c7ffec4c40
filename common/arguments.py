"""Command-line pieces every ``pyhami`` subcommand shares: the subparser type and value types."""

from __future__ import annotations

import argparse
from typing import TypeAlias

from common.core import Defaults, NodePolicy, parse_default_chain

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


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


def defaults_from(args: argparse.Namespace) -> Defaults:
    return Defaults(parse_default_chain(args.gpu_scheduler_policy),
                    NodePolicy(args.node_scheduler_policy))
