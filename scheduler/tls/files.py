"""Serving certificates read from files, for the webhook and the extender.

A certificate and its key (and, for mutual TLS, the CA that signs the clients' certificates)
are read at start and read again whenever the files change, e.g. a mounted
``kubernetes.io/tls`` Secret that cert-manager renews: new connections get the new files
without a restart. A renewal that cannot be served (half written, a key that is not the
certificate's) is logged and the files served until then stay in use.

The listener keeps the context it was started with; that context hands every new
connection, in its ClientHello callback, to the context last loaded from the files. So a
client CA taken out of the file stops being trusted too, which loading it again into one
context (that only ever adds CAs) could not do.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from common.files import SECRET_FILE_MAX_BYTES, InputFileError, read_bounded
from scheduler.errors import SchedulerError, StartupError

logger = logging.getLogger(__name__)

DEFAULT_CHECK_PERIOD_S = 10.0


class TlsError(SchedulerError):
    """A certificate or key that cannot be served; the message says which and why."""


@dataclass(frozen=True, slots=True)
class TlsFlags:
    """The flags that name the files, for messages: what is wrong names the flag."""

    cert: str
    key: str
    client_ca: str = ""


def certificates(pem: bytes, what: str) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise TlsError(f"{what} holds no PEM certificate") from None


def check_pair(cert_pem: bytes, key_pem: bytes, cert_what: str, key_what: str,
               now: datetime.datetime) -> x509.Certificate:
    """The leaf certificate, once it is known to match the key and be valid ``now``."""
    leaf = certificates(cert_pem, cert_what)[0]
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise TlsError(f"{key_what} holds no unencrypted PEM private key") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if (key.public_key().public_bytes(serialization.Encoding.PEM, public)
            != leaf.public_key().public_bytes(serialization.Encoding.PEM, public)):
        raise TlsError(f"{key_what} is not the private key of the certificate in {cert_what}")
    if now < leaf.not_valid_before_utc:
        raise TlsError(f"the certificate in {cert_what} is valid only from "
                       f"{leaf.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    if now >= leaf.not_valid_after_utc:
        raise TlsError(f"the certificate in {cert_what} expired on "
                       f"{leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    return leaf


def server_context(cert_file: str, key_file: str,
                   client_ca_file: str | None = None) -> ssl.SSLContext:
    """TLS 1.2 or later; with ``client_ca_file``, only clients presenting a certificate
    that CA signed get past the handshake."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=client_ca_file)
    return context


def _read(path: str, flag: str) -> bytes:
    # Bounded and regular only: a FIFO or a device there would hang the start, or the
    # reload of a rotated certificate.
    try:
        return read_bounded(Path(path), SECRET_FILE_MAX_BYTES)
    except InputFileError as error:
        raise TlsError(f"{flag}: cannot read {error}") from None


class CertificateFiles:
    """The serving context of one listener from its files, loaded again by ``follow`` when
    they change. ``what`` names the listener in the log."""

    def __init__(self, what: str, flags: TlsFlags, cert_file: str, key_file: str, *,
                 period: float = DEFAULT_CHECK_PERIOD_S,
                 client_ca_file: str | None = None) -> None:
        self._what, self._flags, self._period = what, flags, period
        self._cert_file, self._key_file = cert_file, key_file
        self._client_ca_file = client_ca_file
        self._seen = self._stamp()
        self._current = self._load(datetime.datetime.now(datetime.UTC))
        # What the listener is started with; it hands each connection to the latest.
        self.context = self._current
        self.context.sni_callback = self._hand_over

    @property
    def mutual(self) -> bool:
        return self._client_ca_file is not None

    def describe(self) -> str:
        files = f"files {self._cert_file}, {self._key_file}"
        if self._client_ca_file is None:
            return files
        return f"{files}; client certificates signed by {self._client_ca_file}"

    def _hand_over(self, connection: ssl.SSLObject, _server_name: str | None,
                   _context: ssl.SSLContext) -> None:
        # Called for every ClientHello, with or without a server name in it.
        connection.context = self._current

    def _paths(self) -> tuple[str, ...]:
        paths = (self._cert_file, self._key_file)
        return paths if self._client_ca_file is None else (*paths, self._client_ca_file)

    def _stamp(self) -> tuple[float, ...]:
        stamps: list[float] = []
        for path in self._paths():
            try:
                stamps.append(os.stat(path).st_mtime)
            except OSError:
                stamps.append(-1.0)
        return tuple(stamps)

    def _load(self, now: datetime.datetime) -> ssl.SSLContext:
        """Raises ``TlsError`` naming the flag, the file and what is wrong with it."""
        flags = self._flags
        cert_pem = _read(self._cert_file, flags.cert)
        key_pem = _read(self._key_file, flags.key)
        check_pair(cert_pem, key_pem, f"{flags.cert} {self._cert_file}",
                   f"{flags.key} {self._key_file}", now)
        if self._client_ca_file is not None:
            certificates(_read(self._client_ca_file, flags.client_ca),
                         f"{flags.client_ca} {self._client_ca_file}")
        try:
            return server_context(self._cert_file, self._key_file, self._client_ca_file)
        except (OSError, ssl.SSLError) as error:
            names = f"{flags.cert} {self._cert_file} with {flags.key} {self._key_file}"
            if self._client_ca_file is not None:
                names += f" and {flags.client_ca} {self._client_ca_file}"
            raise TlsError(f"{names}: {error}") from None

    def reload_if_changed(self, now: datetime.datetime) -> bool:
        """Serve the files again if they changed since last read; True when they were.

        New connections get the new files; files that do not load (a renewal half
        written) are logged and the current ones kept until the next change."""
        stamp = self._stamp()
        if stamp == self._seen:
            return False
        self._seen = stamp
        try:
            self._current = self._load(now)
        except TlsError as error:
            logger.warning("%s certificate files changed but cannot be served, keeping the "
                           "current ones: %s", self._what, error)
            return False
        logger.info("%s certificate reloaded from %s", self._what, self._cert_file)
        return True

    async def follow(self) -> None:
        while True:
            await asyncio.sleep(self._period)
            self.reload_if_changed(datetime.datetime.now(datetime.UTC))


def read_at_start(read: Callable[[], CertificateFiles]) -> CertificateFiles:
    """The files ``read`` reads, read at once: a bad one stops the start
    (``StartupError``, naming the flag and what is wrong)."""
    try:
        return read()
    except TlsError as error:
        raise StartupError(str(error)) from None


def context_of(files: CertificateFiles | None) -> ssl.SSLContext | None:
    """The TLS context a listener serving ``files`` keeps (it hands each connection the
    files last loaded); None: plain HTTP."""
    return files.context if files is not None else None


def tls_status(files: CertificateFiles | None) -> dict[str, object]:
    """What ``/statusz`` says of a listener's TLS: off, server or mutual, and its files."""
    if files is None:
        return {"tls": "off"}
    return {"tls": "mutual" if files.mutual else "server", "certificate": files.describe()}
