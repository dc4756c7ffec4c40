"""How ``pyhami simulate`` reports its runs: one JSON document, a table, a plot drawn as
plain SVG (alone or in an HTML page), and progress bars while the runs go."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from html import escape

from rich.console import Console
from rich.markup import escape as escape_markup
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from pyhami.simulate._results import PolicyRun, Sample, percentile, thinned

ProgressCallback = Callable[[int, int], None]

# The table names this many refusal reasons per policy, the commonest first.
SHOWN_REASONS = 3
# The counts of the by-namespace table (and of the HTML page's), in order.
NAMESPACE_COUNTS = ("pods", "placed", "refused for quota", "refused otherwise")
# The table's columns for a workload with groups, after "groups placed".
GROUP_COUNTS = ("jobs", "jobs started", "jobs waiting", "idle GPU-hours")

# The plot: two panels side by side, each PANEL_WIDTH x PANEL_HEIGHT including its margins,
# then the legend, one row per policy.
PANEL_WIDTH = 440
PANEL_HEIGHT = 300
MARGIN_LEFT = 60
MARGIN_RIGHT = 20
MARGIN_TOP = 36
MARGIN_BOTTOM = 48
PLOT_WIDTH = PANEL_WIDTH - MARGIN_LEFT - MARGIN_RIGHT
PLOT_HEIGHT = PANEL_HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
LEGEND_ROW = 20
TICK_INTERVALS = 5
# A line keeps at most this many points: more are finer than the pixels.
PLOT_POINTS = 1000
# Okabe and Ito's colour-blind-safe palette, less its yellow, which is faint on white.
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
DASHED = "6 3"  # the lines after the palette's first round
SVG_NAMESPACE = "http://www.w3.org/2000/svg"


def simulation_document(nodes: int, cards: int, pods: int, runs: Sequence[PolicyRun],
                        quotas: int = 0) -> dict[str, object]:
    """What ``--output json`` prints (``quotas``: the cluster's ResourceQuotas that limit
    GPU memory or cores)."""
    return {"cluster": {"nodes": nodes, "cards": cards, "quotas": quotas},
            "workload": {"pods": pods}, "policies": [run.document() for run in runs]}


def mig_lines(runs: Sequence[PolicyRun]) -> list[str]:
    """Under the table, for a cluster with MIG cards: the instances each run gave, by
    profile (``spread: 1g.10gb x 120, 3g.40gb x 8``)."""
    if not any(run.mig_instances for run in runs):
        return []
    return ["MIG instances given:", *(
        f"  {run.policy}: " + (", ".join(f"{profile} x {count}" for profile, count
                                         in sorted(run.mig_instances.items())) or "none")
        for run in runs)]


# The table.

def summary_table(runs: Sequence[PolicyRun]) -> Table:
    """One row per run. Reasons and policy names are shown as text, never read as rich
    markup (reasons hold brackets)."""
    table = Table(show_edge=False, pad_edge=False, box=None, padding=(0, 1, 0, 2))
    for column in ("policy", "node policy"):
        table.add_column(column, no_wrap=True)
    for column in ("pods", "placed", "refused"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("refused for")
    for column in ("peak allocation", "allocation at 100% arrived", "fragmented at end",
                   "wait p50", "wait p95"):
        table.add_column(column, justify="right", no_wrap=True)
    groups = shows_groups(runs)
    if groups:
        table.add_column("groups placed", no_wrap=True)
        for column in GROUP_COUNTS:
            table.add_column(column, justify="right", no_wrap=True)
    for run in runs:
        at_capacity = allocation_at_arrived(run.samples, 1.0)
        cells: list[str | Text] = [
            Text(run.policy), Text(run.node_policy), str(run.pods), str(run.placed),
            str(run.refused), Text(top_reasons(run.refused_by_reason)),
            share(run.peak_allocation), share(at_capacity),
            share(run.samples[-1].fragmentation if run.samples else None),
            duration(percentile(run.waits, 0.5)), duration(percentile(run.waits, 0.95))]
        if groups:
            tally = run.groups
            cells += [tally.placement.replace("-", " "), str(tally.jobs), str(tally.started),
                      str(tally.waiting), f"{tally.idle_gpu_hours:.1f}"]
        table.add_row(*cells)
    return table


def shows_groups(runs: Sequence[PolicyRun]) -> bool:
    """Whether the workload declares groups: the table then counts the jobs."""
    return any(run.groups.jobs for run in runs)


def shows_namespaces(runs: Sequence[PolicyRun], quotas: int) -> bool:
    """Whether the by-namespace table says anything: the cluster has quotas, or the
    workload spans several namespaces."""
    return quotas > 0 or any(len(run.by_namespace) > 1 for run in runs)


def namespace_table(runs: Sequence[PolicyRun]) -> Table:
    """One row per run and namespace: its pods, how many were placed, and how many were
    never placed, for its ResourceQuotas or for another reason."""
    table = Table(show_edge=False, pad_edge=False, box=None, padding=(0, 1, 0, 2))
    for column in ("policy", "namespace"):
        table.add_column(column, no_wrap=True)
    for column in NAMESPACE_COUNTS:
        table.add_column(column, justify="right", no_wrap=True)
    for run in runs:
        for namespace, tally in run.by_namespace.items():
            table.add_row(Text(run.policy), Text(namespace), str(tally.pods),
                          str(tally.placed), str(tally.refused_for_quota),
                          str(tally.refused_otherwise))
    return table


def allocation_at_arrived(samples: Sequence[Sample], arrived: float) -> float | None:
    """The allocation when the arrived workload reached ``arrived``, linear between the
    samples around it (and from nothing arrived, nothing allocated, before the first);
    None when the workload never reached it."""
    before = (0.0, 0.0)
    for sample in samples:
        if sample.arrived >= arrived:
            was_arrived, was_allocated = before
            if sample.arrived == was_arrived:
                return sample.allocation
            step = (arrived - was_arrived) / (sample.arrived - was_arrived)
            return was_allocated + (sample.allocation - was_allocated) * step
        before = (sample.arrived, sample.allocation)
    return None


def top_reasons(refused_by_reason: dict[str, int]) -> str:
    ranked = sorted(refused_by_reason.items(), key=lambda item: (-item[1], item[0]))
    shown = ", ".join(f"{reason} ({count})" for reason, count in ranked[:SHOWN_REASONS])
    left = len(ranked) - SHOWN_REASONS
    if left > 0:
        shown += f", {left} more"
    return shown or "-"


def share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


# Progress.

@contextmanager
def progress_bars(labels: Sequence[str],
                  console: Console | None) -> Iterator[list[ProgressCallback | None]]:
    """One bar per label on ``console``, and the callback (done, total) that moves each;
    without a console, no bars and no callbacks."""
    if console is None:
        yield [None for _ in labels]
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        def mover(task: TaskID) -> ProgressCallback:
            def move(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total)
            return move

        yield [mover(progress.add_task(escape_markup(label), total=None)) for label in labels]


# The plot.

# A round axis top is one of these times a power of ten: a fifth of each is a round tick.
AXIS_TOPS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)
# How far past its last value an axis may run: a round top further out than this leaves
# the lines in the left of the panel (data to 126% on an axis to 150%), so the axis then
# ends this far past the data, with the round top's ticks that fall on it.
AXIS_MARGIN = 0.04


def nice_ceiling(value: float) -> float:
    """The smallest axis top that is at least ``value`` (1 for nothing)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for multiple in AXIS_TOPS:
        if multiple * power >= value * (1 - 1e-9):  # a value already round stays
            return multiple * power
    return 10 * power


