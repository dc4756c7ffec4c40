"""``pyhami nats-auth``: the credentials of pyhami's NATS, without Kubernetes.

``init DIR`` writes the issuer NKey seed the daemon signs auth callout answers
with, the daemon's and the watchers' passwords and a nats-server configuration
naming them (docs/security.md), and with ``--cluster N`` one configuration per
server of a routed cluster, each with the same auth callout; ``agent-token``
mints the token that lets one node's agent publish that node's inventory. On
Kubernetes the agents use their projected ServiceAccount tokens instead, and the
chart makes the rest.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from common.arguments import Subcommands
from common.busaccess import (
    DAEMON_PASSWORD,
    ISSUER_PUBLIC,
    ISSUER_SEED,
    WATCH_PASSWORD,
    BusCredentials,
    CredentialsError,
    ServerTls,
)
from common.core.annotations import comma_list
from common.core.names import InvalidName, check_subdomain
from common.files import PRIVATE_MODE, write_files
from common.natsjwt import JwtError, node_token, signer_from_seed

SERVER_CONFIG = "nats.conf"
FILES = (ISSUER_SEED, ISSUER_PUBLIC, DAEMON_PASSWORD, WATCH_PASSWORD, SERVER_CONFIG)
# The TLS files ``pyhami certs init`` writes, which the server configuration names.
TLS_FILES = ("nats.pem", "nats.key", "ca.pem")
DEFAULT_TOKEN_DAYS = 365
CLUSTER_NAME = "pyhami"
ROUTE_USER = "pyhami-route"
FIRST_ROUTE_PORT = 6222
CLUSTER_SIZES = (3, 5)


def cluster_config_name(index: int) -> str:
    """The configuration file of the cluster's server ``index`` (from 1)."""
    return f"nats-{index}.conf"


def route_list(text: str) -> list[tuple[str, int]]:
    """``--routes``: HOST:PORT entries, one per server, in the servers' order."""
    routes = []
    for entry in comma_list(text):
        host, colon, port = entry.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise argparse.ArgumentTypeError(f"{entry!r} is not HOST:PORT")
        routes.append((host, int(port)))
    return routes


def register(commands: Subcommands) -> None:
    parser = commands.add_parser("nats-auth", help="make the credentials of pyhami's NATS "
                                 "(compose and standalone)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = actions.add_parser("init", help="write the issuer key, passwords and a nats-server "
                              "configuration into DIR")
    init.add_argument("directory", metavar="DIR",
                      help="the folder to write into (made if missing)")
    init.add_argument("--tls", metavar="CERTS_DIR",
                      help="serve TLS with the nats.pem, nats.key and ca.pem of this folder "
                           "(written by `pyhami certs init`; give the path the server sees)")
    init.add_argument("--verify-clients", action="store_true",
                      help="with --tls: every client must present a certificate the CA "
                           "signed (mutual TLS)")
    init.add_argument("--agents", metavar="NODE[,NODE...]", type=comma_list, default=[],
                      help="also mint the tokens of these nodes' agents, each into "
                           "DIR/NODE.token")
    init.add_argument("--days", type=int, default=DEFAULT_TOKEN_DAYS,
                      help=f"validity of the --agents tokens (default {DEFAULT_TOKEN_DAYS})")
    init.add_argument("--cluster", metavar="N", type=int, choices=CLUSTER_SIZES,
                      help="also write the configurations of a cluster of N (3 or 5) servers, "
                           "DIR/nats-1.conf ... nats-N.conf: routes between them, each with "
                           "the auth callout (docs/security.md, A cluster of three)")
    init.add_argument("--routes", metavar="HOST:PORT,...", type=route_list,
                      help="with --cluster: where each server listens for the others' routes, "
                           "in order (default 127.0.0.1:6222, 127.0.0.1:6223, ...: all on "
                           "this machine)")
    existing = init.add_mutually_exclusive_group()
    existing.add_argument("--force", action="store_true", help="replace existing files")
    existing.add_argument("--keep-existing", action="store_true",
                          help="leave a complete existing set as it is and succeed")
    init.set_defaults(handler=run_init)
    token = actions.add_parser("agent-token", help="mint the token of one node's agent")
    token.add_argument("directory", metavar="DIR", nargs="?", default=".",
                       help=f"the folder `init` wrote: its {ISSUER_SEED} signs the token "
                            "(default: the current folder)")
    token.add_argument("--issuer-seed", metavar="FILE",
                       help=f"the issuer seed to sign with, when it is not DIR/{ISSUER_SEED} "
                            f"(default DIR/{ISSUER_SEED})")
    token.add_argument("--node", required=True, help="the node the agent speaks for")
    token.add_argument("--days", type=int, default=DEFAULT_TOKEN_DAYS,
                       help=f"validity (default {DEFAULT_TOKEN_DAYS})")
    # Not --output: every command's PYHAMI_OUTPUT is the table/json switch, which would
    # have named the token's file.
    token.add_argument("--token-file", metavar="FILE",
                       help="write the token to FILE (mode 0600), which the agent's "
                            "--nats-token-file reads (default: print it)")
    token.set_defaults(handler=run_agent_token)


