"""pyhami's own certificates (``common.certificates``): the bundle's files, and real TLS
peers accepting and refusing them: Python's ssl over a loopback socket, and a real
nats-server with mutual TLS.

The webhook's self-made certificate, built on the same functions, is checked against
openssl in tests/scheduler/tls/test_webhook_tls.py and tests/e2e/test_webhook.py.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import re
import socket
import ssl
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import nats
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.certificates import (
    BACKDATE,
    CLIENT_NAME,
    FILE_NAMES,
    KUBE_SCHEDULER_NAME,
    Bundle,
    dns_name,
    ip_address,
    write_bundle,
)
from common.core.errors import SettingsError
from pyhami.natsserver import LocalNatsServer
from tests.harness import eventually

NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
TIMEOUT_S = 10
# OpenSSL's verification codes, whose wording changes between its versions.
UNTRUSTED = {19, 20}  # X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN, ..._UNABLE_TO_GET_ISSUER_CERT_LOCALLY
WRONG_PURPOSE = 26  # X509_V_ERR_INVALID_PURPOSE
NAME_MISMATCH = {62, 64}  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return write_bundle(tmp_path_factory.mktemp("first") / "certs")


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    """A second bundle: another CA."""
    return write_bundle(tmp_path_factory.mktemp("second") / "certs")


def certificate(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def common_name(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# The files.

def test_the_bundle_has_one_file_per_attribute_named_as_agreed(bundle: Bundle) -> None:
    assert {field.name: getattr(bundle, field.name).name for field in fields(bundle)} == {
        "ca": "ca.pem", "ca_key": "ca.key", "nats": "nats.pem", "nats_key": "nats.key",
        "extender": "extender.pem", "extender_key": "extender.key",
        "kube_scheduler": "kube-scheduler.pem", "kube_scheduler_key": "kube-scheduler.key",
        "client": "client.pem", "client_key": "client.key"}
    assert bundle.paths().keys() == FILE_NAMES.keys()
    assert all(path.parent == bundle.ca.parent for path in bundle.paths().values())


def test_keys_are_readable_by_their_owner_only(bundle: Bundle) -> None:
    for field, path in bundle.paths().items():
        if field.endswith("_key"):
            assert mode(path) == 0o600, path
            assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
        else:
            assert mode(path) & 0o077 == 0o044 & mode(path), path  # group/other: read at most
            assert path.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
    assert mode(bundle.ca.parent) == 0o700


def test_what_each_certificate_is_for(tmp_path: Path) -> None:
    made = write_bundle(tmp_path / "certs", dns=("nats.pyhami.svc", "*.nats.pyhami.svc"),
                        ips=("10.0.0.7", "::1"), days=30, now=NOW)
    ca = certificate(made.ca)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca and constraints.path_length == 0
    usages = {"nats": ExtendedKeyUsageOID.SERVER_AUTH,
              "extender": ExtendedKeyUsageOID.SERVER_AUTH,
              "kube_scheduler": ExtendedKeyUsageOID.CLIENT_AUTH,
              "client": ExtendedKeyUsageOID.CLIENT_AUTH}
    for field, usage in usages.items():
        leaf = certificate(getattr(made, field))
        leaf.verify_directly_issued_by(ca)
        assert list(leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) \
            == [usage], field
        assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for leaf in (ca, *(certificate(getattr(made, field)) for field in usages)):
        assert leaf.not_valid_before_utc == NOW - BACKDATE
        assert leaf.not_valid_after_utc == NOW + datetime.timedelta(days=30)
    for field in ("nats", "extender"):
        names = certificate(getattr(made, field)).extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value
        assert names.get_values_for_type(x509.DNSName) == ["nats.pyhami.svc",
                                                            "*.nats.pyhami.svc"]
        assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == [
            "10.0.0.7", "::1"]
    for field, name in (("kube_scheduler", KUBE_SCHEDULER_NAME), ("client", CLIENT_NAME)):
        assert common_name(certificate(getattr(made, field))) == name


def test_each_bundle_has_its_own_ca(bundle: Bundle, other: Bundle) -> None:
    assert certificate(bundle.ca).subject != certificate(other.ca).subject
    assert bundle.ca_key.read_bytes() != other.ca_key.read_bytes()


def test_a_bundle_is_not_overwritten_unless_forced(tmp_path: Path) -> None:
    made = write_bundle(tmp_path / "certs")
    before = {path: path.read_bytes() for path in made.paths().values()}
    with pytest.raises(SettingsError, match=r"certs already holds ca\.pem, ca\.key, .*"
                                            r"client\.key: .* unless forced \(--force\)"):
        write_bundle(tmp_path / "certs")
    assert {path: path.read_bytes() for path in made.paths().values()} == before
    made.ca_key.chmod(0o644)
    write_bundle(tmp_path / "certs", force=True)
    assert made.ca.read_bytes() != before[made.ca]
    assert mode(made.ca_key) == 0o600
    assert sorted(path.name for path in (tmp_path / "certs").iterdir()) == sorted(
        FILE_NAMES.values())  # nothing staged is left behind


def test_one_file_of_a_bundle_is_enough_to_refuse(tmp_path: Path) -> None:
    (tmp_path / "client.key").write_text("mine")
    with pytest.raises(SettingsError, match=r"already holds client\.key: "):
        write_bundle(tmp_path)
    assert [path.name for path in tmp_path.iterdir()] == ["client.key"]


def test_a_path_taken_by_a_directory_writes_nothing_even_when_forced(tmp_path: Path) -> None:
    (tmp_path / "nats.key").mkdir()
    with pytest.raises(SettingsError, match=r"nats\.key exists and is not a file$"):
        write_bundle(tmp_path, force=True)
    assert [path.name for path in tmp_path.iterdir()] == ["nats.key"]


@pytest.mark.parametrize(("settings", "problem"), [
    ({"dns": ("nats", "bad name")}, r"^'bad name' is not a DNS name$"),
    ({"dns": ("10.0.0.1",)}, r"^'10\.0\.0\.1' is an IP address, not a DNS name$"),
    ({"ips": ("127.0.0.1", "localhost")}, r"^'localhost' is not an IP address$"),
    ({"dns": (), "ips": ()}, r"needs at least one DNS name or IP address$"),
    ({"days": 0}, r"^days must be from 1 to 36500, not 0$"),
    ({"days": 36501}, r"^days must be from 1 to 36500, not 36501$"),
])
def test_bad_input_is_refused_naming_it_and_nothing_is_written(
        tmp_path: Path, settings: dict[str, object], problem: str) -> None:
    with pytest.raises(SettingsError, match=problem):
        write_bundle(tmp_path / "certs", **settings)  # type: ignore[arg-type]
    assert not (tmp_path / "certs").exists()


def test_a_directory_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "certs").write_text("notes")
    with pytest.raises(SettingsError, match=r"certs exists and is not a directory$"):
        write_bundle(tmp_path / "certs")
    assert (tmp_path / "certs").read_text() == "notes"


@pytest.mark.parametrize("name", ["localhost", "nats", "nats-0.nats.pyhami.svc",
                                  "*.pyhami.svc", "a" * 63, "X1.example"])
def test_dns_names_a_certificate_carries(name: str) -> None:
    assert dns_name(name) == name


@pytest.mark.parametrize("name", ["", "a..b", "-a", "a-", "a_b", "a b", "a" * 64, "*",
                                  "a.*.b", "nats.", "bücher.example", "::1"])
def test_text_that_is_no_dns_name(name: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(repr(name))} is"):
        dns_name(name)


def test_ip_addresses() -> None:
    assert str(ip_address("fd00::1")) == "fd00::1"
    with pytest.raises(ValueError, match=r"^'256\.0\.0\.1' is not an IP address$"):
        ip_address("256.0.0.1")


# Python's ssl, a server and a client on a loopback socket.

def server_context(cert: Path, key: Path, client_ca: Path) -> ssl.SSLContext:
    """A server that requires a client certificate signed by ``client_ca``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.load_verify_locations(client_ca)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(ca: Path, cert: Path | None = None,
                   key: Path | None = None) -> ssl.SSLContext:
    """A client that checks the server against ``ca`` and the name it dials."""
    context = ssl.create_default_context(cafile=ca)
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


