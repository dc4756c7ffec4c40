"""Connecting to NATS as a long-running component must: settings, credentials, TLS, backoff.

Every setting comes from a flag or, when the flag is absent, from its
environment variable by the rule of ``common.arguments`` (``--nats-ca``:
``PYHAMI_NATS_CA``; a Kubernetes Secret mounted as environment or files). The
connection is retried forever: the first one every ``INITIAL_RETRY_S`` seconds,
a lost one with exponential backoff and jitter. ``Connection`` keeps one alive
for the life of a process, even when the server makes nats-py close its client
for good.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import random
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from nats.aio.client import DEFAULT_INBOX_PREFIX, Client, Server
from nats.aio.msg import Msg

from common.arguments import variable_for
from common.core.errors import SettingsError
from common.files import SECRET_FILE_MAX_BYTES, InputFileError, read_bounded

logger = logging.getLogger(__name__)

DEFAULT_URL = "nats://127.0.0.1:4222"
INITIAL_RETRY_S = 2
RECONNECT_BASE_S = 0.25
DEFAULT_RECONNECT_MAX_S = 10.0
# Notice a silently dead server (no TCP reset) within a minute, not nats-py's four.
PING_INTERVAL_S = 20
MAX_OUTSTANDING_PINGS = 3

URL_SCHEMES = ("nats", "tls", "ws", "wss")

def describe_error(error: BaseException) -> str:
    """An exception in a line; nats-py raises many with an empty message."""
    return str(error) or type(error).__name__


@dataclass(frozen=True)
class NatsSettings:
    servers: tuple[str, ...] = (DEFAULT_URL,)
    user: str | None = None
    password: str | None = None
    token: str | None = None
    token_file: Path | None = None
    nkey_seed: Path | None = None
    creds: Path | None = None
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    reconnect_max_wait: float = DEFAULT_RECONNECT_MAX_S
    inbox_prefix: str | None = None
    """Where requests get their answers (nats-py's ``inbox_prefix``); an agent sets its
    node's own (``common.busaccess.agent_inbox_prefix``), the one its permissions allow."""


def add_nats_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("NATS connection")
    group.add_argument("--nats", metavar="URL[,URL...]",
                       help=f"server URLs, nats:// or tls:// (default {DEFAULT_URL})")
    group.add_argument("--nats-user", metavar="USER", help="user name")
    group.add_argument("--nats-password", metavar="PASSWORD",
                       help="password (prefer the variable: flags show in ps)")
    group.add_argument("--nats-token", metavar="TOKEN", help="authentication token")
    group.add_argument("--nats-token-file", metavar="FILE",
                       help="a file holding the token, read again at every connection (an "
                            "agent's projected ServiceAccount token, or a node token)")
    group.add_argument("--nats-nkey-seed", metavar="FILE", help="NKey seed file")
    group.add_argument("--nats-creds", metavar="FILE", help="credentials file")
    group.add_argument("--nats-ca", metavar="FILE", help="CA bundle for TLS")
    group.add_argument("--nats-cert", metavar="FILE", help="client certificate")
    group.add_argument("--nats-key", metavar="FILE", help="client key")
    group.add_argument("--nats-reconnect-max-wait", metavar="SECONDS",
                       help="longest wait between reconnection attempts "
                            f"(default {DEFAULT_RECONNECT_MAX_S:g})")


def nats_settings(args: argparse.Namespace) -> NatsSettings:
    """Raises ``SettingsError`` naming the flag (and its variable) that is wrong."""

    def value(field: str) -> str | None:
        given: str | None = getattr(args, "nats" if field == "url" else f"nats_{field}")
        return given or None

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
        token_file=existing_file("token_file"),
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
    return f"{flag} ({variable_for(flag)})"


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
        ("token file", settings.token_file is not None),
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
    if settings.token_file is not None:
        return {"token": _token_reader(settings.token_file)}
    if settings.nkey_seed is not None:
        return {"nkeys_seed": str(settings.nkey_seed)}
    if settings.creds is not None:
        return {"user_credentials": str(settings.creds)}
    return {}


def _token_reader(path: Path) -> Callable[[], str]:
    """The token as the file holds it at each (re)connection: the kubelet rotates it."""

    def read() -> str:
        # Bounded and regular only: read at every reconnection, a FIFO put there would
        # hang the client's reconnect for good.
        try:
            return read_bounded(path, SECRET_FILE_MAX_BYTES).decode().strip()
        except (InputFileError, UnicodeDecodeError) as error:
            logger.warning("NATS: cannot read the token file %s (%s)", path, error)
            return ""

    return read


Callback = Callable[[], Awaitable[None]]


async def connect(settings: NatsSettings, name: str, *,
                  on_reconnected: Callback | None = None,
                  on_disconnected: Callback | None = None,
                  on_closed: Callback | None = None) -> Client:
    """Connect, waiting as long as it takes; the client then reconnects after network
    failures (but nats-py closes it for good on most server errors: see ``Connection``)."""
    rng = random.Random()

    def next_server(servers: list[Server], _info: dict[str, Any]) -> tuple[Server | None, float]:
        server = min(servers, key=lambda candidate: candidate.reconnects)
        return server, reconnect_delay(server.reconnects, rng.random(), settings.reconnect_max_wait)

    async def report_error(error: Exception) -> None:
        logger.warning("NATS: %s", describe_error(error))

    async def report_closed() -> None:
        logger.info("NATS connection closed")
        if on_closed is not None:
            await on_closed()

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
            inbox_prefix=settings.inbox_prefix or DEFAULT_INBOX_PREFIX,
        )
    except BaseException:
        await client.close()
        raise
    return client


