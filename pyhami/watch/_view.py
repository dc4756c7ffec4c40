"""The model shown: rich tables for the terminal, JSON documents for ``--output json``.

Both read the nodes through ``nodes_at``, so the table and the snapshot list the same
cards in the same order and call the same nodes silent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
from rich import box
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from common.telemetry import DecisionEvent
from pyhami.output import fitted
from pyhami.watch._model import CardView, WatchModel, pending_reason, plural

MEMORY_BAR_WIDTH = 10
MEMORY_BARS_MIN_WIDTH = 90


@dataclass(frozen=True)
class NodeAt:
    """A node as it stands at a moment: its cards in index order, and whether it is silent."""

    name: str
    heard_at: float | None
    heard_ago: float | None
    silent: bool
    cards: list[CardView]


def nodes_at(model: WatchModel, now: float) -> list[NodeAt]:
    """The model's nodes by name, as both the table and the JSON snapshot show them."""
    return [NodeAt(name=node.name, heard_at=node.heard_at, heard_ago=node.heard_ago(now),
                   silent=node.is_silent(now),
                   cards=sorted(node.cards.values(), key=lambda card: card.index))
            for node in (model.nodes[name] for name in sorted(model.nodes))]


# The terminal view.


def render(model: WatchModel, now: float) -> RenderableType:
    return Snapshot(model, now)


class Snapshot:
    """The model as it stands at ``now``, laid out for the width it is printed at."""

    def __init__(self, model: WatchModel, now: float) -> None:
        self.model = model
        self.now = now

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from self._parts(options)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        """As wide as its widest part: in a pipe the snapshot is printed at that width."""
        widths = [Measurement.get(console, options, part) for part in self._parts(options)]
        return Measurement(max(width.minimum for width in widths),
                           max(width.maximum for width in widths))

    def _parts(self, options: ConsoleOptions) -> list[RenderableType]:
        model = self.model
        # A terminal's width is shared out: long values are cut short, and the memory bars
        # show only where they do not squeeze the other columns out of shape. Elsewhere
        # (a pipe, a file) every value is printed whole and the bars, mere pictures of the
        # numbers beside them, are left out.
        fit = options.is_terminal
        bars = fit and options.max_width >= MEMORY_BARS_MIN_WIDTH

        def fitting(part: RenderableType) -> RenderableType:
            # Narrower than a table, rich would cut numbers short or drop columns: its
            # cells wrap at their spaces instead, or it is stacked, a row a block
            # (pyhami.output.FittedTable).
            return fitted(part) if fit and isinstance(part, Table) else part

        parts: list[RenderableType] = [
            fitting(nodes_table(nodes_at(model, self.now), bars, fit)), Text(),
            fitting(decisions_table(model, fit))]
        if model.last_explained is not None:
            parts += [Text(), fitting(selection_path(model.last_explained))]
        return [*parts, Text(), footer(model)]


def titled_table(title: str) -> Table:
    return Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
                 show_edge=False, collapse_padding=True)


