"""Secrets read from files (a NATS token, the bus credentials, TLS certificates and keys)
are read as configuration files are (issue 45): a FIFO or a device put in their place is
refused by what it is, never waited on or read without end."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from common.busaccess import DAEMON_PASSWORD, ISSUER_SEED, BusCredentials, CredentialsError
from common.messaging import NatsSettings, _credentials
from scheduler.tls.files import CertificateFiles, TlsError, TlsFlags


def fifo(path: Path) -> None:
    os.mkfifo(path)


def device(path: Path) -> None:
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # like /dev/zero: never ends


MAKERS = [pytest.param(fifo, "a FIFO", id="fifo"),
          pytest.param(device, "a character device", id="device")]


@pytest.mark.parametrize(("make", "kind"), MAKERS)
def test_a_token_file_that_is_not_a_file_gives_no_token(
        tmp_path: Path, make: Callable[[Path], None], kind: str,
        caplog: pytest.LogCaptureFixture) -> None:
    token = tmp_path / "token"
    make(token)
    read = _credentials(NatsSettings(token_file=token))["token"]
    assert read() == ""
    assert f"is {kind}, not a regular file" in caplog.text


@pytest.mark.parametrize(("make", "kind"), MAKERS)
def test_bus_credentials_that_are_not_files_are_refused(
        tmp_path: Path, make: Callable[[Path], None], kind: str) -> None:
    (tmp_path / ISSUER_SEED).write_text("seed")
    make(tmp_path / DAEMON_PASSWORD)
    with pytest.raises(CredentialsError) as refused:
        BusCredentials.read(tmp_path)
    assert str(refused.value) == (f"{tmp_path / DAEMON_PASSWORD}: is {kind}, not a regular "
                                  "file")


@pytest.mark.parametrize(("make", "kind"), MAKERS)
def test_a_certificate_that_is_not_a_file_is_refused(
        tmp_path: Path, make: Callable[[Path], None], kind: str) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    make(cert)
    key.write_text("key")
    with pytest.raises(TlsError) as refused:
        CertificateFiles("the extender", TlsFlags("--tls-cert", "--tls-key", "--client-ca"),
                         str(cert), str(key))
    assert str(refused.value) == (f"--tls-cert: cannot read {cert}: is {kind}, not a regular "
                                  "file")
