"""``pyhami explain``: one pod's selection path, from a running daemon or a cluster file."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.markup import escape

from common.arguments import Subcommands, add_policy_defaults, defaults_from
from common.files import InputFileError
from pyhami.decide import decide_files
from pyhami.demo import selection_path


def register(commands: Subcommands) -> None:
    parser = commands.add_parser("explain", help="draw one pod's selection path")
    parser.add_argument("pod", type=Path, help="Pod manifest (YAML or JSON)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--daemon", metavar="URL", help="a running pyhami scheduler")
    source.add_argument("--cluster", type=Path, help="a cluster file, as pyhami decide reads")
    add_policy_defaults(parser)
    parser.set_defaults(handler=run)


async def _from_daemon(url: str, pod: Path) -> dict[str, Any]:
    try:
        body = pod.read_bytes()
    except OSError as error:
        raise InputFileError(f"{pod}: {error.strerror or error}") from None
    async with aiohttp.ClientSession() as http, http.post(
        f"{url.rstrip('/')}/explain", data=body, headers={"Content-Type": "application/yaml"}
    ) as response:
        if response.status != 200:
            raise InputFileError(f"{url}: {response.status} {(await response.text()).strip()}")
        document: dict[str, Any] = await response.json()
        return document


def run(args: argparse.Namespace, console: Console | None = None) -> int:
    out = console or Console()
    try:
        if args.daemon is not None:
            document = asyncio.run(_from_daemon(args.daemon, args.pod))
        else:
            document = decide_files(args.cluster, args.pod, defaults_from(args), explain=True)
    except InputFileError as error:
        print(f"pyhami explain: {error}", file=sys.stderr)
        return 2
    except aiohttp.ClientError as error:
        print(f"pyhami explain: {args.daemon}: {error}", file=sys.stderr)
        return 1
    if document.get("reason"):
        out.print(f"[yellow]not schedulable[/]: {escape(document['reason'])}")
        return 0
    if document["node"] is None and document["scheduled"]:
        out.print("the pod asks for no nvidia.com resource: pyhami leaves it to kube-scheduler")
        return 0
    out.print(selection_path(document))
    if document["node"] is not None:
        cards = ", ".join(f"GPU {c['index']}" for cs in document["devices"] for c in cs)
        out.print(f"-> [green]{cards} on {document['node']}[/]")
    else:
        # The sentence of the pod's FilteringFailed Event, word for word.
        out.print(f"-> [yellow]Pending[/]: {escape(document['message'])}")
    return 0
