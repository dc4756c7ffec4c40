"""``pyhami decide``: one offline decision from a cluster file and a Pod manifest, or
several pods decided one after the other, a group's members together (all or none)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.text import Text

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
from common.core.decide import Decision
from common.core.errors import SettingsError
from common.core.fleet import Fleet
from common.core.groups import GroupRef, group_of, place_group
from common.core.pod import PodManifest, PodRequest
from common.deviceconfig import add_device_config_argument, device_config_from
from common.files import InputFileError, load_cluster, load_pod
from pyhami.output import add_output_argument, print_decision, print_json, stdout_console


def register(commands: Subcommands) -> None:
    parser = commands.add_parser("decide", help="decide one pod offline against a cluster file")
    parser.add_argument("--cluster", type=Path, required=True, help="cluster JSON file")
    parser.add_argument("--pod", type=Path, required=True, action="append",
                        help="Pod manifest (YAML or JSON); repeat it to decide several pods "
                             "in order, each seeing the cards the ones before it took, and a "
                             "group's members together, all or none")
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
    if len(args.pod) > 1:
        return run_several(args.cluster, args.pod, defaults, args.explain, args.output)
    return run(args.cluster, args.pod[0], defaults, args.explain, args.output)


def _fleet_from_file(cluster_path: Path, defaults: Defaults) -> Fleet:
    """The cluster file's fleet; raises ``InputFileError`` naming the file."""
    try:
        return fleet_from_cluster(load_cluster(cluster_path), defaults.device)
    except ClusterFileError as error:
        raise InputFileError(f"{cluster_path}: {error}") from None


def decide_files(cluster_path: Path, pod_path: Path, defaults: Defaults,
                 explain: bool) -> dict[str, Any]:
    """Raises ``InputFileError`` for a file that cannot be used."""
    fleet = _fleet_from_file(cluster_path, defaults)
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


def decide_several(cluster_path: Path, pod_paths: list[Path], defaults: Defaults,
                   explain: bool) -> dict[str, Any]:
    """Several pods decided in the order given, each on the fleet as the pods before it
    left it; the members of a group (the pods declaring the same group) decided together
    with ``place_group`` where the first of them comes, all placed or none. Raises
    ``InputFileError`` for a file that cannot be used."""
    fleet = _fleet_from_file(cluster_path, defaults)
    manifests = [load_pod(path) for path in pod_paths]
    groups: dict[str, list[PodManifest]] = {}
    declared: dict[str, GroupRef | str | None] = {}
    """Per pod: its group, None for none, or why its declaration is refused."""
    for manifest in manifests:
        try:
            ref = group_of(manifest)
        except PodRejected as error:
            declared[manifest.key] = str(error)
            continue
        declared[manifest.key] = ref
        if ref is not None:
            groups.setdefault(ref.key, []).append(manifest)
    pods: list[dict[str, Any]] = []
    group_documents: list[dict[str, Any]] = []
    decided: dict[str, Decision] = {}
    for manifest in manifests:
        declaration = declared[manifest.key]
        if isinstance(declaration, str):
            decision = rejected(manifest.key, declaration)
        elif declaration is None:
            decision = _decide_alone(fleet, manifest, defaults, explain)
        else:
            if manifest.key not in decided:  # the group's first member given
                group_document, decisions = _decide_group(
                    fleet, declaration, groups[declaration.key], defaults)
                group_documents.append(group_document)
                decided.update(decisions)
            decision = decided[manifest.key]
        pods.append({"pod": manifest.key,
                     "group": declaration.key if isinstance(declaration, GroupRef) else None,
                     **decision_document(decision)})
    return {"pods": pods, "groups": group_documents}


def _decide_alone(fleet: Fleet, manifest: PodManifest, defaults: Defaults,
                  explain: bool) -> Decision:
    """One pod on its own, booked on ``fleet`` when placed."""
    try:
        request = parse_pod(manifest, defaults)
    except PodRejected as error:
        return rejected(manifest.key, str(error))
    decision = decide(fleet, request, explain=explain, describe=True)
    if decision.allocation is not None:
        fleet.allocate(request.key, decision.allocation)
    return decision


def _decide_group(fleet: Fleet, ref: GroupRef, members: list[PodManifest],
                  defaults: Defaults) -> tuple[dict[str, Any], dict[str, Decision]]:
    """A group's members all placed (and booked on ``fleet``) or none, with its part of
    the document and each member's decision. Kueue's count must match the members given
    (the daemon would wait for the rest); the coscheduling plugin's and Kubernetes' counts
    live in a PodGroup no file here holds, so the members given are the group."""
    keys = [member.key for member in members]
    requests: list[PodRequest] = []
    why: str | None = None
    given = {declared.count for declared in map(group_of, members) if declared is not None}
    if len(given) > 1:
        why = (f"group {ref.name}: its members disagree on the member count "
               f"({', '.join(sorted(map(str, given)))}): no member is placed")
    elif ref.count is not None and ref.count != len(members):
        why = (f"group {ref.name}: {len(members)} of {ref.count} members given: a group is "
               "placed whole, so every member's manifest is needed; no member is placed")
    else:
        for member in members:
            try:
                requests.append(parse_pod(member, defaults))
            except PodRejected as error:
                why = (f"group {ref.name}: {member.key} cannot be read ({error}): no member "
                       "is placed")
                break
    decisions: dict[str, Decision]
    if why is None:
        placement = place_group(fleet, ref.name, requests)
        why = placement.message
        fitting = placement.fitting
        decisions = {decision.pod: decision for decision in placement.decisions}
        for decision in placement.decisions:
            if decision.allocation is not None:
                fleet.allocate(decision.pod, decision.allocation)
    else:
        fitting = 0
    if why is not None:
        decisions = {key: Decision(pod=key, scheduled=False, failures={}, message=why)
                     for key in keys}
    document = {"group": ref.key, "source": ref.source.value, "members": keys,
                "placed": why is None, "fitting": fitting, "message": why}
    return document, decisions


def run_several(cluster: Path, pods: list[Path], defaults: Defaults, explain: bool,
                output: str) -> int:
    try:
        document = decide_several(cluster, pods, defaults, explain)
    except InputFileError as error:
        print(f"pyhami decide: {error}", file=sys.stderr)
        return 2
    if output == "table":
        console = stdout_console()
        for group in document["groups"]:
            # The sentence, when the group is refused, names it already.
            console.print(Text(f"group {group['group']}: placed whole, "
                               f"{len(group['members'])} members" if group["placed"]
                               else group["message"]))
        for pod in document["pods"]:
            console.print(Text(f"\n{pod['pod']}"))
            print_decision(pod, console)
    else:
        print_json(document)
    return 0
