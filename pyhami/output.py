"""How every command prints: one output policy, chosen from where the output goes.

- **A terminal** (a tty, ``TERM`` not ``dumb``): rich lays tables out for the window
  (``COLUMNS`` where set, else the window's width), with colours unless ``NO_COLOR`` is
  set, and live views and progress bars redraw in place. A table wider than the window
  wraps its cells at their spaces, or where that is not enough is stacked
  (:class:`FittedTable`): one block of ``column  value`` lines per row, every value
  whole, never cut short.
- **A dumb terminal** (``TERM=dumb``): the same width, but no colours, no cursor moves,
  no live views and no progress bars.
- **A pipe or a file**: there is no window. Each table is printed as wide as its content
  needs, whole; an element with no width of its own (a rule between sections) is as wide
  as the widest table printed before it, and at least 80 columns (``COLUMNS`` where set).
  No colours, no cursor moves, no progress bars.

JSON output does not go through rich at all: one document, or one object per line.

When the reader of stdout goes away (``| head -1``), ``pyhami.cli`` ends the command
quietly: see :func:`stdout_reader_gone` and :data:`READER_GONE_EXIT`.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import errno
import json
import os
import select
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from rich.console import Console, ConsoleOptions, NewLine, RenderableType, RenderResult
from rich.measure import Measurement
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

OUTPUTS = ("table", "json")
# The width of a rule in a pipe where no table is wider and COLUMNS is not set.
PLAIN_RULE_WIDTH = 80
# What a pipe's console is laid out in: wider than any line, so that measuring a table
# gives its natural width; every print then narrows to what it measured.
_UNBOUNDED_WIDTH = 1_000_000
# A shell's status for a command killed by SIGPIPE: what a command cut short by its
# reader going away exits with, as `yes | head -1` leaves `yes`.
READER_GONE_EXIT = 128 + signal.SIGPIPE


@dataclass(frozen=True)
class OutputPolicy:
    """Where a command's output goes and what it may do there."""

    terminal: bool
    """A window to lay tables out for (a tty, dumb or not)."""
    interactive: bool
    """Cursor moves allowed: live views and progress bars redraw in place."""
    color: bool
    """ANSI colours allowed."""
    columns: int | None
    """``COLUMNS`` where set to a positive number."""

    @classmethod
    def for_stream(cls, stream: TextIO,
                   environ: Mapping[str, str] | None = None) -> OutputPolicy:
        env = os.environ if environ is None else environ
        raw = env.get("COLUMNS", "")
        columns = int(raw) if raw.isdigit() and int(raw) > 0 else None
        if not _isatty(stream):
            return cls(terminal=False, interactive=False, color=False, columns=columns)
        dumb = env.get("TERM", "").lower() == "dumb"
        return cls(terminal=True, interactive=not dumb,
                   color=not dumb and not env.get("NO_COLOR"), columns=columns)

    def console(self, file: TextIO | None = None) -> Console:
        """A rich console that prints to ``file`` (default stdout) as this policy says."""
        if not self.terminal:
            return ContentWidthConsole(file, self.columns or PLAIN_RULE_WIDTH)
        if self.interactive:
            # rich reads COLUMNS itself, and the window's width again after a resize.
            return _Console(file=file, force_terminal=True, force_interactive=True,
                            no_color=not self.color)
        return _Console(file=file, force_terminal=False, force_interactive=False,
                        color_system=None, highlight=False,
                        width=self.columns or _window_width(file or sys.stdout))


