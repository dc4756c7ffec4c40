"""``pyhami nats-auth``: the credentials of pyhami's NATS, without Kubernetes.

``init DIR`` writes the issuer NKey seed the daemon signs auth callout answers
with, the daemon's and the watchers' passwords and a nats-server configuration
naming them (docs/security.md); ``agent-token`` mints the token that lets one
node's agent publish that node's inventory. On Kubernetes the agents use their
projected ServiceAccount tokens instead, and the chart makes the rest.
"""

from __future__ import annotations

import argparse
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
from common.core.natsjwt import JwtError, node_token, signer_from_seed
from common.files import PRIVATE_MODE, write_files

SERVER_CONFIG = "nats.conf"
FILES = (ISSUER_SEED, ISSUER_PUBLIC, DAEMON_PASSWORD, WATCH_PASSWORD, SERVER_CONFIG)
# The TLS files ``pyhami certs init`` writes, which the server configuration names.
TLS_FILES = ("nats.pem", "nats.key", "ca.pem")
DEFAULT_TOKEN_DAYS = 365


def register(commands: Subcommands) -> None:
    parser = commands.add_parser("nats-auth", help="make the credentials of pyhami's NATS "
                                 "(compose and standalone)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = actions.add_parser("init", help="write the issuer key, passwords and a nats-server "
                              "configuration into DIR")
    init.add_argument("directory", metavar="DIR")
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
    existing = init.add_mutually_exclusive_group()
    existing.add_argument("--force", action="store_true", help="replace existing files")
    existing.add_argument("--keep-existing", action="store_true",
                          help="leave a complete existing set as it is and succeed")
    init.set_defaults(handler=run_init)
    token = actions.add_parser("agent-token", help="mint the token of one node's agent")
    token.add_argument("--issuer-seed", metavar="FILE", required=True,
                       help=f"the {ISSUER_SEED} that `init` wrote")
    token.add_argument("--node", required=True, help="the node the agent speaks for")
    token.add_argument("--days", type=int, default=DEFAULT_TOKEN_DAYS,
                       help=f"validity (default {DEFAULT_TOKEN_DAYS})")
    token.add_argument("--output", metavar="FILE",
                       help="write the token to FILE (mode 0600) instead of printing it")
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
    present = [name for name in FILES if (directory / name).exists()]
    written: dict[Path, str] = {}
    if present and args.keep_existing and len(present) == len(FILES):
        try:
            credentials = BusCredentials.read(directory)
        except CredentialsError as error:
            return _fail(f"{error} (--force makes a new set)")
        print(f"{directory}: NATS credentials already there; kept")
    else:
        if present and not args.force:
            return _fail(f"{directory} already holds {', '.join(present)}: --force replaces "
                         "them" + ("" if len(present) == len(FILES) else
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
    return 0


def run_agent_token(args: argparse.Namespace) -> int:
    if args.days < 1:
        return _fail(f"--days: {args.days} must be at least 1")
    seed_path = Path(args.issuer_seed)
    try:
        signer = signer_from_seed(seed_path.read_bytes(), f"--issuer-seed {seed_path}")
        now = int(time.time())
        token = node_token(args.node, signer, now, now + args.days * 86400)
    except OSError as error:
        return _fail(f"--issuer-seed: {seed_path}: {error.strerror or error}")
    except (JwtError, InvalidName) as error:
        return _fail(str(error))
    if args.output:
        try:
            _write_secrets({Path(args.output): token + "\n"})
        except OSError as error:
            return _fail(f"--output: {args.output}: {error.strerror or error}")
        print(f"wrote {args.output}")
    else:
        print(token)
    return 0
