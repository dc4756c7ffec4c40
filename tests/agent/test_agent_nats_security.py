"""The agent reaches a nats-server that demands credentials or mutual TLS, configured as in a
DaemonSet: through PYHAMI_NATS* variables."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import pytest

from agent.service import Agent, AgentSettings
from agent.vendors.nvidia.simulated import SimulatedSource, profile_cards
from common.arguments import CommandParser, use_environment
from common.messaging import NatsSettings, add_nats_arguments, nats_settings, tls_context
from common.wire import INVENTORY_SUBJECTS, Inventory, decode_inventory
from pyhami.natsserver import LocalNatsServer


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _certificate(directory: Path, name: str, extensions: str) -> None:
    """A P-256 key and a certificate for it signed by the test CA in ``directory``."""
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
             cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "1", "-out", f"{name}.pem",
             "-extfile", f"{name}.ext", cwd=directory)


@pytest.fixture
def certificates(tmp_path: Path) -> Path:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=pyhami test CA", cwd=tmp_path)
    _certificate(tmp_path, "server", "subjectAltName=IP:127.0.0.1\n")
    _certificate(tmp_path, "agent", "extendedKeyUsage=clientAuth\n")
    return tmp_path


def _nats_settings(environ: dict[str, str]) -> NatsSettings:
    parser = CommandParser()
    add_nats_arguments(parser)
    use_environment(parser, environ)
    return nats_settings(parser.parse_args([]))


async def _first_inventory(url: str, environ: dict[str, str],
                           subscriber_options: dict[str, Any]) -> Inventory:
    settings = _nats_settings({"PYHAMI_NATS": url, **environ})
    client = await nats.connect(url, **subscriber_options)
    subscription = await client.subscribe(INVENTORY_SUBJECTS)
    await client.flush()
    stop = asyncio.Event()
    agent = Agent(AgentSettings("secure-node", poll_interval=0.2), SimulatedSource(
        profile_cards("t4x4", "secure-node")), settings)
    task = asyncio.create_task(agent.run(stop))
    try:
        return decode_inventory((await subscription.next_msg(timeout=10)).data)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await client.close()


async def test_a_token_from_the_environment(
        nats_server_factory: Callable[..., LocalNatsServer]) -> None:
    server = nats_server_factory(extra_args=["--auth", "s3cret-token"])
    message = await _first_inventory(server.url, {"PYHAMI_NATS_TOKEN": "s3cret-token"},
                                     {"token": "s3cret-token"})
    assert message.node == "secure-node"


async def test_a_user_and_password_from_the_environment(
        nats_server_factory: Callable[..., LocalNatsServer]) -> None:
    server = nats_server_factory(extra_args=["--user", "agent", "--pass", "pa55"])
    message = await _first_inventory(
        server.url, {"PYHAMI_NATS_USER": "agent", "PYHAMI_NATS_PASSWORD": "pa55"},
        {"user": "agent", "password": "pa55"})
    assert message.node == "secure-node"


async def test_mutual_tls_with_a_private_ca(
        nats_server_factory: Callable[..., LocalNatsServer], certificates: Path) -> None:
    server = nats_server_factory(scheme="tls", extra_args=[
        "--tls", "--tlscert", str(certificates / "server.pem"),
        "--tlskey", str(certificates / "server.key"),
        "--tlscacert", str(certificates / "ca.pem"), "--tlsverify"])
    environ = {"PYHAMI_NATS_CA": str(certificates / "ca.pem"),
               "PYHAMI_NATS_CERT": str(certificates / "agent.pem"),
               "PYHAMI_NATS_KEY": str(certificates / "agent.key")}
    subscriber_tls = tls_context(_nats_settings(environ))
    message = await _first_inventory(server.url, environ, {"tls": subscriber_tls})
    assert message.node == "secure-node"
