"""Connecting to NATS as a long-running component must: settings, credentials, TLS, backoff.

Every setting comes from a flag or, when the flag is absent, from its
``PYHAMI_NATS_*`` environment variable (a Kubernetes Secret mounted as
environment or files). The connection is retried forever: the first one every
``INITIAL_RETRY_S`` seconds, a lost one with exponential backoff and jitter.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import random
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nats.aio.client import Client, Server

logger = logging.getLogger(__name__)

DEFAULT_URL = "nats://127.0.0.1:4222"
INITIAL_RETRY_S = 2
RECONNECT_BASE_S = 0.25
DEFAULT_RECONNECT_MAX_S = 10.0
# Notice a silently dead server (no TCP reset) within a minute, not nats-py's four.
PING_INTERVAL_S = 20
MAX_OUTSTANDING_PINGS = 3

URL_SCHEMES = ("nats", "tls", "ws", "wss")

ENV = {
    "url": "PYHAMI_NATS_URL",
    "user": "PYHAMI_NATS_USER",
    "password": "PYHAMI_NATS_PASSWORD",
    "token": "PYHAMI_NATS_TOKEN",
    "nkey_seed": "PYHAMI_NATS_NKEY_SEED",
    "creds": "PYHAMI_NATS_CREDS",
    "ca": "PYHAMI_NATS_CA",
    "cert": "PYHAMI_NATS_CERT",
    "key": "PYHAMI_NATS_KEY",
    "reconnect_max_wait": "PYHAMI_NATS_RECONNECT_MAX_WAIT",
}


class SettingsError(ValueError):
    """A NATS setting that cannot be used; the text names the flag or variable."""


@dataclass(frozen=True)
class NatsSettings:
    servers: tuple[str, ...] = (DEFAULT_URL,)
    user: str | None = None
    password: str | None = None
    token: str | None = None
    nkey_seed: Path | None = None
    creds: Path | None = None
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    reconnect_max_wait: float = DEFAULT_RECONNECT_MAX_S


def add_nats_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("NATS connection (each flag falls back to its variable)")
    group.add_argument("--nats", metavar="URL[,URL...]",
                       help=f"server URLs, nats:// or tls:// ({ENV['url']}; default {DEFAULT_URL})")
    group.add_argument("--nats-user", metavar="USER", help=f"user name ({ENV['user']})")
    group.add_argument("--nats-password", metavar="PASSWORD",
                       help=f"password ({ENV['password']}; prefer the variable: flags show in ps)")
    group.add_argument("--nats-token", metavar="TOKEN",
                       help=f"authentication token ({ENV['token']})")
    group.add_argument("--nats-nkey-seed", metavar="FILE",
                       help=f"NKey seed file ({ENV['nkey_seed']})")
    group.add_argument("--nats-creds", metavar="FILE", help=f"credentials file ({ENV['creds']})")
    group.add_argument("--nats-ca", metavar="FILE", help=f"CA bundle for TLS ({ENV['ca']})")
    group.add_argument("--nats-cert", metavar="FILE", help=f"client certificate ({ENV['cert']})")
    group.add_argument("--nats-key", metavar="FILE", help=f"client key ({ENV['key']})")
    group.add_argument("--nats-reconnect-max-wait", metavar="SECONDS",
                       help="longest wait between reconnection attempts "
                            f"({ENV['reconnect_max_wait']}; default {DEFAULT_RECONNECT_MAX_S:g})")


def nats_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> NatsSettings:
    """Raises ``SettingsError`` naming the flag (and its variable) that is wrong."""

    def value(field: str) -> str | None:
        flag: str | None = getattr(args, "nats" if field == "url" else f"nats_{field}")
        return flag if flag is not None else environ.get(ENV[field]) or None

    def existing_file(field: str) -> Path | None:
        text = value(field)
        if text is None:
            return None
        path = Path(text)
        if not path.is_file():
            raise SettingsError(f"{_name(field)}: {text} is not a readable file")
        return path

    settings = NatsSettings(
        servers=_servers(value("url") or DEFAULT_URL),
        user=value("user"),
        password=value("password"),
        token=value("token"),
        nkey_seed=existing_file("nkey_seed"),
        creds=existing_file("creds"),
        ca=existing_file("ca"),
        cert=existing_file("cert"),
        key=existing_file("key"),
        reconnect_max_wait=_seconds(value("reconnect_max_wait"), "reconnect_max_wait"),
    )
    _check_consistent(settings)
    tls_context(settings)  # a certificate that does not load is a settings error, found now
    return settings


def _name(field: str) -> str:
    flag = "--nats" if field == "url" else "--nats-" + field.replace("_", "-")
    return f"{flag} ({ENV[field]})"


def _servers(text: str) -> tuple[str, ...]:
    servers = []
    for entry in (part.strip() for part in text.split(",")):
        url = entry if "://" in entry else f"nats://{entry}"
        parts = urlsplit(url)
        if parts.scheme not in URL_SCHEMES or not parts.hostname:
            raise SettingsError(f"{_name('url')}: {entry!r} is not a NATS URL "
                                f"(expected {'|'.join(URL_SCHEMES)}://HOST[:PORT])")
        servers.append(url)
    return tuple(servers)


def _seconds(text: str | None, field: str) -> float:
    if text is None:
        return DEFAULT_RECONNECT_MAX_S
    try:
        seconds = float(text)
    except ValueError:
        raise SettingsError(f"{_name(field)}: {text!r} is not a number of seconds") from None
    if not seconds > 0:
        raise SettingsError(f"{_name(field)}: {text!r} must be above 0")
    return seconds


def _check_consistent(settings: NatsSettings) -> None:
    methods = [name for name, given in (
        ("user/password", settings.user is not None or settings.password is not None),
        ("token", settings.token is not None),
        ("nkey seed", settings.nkey_seed is not None),
        ("creds file", settings.creds is not None),
    ) if given]
    if len(methods) > 1:
        raise SettingsError(f"NATS authentication: give one method, not {' and '.join(methods)}")
    if (settings.user is None) != (settings.password is None):
        raise SettingsError(f"{_name('user')} and {_name('password')} go together")
    if (settings.cert is None) != (settings.key is None):
        raise SettingsError(f"{_name('cert')} and {_name('key')} go together")
    if (settings.nkey_seed or settings.creds) and importlib.util.find_spec("nkeys") is None:
        raise SettingsError("NKey and creds-file authentication need the Python package "
                            "'nkeys', which is not installed")


def tls_context(settings: NatsSettings) -> ssl.SSLContext | None:
    """The client TLS context, or None when neither a CA nor a certificate is given
    (a tls:// URL then verifies against the system's CAs)."""
    if settings.ca is None and settings.cert is None:
        return None
    try:
        context = ssl.create_default_context(
            cafile=str(settings.ca) if settings.ca is not None else None)
    except (ssl.SSLError, OSError) as error:
        raise SettingsError(f"{_name('ca')}: {settings.ca}: {error}") from None
    if settings.cert is not None and settings.key is not None:
        try:
            context.load_cert_chain(str(settings.cert), str(settings.key))
        except (ssl.SSLError, OSError) as error:
            raise SettingsError(f"{_name('cert')}/{_name('key')}: {settings.cert}, "
                                f"{settings.key}: {error}") from None
    return context


def reconnect_delay(attempt: int, jitter: float, cap: float,
                    base: float = RECONNECT_BASE_S) -> float:
    """Seconds to wait before reconnection attempt ``attempt`` (0 first): doubling from
    ``base`` up to ``cap``, scaled into its upper half by ``jitter`` (0..1) so that a
    fleet of clients does not reconnect in step."""
    exponential = base * 2.0 ** min(attempt, 32)
    return min(cap, exponential) * (0.5 + 0.5 * jitter)


def _credentials(settings: NatsSettings) -> dict[str, Any]:
    if settings.user is not None:
        return {"user": settings.user, "password": settings.password}
    if settings.token is not None:
        return {"token": settings.token}
    if settings.nkey_seed is not None:
        return {"nkeys_seed": str(settings.nkey_seed)}
    if settings.creds is not None:
        return {"user_credentials": str(settings.creds)}
    return {}


Callback = Callable[[], Awaitable[None]]


async def connect(settings: NatsSettings, name: str, *,
                  on_reconnected: Callback | None = None,
                  on_disconnected: Callback | None = None) -> Client:
    """Connect, waiting as long as it takes; the client then reconnects forever."""
    rng = random.Random()

    def next_server(servers: list[Server], _info: dict[str, Any]) -> tuple[Server | None, float]:
        server = min(servers, key=lambda candidate: candidate.reconnects)
        return server, reconnect_delay(server.reconnects, rng.random(), settings.reconnect_max_wait)

    async def report_error(error: Exception) -> None:
        logger.warning("NATS: %s", str(error) or type(error).__name__)

    async def report_closed() -> None:
        logger.info("NATS connection closed")

    client = Client()
    tls = tls_context(settings)
    try:
        await client.connect(
            servers=list(settings.servers),
            name=name,
            max_reconnect_attempts=-1,
            reconnect_time_wait=INITIAL_RETRY_S,
            reconnect_to_server_handler=next_server,
            ping_interval=PING_INTERVAL_S,
            max_outstanding_pings=MAX_OUTSTANDING_PINGS,
            error_cb=report_error,
            closed_cb=report_closed,
            reconnected_cb=on_reconnected,
            disconnected_cb=on_disconnected,
            tls=tls,
            **_credentials(settings),
        )
    except BaseException:
        await client.close()
        raise
    return client
