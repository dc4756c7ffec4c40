"""pyhami's own certificates: a private CA (EC P-256), the server certificates
(serverAuth) and client certificates (clientAuth) it signs, and the bundle
``pyhami certs init`` writes for NATS, the extender and kube-scheduler.

Making a certificate is apart from writing it: ``make_ca``, ``server_certificate``,
``client_certificate`` and ``issue_bundle`` take data and return PEM texts;
``write_bundle`` checks its input, issues every file in memory, and only then writes
them, each key readable by its owner only.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.core.errors import SettingsError
from common.files import PRIVATE_MODE, write_files

# Valid from a little before now: a peer's clock may run behind the issuer's.
BACKDATE = datetime.timedelta(hours=1)
# The names a bundle's server certificates carry by default: this machine, and the
# services of docker-compose.yml that serve TLS.
DEFAULT_DNS = ("localhost", "nats", "scheduler")
DEFAULT_IPS = ("127.0.0.1",)
DEFAULT_DAYS = 365
MAX_DAYS = 36500  # a hundred years: far enough, and within what X.509 dates can say
KUBE_SCHEDULER_NAME = "kube-scheduler"
CLIENT_NAME = "pyhami-client"
KEY_MODE = PRIVATE_MODE
CERT_MODE = 0o644

_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its private key, as PEM texts."""

    cert: bytes
    key: bytes


@dataclass(frozen=True, slots=True)
class Authority:
    """A CA that can sign: its certificate and its private key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def pem(self) -> Issued:
        return Issued(self.cert.public_bytes(serialization.Encoding.PEM), _pem_key(self.key))


@dataclass(frozen=True, slots=True)
class Bundle:
    """The files of a bundle: one path per file, named as in ``FILE_NAMES``."""

    ca: Path
    ca_key: Path
    nats: Path
    nats_key: Path
    extender: Path
    extender_key: Path
    kube_scheduler: Path
    kube_scheduler_key: Path
    client: Path
    client_key: Path

    @classmethod
    def in_directory(cls, directory: Path) -> Bundle:
        return cls(**{field: directory / name for field, name in FILE_NAMES.items()})

    def paths(self) -> dict[str, Path]:
        """Each file's path by its attribute's name, in ``FILE_NAMES``' order."""
        return {field.name: getattr(self, field.name) for field in fields(self)}


FILE_NAMES = {
    "ca": "ca.pem", "ca_key": "ca.key",
    "nats": "nats.pem", "nats_key": "nats.key",
    "extender": "extender.pem", "extender_key": "extender.key",
    "kube_scheduler": "kube-scheduler.pem", "kube_scheduler_key": "kube-scheduler.key",
    "client": "client.pem", "client_key": "client.key",
}


def dns_name(text: str) -> str:
    """``text`` if it is a DNS name a certificate can carry (ASCII labels of letters,
    digits and inner dashes, a ``*`` first label for a wildcard); raises ``ValueError``
    saying why not."""
    if _is_ip(text):
        raise ValueError(f"{text!r} is an IP address, not a DNS name")
    labels = text.split(".")
    wildcard = labels[0] == "*" and len(labels) > 1
    if len(text) > 253 or not all(_LABEL.fullmatch(label)
                                  for label in labels[1 if wildcard else 0:]):
        raise ValueError(f"{text!r} is not a DNS name")
    return text


