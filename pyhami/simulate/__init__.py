"""``pyhami simulate``: replay a cluster's workload through the decision core under each
card policy chain given, side by side, to choose the chain that suits the cluster."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from rich.text import Text

from common.arguments import Subcommands, policy_chain
from common.core import NodePolicy
from common.core.errors import SettingsError
from common.deviceconfig import add_device_config_argument, device_config_from
from common.files import InputFileError
from pyhami.output import (
    add_output_argument,
    fitted,
    print_json,
    stderr_console,
    stdout_console,
)
from pyhami.simulate._formats import load_trace
from pyhami.simulate._parallel import PolicyRuns
from pyhami.simulate._report import (
    mig_lines,
    namespace_table,
    plot_html,
    plot_svg,
    progress_bars,
    shows_namespaces,
    simulation_document,
    summary_table,
)
from pyhami.simulate._results import PolicyRun, Sample

__all__ = ["PolicyRun", "Sample", "register"]

PLOT_FORMATS = {".html": plot_html, ".svg": plot_svg}


def register(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "simulate", help="replay a workload on a cluster under each policy chain")
    parser.add_argument("--cluster", type=Path, required=True,
                        help="the nodes and their cards: a cluster file as pyhami decide reads "
                             "it (JSON or YAML), or an openb node list (CSV)")
    parser.add_argument("--workload", type=Path, required=True,
                        help="the pods and their arrivals: pyhami's workload file (JSON or "
                             "YAML), or an openb pod list (CSV)")
    parser.add_argument("--policy", action="append", type=policy_chain, required=True,
                        metavar="CHAIN",
                        help="a card policy chain as hami.io/gpu-scheduler-policy takes it "
                             "(spread, binpack, mutex,binpack, ...), the cluster default; "
                             "repeat it to compare several")
    parser.add_argument("--node-policy", choices=[policy.value for policy in NodePolicy],
                        default=NodePolicy.BINPACK.value,
                        help="the cluster default node policy (default: binpack)")
    parser.add_argument("--inflate", type=inflation, metavar="X",
                        help="repeat the workload until its arrivals reach X times the "
                             "cluster's GPU capacity (default: the workload once)")
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="place a group's members one at a time as they arrive, as "
                             "kube-scheduler alone does, rather than all or nothing (the "
                             "default), to compare")
    add_device_config_argument(parser)
    add_output_argument(parser, "table", "table: one row per policy; json: one document")
    parser.add_argument("--plot", type=plot_file, metavar="FILE",
                        help="also draw allocation and fragmentation against the arrived "
                             "workload, one line per policy: FILE.svg or FILE.html")
    parser.set_defaults(handler=run)


def inflation(text: str) -> float:
    try:
        factor = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(factor) or factor <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number above 0")
    return factor


def plot_file(text: str) -> Path:
    path = Path(text)
    suffix = path.suffix.lower()
    if suffix in PLOT_FORMATS:
        return path
    supported = " or ".join(PLOT_FORMATS)
    if suffix == ".png":
        raise argparse.ArgumentTypeError(
            f"{text!r}: PNG needs a plotting library, which pyhami does not ship; write "
            f"{supported} (a browser opens either, and can save it as an image)")
    raise argparse.ArgumentTypeError(f"{text!r}: a plot is written as {supported}")


def run(args: argparse.Namespace) -> int:
    try:
        device = device_config_from(args)
    except SettingsError as error:
        return refuse(str(error))
    for path in (args.cluster, args.workload):
        # Both named before either is read: the first may take a while to load.
        if not path.exists():
            return refuse(f"{path}: no such file")
        if not path.is_file():
            return refuse(f"{path}: not a file")
    try:
        trace = load_trace(args.cluster, args.workload, device)
    except InputFileError as error:
        return refuse(str(error))
    except OSError as error:
        return refuse(f"{error.filename}: {error.strerror or error}")
    node_policy = NodePolicy(args.node_policy)
    try:
        # The runs start (in processes of their own) before the bars, which draw from a
        # thread; a run's error is raised here, where the runs are collected.
        started = PolicyRuns(trace, args.policy, node_policy=node_policy,
                             inflate=args.inflate, device=device,
                             all_or_nothing=not args.one_at_a_time)
        with progress_bars(args.policy, stderr_console()) as callbacks:
            runs = started.results(callbacks)
    except (SettingsError, InputFileError) as error:
        return refuse(str(error))
    nodes, cards = len(trace.nodes), sum(len(node.cards) for node in trace.nodes)
    quotas = len(trace.quotas)
    namespaces = shows_namespaces(runs, quotas)
    if args.plot is not None:
        title = (f"pyhami simulate: {args.workload.name} ({len(trace.pods)} pods) on "
                 f"{args.cluster.name} ({nodes} nodes, {cards} cards)")
        suffix = args.plot.suffix.lower()
        page = (plot_html(runs, title, namespaces=namespaces) if suffix == ".html"
                else PLOT_FORMATS[suffix](runs, title))
        try:
            args.plot.write_text(page, encoding="utf-8")
        except OSError as error:
            return refuse(f"{args.plot}: {error.strerror or error}")
    if args.output == "json":
        print_json(simulation_document(nodes, cards, len(trace.pods), runs, quotas))
    else:
        console = stdout_console()
        under = f", {quotas} ResourceQuota{'s' if quotas != 1 else ''}" if quotas else ""
        jobs = len({pod.group.key for pod in trace.pods if pod.group is not None})
        in_groups = f" ({jobs} group{'s' if jobs != 1 else ''})" if jobs else ""
        console.print(Text(f"{nodes} nodes, {cards} cards{under}; {len(trace.pods)} pods"
                           f"{in_groups}"))
        console.print(fitted(summary_table(runs)))
        for line in mig_lines(runs):
            console.print(Text(line))
        if namespaces:
            console.print(Text("\nPods by namespace"))
            console.print(fitted(namespace_table(runs)))
    return 0


def refuse(message: str) -> int:
    print(f"pyhami simulate: {message}", file=sys.stderr)
    return 2