def nodes_table(nodes: list[NodeAt], bars: bool = True, fit: bool = True) -> RenderableType:
    if not nodes:
        return Text("nodes: none heard yet (agents were asked to report)", style="dim")
    table = titled_table("nodes")
    # On a narrow terminal the node's line, the type and the "used MiB" heading wrap at
    # their spaces (the table fits 80 columns with the lab's T4 cards); narrower still,
    # the table is stacked (see _parts). A type longer than 22 is cut short.
    table.add_column("node", overflow="ellipsis")
    table.add_column("GPU", justify="right", no_wrap=True)
    table.add_column("type", overflow="ellipsis", max_width=22 if fit else None)
    table.add_column("tenants", justify="right", no_wrap=True)
    table.add_column("booked MiB", justify="right", no_wrap=True)
    if bars:
        table.add_column("", no_wrap=True)
    table.add_column("used MiB", justify="right")
    table.add_column("util", justify="right", no_wrap=True)
    table.add_column("cores", justify="right", no_wrap=True)
    table.add_column("health", overflow="ellipsis", no_wrap=True, max_width=12 if fit else None)
    for node in nodes:
        labels = [Text(node.name, style="bold"), heard(node)]
        if len(node.cards) < len(labels):
            labels = [Text("\n").join(labels)]
        if not node.cards:
            table.add_row(labels[0], "", Text("no cards", style="dim"))
        for row, card in enumerate(node.cards):
            label = labels[row] if row < len(labels) else ""
            usage = card.usage
            cells: list[RenderableType] = [
                label, str(card.index), card_type(card.type),
                "-" if usage is None else f"{usage.tenants}/{card.count}",
                ("-" if usage is None else f"{usage.usedmem}/{card.memory}")
                + scaled_from(card.memory, card.physical_memory)]
            if bars:
                cells.append(memory_bar(usage.usedmem if usage else 0, card.memory))
            cells += [measured_memory(card), measured_utilization(card),
                      ("-" if usage is None else f"{usage.usedcores}/{card.cores}")
                      + scaled_from(card.cores, card.physical_cores), health(card)]
            table.add_row(*cells)
        table.add_section()
    return table


def measured_memory(card: CardView) -> Text:
    """The memory the agent measured in use on the card, yellow where it is more than the
    daemon booked there (a container beyond its slice, or a process pyhami did not place)."""
    figure = card.measured
    if figure is None or figure.memory_used is None:
        return Text("-", style="dim")
    booked = card.usage.usedmem if card.usage is not None else None
    style = "yellow" if booked is not None and figure.memory_used > booked else ""
    return Text(str(figure.memory_used), style=style)


def measured_utilization(card: CardView) -> str:
    figure = card.measured
    return "-" if figure is None or figure.utilization is None else f"{figure.utilization}%"


def scaled_from(registered: int, physical: int | None) -> str:
    """After a registered figure, the card's own and the factor HAMi's scaling applied
    (`` (15360 x2)``); nothing where the two are the same."""
    if physical is None or physical == registered:
        return ""
    if physical == 0:
        return " (0 own)"
    factor = f"{registered / physical:.2f}".rstrip("0").rstrip(".")
    return f" ({physical} x{factor})"


def card_type(name: str) -> str:
    """Older pyhami agents put the vendor before every NVML name, doubling it on newer cards
    ("NVIDIA-NVIDIA A100-SXM4-80GB"; HAMi's rule, and today's agents, write it once):
    show it once so that the model fits."""
    return name.removeprefix("NVIDIA-") if name.startswith("NVIDIA-NVIDIA ") else name


def heard(node: NodeAt) -> Text:
    if node.heard_ago is None:
        return Text("no report", style="dim")
    if node.silent:
        return Text(f"silent {node.heard_ago:.0f}s", style="bold red")
    return Text(f"heard {node.heard_ago:.0f}s ago", style="dim")


def memory_bar(used: int, total: int) -> Text:
    share = min(1.0, used / total) if total else 0.0
    filled = round(share * MEMORY_BAR_WIDTH)
    if used and not filled:
        filled = 1  # any use shows
    style = "green" if share < 0.7 else "yellow" if share < 0.9 else "red"
    return Text.assemble(("█" * filled, style), ("░" * (MEMORY_BAR_WIDTH - filled), "dim"))


def health(card: CardView) -> Text:
    if not card.health:
        return Text(card.health_detail or "unhealthy", style="bold red")
    if card.cordoned:
        return Text("cordoned", style="yellow")
    return Text("ok", style="green")