def ip_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """Raises ``ValueError`` when ``text`` is no IPv4 or IPv6 address."""
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address") from None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _key_usage(*, sign: bool, certify: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=sign, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=certify,
        crl_sign=certify, encipher_only=False, decipher_only=False)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(common_name: str, *, now: datetime.datetime,
            validity: datetime.timedelta) -> Authority:
    """A new CA, valid from a little before ``now`` until ``now + validity``; it signs
    certificates only, not other CAs."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(sign=False, certify=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return Authority(cert, key)


def _leaf(ca: Authority, common_name: str, usage: x509.ObjectIdentifier,
          alternative_names: Sequence[x509.GeneralName], *, now: datetime.datetime,
          validity: datetime.timedelta) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder()
               .subject_name(_name(common_name)).issuer_name(ca.cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - BACKDATE).not_valid_after(now + validity))
    if alternative_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alternative_names),
                                        critical=False)
    cert = (builder
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(sign=True, certify=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca.key.public_key()), critical=False)
            .sign(ca.key, hashes.SHA256()))
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def server_certificate(ca: Authority, common_name: str, dns: Sequence[str],
                       ips: Sequence[str], *, now: datetime.datetime,
                       validity: datetime.timedelta) -> Issued:
    """A serving certificate (serverAuth) for the names ``dns`` and addresses ``ips``,
    signed by ``ca``. Raises ``ValueError`` for a name or address it cannot carry, or
    for none at all (clients check the name they dial against these)."""
    names: list[x509.GeneralName] = [x509.DNSName(dns_name(name)) for name in dns]
    names += [x509.IPAddress(ip_address(ip)) for ip in ips]
    if not names:
        raise ValueError("a server certificate needs at least one DNS name or IP address")
    return _leaf(ca, common_name, ExtendedKeyUsageOID.SERVER_AUTH, names, now=now,
                 validity=validity)


def client_certificate(ca: Authority, common_name: str, *, now: datetime.datetime,
                       validity: datetime.timedelta) -> Issued:
    """A client certificate (clientAuth) whose subject is ``CN=common_name``."""
    return _leaf(ca, common_name, ExtendedKeyUsageOID.CLIENT_AUTH, (), now=now,
                 validity=validity)


def issue_bundle(dns: Sequence[str], ips: Sequence[str], *, now: datetime.datetime,
                 validity: datetime.timedelta) -> dict[str, bytes]:
    """Every file of a bundle, PEM text by ``Bundle`` attribute: a new CA, the NATS and
    extender server certificates for ``dns`` and ``ips``, and the client certificates of
    kube-scheduler and of a generic NATS client. Raises ``ValueError`` as
    ``server_certificate`` does."""
    ca = make_ca(f"pyhami CA {secrets.token_hex(4)}", now=now, validity=validity)
    issued = {
        "ca": ca.pem(),
        "nats": server_certificate(ca, "pyhami-nats", dns, ips, now=now, validity=validity),
        "extender": server_certificate(ca, "pyhami-extender", dns, ips, now=now,
                                       validity=validity),
        "kube_scheduler": client_certificate(ca, KUBE_SCHEDULER_NAME, now=now,
                                             validity=validity),
        "client": client_certificate(ca, CLIENT_NAME, now=now, validity=validity),
    }
    files: dict[str, bytes] = {}
    for name, pair in issued.items():
        files[name], files[f"{name}_key"] = pair.cert, pair.key
    return files


def _unique(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(values))


def write_bundle(directory: Path, *, dns: Sequence[str] = DEFAULT_DNS,
                 ips: Sequence[str] = DEFAULT_IPS, days: int = DEFAULT_DAYS,
                 force: bool = False, now: datetime.datetime | None = None) -> Bundle:
    """Issue a bundle valid ``days`` days and write it into ``directory`` (made, mode
    0700, when missing). Keys are written mode 0600, certificates 0644 (less what the
    umask takes).

    Raises ``SettingsError`` naming what is wrong: a name, an address or ``days``;
    ``directory`` or a file's path taken by something else; a file of the bundle there
    already (unless ``force``). Nothing is written then; a write that fails removes
    what it staged.
    """
    if not 1 <= days <= MAX_DAYS:
        raise SettingsError(f"days must be from 1 to {MAX_DAYS}, not {days}")
    bundle = Bundle.in_directory(directory)
    if directory.exists() and not directory.is_dir():
        raise SettingsError(f"{directory} exists and is not a directory")
    existing = [path for path in bundle.paths().values() if path.exists()]
    if existing and not force:
        raise SettingsError(f"{directory} already holds {', '.join(p.name for p in existing)}: "
                            "a bundle is not overwritten unless forced (--force)")
    for path in existing:
        if not path.is_file():
            raise SettingsError(f"{path} exists and is not a file")
    try:
        files = issue_bundle(_unique(dns), _unique(ips),
                             now=now or datetime.datetime.now(datetime.UTC),
                             validity=datetime.timedelta(days=days))
    except ValueError as error:
        raise SettingsError(str(error)) from None
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        paths = bundle.paths()
        write_files({path: files[field] for field, path in paths.items()},
                    {path: KEY_MODE if path.suffix == ".key" else CERT_MODE
                     for path in paths.values()})
    except OSError as error:
        raise SettingsError(f"{directory}: cannot write the bundle: "
                            f"{error.strerror or error}") from None
    return bundle
