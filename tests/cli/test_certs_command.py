"""``pyhami certs init``: the files it writes, what it prints, and what it refuses."""

from __future__ import annotations

import datetime
import stat
from pathlib import Path

import pytest
from cryptography import x509

from common.certificates import FILE_NAMES
from pyhami.cli import main
from tests.commands import run_command


def certs_init(capsys: pytest.CaptureFixture[str], *argv: str | Path,
               environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The exit code, stdout and stderr of ``pyhami certs init ARGV``; an argparse error
    (exit 2) included."""
    return run_command(capsys, "certs", "init", *argv, environ=environ)


def server_names(path: Path) -> list[str]:
    names = x509.load_pem_x509_certificate(path.read_bytes()).extensions \
        .get_extension_for_class(x509.SubjectAlternativeName).value
    return [*names.get_values_for_type(x509.DNSName),
            *map(str, names.get_values_for_type(x509.IPAddress))]


def test_it_writes_the_bundle_and_says_what_it_wrote(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = certs_init(capsys, tmp_path / "certs")
    assert (code, err) == (0, "")
    written = {path.name: stat.S_IMODE(path.stat().st_mode)
               for path in (tmp_path / "certs").iterdir()}
    assert written.keys() == set(FILE_NAMES.values())
    assert all(mode == 0o600 for name, mode in written.items() if name.endswith(".key"))
    assert out.splitlines()[0] == (f"wrote {tmp_path / 'certs'}, every certificate valid "
                                   "365 days, keys mode 0600:")
    for name in FILE_NAMES.values():
        assert name in out
    assert "NATS server (serverAuth): localhost, nats, scheduler, 127.0.0.1" in out
    assert "client (clientAuth): CN=kube-scheduler" in out
    for server in ("nats.pem", "extender.pem"):
        assert server_names(tmp_path / "certs" / server) == [
            "localhost", "nats", "scheduler", "127.0.0.1"]


def test_names_addresses_and_days_from_flags_or_variables(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = certs_init(capsys, tmp_path / "flags", "--dns", "nats.pyhami.svc, nats",
                              "--ip", "10.0.0.7,::1", "--days", "30")
    assert code == 0, err
    assert server_names(tmp_path / "flags" / "nats.pem") == [
        "nats.pyhami.svc", "nats", "10.0.0.7", "::1"]
    cert = x509.load_pem_x509_certificate((tmp_path / "flags" / "client.pem").read_bytes())
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == datetime.timedelta(
        days=30, hours=1)  # valid from an hour before it was made
    code, _, err = certs_init(capsys, tmp_path / "variables", environ={
        "PYHAMI_DNS": "pyhami-nats", "PYHAMI_IP": "192.0.2.1"})
    assert code == 0, err
    assert server_names(tmp_path / "variables" / "extender.pem") == ["pyhami-nats",
                                                                     "192.0.2.1"]


def test_an_existing_bundle_is_kept_unless_forced(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    assert certs_init(capsys, tmp_path)[0] == 0
    ca = (tmp_path / "ca.pem").read_bytes()
    code, out, err = certs_init(capsys, tmp_path)
    assert (code, out) == (2, "")
    assert err == (f"pyhami certs init: {tmp_path} already holds ca.pem, ca.key, nats.pem, "
                   "nats.key, extender.pem, extender.key, kube-scheduler.pem, "
                   "kube-scheduler.key, client.pem, client.key: a bundle is not overwritten "
                   "unless forced (--force)\n")
    assert (tmp_path / "ca.pem").read_bytes() == ca
    assert certs_init(capsys, tmp_path, "--force")[0] == 0
    assert (tmp_path / "ca.pem").read_bytes() != ca


@pytest.mark.parametrize(("argv", "error"), [
    (["--dns", "nats,bad_name"], "argument --dns: 'bad_name' is not a DNS name"),
    (["--dns", "192.0.2.1"], "argument --dns: '192.0.2.1' is an IP address, not a DNS name"),
    (["--ip", "127.0.0.1,300.0.0.1"], "argument --ip: '300.0.0.1' is not an IP address"),
    (["--ip", "localhost"], "argument --ip: 'localhost' is not an IP address"),
    (["--days", "0"], "argument --days: '0' must be at least 1"),
    (["--days", "100000"], "days must be from 1 to 36500, not 100000"),
])
def test_bad_input_is_refused_naming_it_and_writes_nothing(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str],
        error: str) -> None:
    code, out, err = certs_init(capsys, tmp_path / "certs", *argv)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1].endswith(error)
    assert not (tmp_path / "certs").exists()


def test_a_bad_variable_is_refused_naming_it(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    code, _, err = certs_init(capsys, tmp_path / "certs", environ={"PYHAMI_DNS": "a b"})
    assert code == 2
    assert err.splitlines()[-1] == ("pyhami certs init: error: PYHAMI_DNS (for --dns): "
                                    "'a b' is not a DNS name")
    assert not (tmp_path / "certs").exists()


def test_a_directory_that_is_a_file_is_refused(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    (tmp_path / "certs").write_text("notes")
    assert certs_init(capsys, tmp_path / "certs") == (
        2, "", f"pyhami certs init: {tmp_path / 'certs'} exists and is not a directory\n")
    assert (tmp_path / "certs").read_text() == "notes"


def test_keep_existing_leaves_a_complete_bundle_and_makes_a_missing_one(tmp_path: Path) -> None:
    directory = tmp_path / "certs"
    assert main(["certs", "init", str(directory), "--keep-existing"]) == 0
    ca = (directory / "ca.pem").read_bytes()
    assert main(["certs", "init", str(directory), "--keep-existing"]) == 0
    assert (directory / "ca.pem").read_bytes() == ca
    (directory / "client.key").unlink()
    # An incomplete bundle is neither kept nor overwritten without --force.
    assert main(["certs", "init", str(directory), "--keep-existing"]) == 2
    assert (directory / "ca.pem").read_bytes() == ca
