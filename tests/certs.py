"""Test certificates made with the openssl command, apart from the code under test."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class ServerFiles:
    ca: Path
    cert: Path
    key: Path


def server_files(directory: Path, name: str = "server",
                 san: str = "IP:127.0.0.1,DNS:localhost") -> ServerFiles:
    """A CA ``<name>-ca`` and a P-256 serving certificate for ``san`` it signed, valid a day."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = f"{name}-ca"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "1",
            "-subj", f"/CN={ca}", cwd=directory)
    (directory / f"{name}.ext").write_text(
        f"subjectAltName={san}\nextendedKeyUsage=serverAuth\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
            cwd=directory)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "1", "-out", f"{name}.pem",
            "-extfile", f"{name}.ext", cwd=directory)
    return ServerFiles(directory / f"{ca}.pem", directory / f"{name}.pem",
                       directory / f"{name}.key")


@dataclass(frozen=True)
class ClientFiles:
    cert: Path
    key: Path


def client_files(directory: Path, ca: Path, name: str = "client") -> ClientFiles:
    """A P-256 client certificate (clientAuth, CN ``name``) signed by the CA ``ca``
    (``server_files``'s ``<name>-ca.pem``, its key beside it), valid a day."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ca.with_suffix(".key")
    (directory / f"{name}.ext").write_text("extendedKeyUsage=clientAuth\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
            cwd=directory)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-days", "1", "-out", f"{name}.pem",
            "-extfile", f"{name}.ext", cwd=directory)
    return ClientFiles(directory / f"{name}.pem", directory / f"{name}.key")
