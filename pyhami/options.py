"""Argument types and the cluster policy defaults shared by several commands."""

from __future__ import annotations

import argparse
from typing import TypeAlias

from common.core import Defaults, NodePolicy, parse_default_chain

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def chain(text: str) -> str:
    try:
        parse_default_chain(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def add_policy_defaults(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu-scheduler-policy", type=chain, default="spread",
                        help="cluster default card policy chain (default: spread)")
    parser.add_argument("--node-scheduler-policy", choices=[p.value for p in NodePolicy],
                        default="binpack", help="cluster default node policy (default: binpack)")


def defaults_from(args: argparse.Namespace) -> Defaults:
    return Defaults(parse_default_chain(args.gpu_scheduler_policy),
                    NodePolicy(args.node_scheduler_policy))
