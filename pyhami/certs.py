"""``pyhami certs init``: a private CA and the certificates NATS, the extender and
kube-scheduler present, written into one directory (``common.certificates``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from common.arguments import Subcommands, positive_int
from common.certificates import (
    CLIENT_NAME,
    DEFAULT_DAYS,
    DEFAULT_DNS,
    DEFAULT_IPS,
    KUBE_SCHEDULER_NAME,
    Bundle,
    dns_name,
    ip_address,
    write_bundle,
)
from common.core.errors import SettingsError


def _comma_list(parse: Callable[[str], object]) -> Callable[[str], tuple[str, ...]]:
    """An option's type: comma-separated entries, each checked by ``parse``."""

    def entries(text: str) -> tuple[str, ...]:
        found = tuple(entry.strip() for entry in text.split(","))
        for entry in found:
            try:
                parse(entry)
            except ValueError as error:
                raise argparse.ArgumentTypeError(str(error)) from None
        return found

    return entries


def register(commands: Subcommands) -> None:
    parser = commands.add_parser("certs", help="make certificates for TLS between the parts")
    actions = parser.add_subparsers(dest="certs", required=True, metavar="ACTION")
    init = actions.add_parser(
        "init", help="write a new CA and the certificates it signs into a directory",
        description="Write into DIR a new CA (ca.pem, ca.key), server certificates for NATS "
                    "(nats.pem, nats.key) and the extender (extender.pem, extender.key), and "
                    "client certificates for kube-scheduler (kube-scheduler.pem, "
                    "kube-scheduler.key) and NATS clients (client.pem, client.key). Keys "
                    "are written mode 0600.")
    init.add_argument("dir", type=Path, metavar="DIR",
                      help="where to write the files; made when missing")
    init.add_argument("--dns", type=_comma_list(dns_name), default=DEFAULT_DNS,
                      metavar="NAME[,NAME...]",
                      help="DNS names the server certificates carry "
                           f"(default {','.join(DEFAULT_DNS)})")
    init.add_argument("--ip", type=_comma_list(ip_address), default=DEFAULT_IPS,
                      metavar="ADDR[,ADDR...]",
                      help="IP addresses the server certificates carry "
                           f"(default {','.join(DEFAULT_IPS)})")
    init.add_argument("--days", type=positive_int, default=DEFAULT_DAYS, metavar="N",
                      help=f"how long every certificate is valid (default {DEFAULT_DAYS})")
    existing = init.add_mutually_exclusive_group()
    existing.add_argument("--force", action="store_true",
                          help="overwrite the files of a bundle already in DIR")
    existing.add_argument("--keep-existing", action="store_true",
                          help="leave a complete bundle already in DIR as it is and succeed "
                               "(a step run at every start, as in docker-compose.yml)")
    init.set_defaults(handler=run_init)


def run_init(args: argparse.Namespace) -> int:
    if args.keep_existing and all(
            path.is_file() for path in Bundle.in_directory(args.dir).paths().values()):
        print(f"{args.dir}: a complete bundle is there already; kept")
        return 0
    try:
        bundle = write_bundle(args.dir, dns=args.dns, ips=args.ip, days=args.days,
                              force=args.force)
    except SettingsError as error:
        print(f"pyhami certs init: {error}", file=sys.stderr)
        return 2
    print(summary(bundle, args.dns, args.ip, args.days))
    return 0


def summary(bundle: Bundle, dns: tuple[str, ...], ips: tuple[str, ...], days: int) -> str:
    """What was written, a pair of files a line."""
    names = ", ".join((*dict.fromkeys(dns), *dict.fromkeys(ips)))
    pairs = (
        (bundle.ca, bundle.ca_key, "the CA; only whoever issues needs ca.key"),
        (bundle.nats, bundle.nats_key, f"NATS server (serverAuth): {names}"),
        (bundle.extender, bundle.extender_key, f"extender server (serverAuth): {names}"),
        (bundle.kube_scheduler, bundle.kube_scheduler_key,
         f"client (clientAuth): CN={KUBE_SCHEDULER_NAME}"),
        (bundle.client, bundle.client_key, f"client (clientAuth): CN={CLIENT_NAME}"),
    )
    width = max(len(f"{cert.name} {key.name}") for cert, key, _ in pairs)
    lines = [f"wrote {bundle.ca.parent}, every certificate valid {days} days, keys mode 0600:"]
    lines += [f"  {f'{cert.name} {key.name}':<{width}}  {what}" for cert, key, what in pairs]
    return "\n".join(lines)
