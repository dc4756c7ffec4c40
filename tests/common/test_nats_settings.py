"""NATS settings from flags and their PYHAMI_NATS* variables, and the reconnection backoff."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from common.arguments import CommandParser, use_environment
from common.core.errors import SettingsError
from common.messaging import (
    DEFAULT_URL,
    NatsSettings,
    add_nats_arguments,
    nats_settings,
    reconnect_delay,
)


def _settings(*flags: str, environ: dict[str, str] | None = None) -> NatsSettings:
    parser = CommandParser()
    add_nats_arguments(parser)
    use_environment(parser, environ or {})
    return nats_settings(parser.parse_args(list(flags)))


def test_defaults_connect_to_the_local_server_without_credentials() -> None:
    assert _settings() == NatsSettings(servers=(DEFAULT_URL,))


def test_variables_fill_in_and_flags_win(tmp_path: Path) -> None:
    settings = _settings("--nats-user", "agent", environ={
        "PYHAMI_NATS": "nats-0.nats:4222, tls://nats-1.nats:4222",
        "PYHAMI_NATS_USER": "ignored",
        "PYHAMI_NATS_PASSWORD": "s3cret",
        "PYHAMI_NATS_RECONNECT_MAX_WAIT": "2.5",
    })
    assert settings.servers == ("nats://nats-0.nats:4222", "tls://nats-1.nats:4222")
    assert (settings.user, settings.password) == ("agent", "s3cret")
    assert settings.reconnect_max_wait == 2.5


@pytest.mark.parametrize(("flags", "environ", "problem"), [
    (["--nats", "http://x:1"], {}, r"--nats \(PYHAMI_NATS\): 'http://x:1' is not a NATS URL"),
    (["--nats-token", "t", "--nats-user", "u", "--nats-password", "p"], {},
     "give one method, not user/password and token"),
    (["--nats-user", "u"], {}, r"--nats-user \(PYHAMI_NATS_USER\) and --nats-password"),
    ([], {"PYHAMI_NATS_CA": "/nonexistent/ca.pem"},
     r"--nats-ca \(PYHAMI_NATS_CA\): /nonexistent/ca.pem is not a readable file"),
    (["--nats-reconnect-max-wait", "0"], {}, "--nats-reconnect-max-wait .* must be above 0"),
    (["--nats-reconnect-max-wait", "soon"], {}, "'soon' is not a number of seconds"),
])
def test_a_bad_setting_is_refused_naming_the_flag_and_variable(
        flags: list[str], environ: dict[str, str], problem: str) -> None:
    with pytest.raises(SettingsError, match=problem):
        _settings(*flags, environ=environ)


def test_a_certificate_without_its_key_is_refused(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("not a certificate")
    with pytest.raises(SettingsError, match=r"--nats-cert .* and --nats-key .* go together"):
        _settings("--nats-cert", str(cert))


def test_a_ca_file_that_is_no_certificate_is_refused_at_startup(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate")
    with pytest.raises(SettingsError, match=r"--nats-ca \(PYHAMI_NATS_CA\): .*ca.pem"):
        _settings("--nats-ca", str(ca))


def test_nkey_authentication_without_the_nkeys_package_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: None if name == "nkeys" else find_spec(name, *rest))
    seed = tmp_path / "agent.nk"
    seed.write_text("SUAseed")
    with pytest.raises(SettingsError, match="need the Python package 'nkeys'"):
        _settings("--nats-nkey-seed", str(seed))


def test_reconnect_delays_double_up_to_the_cap_and_keep_at_least_half() -> None:
    upper = [reconnect_delay(attempt, jitter=1.0, cap=10.0, base=0.25) for attempt in range(10)]
    assert upper[:7] == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
    assert upper[7:] == [10.0] * 3
    assert reconnect_delay(3, jitter=0.0, cap=10.0, base=0.25) == 1.0
    assert reconnect_delay(10_000, jitter=0.5, cap=10.0) == 7.5