@dataclass
class Handshake:
    received: bytes | None = None
    client_error: OSError | None = None
    server_error: OSError | None = None
    peer: str | None = None
    """The client certificate's CN, as the server saw it."""


def handshake(server: ssl.SSLContext, client: ssl.SSLContext,
              server_hostname: str) -> Handshake:
    """One connection over 127.0.0.1: the server greets a client it accepts with
    ``hello``."""
    outcome = Handshake()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(TIMEOUT_S)

        def serve() -> None:
            connection, _ = listener.accept()
            connection.settimeout(TIMEOUT_S)
            try:
                with server.wrap_socket(connection, server_side=True) as tls:
                    peer = tls.getpeercert(binary_form=True)
                    assert peer is not None  # required by the context
                    outcome.peer = common_name(x509.load_der_x509_certificate(peer))
                    tls.sendall(b"hello")
            except OSError as error:  # ssl.SSLError among them
                outcome.server_error = error
                connection.close()

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            with socket.create_connection(listener.getsockname(), timeout=TIMEOUT_S) as raw, \
                    client.wrap_socket(raw, server_hostname=server_hostname) as tls:
                outcome.received = tls.recv(5) or None
        except OSError as error:
            outcome.client_error = error
        finally:
            thread.join(TIMEOUT_S)
    return outcome