class _Console(Console):
    """rich's console, but a closed pipe is raised as BrokenPipeError, so that the command
    stops what it started on the way out and ``pyhami.cli`` ends it quietly (rich's own
    answer is SystemExit(1))."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more is written, not even a last frame
        raise BrokenPipeError(errno.EPIPE, "stdout's reader has gone")


class ContentWidthConsole(_Console):
    """A console for a pipe or a file: every print as wide as its content needs.

    A renderable with a natural width (text, a table) is printed at that width, whole; one
    without (a rule) at the width of the widest table printed so far, and at least
    ``rule_width``. Nothing is coloured and nothing moves the cursor.
    """

    def __init__(self, file: TextIO | None, rule_width: int) -> None:
        super().__init__(file=file, width=_UNBOUNDED_WIDTH, color_system=None,
                         highlight=False, force_terminal=False, force_interactive=False)
        self._rule_width = rule_width
        self._widest_table = 0

    def print(self, *objects: Any, width: int | None = None, **options: Any) -> None:
        if width is None:
            width = self._width_of(objects)
        super().print(*objects, width=width, **options)

    def _width_of(self, objects: tuple[Any, ...]) -> int:
        fallback = max(self._rule_width, self._widest_table)
        if not objects:
            return fallback
        if any(isinstance(item, Rule) for item in objects):  # as wide as it is given
            return fallback
        measured = [Measurement.get(self, self.options, item).maximum for item in objects]
        if any(width >= _UNBOUNDED_WIDTH for width in measured):  # no width of its own
            return fallback
        natural = max(1, sum(measured) + len(objects) - 1)  # objects are joined by spaces
        if any(isinstance(item, (Table, FittedTable)) for item in objects):
            self._widest_table = max(self._widest_table, natural)
        return natural


class FittedTable:
    """A table printed whole at the width: as it is where it fits, its cells wrapped at
    their spaces where that is enough (:func:`laid_out`), else stacked (:func:`stacked`).

    Narrower than its content, rich alone would cut cells short (``mutex,bi…``, ``0.0…``,
    a number cut to one digit), fold words apart or drop columns. Stacked, each row is a
    block of ``column  value`` lines, blocks apart by a blank line, every value whole: a
    value longer than the line wraps at its spaces, and only a single word longer than
    the whole line is folded. In a pipe a table is as wide as its content: it fits.
    """

    def __init__(self, table: Table) -> None:
        self.table = table

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.table)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        whole = laid_out(self.table, console, options)
        if whole is not None:
            yield whole
            return
        yield from stacked(self.table)


def laid_out(table: Table, console: Console, options: ConsoleOptions) -> Table | None:
    """``table`` as it prints in ``options.max_width`` with every cell whole, or None
    where it cannot: each column at least as wide as its widest cell where it may not
    wrap, and as its longest word where it may (a column's own ``max_width`` is its
    choice to cut). The table itself where it fits unnarrowed."""
    unbounded = options.update_width(_UNBOUNDED_WIDTH)
    if Measurement.get(console, unbounded, table).maximum <= options.max_width:
        return table
    # rich narrows a table by sharing the excess out without regard to the words, then
    # cuts, drops or crops columns: the widths are chosen here instead, and fixed. The
    # measures are rich's own, as Table.__rich_console__ takes them (rich 15): widths
    # with the cells' padding, the rules between columns apart.
    available = options.max_width - table._extra_width
    ranges = [table._measure_column(console, unbounded, column) for column in table.columns]
    widths = [measure.maximum if column.no_wrap else measure.minimum
              for column, measure in zip(table.columns, ranges, strict=True)]
    slack = available - sum(widths)
    if slack < 0:
        return None
    # The room left goes to the wrapping columns, those that need least to be whole on
    # one line first.
    for index in sorted(range(len(widths)), key=lambda i: ranges[i].maximum - widths[i]):
        more = min(slack, ranges[index].maximum - widths[index])
        widths[index] += more
        slack -= more
    narrowed = copy.copy(table)
    narrowed.columns = [
        dataclasses.replace(column, width=width - table._get_padding_width(column._index))
        for column, width in zip(table.columns, widths, strict=True)]
    return narrowed


def stacked(table: Table) -> list[RenderableType]:
    """``table`` as one block of ``header  value`` lines per row (its title first)."""
    parts: list[RenderableType] = []
    if table.title:
        parts.append(table.title if isinstance(table.title, Text)
                     else Text(str(table.title), style="bold"))
    rows = zip(*(list(column.cells) for column in table.columns), strict=True)
    for number, cells in enumerate(rows):
        block = Table.grid(padding=(0, 2))
        block.add_column(style="dim", no_wrap=True)
        block.add_column(overflow="fold")
        for column, cell in zip(table.columns, cells, strict=True):
            if cell == "" or (isinstance(cell, Text) and not cell.plain):
                continue  # nothing to say: a blank header stays blank too
            block.add_row(column.header, cell)
        if number:
            parts.append(NewLine())
        parts.append(block)
    return parts


def fitted(table: Table) -> FittedTable:
    """A result table as every command prints it: see :class:`FittedTable`."""
    return FittedTable(table)


def stdout_console(file: TextIO | None = None) -> Console:
    """The console for a command's results: on stdout, or on ``file`` as if it were."""
    return OutputPolicy.for_stream(file or sys.stdout).console(file)