def _fail(message: str) -> int:
    print(f"pyhami nats-auth: {message}", file=sys.stderr)
    return 2


def _write_secrets(contents: Mapping[Path, str]) -> None:
    """Mode 0600, each written whole, moved into place in the order given."""
    write_files({path: text.encode() for path, text in contents.items()},
                dict.fromkeys(contents, PRIVATE_MODE))


def run_init(args: argparse.Namespace) -> int:
    directory = Path(args.directory)
    if directory.exists() and not directory.is_dir():
        return _fail(f"{directory} exists and is not a folder")
    if args.days < 1:
        return _fail(f"--days: {args.days} must be at least 1")
    for node in args.agents:
        try:
            check_subdomain("--agents", node)
        except InvalidName as error:
            return _fail(str(error))
    routes: list[tuple[str, int]] = []
    if args.cluster is not None:
        routes = args.routes or [("127.0.0.1", FIRST_ROUTE_PORT + index)
                                 for index in range(args.cluster)]
        if len(routes) != args.cluster:
            return _fail(f"--routes: {len(routes)} entries for --cluster {args.cluster}: give "
                         "one HOST:PORT per server")
        if len(set(routes)) != len(routes):
            return _fail("--routes: an entry is given twice; each server needs its own")
    elif args.routes is not None:
        return _fail("--routes needs --cluster")
    expected = FILES + tuple(cluster_config_name(index + 1) for index in range(len(routes)))
    present = [name for name in expected if (directory / name).exists()]
    written: dict[Path, str] = {}
    if present and args.keep_existing and len(present) == len(expected):
        try:
            credentials = BusCredentials.read(directory)
        except CredentialsError as error:
            return _fail(f"{error} (--force makes a new set)")
        print(f"{directory}: NATS credentials already there; kept")
    else:
        if present and not args.force:
            return _fail(f"{directory} already holds {', '.join(present)}: --force replaces "
                         "them" + ("" if len(present) == len(expected) else
                                   " (the set is incomplete, so --keep-existing cannot keep it)"))
        if args.verify_clients and not args.tls:
            return _fail("--verify-clients needs --tls")
        tls = None
        if args.tls:
            certs = Path(args.tls)
            missing = [name for name in TLS_FILES if not (certs / name).is_file()]
            if missing:
                return _fail(f"--tls {certs}: {', '.join(missing)} missing "
                             "(run `pyhami certs init` first)")
            tls = ServerTls(cert=certs / "nats.pem", key=certs / "nats.key",
                            ca=certs / "ca.pem", verify_clients=args.verify_clients)
        credentials = BusCredentials.new()
        stored = credentials.stored()
        written.update({directory / name: stored[name].decode()
                        for name in (ISSUER_SEED, DAEMON_PASSWORD, WATCH_PASSWORD)})
        written[directory / SERVER_CONFIG] = credentials.server_config(tls)
        # Routes are authenticated too: whoever reached a route port unasked would join as a
        # server and receive every message.
        route_password = secrets.token_urlsafe(24)
        for index in range(len(routes)):
            written[directory / cluster_config_name(index + 1)] = (
                credentials.server_config(tls) + cluster_block(index, routes, route_password))
        # Moved into place after the rest of the set: a complete set is what
        # --keep-existing keeps.
        written[directory / ISSUER_PUBLIC] = stored[ISSUER_PUBLIC].decode()
    now = int(time.time())
    for node in args.agents:
        path = directory / f"{node}.token"
        if not (path.exists() and args.keep_existing):
            written[path] = node_token(node, credentials.signer, now,
                                       now + args.days * 86400) + "\n"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _write_secrets(written)
    except OSError as error:
        return _fail(f"{directory}: cannot write the credentials: {error.strerror or error}")
    for path in written:
        print(f"wrote {path}")
    print(next_steps(directory, args))
    return 0


