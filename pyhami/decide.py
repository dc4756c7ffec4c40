"""``pyhami decide``: one offline decision from a cluster file and a Pod manifest."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from common.arguments import Subcommands, add_policy_defaults, defaults_from
from common.core import (
    ClusterFileError,
    Defaults,
    PodRejected,
    decide,
    decision_document,
    fleet_from_cluster,
    parse_pod,
    rejected,
)
from common.core.errors import SettingsError
from common.deviceconfig import add_device_config_argument, device_config_from
from common.files import InputFileError, load_cluster, load_pod
from pyhami.output import add_output_argument, print_decision, print_json, stdout_console


def register(commands: Subcommands) -> None:
    parser = commands.add_parser("decide", help="decide one pod offline against a cluster file")
    parser.add_argument("--cluster", type=Path, required=True, help="cluster JSON file")
    parser.add_argument("--pod", type=Path, required=True, help="Pod manifest (YAML or JSON)")
    parser.add_argument("--explain", action="store_true", help="add the per-card selection path")
    add_policy_defaults(parser)
    add_device_config_argument(parser)
    add_output_argument(parser, "json", "json: the decision document; table: as pyhami "
                                         "explain draws it")
    parser.set_defaults(handler=command)


def command(args: argparse.Namespace) -> int:
    try:
        defaults = defaults_from(args, device_config_from(args))
    except SettingsError as error:
        print(f"pyhami decide: {error}", file=sys.stderr)
        return 2
    return run(args.cluster, args.pod, defaults, args.explain, args.output)


def decide_files(cluster_path: Path, pod_path: Path, defaults: Defaults,
                 explain: bool) -> dict[str, Any]:
    """Raises ``InputFileError`` for a file that cannot be used."""
    try:
        fleet = fleet_from_cluster(load_cluster(cluster_path), defaults.device)
    except ClusterFileError as error:
        raise InputFileError(f"{cluster_path}: {error}") from None
    manifest = load_pod(pod_path)
    try:
        request = parse_pod(manifest, defaults)
    except PodRejected as error:
        return decision_document(rejected(manifest.key, str(error)))
    return decision_document(decide(fleet, request, explain=explain, describe=True))


def run(cluster: Path, pod: Path, defaults: Defaults, explain: bool, output: str) -> int:
    try:
        document = decide_files(cluster, pod, defaults, explain)
    except InputFileError as error:
        print(f"pyhami decide: {error}", file=sys.stderr)
        return 2
    if output == "table":
        print_decision(document, stdout_console())
    else:
        print_json(document)
    return 0
