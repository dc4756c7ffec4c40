"""The webhook's flags: read from the command line or PYHAMI_* variables, and settings
that cannot work refused with one clear line (exit 2)."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from pyhami.cli import build_parser
from scheduler.cli import config_from
from scheduler.config import DaemonConfig, WebhookConfig
from scheduler.tls.webhook import issue, service_names
from tests.certs import ServerFiles, server_files
from tests.scheduler.daemon.test_config_errors import one_clear_line, scheduler

NATS = "nats://127.0.0.1:4222"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> ServerFiles:
    return server_files(tmp_path_factory.mktemp("webhook-config"))


def parse(*argv: str) -> DaemonConfig:
    return config_from(build_parser().parse_args(["scheduler", *argv]))


def webhook_of(config: DaemonConfig) -> WebhookConfig:
    assert config.webhook is not None
    return config.webhook


def test_the_webhook_is_off_unless_asked_for() -> None:
    config = parse("--standalone", "--nats", NATS)
    assert config.webhook is None
    assert config.scheduler_name == "pyhami-scheduler"


def test_the_flags_and_their_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("{}")
    config = parse("--kubeconfig", str(kubeconfig), "--nats", NATS,
                   "--webhook-listen", ":8443", "--scheduler-name", "gpu-team")
    assert config.scheduler_name == "gpu-team"
    webhook = webhook_of(config)
    assert webhook.listen == ("0.0.0.0", 8443)
    assert (webhook.cert_file, webhook.key_file) == (None, None)
    assert webhook.namespace == "pyhami-system"
    assert webhook.tls_secret == "pyhami-scheduler-webhook-tls"
    assert webhook.service == "pyhami-scheduler"
    assert webhook.configuration == "pyhami-scheduler"
    assert webhook.check_period == 10.0


def test_every_flag_falls_back_to_its_environment_variable(
        monkeypatch: pytest.MonkeyPatch, tls: ServerFiles) -> None:
    for name, value in {
        "PYHAMI_WEBHOOK_LISTEN": "127.0.0.1:9443", "PYHAMI_SCHEDULER_NAME": "gpu-team",
        "PYHAMI_TLS_CERT_FILE": str(tls.cert), "PYHAMI_TLS_PRIVATE_KEY_FILE": str(tls.key),
        "PYHAMI_WEBHOOK_TLS_SECRET": "hook-tls", "PYHAMI_WEBHOOK_SERVICE": "hook",
        "PYHAMI_WEBHOOK_CONFIGURATION": "hook-config", "PYHAMI_NAMESPACE": "gpu",
        "PYHAMI_WEBHOOK_CHECK_PERIOD": "3",
    }.items():
        monkeypatch.setenv(name, value)
    config = parse("--standalone", "--nats", NATS)
    assert config.scheduler_name == "gpu-team"
    assert webhook_of(config) == WebhookConfig(
        listen=("127.0.0.1", 9443), cert_file=str(tls.cert), key_file=str(tls.key),
        namespace="gpu", tls_secret="hook-tls", service="hook", configuration="hook-config",
        check_period=3.0)


def test_the_namespace_defaults_to_the_pods_own(monkeypatch: pytest.MonkeyPatch,
                                                 tls: ServerFiles) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "gpu-operators")
    config = parse("--standalone", "--nats", NATS, "--webhook-listen", ":8443",
                   "--tls-cert-file", str(tls.cert), "--tls-private-key-file", str(tls.key))
    assert webhook_of(config).namespace == "gpu-operators"


@pytest.mark.parametrize(("flags", "refusal"), [
    (["--webhook-listen", "127.0.0.1:8443"],
     "--webhook-listen with --standalone needs --tls-cert-file and --tls-private-key-file: "
     "without Kubernetes there is no Secret to keep a certificate of its own in"),
    (["--webhook-listen", "127.0.0.1:8443", "--tls-cert-file", "{cert}"],
     "--tls-cert-file and --tls-private-key-file go together"),
    (["--tls-cert-file", "{cert}", "--tls-private-key-file", "{key}"],
     "--tls-cert-file serves the webhook: set --webhook-listen too"),
], ids=["standalone-without-certificate-files", "a-certificate-without-its-key",
        "certificate-files-without-a-listener"])
def test_standalone_webhook_flags_that_do_not_go_together_are_refused(
        tls: ServerFiles, flags: list[str], refusal: str) -> None:
    files = [flag.format(cert=tls.cert, key=tls.key) for flag in flags]
    line = one_clear_line(scheduler("--standalone", "--nats", NATS, *files))
    assert line == f"pyhami scheduler: {refusal}"


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--scheduler-name", "Pyhami_Scheduler", "--scheduler-name: 'Pyhami_Scheduler' is not a "
                                             "valid DNS-1123 subdomain"),
    ("--namespace", "gpu.team", "--namespace: 'gpu.team' is not a valid DNS-1123 label"),
    ("--webhook-configuration", "", "--webhook-configuration: must not be empty"),
])
def test_a_name_kubernetes_would_refuse_is_refused(tls: ServerFiles, flag: str, value: str,
                                                   message: str) -> None:
    line = one_clear_line(scheduler("--standalone", "--nats", NATS, "--webhook-listen",
                                    "127.0.0.1:8443", "--tls-cert-file", str(tls.cert),
                                    "--tls-private-key-file", str(tls.key), flag, value))
    assert line.startswith(f"pyhami scheduler: {message}")


def test_an_unreadable_certificate_file_stops_the_start(tmp_path: Path,
                                                        tls: ServerFiles) -> None:
    line = one_clear_line(scheduler("--standalone", "--nats", NATS, "--webhook-listen",
                                    "127.0.0.1:8443", "--tls-cert-file", str(tmp_path / "no.crt"),
                                    "--tls-private-key-file", str(tls.key)))
    assert line == (f"pyhami scheduler: --tls-cert-file: cannot read {tmp_path}/no.crt: "
                    "No such file or directory")


def test_a_key_that_is_not_the_certificates_stops_the_start(tmp_path: Path,
                                                           tls: ServerFiles) -> None:
    other = issue(service_names("x", "y"), datetime.datetime.now(datetime.UTC))
    key = tmp_path / "other.key"
    key.write_bytes(other.key)
    line = one_clear_line(scheduler("--standalone", "--nats", NATS, "--webhook-listen",
                                    "127.0.0.1:8443", "--tls-cert-file", str(tls.cert),
                                    "--tls-private-key-file", str(key)))
    assert line == (f"pyhami scheduler: --tls-private-key-file {key} is not the private key "
                    f"of the certificate in --tls-cert-file {tls.cert}")