@dataclass(frozen=True)
class Axis:
    """Where an axis ends and the values its ticks mark (0 first)."""

    end: float
    ticks: tuple[float, ...]


def axis_to(value: float, cap: float | None = None) -> Axis:
    """An axis for data reaching ``value``: to the round top above it where that is within
    AXIS_MARGIN of it, else AXIS_MARGIN past it; ticks a fifth of the round top apart.
    ``cap``: no axis runs past it (a share that cannot pass 100%)."""
    top = nice_ceiling(value) if cap is None else min(cap, nice_ceiling(value))
    step = top / TICK_INTERVALS
    if value <= 0 or top <= value * (1 + AXIS_MARGIN):
        return Axis(top, tuple(step * i for i in range(TICK_INTERVALS + 1)))
    end = value * (1 + AXIS_MARGIN)
    last = math.floor(end / step + 1e-9)
    return Axis(end, tuple(step * i for i in range(last + 1)))


def coinciding(runs: Sequence[PolicyRun]) -> list[str]:
    """For each run, what the legend says of its lines that are an earlier run's (the same
    points), and so drawn over that run's and hiding them; "" where none is."""
    notes: list[str] = []
    for index, run in enumerate(runs):
        twins = [_first_same(runs[:index], run, panel) for panel in ("allocation",
                                                                      "fragmentation")]
        allocation, fragmentation = (None if twin is None else twin.policy for twin in twins)
        if allocation is None and fragmentation is None:
            notes.append("")
        elif allocation == fragmentation:
            notes.append(f"the same lines as {allocation}, drawn over them")
        elif fragmentation is None:
            notes.append(f"the same allocation line as {allocation}, drawn over it")
        elif allocation is None:
            notes.append(f"the same fragmentation line as {fragmentation}, drawn over it")
        else:
            notes.append(f"the same allocation line as {allocation} and fragmentation "
                         f"line as {fragmentation}, drawn over them")
    return notes


