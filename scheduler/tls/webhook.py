"""The webhook's serving certificate: from files, or made and kept by the daemon itself.

From files (``--tls-cert-file``, ``--tls-private-key-file``): ``WEBHOOK_FLAGS`` for
``scheduler.tls.files.CertificateFiles``, which reads them again whenever they change.

Self-managed (on Kubernetes, without the files): the daemon reads the Secret
``--webhook-tls-secret``; when there is none it makes a CA and a serving certificate for
the Service's DNS names, valid ``CERT_VALIDITY``, and creates the Secret (type
``kubernetes.io/tls`` plus ``ca.crt``). A 409 means another replica created it first:
theirs is read and served, so every replica serves one certificate. The CA's private key
is not kept: nothing is signed with it again. ``CaBundleKeeper`` then keeps the
MutatingWebhookConfiguration's ``caBundle`` equal to that CA, since a ``helm upgrade``
puts back the chart's own.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import ssl
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from common.certificates import make_ca, server_certificate
from scheduler.cluster import ClusterError, WebhookCluster
from scheduler.errors import StartupError
from scheduler.retry import while_the_api_fails
from scheduler.tls.files import (
    CertificateFiles,
    TlsError,
    TlsFlags,
    certificates,
    check_pair,
    read_at_start,
    server_context,
)

logger = logging.getLogger(__name__)

CERT_VALIDITY = datetime.timedelta(days=3650)
SECRET_CERT = "tls.crt"
SECRET_KEY = "tls.key"
SECRET_CA = "ca.crt"
WEBHOOK_FLAGS = TlsFlags("--tls-cert-file", "--tls-private-key-file")


@dataclass(frozen=True, slots=True)
class ServingTls:
    """PEM texts: the CA the API server trusts, the serving certificate and its key."""

    ca: bytes
    cert: bytes
    key: bytes


def service_names(service: str, namespace: str) -> tuple[str, ...]:
    """The DNS names of a Service; the API server calls a webhook at ``<svc>.<ns>.svc``."""
    return (service, f"{service}.{namespace}", f"{service}.{namespace}.svc")


def issue(names: Sequence[str], now: datetime.datetime) -> ServingTls:
    """A new CA and a certificate for ``names`` signed by it, both valid ``CERT_VALIDITY``."""
    ca = make_ca(f"{names[0]}-webhook-ca", now=now, validity=CERT_VALIDITY)
    serving = server_certificate(ca, names[-1], names, (), now=now, validity=CERT_VALIDITY)
    return ServingTls(ca=ca.cert.public_bytes(serialization.Encoding.PEM), cert=serving.cert,
                      key=serving.key)


def check(tls: ServingTls, names: Sequence[str], now: datetime.datetime,
          where: str) -> None:
    """Raises ``TlsError`` unless ``tls`` can be served for ``names`` ``now``: the key is
    the certificate's, the CA signed it, it is valid and names every one of ``names``.
    ``where`` names the Secret in the message."""
    leaf = check_pair(tls.cert, tls.key, f"{where} {SECRET_CERT}", f"{where} {SECRET_KEY}",
                       now)
    ca = certificates(tls.ca, f"{where} {SECRET_CA}")[0]
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise TlsError(f"the certificate in {where} {SECRET_CERT} is not signed by the CA "
                       f"in {SECRET_CA}") from None
    try:
        covered = set(leaf.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        covered = set()
    missing = [name for name in names if name not in covered]
    if missing:
        raise TlsError(f"the certificate in {where} {SECRET_CERT} does not name "
                       f"{', '.join(missing)}")


def context_for(tls: ServingTls) -> ssl.SSLContext:
    """A server context serving ``tls`` (already ``check``ed)."""
    # The ssl module loads a certificate only from files: they live as long as this call.
    with tempfile.TemporaryDirectory(prefix="pyhami-webhook-") as directory:
        cert_file, key_file = Path(directory, SECRET_CERT), Path(directory, SECRET_KEY)
        cert_file.write_bytes(tls.cert)
        key_file.touch(mode=0o600)
        key_file.write_bytes(tls.key)
        return server_context(str(cert_file), str(key_file))


def from_secret(data: Mapping[str, bytes], where: str) -> ServingTls:
    """The three PEM texts of the Secret's data; raises ``TlsError`` naming a missing one."""
    missing = [key for key in (SECRET_CA, SECRET_CERT, SECRET_KEY) if not data.get(key)]
    if missing:
        raise TlsError(f"{where} has no {', '.join(missing)}")
    return ServingTls(ca=data[SECRET_CA], cert=data[SECRET_CERT], key=data[SECRET_KEY])