def stderr_console() -> Console | None:
    """A console for progress bars on stderr, or None where they cannot redraw in place."""
    policy = OutputPolicy.for_stream(sys.stderr)
    return policy.console(sys.stderr) if policy.interactive else None


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has closed it.

    Told from the descriptor itself, so that a broken pipe elsewhere (a socket to a
    daemon) is not mistaken for the reader leaving.
    """
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return False
    poller = select.poll()
    poller.register(descriptor, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that nothing (the interpreter's last flush included)
    writes to a pipe whose reader is gone and reports it on stderr."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def add_output_argument(parser: argparse.ArgumentParser, default: str, meaning: str) -> None:
    parser.add_argument("-o", "--output", choices=OUTPUTS, default=default,
                        help=f"{meaning} (default: {default})")


def print_json(document: Any, file: TextIO | None = None, *, indent: int | None = 2) -> None:
    out = file if file is not None else sys.stdout
    out.write(json.dumps(document, indent=indent) + "\n")
    out.flush()


def print_decision(document: dict[str, Any], console: Console) -> None:
    """A decision document (``pyhami decide``'s JSON) as ``pyhami explain`` draws it: the
    selection path when the document has one, then the outcome. Reasons are printed as
    text, never read as rich markup (they hold brackets: ``limits[nvidia.com/gpu]``)."""
    if document.get("reason"):
        console.print(Text.assemble(("not schedulable", "yellow"), f": {document['reason']}"))
        return
    # Figures read otherwise than written (a share above 100 read as 100): said first,
    # as the RequestAdjusted Event says them.
    for warning in document.get("warnings", ()):
        console.print(Text.assemble(("warning", "yellow"), f": {warning}"))
    if not document.get("gpu", True):
        console.print(Text(document["note"]))
        return
    if document.get("explain"):
        console.print(selection_path(document))
    if document["node"] is not None:
        cards = ", ".join(_card_words(c) for cs in document["devices"] for c in cs)
        console.print(Text.assemble("-> ", (f"{cards} on {document['node']}", "green")))
        return
    # The sentence ending the pod's FilteringFailed summary Event, word for word.
    console.print(Text.assemble("-> ", ("Pending", "yellow"), ": ", document["message"]))


def _card_words(device: dict[str, Any]) -> str:
    """``GPU 0``, or on a MIG card ``GPU 0 (MIG 1g.10gb at slice 6)``."""
    mig = device.get("mig")
    if mig is None:
        return f"GPU {device['index']}"
    return f"GPU {device['index']} (MIG {mig['profile']} at slice {mig['placement']['start']})"


def selection_path(document: dict[str, Any]) -> FittedTable:
    """The article's figure as a table: every card, its score, what removed it, its rank
    (stacked, a card a block, on a terminal too narrow for it)."""
    rows = document.get("explain", ())
    several_nodes = len({row["node"] for row in rows}) > 1
    table = Table(show_edge=False, pad_edge=False, box=None, padding=(0, 1, 0, 2))
    if several_nodes:
        table.add_column("node", style="dim", no_wrap=True)
    for column in ("card", "tenants", "score", "filtered by", "rank", ""):
        table.add_column(column, no_wrap=True)
    for row in rows:
        cells = [f"GPU {row['index']}", str(row["used"]), f"{row['score']:.6f}",
                 row["filtered_by"] or "-", "-" if row["rank"] is None else str(row["rank"]),
                 "[bold green]<- chosen[/]" if row["chosen"] else ""]
        table.add_row(*([row["node"]] if several_nodes else []), *cells)
    return fitted(table)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or a stand-in without isatty
        return False


def _window_width(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns or PLAIN_RULE_WIDTH
    except (AttributeError, ValueError, OSError):
        return PLAIN_RULE_WIDTH
