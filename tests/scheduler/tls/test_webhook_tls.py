"""The webhook's own certificate (``scheduler.tls.webhook``): made, checked, served.

What the Secret and the caBundle do on a real API server is in tests/e2e/test_webhook.py.
"""

from __future__ import annotations

import asyncio
import datetime
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from pyhami.natsserver import free_port
from scheduler.tls.files import CertificateFiles, TlsError
from scheduler.tls.webhook import (
    CERT_VALIDITY,
    WEBHOOK_FLAGS,
    ServingTls,
    check,
    context_for,
    from_secret,
    issue,
    service_names,
)

NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
NAMES = service_names("pyhami-scheduler", "pyhami-system")
WHERE = "Secret pyhami-system/pyhami-scheduler-webhook-tls"


@pytest.fixture(scope="module")
def made() -> ServingTls:
    return issue(NAMES, NOW)


def test_the_service_names_are_those_the_api_server_calls() -> None:
    assert NAMES == ("pyhami-scheduler", "pyhami-scheduler.pyhami-system",
                     "pyhami-scheduler.pyhami-system.svc")


def test_a_made_certificate_names_the_service_and_lasts_ten_years(made: ServingTls) -> None:
    check(made, NAMES, NOW, WHERE)
    leaf = x509.load_pem_x509_certificate(made.cert)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == list(NAMES)
    assert leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == \
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])
    assert leaf.not_valid_after_utc == NOW + CERT_VALIDITY
    assert leaf.not_valid_after_utc == datetime.datetime(2036, 2, 27, 12, 0, tzinfo=datetime.UTC)
    assert leaf.not_valid_before_utc < NOW
    ca = x509.load_pem_x509_certificate(made.ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    leaf.verify_directly_issued_by(ca)


def test_the_ca_key_is_not_kept(made: ServingTls) -> None:
    assert made.key.count(b"PRIVATE KEY-----") == 2  # one key: BEGIN and END
    assert b"PRIVATE KEY" not in made.ca + made.cert


def test_each_issue_is_a_new_ca(made: ServingTls) -> None:
    assert issue(NAMES, NOW).ca != made.ca


@pytest.mark.parametrize(("spoiled", "names", "when", "refusal"), [
    (lambda made: made, [*NAMES[:2], "hami-scheduler.cluster.kube-system.svc"], NOW,
     r"does not name hami-scheduler.cluster.kube-system.svc$"),
    (lambda made: replace(made, key=issue(NAMES, NOW).key), NAMES, NOW,
     f"^{WHERE} tls.key is not the private key of the certificate in {WHERE} tls.crt$"),
    (lambda made: replace(made, ca=issue(NAMES, NOW).ca), NAMES, NOW,
     r"is not signed by the CA in ca\.crt$"),
    (lambda made: made, NAMES, NOW + CERT_VALIDITY, r"expired on 2036-02-27 12:00 UTC"),
    (lambda made: made, NAMES, NOW - datetime.timedelta(hours=2),
     r"is valid only from 2026-03-01 11:00 UTC"),
    (lambda made: replace(made, cert=b"garbage"), NAMES, NOW,
     f"^{WHERE} tls.crt holds no PEM certificate$"),
    (lambda made: replace(made, key=made.cert), NAMES, NOW,
     f"^{WHERE} tls.key holds no unencrypted PEM private"),
], ids=["another-service-is-not-covered", "a-key-of-another-certificate",
        "a-certificate-another-ca-signed", "an-expired-certificate",
        "a-certificate-from-the-future", "a-certificate-that-is-no-pem",
        "a-key-that-is-no-pem"])
def test_a_certificate_that_cannot_serve_is_refused_saying_why(
        made: ServingTls, spoiled: Callable[[ServingTls], ServingTls], names: Sequence[str],
        when: datetime.datetime, refusal: str) -> None:
    with pytest.raises(TlsError, match=refusal):
        check(spoiled(made), names, when, WHERE)


@pytest.mark.parametrize(("data", "message"), [
    ({}, f"{WHERE} has no ca.crt, tls.crt, tls.key"),
    ({"tls.crt": b"x", "tls.key": b"y"}, f"{WHERE} has no ca.crt"),
    ({"tls.crt": b"x", "tls.key": b"y", "ca.crt": b""}, f"{WHERE} has no ca.crt"),
])
def test_a_secret_missing_a_key_is_refused(data: dict[str, bytes], message: str) -> None:
    with pytest.raises(TlsError) as raised:
        from_secret(data, WHERE)
    assert str(raised.value) == message


@pytest.fixture
async def served() -> AsyncIterator[tuple[ServingTls, int]]:
    """A listener serving a certificate made now, as the daemon serves its own."""
    tls = issue(NAMES, datetime.datetime.now(datetime.UTC))

    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application()
    app.add_routes([web.get("/", hello)])
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context_for(tls)).start()
    yield tls, port
    await runner.cleanup()


async def handshake(port: int, ca: bytes, server_name: str) -> None:
    context = ssl.create_default_context(cadata=ca.decode())
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                              server_hostname=server_name)
    writer.close()
    await writer.wait_closed()


async def test_the_served_certificate_verifies_against_the_ca_at_the_service_name(
        served: tuple[ServingTls, int]) -> None:
    tls, port = served
    await handshake(port, tls.ca, "pyhami-scheduler.pyhami-system.svc")
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        await handshake(port, tls.ca, "other.pyhami-system.svc")
    with pytest.raises(ssl.SSLCertVerificationError):
        await handshake(port, issue(NAMES, NOW).ca, "pyhami-scheduler.pyhami-system.svc")


def write(directory: Path, tls: ServingTls) -> tuple[str, str]:
    cert, key = directory / "tls.crt", directory / "tls.key"
    cert.write_bytes(tls.cert)
    key.write_bytes(tls.key)
    return str(cert), str(key)


def test_certificate_files_that_cannot_be_read_are_named(tmp_path: Path) -> None:
    with pytest.raises(TlsError, match=f"^--tls-cert-file: cannot read {tmp_path}/missing.crt: "
                                       "No such file or directory$"):
        CertificateFiles("webhook", WEBHOOK_FLAGS, str(tmp_path / "missing.crt"),
                         str(tmp_path / "missing.key"))


def test_certificate_files_that_do_not_match_are_refused(tmp_path: Path,
                                                         made: ServingTls) -> None:
    cert, key = write(tmp_path, ServingTls(ca=made.ca, cert=made.cert,
                                           key=issue(NAMES, NOW).key))
    with pytest.raises(TlsError, match=f"^--tls-private-key-file {key} is not the private key "
                                       f"of the certificate in --tls-cert-file {cert}$"):
        CertificateFiles("webhook", WEBHOOK_FLAGS, cert, key)


def test_expired_certificate_files_are_refused(tmp_path: Path) -> None:
    old = issue(NAMES, datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC))
    cert, key = write(tmp_path, old)
    with pytest.raises(TlsError, match=f"^the certificate in --tls-cert-file {cert} expired "
                                       "on 2009-12-29 00:00 UTC$"):
        CertificateFiles("webhook", WEBHOOK_FLAGS, cert, key)