def _first_same(earlier: Sequence[PolicyRun], run: PolicyRun, panel: str) -> PolicyRun | None:
    def line(each: PolicyRun) -> list[tuple[float, float]]:
        return [(s.arrived, getattr(s, panel)) for s in each.samples]

    drawn = line(run)
    return next((other for other in earlier if line(other) == drawn), None)


def percent_label(value: float) -> str:
    return f"{round(value * 100, 6):g}%"


def run_label(run: PolicyRun) -> str:
    return f"{run.policy} (nodes: {run.node_policy})"


def line_style(index: int) -> str:
    dash = f' stroke-dasharray="{DASHED}"' if index >= len(COLOURS) else ""
    return f'stroke="{COLOURS[index % len(COLOURS)]}"{dash}'


class Panel:
    """One chart: its place in the picture and the scales of its axes."""

    def __init__(self, index: int, x_axis: Axis, y_axis: Axis) -> None:
        self.left = index * PANEL_WIDTH + MARGIN_LEFT
        self.x_axis = x_axis
        self.y_axis = y_axis

    def x(self, value: float) -> float:
        return self.left + PLOT_WIDTH * value / self.x_axis.end

    def y(self, value: float) -> float:
        return MARGIN_TOP + PLOT_HEIGHT - PLOT_HEIGHT * value / self.y_axis.end

    def draw(self, title: str, y_label: str, lines: list[tuple[int, list[tuple[float, float]]]],
             ) -> list[str]:
        bottom = MARGIN_TOP + PLOT_HEIGHT
        right = self.left + PLOT_WIDTH
        parts = [f'<g class="panel" data-title="{escape(title)}">',
                 f'<text x="{self.left}" y="{MARGIN_TOP - 14}" font-weight="bold">'
                 f'{escape(title)}</text>']
        for y_tick in self.y_axis.ticks:
            y = self.y(y_tick)
            parts += [
                f'<line class="grid" x1="{self.left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" '
                f'stroke="#e0e0e0"/>',
                f'<text class="y-tick" x="{self.left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                f'{percent_label(y_tick)}</text>',
            ]
        for x_tick in self.x_axis.ticks:
            x = self.x(x_tick)
            parts += [
                f'<line class="grid" x1="{x:.1f}" y1="{MARGIN_TOP}" x2="{x:.1f}" y2="{bottom}" '
                f'stroke="#e0e0e0"/>',
                f'<text class="x-tick" x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">'
                f'{percent_label(x_tick)}</text>',
            ]
        parts += [
            f'<path class="axes" d="M{self.left},{MARGIN_TOP} V{bottom} H{right}" fill="none" '
            f'stroke="#333"/>',
            f'<text x="{self.left + PLOT_WIDTH / 2:.1f}" y="{PANEL_HEIGHT - 10}" '
            f'text-anchor="middle">arrived workload, % of GPU capacity</text>',
            f'<text transform="translate({self.left - 44},{MARGIN_TOP + PLOT_HEIGHT / 2:.1f}) '
            f'rotate(-90)" text-anchor="middle">{escape(y_label)}</text>',
        ]
        for index, points in lines:
            shown = " ".join(f"{self.x(x):.1f},{self.y(y):.1f}" for x, y in points)
            parts.append(f'<polyline class="series" data-series="{index}" points="{shown}" '
                         f'fill="none" stroke-width="2" {line_style(index)}/>')
        parts.append("</g>")
        return parts