async def self_managed(cluster: WebhookCluster, namespace: str, secret: str,
                       names: Sequence[str], now: datetime.datetime) -> ServingTls:
    """The Secret's certificate, made and stored first when there is none.

    Raises ``ClusterError`` when the API fails (worth trying again) and ``TlsError`` when
    the Secret holds nothing servable (it is left as it is: deleting it has a new one made).
    """
    where = f"Secret {namespace}/{secret}"
    data = await cluster.read_secret(namespace, secret)
    if data is None:
        made = await asyncio.to_thread(issue, names, now)
        if await cluster.create_tls_secret(namespace, secret, {
                SECRET_CA: made.ca, SECRET_CERT: made.cert, SECRET_KEY: made.key}):
            logger.info("webhook certificate for %s made and stored in %s, valid until %s",
                        ", ".join(names), where, f"{now + CERT_VALIDITY:%Y-%m-%d}")
            return made
        # Another replica created it meanwhile: serve theirs.
        data = await cluster.read_secret(namespace, secret)
        if data is None:
            raise ClusterError(f"{where} was created by another replica, then deleted")
    tls = from_secret(data, where)
    check(tls, names, now, where)
    return tls


class CaBundleKeeper:
    """Keeps every webhook of the MutatingWebhookConfiguration trusting the daemon's CA:
    checked at start, then every ``period`` seconds, patched only when different."""

    def __init__(self, cluster: WebhookCluster, configuration: str, ca: bytes,
                 period: float) -> None:
        self._cluster, self._configuration, self._ca = cluster, configuration, ca
        self._period = period
        self._missing = False
        self.state = "not checked yet"

    async def check(self) -> None:
        """One check; what fails is logged, never raised."""
        what = f"MutatingWebhookConfiguration {self._configuration}"
        try:
            bundles = await self._cluster.webhook_ca_bundles(self._configuration)
            if bundles is None:
                if not self._missing:
                    logger.warning("%s not found: the API server calls no webhook of "
                                   "pyhami until it exists (looked for again every %gs)",
                                   what, self._period)
                self._missing = True
                self.state = "configuration not found"
                return
            if self._missing:
                logger.info("%s found", what)
            self._missing = False
            stale = [(index, name) for index, (name, ca) in enumerate(bundles)
                     if ca != self._ca]
            if stale:
                await self._cluster.set_webhook_ca_bundle(self._configuration, stale,
                                                          self._ca)
                logger.info("%s: caBundle of %s set to the daemon's CA", what,
                            ", ".join(name for _, name in stale))
        except ClusterError as error:
            logger.warning("%s: caBundle not checked: %s", what, error)
            self.state = f"check failed: {error}"
            return
        self.state = "caBundle in place"

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self._period)


def webhook_files(cert_file: str | None, key_file: str | None,
                  period: float) -> CertificateFiles | None:
    """The webhook's certificate files (``--tls-cert-file``, ``--tls-private-key-file``),
    read at once: a bad one stops the start. None: the certificate is self-managed."""
    if cert_file is None or key_file is None:
        return None
    return read_at_start(lambda: CertificateFiles("webhook", WEBHOOK_FLAGS, cert_file,
                                                  key_file, period=period))


async def self_managed_at_start(cluster: WebhookCluster, namespace: str, secret: str,
                                service: str) -> ServingTls:
    """The certificate in the Secret, made first if need be; tried again while the API
    fails, refused (``StartupError``) when the Secret holds nothing servable."""
    names = service_names(service, namespace)
    try:
        return await while_the_api_fails("webhook certificate", lambda: self_managed(
            cluster, namespace, secret, names, datetime.datetime.now(datetime.UTC)))
    except TlsError as error:
        raise StartupError(f"--webhook-tls-secret: {error}; delete the Secret to have "
                           "the daemon make a new one") from None