# nats-server refuses a protocol line longer than this (its default ``max_control_line``)
# with -ERR, and nats-py then closes the client.
MAX_CONTROL_LINE = 4096
# A replacement client that stays up this long resets the backoff.
STABLE_AFTER_S = 60.0
# How often a client that nats-py closed without its callback is noticed.
CLOSE_CHECK_S = 1.0
LOG_EVERY_S = 60.0
DRAIN_TIMEOUT_S = 2.0

Handler = Callable[[Msg], Awaitable[None]]
UpHook = Callable[[Client, bool], Awaitable[None]]
Unsent = Literal["disconnected", "too_large", "failed"]


def fits_control_line(subject: str, payload_size: int) -> bool:
    """Whether ``PUB <subject> <size>`` stays within the server's control line limit."""
    return len(f"PUB {subject} {payload_size}\r\n".encode()) <= MAX_CONTROL_LINE


class RateLimitedLog:
    """One warning per kind a minute at most, saying how many were not logged between."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 log: logging.Logger = logger) -> None:
        self._clock = clock
        self._logger = log
        self._last: dict[str, float] = {}
        self._quiet: Counter[str] = Counter()

    def warning(self, kind: str, message: str, *args: object) -> None:
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < LOG_EVERY_S:
            self._quiet[kind] += 1
            return
        self._last[kind] = now
        quiet = self._quiet.pop(kind, 0)
        suffix = f" ({quiet} more like it not logged)" if quiet else ""
        self._logger.warning(message + suffix, *args)


class Connection:
    """One NATS connection for the life of a process, whatever the server does to it.

    nats-py reconnects by itself after network failures, but closes its client
    for good on most server ``-ERR`` lines (any but stale connection and
    permission errors: a "maximum control line exceeded", an authorization
    violation). ``run`` then connects a new client with the same settings, after a
    backoff, subscribes it again, and tells the ``when_up`` hooks, so that whatever
    was built on the old client (a JetStream bucket handle) is built again.

    ``publish`` never raises and never sends what the server would refuse.
    """

    def __init__(self, settings: NatsSettings, name: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._name = name
        self._clock = clock
        self._client: Client | None = None
        self._subscriptions: list[tuple[str, Handler, str]] = []
        self._up_hooks: list[UpHook] = []
        self._up = asyncio.Event()
        self._down_since: float | None = clock()
        self._closing = False
        self._rng = random.Random()
        self._log = RateLimitedLog(clock)
        self.replaced = 0
        """Clients connected again after nats-py closed the previous one for good."""
        self.unsent: Counter[Unsent] = Counter()

    def authenticate(self, user: str, password: str) -> None:
        """Connect as ``user`` from now on: for a password known only after start-up."""
        self._settings = replace(self._settings, user=user, password=password, token=None,
                                 token_file=None, nkey_seed=None, creds=None)

    @property
    def client(self) -> Client | None:
        """The current client; None before the first connection."""
        return self._client

    @property
    def connected(self) -> bool:
        return self._client is not None and self._client.is_connected

    @property
    def server(self) -> str | None:
        """HOST:PORT of the server connected to now (of a cluster, the one nats-py chose);
        None while down."""
        client = self._client
        if client is None or not client.is_connected or client.connected_url is None:
            return None
        return client.connected_url.netloc

    def down_for(self) -> float:
        """Seconds since the connection was lost (or since start, before the first one);
        0 while connected."""
        return 0.0 if self._down_since is None else self._clock() - self._down_since

    async def subscribe(self, subject: str, handler: Handler, queue: str = "") -> None:
        """Subscribe the current client, if connected, and every client made after it."""
        self._subscriptions.append((subject, handler, queue))
        client = self._client
        if client is not None and not client.is_closed:
            await client.subscribe(subject, queue=queue, cb=handler)

    def when_up(self, hook: UpHook) -> None:
        """Call ``hook(client, new_client)`` each time the connection is up again:
        ``new_client`` is True for a client just made (the first, or a replacement for
        one nats-py closed), False when nats-py reconnected the same client."""
        self._up_hooks.append(hook)

    async def wait_up(self) -> Client:
        await self._up.wait()
        assert self._client is not None
        return self._client

    async def run(self) -> None:
        """Connect, and connect again whenever nats-py closes the client for good;
        runs until cancelled or ``close()``."""
        attempt = 0
        while not self._closing:
            closed = asyncio.Event()
            try:
                client = await connect(self._settings, self._name,
                                       on_reconnected=self._reconnected,
                                       on_disconnected=self._disconnected,
                                       on_closed=self._closed(closed))
            except Exception as error:  # e.g. refused credentials: try again, never give up
                logger.warning("NATS: connecting failed (%s)", describe_error(error))
                await self._backoff(attempt)
                attempt += 1
                continue
            started = self._clock()
            if await self._set_up(client):
                await self._until_closed(client, closed)
                if self._closing:
                    return
                last = client.last_error
                logger.error("NATS closed the connection for good (%s); connecting a new one",
                             describe_error(last) if last else "no error given")
            self._up.clear()
            self._mark_down()
            if self._clock() - started > STABLE_AFTER_S:
                attempt = 0
            await self._backoff(attempt)
            attempt += 1
            self.replaced += 1

    async def _set_up(self, client: Client) -> bool:
        """Subscribe a new client and run the hooks; False (the client closed) on failure."""
        new = self._client is None or self._client is not client
        try:
            for subject, handler, queue in self._subscriptions:
                await client.subscribe(subject, queue=queue, cb=handler)
            self._client = client
            self._down_since = None
            for hook in self._up_hooks:
                await hook(client, new)
        except Exception:
            logger.exception("NATS: setting up the new connection failed; closing it")
            with contextlib.suppress(Exception):
                await client.close()
            return False
        self._up.set()
        return True

    async def _until_closed(self, client: Client, closed: asyncio.Event) -> None:
        # nats-py skips its closed callback when it closes while (re)connecting, so the
        # client is looked at too; ``close()`` ends the wait even if a cancellation of this
        # task was lost (nats-py swallows one that arrives while it flushes).
        ended = asyncio.ensure_future(closed.wait())
        try:
            while not (client.is_closed or self._closing or ended.done()):
                await asyncio.wait({ended}, timeout=CLOSE_CHECK_S)
        finally:
            ended.cancel()

    async def _backoff(self, attempt: int) -> None:
        await asyncio.sleep(reconnect_delay(attempt, self._rng.random(),
                                            self._settings.reconnect_max_wait,
                                            base=INITIAL_RETRY_S / 4))

    def _closed(self, closed: asyncio.Event) -> Callback:
        async def mark() -> None:
            closed.set()

        return mark

    def _mark_down(self) -> None:
        if self._down_since is None:
            self._down_since = self._clock()

    async def _disconnected(self) -> None:
        if not self._closing and self._down_since is None:
            logger.warning("disconnected from NATS")
        self._mark_down()

    async def _reconnected(self) -> None:
        self._down_since = None
        client = self._client
        if client is None:
            return
        for hook in self._up_hooks:
            try:
                await hook(client, False)
            except Exception:
                logger.exception("NATS: a reconnection hook failed")

    async def publish(self, subject: str, payload: bytes) -> Unsent | None:
        """Send one message; never raises. What could not go is counted, logged at most
        once a minute, and returned as the reason; None when it went."""
        client = self._client
        reason: Unsent | None = None
        detail = ""
        if client is None or not client.is_connected:
            reason = "disconnected"
        elif len(payload) > client.max_payload or not fits_control_line(subject, len(payload)):
            reason, detail = "too_large", (f"{len(payload)} bytes on a {len(subject)}-character "
                                           f"subject (server limit {client.max_payload} bytes, "
                                           f"{MAX_CONTROL_LINE}-byte control line)")
        else:
            try:
                await client.publish(subject, payload)
            except Exception as error:  # a closing client, a full reconnect buffer
                reason, detail = "failed", describe_error(error)
        if reason is not None:
            self.unsent[reason] += 1
            self._log.warning(reason, "NATS: a message on %.80s was not sent (%s%s)", subject,
                              reason, f": {detail}" if detail else "")
        return reason

    async def close(self) -> None:
        """Drain (briefly: stopping must stay quick) and close; ``run`` then returns."""
        self._closing = True
        client = self._client
        if client is None or client.is_closed:
            return
        try:
            await asyncio.wait_for(client.drain(), DRAIN_TIMEOUT_S)
            logger.info("NATS connection drained")
        except Exception as error:  # a timeout or any client error: close it
            logger.warning("could not drain the NATS connection (%s); closing it",
                           describe_error(error))
        if not client.is_closed:
            # nats-py flushes what it buffered while reconnecting onto the transport it
            # has just closed, and raises; the buffer is lost either way.
            with contextlib.suppress(RuntimeError):
                await client.close()
