"""How the commands print: ``--output table|json``, and tables that fit a terminal but are
printed whole in a pipe.

On a terminal rich lays a table out for the window. In a pipe or a file there is no
window: rich would assume 80 columns and cut or fold what does not fit, so there the
console is as wide as the widest line needs and prints no colours (``plain_console``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

OUTPUTS = ("table", "json")
# Wide enough for any line a table holds: rich lays tables out at their natural width.
UNBOUNDED_WIDTH = 1_000_000


def add_output_argument(parser: argparse.ArgumentParser, default: str, meaning: str) -> None:
    parser.add_argument("-o", "--output", choices=OUTPUTS, default=default,
                        help=f"{meaning} (default: {default})")


def stdout_console(file: TextIO | None = None) -> Console:
    """Rich on a terminal; elsewhere plain text, every column whole."""
    console = Console(file=file)
    if console.is_terminal:
        return console
    return Console(file=file, width=UNBOUNDED_WIDTH, color_system=None, highlight=False)


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
    if not document.get("gpu", True):
        console.print(Text(document["note"]))
        return
    if document.get("explain"):
        console.print(selection_path(document))
    if document["node"] is not None:
        cards = ", ".join(f"GPU {c['index']}" for cs in document["devices"] for c in cs)
        console.print(Text.assemble("-> ", (f"{cards} on {document['node']}", "green")))
        return
    # The sentence of the pod's FilteringFailed Event, word for word.
    console.print(Text.assemble("-> ", ("Pending", "yellow"), ": ", document["message"]))


def selection_path(document: dict[str, Any]) -> Table:
    """The article's figure as a table: every card, its score, what removed it, its rank."""
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
    return table