@pytest.mark.parametrize("name", ["localhost", "nats", "scheduler", "127.0.0.1"])
def test_mutual_tls_between_the_nats_certificate_and_the_client(bundle: Bundle,
                                                                 name: str) -> None:
    outcome = handshake(server_context(bundle.nats, bundle.nats_key, bundle.ca),
                        client_context(bundle.ca, bundle.client, bundle.client_key), name)
    assert outcome == Handshake(received=b"hello", peer=CLIENT_NAME)


def test_kube_scheduler_calls_the_extender(bundle: Bundle) -> None:
    outcome = handshake(server_context(bundle.extender, bundle.extender_key, bundle.ca),
                        client_context(bundle.ca, bundle.kube_scheduler,
                                       bundle.kube_scheduler_key), "localhost")
    assert outcome == Handshake(received=b"hello", peer=KUBE_SCHEDULER_NAME)


def test_a_client_certificate_of_another_ca_is_refused(bundle: Bundle, other: Bundle) -> None:
    outcome = handshake(server_context(bundle.nats, bundle.nats_key, bundle.ca),
                        client_context(bundle.ca, other.client, other.client_key), "nats")
    assert isinstance(outcome.server_error, ssl.SSLCertVerificationError)
    assert outcome.server_error.verify_code in UNTRUSTED
    assert outcome.received is None and outcome.peer is None


def test_a_client_without_a_certificate_is_refused(bundle: Bundle) -> None:
    outcome = handshake(server_context(bundle.nats, bundle.nats_key, bundle.ca),
                        client_context(bundle.ca), "nats")
    assert isinstance(outcome.server_error, ssl.SSLError)
    assert "peer did not return a certificate" in str(outcome.server_error)
    assert outcome.received is None


@pytest.mark.parametrize("name", ["pyhami.example", "nats.pyhami.svc", "127.0.0.2"])
def test_the_server_certificate_fails_for_a_name_it_does_not_carry(bundle: Bundle,
                                                                   name: str) -> None:
    outcome = handshake(server_context(bundle.nats, bundle.nats_key, bundle.ca),
                        client_context(bundle.ca, bundle.client, bundle.client_key), name)
    assert isinstance(outcome.client_error, ssl.SSLCertVerificationError)
    assert outcome.client_error.verify_code in NAME_MISMATCH
    assert outcome.received is None


def test_a_client_trusting_another_ca_refuses_the_server(bundle: Bundle,
                                                         other: Bundle) -> None:
    outcome = handshake(server_context(bundle.nats, bundle.nats_key, bundle.ca),
                        client_context(other.ca, bundle.client, bundle.client_key), "nats")
    assert isinstance(outcome.client_error, ssl.SSLCertVerificationError)
    assert outcome.client_error.verify_code in UNTRUSTED