def plot_svg(runs: Sequence[PolicyRun], title: str) -> str:
    """Allocation and fragmentation against the arrived workload, one line per run, and
    a legend: a standalone SVG document."""
    series = [thinned(run.samples, PLOT_POINTS) for run in runs]
    x_axis = axis_to(max((s.arrived for samples in series for s in samples), default=0))
    fragmentation_axis = axis_to(
        max((s.fragmentation for samples in series for s in samples), default=0), cap=1.0)
    allocation = Panel(0, x_axis, axis_to(1.0))
    fragmentation = Panel(1, x_axis, fragmentation_axis)
    width = 2 * PANEL_WIDTH
    height = PANEL_HEIGHT + 8 + LEGEND_ROW * len(runs)
    parts = [f'<svg xmlns="{SVG_NAMESPACE}" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
             f"<title>{escape(title)}</title>",
             f'<rect width="{width}" height="{height}" fill="white"/>']
    parts += allocation.draw(
        "GPU allocation", "allocated cores, % of all cards",
        [(i, [(s.arrived, s.allocation) for s in samples]) for i, samples in enumerate(series)])
    parts += fragmentation.draw(
        "Fragmentation", "fragmented, % of GPU capacity",
        [(i, [(s.arrived, s.fragmentation) for s in samples])
         for i, samples in enumerate(series)])
    parts.append('<g class="legend">')
    for index, (run, note) in enumerate(zip(runs, coinciding(runs), strict=True)):
        y = PANEL_HEIGHT + 8 + LEGEND_ROW * index + LEGEND_ROW / 2
        # A line the same as an earlier run's hides it: said, or the earlier run would
        # seem missing from the panel.
        label = f"{run_label(run)}: {note}" if note else run_label(run)
        parts += [f'<line x1="{MARGIN_LEFT}" y1="{y}" x2="{MARGIN_LEFT + 28}" y2="{y}" '
                  f'stroke-width="2" {line_style(index)}/>',
                  f'<text x="{MARGIN_LEFT + 36}" y="{y + 4}">{escape(label)}</text>']
    parts += ["</g>", "</svg>"]
    return "\n".join(parts) + "\n"


def plot_html(runs: Sequence[PolicyRun], title: str, *, namespaces: bool = False) -> str:
    """The SVG in a page with its title and a legend that adds each run's totals; with
    ``namespaces``, then each run's pods by namespace, as the by-namespace table."""
    rows = "\n".join(
        f'<tr><td><svg width="28" height="10"><line x1="0" y1="5" x2="28" y2="5" '
        f'stroke-width="2" {line_style(index)}/></svg></td>'
        f"<td>{escape(run.policy)}</td><td>{escape(run.node_policy)}</td>"
        f"<td>{run.placed} of {run.pods}</td><td>{share(run.peak_allocation)}</td>"
        f"<td>{share(allocation_at_arrived(run.samples, 1.0))}</td></tr>"
        for index, run in enumerate(runs))
    by_namespace = ""
    if namespaces:
        heads = "".join(f"<th>{escape(name)}</th>" for name in ("policy", "namespace",
                                                                  *NAMESPACE_COUNTS))
        cells = "\n".join(
            f"<tr><td>{escape(run.policy)}</td><td>{escape(namespace)}</td>"
            f"<td>{tally.pods}</td><td>{tally.placed}</td><td>{tally.refused_for_quota}</td>"
            f"<td>{tally.refused_otherwise}</td></tr>"
            for run in runs for namespace, tally in run.by_namespace.items())
        by_namespace = f"""<h2>Pods by namespace</h2>
<table class="namespaces">
<tr>{heads}</tr>
{cells}
</table>
"""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; margin-top: 1em; }}
th, td {{ padding: 0.2em 0.8em; text-align: left; }}
</style>
</head>
<body>
<h1>{escape(title)}</h1>
{plot_svg(runs, title)}<table class="legend">
<tr><th></th><th>policy</th><th>node policy</th><th>placed</th><th>peak allocation</th>
<th>allocation at 100% arrived</th></tr>
{rows}
</table>
{by_namespace}</body>
</html>
"""