def decisions_table(model: WatchModel, fit: bool = True) -> RenderableType:
    if not model.decisions:
        return Text("decisions: none yet", style="dim")
    table = titled_table("recent decisions")
    table.add_column("time", no_wrap=True)
    table.add_column("pod", overflow="fold", max_width=32 if fit else None)
    table.add_column("result", overflow="fold")
    table.add_column("ms", justify="right", no_wrap=True)
    table.add_column("ignored", overflow="fold", max_width=16 if fit else None)
    for event in reversed(model.decisions):
        pod = Text(event.pod)
        if event.verb != "filter":
            pod.append(f" {event.verb}", style="dim")
        table.add_row(clock(event.timestamp), pod, outcome(event), f"{event.duration_ms:.1f}",
                      ", ".join(event.ignored_policies))
    return table


def clock(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%H:%M:%S")


def outcome(event: DecisionEvent) -> Text:
    if event.scheduled:
        indexes = ",".join(str(card.index) for cards in event.cards for card in cards)
        return Text(f"{event.node} GPU {indexes}", style="green")
    return Text.assemble(("Pending", "bold yellow"), f" ({pending_reason(event)})")


def selection_path(event: DecisionEvent) -> Table:
    table = titled_table(f"selection path of {event.pod} on {event.node}, "
                         f"{clock(event.timestamp)}")
    for column in ("GPU", "tenants", "score", "filtered by", "rank", ""):
        table.add_column(column, justify="right" if column in ("GPU", "tenants", "score",
                                                                 "rank") else "left")
    for row in event.explain:
        table.add_row(str(row.index), str(row.used), f"{row.score:.6f}", row.filtered_by or "-",
                      "-" if row.rank is None else str(row.rank),
                      Text("◀ chosen", style="bold green") if row.chosen else "")
    return table


def footer(model: WatchModel) -> Text:
    text = Text(f"{model.source} ", style="dim")
    text.append(model.connection, style="green" if model.connection == "connected" else "yellow")
    if model.connection != "connected" and model.connection_error:
        text.append(f" ({model.connection_error})", style="yellow")
    text.append(f" · {plural(len(model.nodes), 'node')}"
                f" · {plural(model.decisions_seen, 'decision')} seen, "
                f"{model.pending_seen} pending", style="dim")
    if model.undecodable:
        text.append(f" · {plural(model.undecodable, 'undecodable message')}", style="bold red")
    return text


# The JSON view (``--output json``): one object per line, its kind in "event".


def snapshot_document(model: WatchModel, now: float) -> dict[str, Any]:
    """What the table view shows at ``now``, whole (``--once --output json``)."""
    return {
        "event": "snapshot",
        "time": now,
        "source": model.source,
        "connection": model.connection,
        "nodes": [node_document(node) for node in nodes_at(model, now)],
        "decisions": [msgspec.to_builtins(event) for event in model.decisions],  # oldest first
        "decisions_seen": model.decisions_seen,
        "pending_seen": model.pending_seen,
        "undecodable": model.undecodable,
    }


def node_document(node: NodeAt) -> dict[str, Any]:
    return {
        "node": node.name,
        "heard_at": node.heard_at,
        "silent": node.silent,
        "cards": [card_document(card) for card in node.cards],
    }


def card_document(card: CardView) -> dict[str, Any]:
    usage = card.usage
    return {
        "uuid": card.uuid, "index": card.index, "type": card.type, "memory": card.memory,
        "cores": card.cores, "count": card.count, "health": card.health,
        "physical_memory": card.memory if card.physical_memory is None else card.physical_memory,
        "physical_cores": card.cores if card.physical_cores is None else card.physical_cores,
        "health_detail": card.health_detail, "cordoned": card.cordoned,
        "usage": None if usage is None else {
            "tenants": usage.tenants, "used": usage.used, "usedmem": usage.usedmem,
            "usedcores": usage.usedcores},
        "measured": None if card.measured is None else {
            "memory_used": card.measured.memory_used,
            "utilization": card.measured.utilization},
    }


def message_document(kind: str, message: msgspec.Struct) -> dict[str, Any]:
    """A message as heard (``--output json`` without --once): ``usage``, ``decision`` or
    ``inventory``, then the message's own fields."""
    fields: dict[str, Any] = msgspec.to_builtins(message)
    return {"event": kind, **fields}