def next_steps(directory: Path, args: argparse.Namespace) -> str:
    """What to run with the set just written, all on this machine: the commands a user
    would otherwise piece together from three docs."""
    configs = ([directory / cluster_config_name(index + 1) for index in range(args.cluster)]
               if args.cluster else [directory / SERVER_CONFIG])
    scheme = "tls" if args.tls else "nats"
    url = ",".join(f"{scheme}://127.0.0.1:{4222 + index}" for index in range(len(configs)))
    client = f" --nats-ca {Path(args.tls) / 'ca.pem'}" if args.tls else ""
    if args.verify_clients:
        client += " --nats-cert CLIENT.pem --nats-key CLIENT.key"
    servers = [f"  nats-server --config {config} --jetstream --store_dir "
               f"{directory / 'jetstream'}" + (f"-{index + 1} --port {4222 + index}"
                                                 if len(configs) > 1 else "")
               for index, config in enumerate(configs)]
    node, token = ((args.agents[0], directory / f"{args.agents[0]}.token") if args.agents
                   else ("NODE", Path("NODE.token")))
    return "\n".join([
        "Next (docs/security.md):",
        *servers,
        f"  pyhami scheduler --standalone --nats {url}{client} --nats-auth-dir {directory}",
        *([] if args.agents else [
            f"  pyhami nats-auth agent-token {directory} --node NODE --token-file {token}"]),
        f"  pyhami agent --node {node} --nats {url}{client} --nats-token-file {token} "
        "--inventory nvml",
    ])


def cluster_block(index: int, routes: list[tuple[str, int]], password: str) -> str:
    """The part of server ``index``'s configuration that joins it to the others: its name
    (JetStream's peers are named, so it must stay the same across restarts), where it
    listens for routes, and the routes to every other server, all under one password."""
    host, port = routes[index]
    others = [f"nats-route://{ROUTE_USER}:{password}@{other_host}:{other_port}"
              for other, (other_host, other_port) in enumerate(routes) if other != index]
    lines = [
        f"server_name: {json.dumps(f'{CLUSTER_NAME}-{index + 1}')}",
        "cluster {",
        f"  name: {json.dumps(CLUSTER_NAME)}",
        f"  listen: {json.dumps(f'{host}:{port}')}",
        "  authorization {",
        f"    user: {json.dumps(ROUTE_USER)}",
        f"    password: {json.dumps(password)}",
        "  }",
        "  routes: [",
        *(f"    {json.dumps(route)}" for route in others),
        "  ]",
        "}",
    ]
    return "\n".join(lines) + "\n"


def run_agent_token(args: argparse.Namespace) -> int:
    if args.days < 1:
        return _fail(f"--days: {args.days} must be at least 1")
    seed_path = Path(args.issuer_seed or Path(args.directory) / ISSUER_SEED)
    try:
        signer = signer_from_seed(seed_path.read_bytes(), f"--issuer-seed {seed_path}")
        now = int(time.time())
        token = node_token(args.node, signer, now, now + args.days * 86400)
    except OSError as error:
        hint = "" if args.issuer_seed else (
            " (give the folder `pyhami nats-auth init` wrote, or --issuer-seed FILE)")
        flag = "--issuer-seed: " if args.issuer_seed else ""
        return _fail(f"{flag}{seed_path}: {error.strerror or error}{hint}")
    except (JwtError, InvalidName) as error:
        return _fail(str(error))
    if args.token_file:
        try:
            _write_secrets({Path(args.token_file): token + "\n"})
        except OSError as error:
            return _fail(f"--token-file: {args.token_file}: {error.strerror or error}")
        print(f"wrote {args.token_file}")
    else:
        print(token)
    return 0
