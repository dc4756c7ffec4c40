"""The extender over HTTPS, and with mutual TLS nothing served to a client without a
certificate the configured CA signed: not over plain HTTP, not without a certificate, not
with one from another CA. The kubelet's probes reach ``/healthz`` and ``/readyz`` on the
metrics listener instead.

Certificates come from the openssl command (``tests.certs``); the daemon is the real one,
in this event loop, against a real nats-server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import pytest

from common.core.errors import SettingsError
from pyhami.cli import build_parser
from pyhami.natsserver import LocalNatsServer, free_port
from pyhami.sandbox import RunningDaemon, standalone_config
from scheduler.cli import config_from
from scheduler.config import DaemonConfig, ExtenderTls
from scheduler.daemon import run_daemon
from tests.certs import (
    ClientFiles,
    ServerFiles,
    certificate_authority,
    client_files,
    server_files,
)
from tests.scheduler.daemon.test_config_errors import one_clear_line, scheduler

NATS = "nats://127.0.0.1:4222"


@dataclass(frozen=True)
class Pki:
    server: ServerFiles  # the extender's certificate and the CA that signed it
    client_ca: Path  # the CA kube-scheduler's certificate comes from
    kube_scheduler: ClientFiles
    stranger: ClientFiles  # a client certificate from another CA


def make_pki(directory: Path) -> Pki:
    client_ca = certificate_authority(directory, "clients-ca")
    return Pki(server_files(directory, "extender"), client_ca,
               client_files(directory, client_ca, "kube-scheduler"),
               client_files(directory, certificate_authority(directory, "other-ca"), "stranger"))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("extender-tls"))


def parse(*argv: str) -> DaemonConfig:
    return config_from(build_parser().parse_args(["scheduler", "--standalone", "--nats", NATS,
                                                  *argv]))


def client_context(pki: Pki, certificate: ClientFiles | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.server.ca))
    if certificate is not None:
        context.load_cert_chain(str(certificate.cert), str(certificate.key))
    return context


async def get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    connector = aiohttp.TCPConnector(ssl=context if context is not None else False,
                                     force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session, \
            session.get(url) as response:
        return response.status, await response.text()


async def refused(url: str, context: ssl.SSLContext | None = None) -> str:
    """What the client saw: no HTTP answer at all, whatever the path."""
    try:
        status, _ = await get(url, context)
    except (aiohttp.ClientError, ssl.SSLError, ConnectionError) as error:
        return f"{type(error).__name__}: {error}"
    raise AssertionError(f"{url} answered {status}")


# The flags ----------------------------------------------------------------------------------


def test_the_extender_listens_on_loopback_in_plain_http_by_default() -> None:
    config = parse()
    assert config.listen == ("127.0.0.1", 8888)
    assert config.metrics == ("0.0.0.0", 9395)
    assert config.extender_tls is None


def test_the_flags_and_their_variables(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse("--extender-cert-file", str(pki.server.cert),
                   "--extender-key-file", str(pki.server.key))
    assert config.extender_tls == ExtenderTls(str(pki.server.cert), str(pki.server.key))
    for name, value in {"PYHAMI_EXTENDER_CERT_FILE": pki.server.cert,
                        "PYHAMI_EXTENDER_KEY_FILE": pki.server.key,
                        "PYHAMI_EXTENDER_CLIENT_CA_FILE": pki.client_ca}.items():
        monkeypatch.setenv(name, str(value))
    assert parse().extender_tls == ExtenderTls(str(pki.server.cert), str(pki.server.key),
                                               str(pki.client_ca))


@pytest.mark.parametrize(("flags", "message"), [
    (["--extender-cert-file", "CERT"], "--extender-cert-file and --extender-key-file go together"),
    (["--extender-key-file", "KEY"], "--extender-cert-file and --extender-key-file go together"),
    (["--extender-client-ca-file", "CA"],
     "--extender-client-ca-file needs --extender-cert-file and --extender-key-file"),
])
def test_files_that_do_not_go_together_are_refused(pki: Pki, flags: list[str],
                                                   message: str) -> None:
    files = {"CERT": pki.server.cert, "KEY": pki.server.key, "CA": pki.client_ca}
    with pytest.raises(SettingsError, match=f"^{message}"):
        parse(*(str(files.get(flag, flag)) for flag in flags))


def test_files_that_cannot_be_served_are_refused_naming_the_flag(pki: Pki,
                                                                 tmp_path: Path) -> None:
    server = ["--extender-cert-file", str(pki.server.cert),
              "--extender-key-file", str(pki.server.key)]
    missing = tmp_path / "missing.pem"
    with pytest.raises(SettingsError, match=f"^--extender-cert-file: cannot read {missing}: "
                                            "No such file or directory$"):
        parse("--extender-cert-file", str(missing), "--extender-key-file", str(pki.server.key))
    other_key = pki.client_ca.with_suffix(".key")
    with pytest.raises(SettingsError, match=f"^--extender-key-file {other_key} is not the "
                                            "private key of the certificate in "
                                            f"--extender-cert-file {pki.server.cert}$"):
        parse("--extender-cert-file", str(pki.server.cert), "--extender-key-file", str(other_key))
    with pytest.raises(SettingsError, match=f"^--extender-client-ca-file {pki.server.key} "
                                            "holds no PEM certificate$"):
        parse(*server, "--extender-client-ca-file", str(pki.server.key))
    with pytest.raises(SettingsError, match=f"^--extender-client-ca-file: cannot read {missing}"):
        parse(*server, "--extender-client-ca-file", str(missing))


def test_the_command_prints_the_refusal_on_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    line = one_clear_line(scheduler("--standalone", "--nats", NATS, "--extender-cert-file",
                                    str(missing), "--extender-key-file", str(missing)))
    assert line == (f"pyhami scheduler: --extender-cert-file: cannot read {missing}: "
                    "No such file or directory")


# The listener -------------------------------------------------------------------------------


@pytest.fixture
async def mutual(jetstream_server: LocalNatsServer, pki: Pki) -> AsyncIterator[RunningDaemon]:
    config = replace(standalone_config(jetstream_server.url),
                     metrics=("127.0.0.1", free_port()),
                     extender_tls=ExtenderTls(str(pki.server.cert), str(pki.server.key),
                                              str(pki.client_ca)))
    daemon = await RunningDaemon(config).start()
    yield daemon
    await daemon.stop()


def extender(daemon: RunningDaemon, path: str, scheme: str = "https") -> str:
    return f"{scheme}://127.0.0.1:{daemon.config.listen[1]}{path}"


async def test_with_mutual_tls_only_a_client_the_ca_signed_is_answered(
        mutual: RunningDaemon, pki: Pki) -> None:
    status, body = await get(extender(mutual, "/statusz"),
                             client_context(pki, pki.kube_scheduler))
    assert status == 200, body
    assert '"extender":{"listen":"127.0.0.1:' in body
    assert f'"tls":"mutual","certificate":"files {pki.server.cert}' in body

    for path in ("/filter", "/bind", "/healthz", "/statusz"):
        await refused(extender(mutual, path, "http"))
        # The handshake fails: the client gets no byte of an answer.
        await refused(extender(mutual, path), client_context(pki, None))
        await refused(extender(mutual, path), client_context(pki, pki.stranger))


async def test_a_filter_call_with_the_client_certificate_is_answered(
        mutual: RunningDaemon, pki: Pki) -> None:
    connector = aiohttp.TCPConnector(ssl=client_context(pki, pki.kube_scheduler))
    async with aiohttp.ClientSession(connector=connector) as session, session.post(
            extender(mutual, "/filter"),
            json={"Pod": {"metadata": {"name": "p", "namespace": "default"}, "spec": {
                "containers": [{"name": "c", "image": "i"}]}}, "NodeNames": ["n1"]},
    ) as response:
        assert response.status == 200
        assert (await response.json())["NodeNames"] == ["n1"]  # no GPU asked: passes


async def test_the_probes_and_prometheus_are_answered_on_the_metrics_listener(
        mutual: RunningDaemon) -> None:
    assert mutual.config.metrics is not None
    metrics = f"http://127.0.0.1:{mutual.config.metrics[1]}"
    assert await get(f"{metrics}/healthz") == (200, "ok\n")
    assert await get(f"{metrics}/readyz") == (200, "ready\n")
    status, text = await get(f"{metrics}/metrics")
    assert status == 200 and "pyhami_ready 1.0" in text
    assert (await get(f"{metrics}/statusz"))[0] == 404  # what the extender tells, it keeps


async def test_server_tls_alone_answers_any_https_client_and_no_plain_one(
        jetstream_server: LocalNatsServer, pki: Pki) -> None:
    config = replace(standalone_config(jetstream_server.url),
                     extender_tls=ExtenderTls(str(pki.server.cert), str(pki.server.key)))
    daemon = await RunningDaemon(config).start()
    try:
        status, body = await get(extender(daemon, "/statusz"), client_context(pki, None))
        assert status == 200 and '"tls":"server"' in body
        await refused(extender(daemon, "/statusz", "http"))
    finally:
        await daemon.stop()


def replace_file(target: Path, source: Path) -> None:
    """As the kubelet updates a mounted Secret: new content, a new modification time."""
    target.write_bytes(source.read_bytes())
    stamp = time.time() + 5
    os.utime(target, (stamp, stamp))


async def test_a_new_client_ca_is_served_and_the_old_one_no_longer_trusted(
        jetstream_server: LocalNatsServer, tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    client_ca = tmp_path / "client-ca.pem"
    client_ca.write_bytes(pki.client_ca.read_bytes())
    config = replace(standalone_config(jetstream_server.url), extender_tls=ExtenderTls(
        str(pki.server.cert), str(pki.server.key), str(client_ca), check_period=0.1))
    daemon = await RunningDaemon(config).start()
    try:
        url = extender(daemon, "/healthz")
        assert (await get(url, client_context(pki, pki.kube_scheduler)))[0] == 200
        # The stranger's CA takes the place of the first one.
        replace_file(client_ca, tmp_path / "pki" / "other-ca.pem")
        deadline = time.monotonic() + 10
        while True:
            try:
                if (await get(url, client_context(pki, pki.stranger)))[0] == 200:
                    break
            except (aiohttp.ClientError, ssl.SSLError):
                assert time.monotonic() < deadline, "the new client CA was never trusted"
                await asyncio.sleep(0.1)
        await refused(url, client_context(pki, pki.kube_scheduler))
    finally:
        await daemon.stop()


async def test_while_starting_the_probes_are_answered_and_the_extender_still_asks_for_a_certificate(
        pki: Pki) -> None:
    listen, metrics = free_port(), free_port()
    config = replace(standalone_config(f"nats://127.0.0.1:{free_port()}"),  # no NATS there
                     listen=("127.0.0.1", listen), metrics=("127.0.0.1", metrics),
                     extender_tls=ExtenderTls(str(pki.server.cert), str(pki.server.key),
                                              str(pki.client_ca)))
    stop = asyncio.Event()
    task = asyncio.create_task(run_daemon(config, stop))
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                answer = await get(f"http://127.0.0.1:{metrics}/healthz")
                break
            assert time.monotonic() < deadline, "the metrics listener never answered"
            await asyncio.sleep(0.1)
        assert answer == (200, "ok\n")
        status, why = await get(f"http://127.0.0.1:{metrics}/readyz")
        assert (status, why) == (503, "connecting to NATS\n")
        url = f"https://127.0.0.1:{listen}/readyz"
        assert await get(url, client_context(pki, pki.kube_scheduler)) == (
            503, "connecting to NATS\n")
        await refused(url, client_context(pki, None))
        await refused(f"http://127.0.0.1:{listen}/readyz")
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def explain(*args: str) -> tuple[int, str, str]:
    done = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pyhami.cli", "explain", *args, "-o", "json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(done.communicate(), 60)
    return done.returncode or 0, out.decode(), err.decode()


async def test_explain_reaches_a_mutual_tls_daemon_with_a_client_certificate(
        mutual: RunningDaemon, pki: Pki, tmp_path: Path) -> None:
    pod = tmp_path / "pod.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
                   "spec: {containers: [{name: c, image: i, resources: {limits: "
                   "{nvidia.com/gpu: 1}}}]}\n")
    url = extender(mutual, "")
    code, out, err = await explain(str(pod), "--daemon", url, "--daemon-ca", str(pki.server.ca),
                                   "--daemon-cert", str(pki.kube_scheduler.cert),
                                   "--daemon-key", str(pki.kube_scheduler.key))
    assert code == 0, err
    assert json.loads(out)["scheduled"] is False  # no node reports to this daemon
    code, _, err = await explain(str(pod), "--daemon", url, "--daemon-ca", str(pki.server.ca))
    assert code == 1 and err.startswith(f"pyhami explain: {url}: "), err
    code, _, err = await explain(str(pod), "--daemon", url, "--daemon-cert",
                                 str(pki.kube_scheduler.cert))
    assert (code, err) == (2, "pyhami explain: --daemon-cert and --daemon-key go together\n")
