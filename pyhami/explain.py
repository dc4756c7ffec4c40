"""``pyhami explain``: one pod's selection path, from a running daemon or a cluster file."""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console

from common.arguments import Subcommands, add_policy_defaults, defaults_from
from common.core.errors import SettingsError
from common.deviceconfig import add_device_config_argument, device_config_from
from common.files import InputFileError
from pyhami.decide import decide_files
from pyhami.output import add_output_argument, print_decision, print_json, stdout_console


def register(commands: Subcommands) -> None:
    parser = commands.add_parser("explain", help="draw one pod's selection path")
    parser.add_argument("pod", type=Path, help="Pod manifest (YAML or JSON)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--daemon", metavar="URL", help="a running pyhami scheduler")
    source.add_argument("--cluster", type=Path, help="a cluster file, as pyhami decide reads")
    tls = parser.add_argument_group(
        "daemon over HTTPS", "for a daemon serving its extender with --extender-cert-file")
    tls.add_argument("--daemon-ca", metavar="FILE",
                     help="the CA that signed the daemon's certificate (default: the system's)")
    tls.add_argument("--daemon-cert", metavar="FILE",
                     help="a client certificate, for a daemon that asks for one "
                          "(--extender-client-ca-file), with --daemon-key")
    tls.add_argument("--daemon-key", metavar="FILE", help="the private key of --daemon-cert")
    add_policy_defaults(parser)
    add_device_config_argument(parser)
    add_output_argument(parser, "table", "table: the selection path; json: the decision "
                                          "document, as pyhami decide prints it")
    parser.set_defaults(handler=run)


def client_tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The context for an https:// daemon; raises ``SettingsError`` naming the flag."""
    if (args.daemon_cert is None) != (args.daemon_key is None):
        raise SettingsError("--daemon-cert and --daemon-key go together")
    if args.daemon_ca is None and args.daemon_cert is None:
        return None
    try:
        context = ssl.create_default_context(cafile=args.daemon_ca)
    except (OSError, ssl.SSLError) as error:
        raise SettingsError(f"--daemon-ca {args.daemon_ca}: {error}") from None
    if args.daemon_cert is not None:
        try:
            context.load_cert_chain(args.daemon_cert, args.daemon_key)
        except (OSError, ssl.SSLError) as error:
            raise SettingsError(f"--daemon-cert {args.daemon_cert} with --daemon-key "
                                f"{args.daemon_key}: {error}") from None
    return context


async def _from_daemon(url: str, pod: Path, tls: ssl.SSLContext | None) -> dict[str, Any]:
    try:
        body = pod.read_bytes()
    except OSError as error:
        raise InputFileError(f"{pod}: {error.strerror or error}") from None
    connector = aiohttp.TCPConnector(ssl=tls if tls is not None else True)
    async with aiohttp.ClientSession(connector=connector) as http, http.post(
        f"{url.rstrip('/')}/explain", data=body, headers={"Content-Type": "application/yaml"}
    ) as response:
        if response.status != 200:
            raise InputFileError(f"{url}: {response.status} {(await response.text()).strip()}")
        document: dict[str, Any] = await response.json()
        return document


def run(args: argparse.Namespace, console: Console | None = None) -> int:
    try:
        device = device_config_from(args)  # checked with a daemon too: a bad file is refused
        if args.daemon is not None:
            document = asyncio.run(_from_daemon(args.daemon, args.pod, client_tls(args)))
        else:
            document = decide_files(args.cluster, args.pod, defaults_from(args, device),
                                    explain=True)
    except (InputFileError, SettingsError) as error:
        print(f"pyhami explain: {error}", file=sys.stderr)
        return 2
    except aiohttp.ClientError as error:
        print(f"pyhami explain: {args.daemon}: {error}", file=sys.stderr)
        return 1
    if args.output == "json":
        print_json(document)
    else:
        print_decision(document, console or stdout_console())
    return 0
