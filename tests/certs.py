"""Test certificates made with the openssl command, apart from the code under test."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

P256 = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def certificate_authority(directory: Path, name: str) -> Path:
    """A self-signed P-256 CA ``<name>.pem`` (its key ``<name>.key`` beside it), valid a day."""
    directory.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", *P256, "-keyout", f"{name}.key", "-out", f"{name}.pem",
            "-days", "1", "-subj", f"/CN={name}", cwd=directory)
    return directory / f"{name}.pem"


def _signed(directory: Path, ca: Path, name: str, extensions: str) -> tuple[Path, Path]:
    """A P-256 certificate ``<name>.pem`` (key ``<name>.key``) that ``ca`` signed."""
    (directory / f"{name}.ext").write_text(extensions)
    openssl("req", *P256, "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}", cwd=directory)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", str(ca),
            "-CAkey", str(ca.with_suffix(".key")), "-CAcreateserial", "-days", "1",
            "-out", f"{name}.pem", "-extfile", f"{name}.ext", cwd=directory)
    return directory / f"{name}.pem", directory / f"{name}.key"


@dataclass(frozen=True)
class ServerFiles:
    ca: Path
    cert: Path
    key: Path


def server_files(directory: Path, name: str = "server",
                 san: str = "IP:127.0.0.1,DNS:localhost") -> ServerFiles:
    """A CA ``<name>-ca`` and a P-256 serving certificate for ``san`` it signed, valid a day."""
    ca = certificate_authority(directory, f"{name}-ca")
    cert, key = _signed(directory, ca, name,
                        f"subjectAltName={san}\nextendedKeyUsage=serverAuth\n")
    return ServerFiles(ca, cert, key)


@dataclass(frozen=True)
class ClientFiles:
    cert: Path
    key: Path


def client_files(directory: Path, ca: Path, name: str = "client") -> ClientFiles:
    """A P-256 client certificate (clientAuth, CN ``name``) that the CA ``ca`` signed (a
    ``certificate_authority``, its key beside it), valid a day."""
    directory.mkdir(parents=True, exist_ok=True)
    return ClientFiles(*_signed(directory, ca, name, "extendedKeyUsage=clientAuth\n"))
