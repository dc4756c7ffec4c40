"""Who may do what on pyhami's NATS subjects, and the nats-server configuration that says so.

Three kinds of client share one account:

- the daemon (``DAEMON_USER``, a password in the server's configuration): everything,
  including the standalone pod store (JetStream) and answering the auth callout;
- watchers (``WATCH_USER``, a password): subscribe to ``pyhami.>`` and publish nothing,
  so ``pyhami watch`` and dashboards read what the daemon and the agents say and
  can neither change anything nor make the agents talk;
- agents: no password in the configuration; nats-server asks the daemon (auth
  callout) and the daemon admits each as the agent of the one node its token is
  bound to, allowed to publish ``pyhami.inventory.<node>``, hear resync requests, ask
  for its node's pending allocations (``pyhami.allocations.<node>``, the answers coming
  to its own inbox, ``agent_inbox_prefix(node)``) and report their outcome
  (``pyhami.allocated.<node>``).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import nkeys

from common.core.errors import InvalidInput
from common.files import SECRET_FILE_MAX_BYTES, InputFileError, read_bounded
from common.natsjwt import (
    JwtError,
    Permissions,
    public_key,
    seed_from_random,
    signer_from_seed,
)
from common.wire import (
    RESYNC_SUBJECT,
    allocated_subject,
    allocations_subject,
    inventory_subject,
)

ACCOUNT = "PYHAMI"
DAEMON_USER = "pyhami-daemon"
WATCH_USER = "pyhami-watch"
AGENT_USER_PREFIX = "pyhami-agent:"
AGENT_INBOX_PREFIX = "_INBOX.pyhami-agent"
ALL_PYHAMI_SUBJECTS = "pyhami.>"

WATCH_PERMISSIONS = Permissions(publish=(), subscribe=(ALL_PYHAMI_SUBJECTS,))


def agent_inbox_prefix(node: str) -> str:
    """The inbox an agent's requests get their answers on: its node's own, so that no
    agent may read another's answers."""
    return f"{AGENT_INBOX_PREFIX}.{node}"


def agent_permissions(node: str) -> Permissions:
    return Permissions(
        publish=(inventory_subject(node), allocations_subject(node), allocated_subject(node)),
        subscribe=(RESYNC_SUBJECT, f"{agent_inbox_prefix(node)}.>"))


def agent_user(node: str) -> str:
    """The name the server logs an agent's connection under."""
    return AGENT_USER_PREFIX + node


@dataclass(frozen=True, slots=True)
class ServerTls:
    """nats-server's TLS files; ``verify_clients`` asks every client for a certificate."""

    cert: Path
    key: Path
    ca: Path
    verify_clients: bool = False




# Where the credentials are kept: files of `pyhami nats-auth init`, keys of the Secret.
ISSUER_SEED = "issuer.seed"
ISSUER_PUBLIC = "issuer.pub"
DAEMON_PASSWORD = "daemon.password"
WATCH_PASSWORD = "watch.password"
AUTH_CONFIG = "auth.conf"


class CredentialsError(InvalidInput):
    """Stored NATS credentials that cannot be used; the text names the store and the key."""


@dataclass(frozen=True)
class BusCredentials:
    """The issuer key the daemon signs callout answers with, and the two passwords."""

    seed: bytes
    daemon_password: str
    watch_password: str

    @classmethod
    def new(cls, random_bytes: Callable[[int], bytes] = secrets.token_bytes) -> BusCredentials:
        def password() -> str:
            return random_bytes(24).hex()

        return cls(seed_from_random(random_bytes(32)), password(), password())

    @property
    def signer(self) -> nkeys.KeyPair:
        return signer_from_seed(self.seed, ISSUER_SEED)

    @property
    def issuer(self) -> str:
        return public_key(self.signer)

    def server_config(self, tls: ServerTls | None = None) -> str:
        """A nats-server configuration with pyhami's account, users and auth callout.

        JetStream, ports and storage stay on the server's command line
        (``--jetstream --store_dir DIR``); this file says who may connect.
        """

        def quoted(text: str | Path) -> str:
            return json.dumps(str(text))

        # The nats-server configuration takes the same permission objects as a user JWT.
        watch = WATCH_PERMISSIONS.claims()
        lines = [
            "# Who may connect to pyhami's NATS: written by `pyhami nats-auth init`.",
            "accounts {",
            f"  {ACCOUNT} {{",
            "    jetstream: enabled",
            "    users: [",
            f"      {{ user: {quoted(DAEMON_USER)}, password: {quoted(self.daemon_password)} }}",
            f"      {{ user: {quoted(WATCH_USER)}, password: {quoted(self.watch_password)},",
            "        permissions: {",
            f"          publish: {json.dumps(watch['pub'])}",
            f"          subscribe: {json.dumps(watch['sub'])}",
            "        }",
            "      }",
            "    ]",
            "  }",
            "}",
            "authorization {",
            "  auth_callout {",
            f"    issuer: {quoted(self.issuer)}",
            f"    account: {ACCOUNT}",
            f"    auth_users: [ {quoted(DAEMON_USER)}, {quoted(WATCH_USER)} ]",
            "  }",
            "}",
        ]
        if tls is not None:
            lines += [
                "tls {",
                f"  cert_file: {quoted(tls.cert)}",
                f"  key_file: {quoted(tls.key)}",
                f"  ca_file: {quoted(tls.ca)}",
                f"  verify: {'true' if tls.verify_clients else 'false'}",
                "}",
            ]
        return "\n".join(lines) + "\n"

    def stored(self) -> dict[str, bytes]:
        """Every file (Secret key) to keep, the server configuration fragment included."""
        return {ISSUER_SEED: self.seed + b"\n", ISSUER_PUBLIC: (self.issuer + "\n").encode(),
                DAEMON_PASSWORD: (self.daemon_password + "\n").encode(),
                WATCH_PASSWORD: (self.watch_password + "\n").encode(),
                AUTH_CONFIG: self.server_config().encode()}

    @classmethod
    def read(cls, directory: Path) -> BusCredentials:
        """The credentials ``pyhami nats-auth init`` wrote into ``directory``."""
        stored = {}
        for name in (ISSUER_SEED, DAEMON_PASSWORD, WATCH_PASSWORD):
            try:
                stored[name] = read_bounded(directory / name, SECRET_FILE_MAX_BYTES)
            except InputFileError as error:
                raise CredentialsError(str(error)) from None
        return cls.from_stored(stored, str(directory))

    @classmethod
    def from_stored(cls, data: Mapping[str, bytes], where: str) -> BusCredentials:
        missing = [key for key in (ISSUER_SEED, DAEMON_PASSWORD, WATCH_PASSWORD)
                   if not data.get(key, b"").strip()]
        if missing:
            raise CredentialsError(f"{where}: {', '.join(missing)} missing or empty")
        credentials = cls(data[ISSUER_SEED].strip(),
                          data[DAEMON_PASSWORD].decode(errors="replace").strip(),
                          data[WATCH_PASSWORD].decode(errors="replace").strip())
        try:
            credentials.signer  # noqa: B018 (checks the seed)
        except JwtError as error:
            raise CredentialsError(f"{where}: {error}") from None
        return credentials