def test_a_client_certificate_cannot_serve_and_a_server_certificate_cannot_call(
        bundle: Bundle) -> None:
    serving_as_client = handshake(server_context(bundle.client, bundle.client_key, bundle.ca),
                                  client_context(bundle.ca, bundle.client, bundle.client_key),
                                  "localhost")
    assert isinstance(serving_as_client.client_error, ssl.SSLCertVerificationError)
    assert serving_as_client.client_error.verify_code == WRONG_PURPOSE
    calling_as_server = handshake(server_context(bundle.nats, bundle.nats_key, bundle.ca),
                                  client_context(bundle.ca, bundle.nats, bundle.nats_key),
                                  "localhost")
    assert isinstance(calling_as_server.server_error, ssl.SSLCertVerificationError)
    assert calling_as_server.server_error.verify_code == WRONG_PURPOSE


# A real nats-server with mutual TLS from the bundle.

@dataclass
class NatsTls:
    server: LocalNatsServer
    log: Path

    async def logged(self, line: str) -> None:
        """Waits until the server's log holds ``line``: it says why it refused a client."""
        async def found() -> bool:
            return self.log.is_file() and line in self.log.read_text()
        await eventually(found, f"nats-server to log {line!r}")


@pytest.fixture
def nats_tls(nats_server_factory: Callable[..., LocalNatsServer], bundle: Bundle,
             tmp_path: Path) -> NatsTls:
    config, log = tmp_path / "nats.conf", tmp_path / "nats.log"
    config.write_text(f"""log_file: "{log}"
tls {{
  cert_file: "{bundle.nats}"
  key_file: "{bundle.nats_key}"
  ca_file: "{bundle.ca}"
  verify: true
}}
""")
    return NatsTls(nats_server_factory(extra_args=["-c", str(config)], scheme="tls"), log)


async def test_nats_accepts_a_client_with_the_bundles_client_certificate(
        nats_tls: NatsTls, bundle: Bundle) -> None:
    client = await nats.connect(nats_tls.server.url, connect_timeout=TIMEOUT_S,
                                tls=client_context(bundle.ca, bundle.client, bundle.client_key))
    try:
        subscription = await client.subscribe("pyhami.certs")
        await client.publish("pyhami.certs", b"over mutual TLS")
        assert (await subscription.next_msg(timeout=TIMEOUT_S)).data == b"over mutual TLS"
    finally:
        await client.close()


async def connect_once(url: str, tls: ssl.SSLContext) -> None:
    async def quiet(_: Exception) -> None:
        """The refusal is asserted from the server's side."""

    await nats.connect(url, tls=tls, connect_timeout=TIMEOUT_S, allow_reconnect=False,
                       max_reconnect_attempts=0, error_cb=quiet)


async def test_nats_refuses_a_client_without_a_certificate(nats_tls: NatsTls,
                                                           bundle: Bundle) -> None:
    with pytest.raises((OSError, nats.errors.Error)):
        await connect_once(nats_tls.server.url, client_context(bundle.ca))
    await nats_tls.logged("client didn't provide a certificate")


async def test_nats_refuses_a_client_certificate_of_another_ca(
        nats_tls: NatsTls, bundle: Bundle, other: Bundle) -> None:
    with pytest.raises((OSError, nats.errors.Error)):
        await connect_once(nats_tls.server.url,
                           client_context(bundle.ca, other.client, other.client_key))
    await nats_tls.logged("certificate signed by unknown authority")


async def in_clear(port: int) -> tuple[dict[str, object], list[bytes]]:
    """A client speaking the protocol in clear: the server's INFO, and the lines it
    answers CONNECT and PING with, until PONG or until it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        kind, _, info = (await asyncio.wait_for(reader.readline(), TIMEOUT_S)).partition(b" ")
        assert kind == b"INFO"
        writer.write(b'CONNECT {"verbose":false}\r\nPING\r\n')
        await writer.drain()
        lines: list[bytes] = []
        while not lines or lines[-1] not in (b"", b"PONG\r\n"):
            lines.append(await asyncio.wait_for(reader.readline(), TIMEOUT_S))
        return json.loads(info), lines
    finally:
        writer.close()


async def test_nats_refuses_a_plain_client(nats_tls: NatsTls,
                                           nats_server: LocalNatsServer) -> None:
    info, answer = await in_clear(nats_tls.server.port)
    assert info["tls_required"] is True and info["tls_verify"] is True
    assert answer[-1] == b""  # closed, never a PONG
    # The same words get their PONG from a server without TLS.
    assert (await in_clear(nats_server.port))[1][-1] == b"PONG\r\n"
