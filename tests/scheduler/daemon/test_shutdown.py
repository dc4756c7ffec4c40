"""SIGTERM and SIGINT end ``pyhami scheduler`` and ``pyhami agent`` within 10 s in every
state: connecting to an unreachable NATS, connected, with NATS gone, and (the daemon)
rebuilding while the Kubernetes API is unreachable. While it
connects, the daemon already answers /healthz (and /readyz says why it is not ready)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from pyhami.natsserver import LocalNatsServer, free_port
from tests.harness import eventually

pytestmark = pytest.mark.slow  # daemon processes stopped with NATS or the API server gone

STOP_LIMIT_S = 10.0
KUBECONFIG_TO_NOWHERE = """\
apiVersion: v1
kind: Config
current-context: lab
clusters:
- name: lab
  cluster: {{server: "http://127.0.0.1:{port}"}}
users:
- name: admin
  user: {{token: secret}}
contexts:
- name: lab
  context: {{cluster: lab, user: admin}}
"""


class Command:
    """A ``pyhami`` process whose log (stderr) is collected as it comes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.log: list[str] = []
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, *args: str) -> Command:
        environment = {name: value for name, value in os.environ.items()
                       if not name.startswith("PYHAMI_") and name != "NODE_NAME"}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pyhami.cli", *args, env=environment,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        return cls(process)

    async def _read(self) -> None:
        assert self.process.stderr is not None
        async for line in self.process.stderr:
            self.log.append(line.decode(errors="replace"))

    async def logged(self, text: str, timeout: float = 20) -> None:
        async def seen() -> bool:
            return any(text in line for line in self.log)

        await eventually(seen, f"{text!r} in the log", timeout=timeout)

    async def stop(self, received: signal.Signals) -> tuple[int, float]:
        """Send the signal; the exit code and the seconds it took to exit."""
        sent = time.monotonic()
        self.process.send_signal(received)
        code = await asyncio.wait_for(self.process.wait(), STOP_LIMIT_S * 3)
        await self._reader
        return code, time.monotonic() - sent

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()


@pytest.fixture
async def commands() -> AsyncIterator[list[Command]]:
    started: list[Command] = []
    yield started
    for command in started:
        command.kill()
        await command.process.wait()


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    try:
        async with http.get(url) as response:
            return response.status, await response.text()
    except aiohttp.ClientError:
        return 0, ""


async def scheduler(commands: list[Command], nats_url: str) -> tuple[Command, str]:
    port = free_port()
    command = await Command.start("scheduler", "--standalone", "--nats", nats_url,
                                  "--listen", f"127.0.0.1:{port}",
                                  "--metrics", f"127.0.0.1:{free_port()}",
                                  "--resync-wait", "0.2")
    commands.append(command)
    return command, f"http://127.0.0.1:{port}"


async def ready_scheduler(commands: list[Command], http: aiohttp.ClientSession,
                          nats_url: str) -> Command:
    command, url = await scheduler(commands, nats_url)

    async def ready() -> bool:
        return (await get(http, f"{url}/readyz"))[0] == 200

    await until(ready, "the daemon to be ready")
    return command


def unreachable_nats() -> str:
    return f"nats://127.0.0.1:{free_port()}"


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    await eventually(check, what, timeout=30)


@pytest.mark.parametrize("received", [signal.SIGTERM, signal.SIGINT])
async def test_the_daemon_serves_health_and_stops_while_nats_is_unreachable(
        commands: list[Command], http: aiohttp.ClientSession,
        received: signal.Signals) -> None:
    command, url = await scheduler(commands, unreachable_nats())

    async def healthy() -> bool:
        return await get(http, f"{url}/healthz") == (200, "ok\n")

    await until(healthy, "/healthz while NATS is unreachable")
    assert await get(http, f"{url}/readyz") == (503, "connecting to NATS\n")
    async with http.post(f"{url}/filter", data=b"{}") as response:
        assert response.status == 503
    code, seconds = await command.stop(received)
    assert (code, seconds < STOP_LIMIT_S) == (0, True), "".join(command.log)


async def test_the_daemon_stops_when_ready(
        commands: list[Command], http: aiohttp.ClientSession,
        jetstream_server: LocalNatsServer) -> None:
    command = await ready_scheduler(commands, http, jetstream_server.url)
    code, seconds = await command.stop(signal.SIGTERM)
    assert (code, seconds < STOP_LIMIT_S) == (0, True), "".join(command.log)


async def test_the_daemon_stops_with_nats_gone(
        commands: list[Command], http: aiohttp.ClientSession,
        jetstream_server: LocalNatsServer) -> None:
    command = await ready_scheduler(commands, http, jetstream_server.url)
    jetstream_server.kill()
    await command.logged("disconnected from NATS")
    code, seconds = await command.stop(signal.SIGTERM)
    assert (code, seconds < STOP_LIMIT_S) == (0, True), "".join(command.log)


async def agent(commands: list[Command], nats_url: str) -> Command:
    command = await Command.start("agent", "--node", "gpu-node-1", "--inventory", "sim:t4x4",
                                  "--nats", nats_url)
    commands.append(command)
    return command


async def test_the_agent_stops_while_nats_is_unreachable(commands: list[Command]) -> None:
    command = await agent(commands, unreachable_nats())
    await command.logged("NATS: ")  # a failed connection attempt
    code, seconds = await command.stop(signal.SIGTERM)
    assert (code, seconds < STOP_LIMIT_S) == (0, True), "".join(command.log)


async def test_the_agent_stops_when_connected(commands: list[Command],
                                              nats_server: LocalNatsServer) -> None:
    command = await agent(commands, nats_server.url)
    await command.logged("connected to NATS at")
    code, seconds = await command.stop(signal.SIGINT)
    assert (code, seconds < STOP_LIMIT_S) == (0, True), "".join(command.log)


async def test_the_agent_stops_with_nats_gone(commands: list[Command],
                                              nats_server: LocalNatsServer) -> None:
    command = await agent(commands, nats_server.url)
    await command.logged("connected to NATS at")
    nats_server.kill()
    await command.logged("disconnected from NATS")
    code, seconds = await command.stop(signal.SIGTERM)
    assert (code, seconds < STOP_LIMIT_S) == (0, True), "".join(command.log)


async def test_the_daemon_stops_while_the_kubernetes_api_is_unreachable(
        commands: list[Command], http: aiohttp.ClientSession, nats_server: LocalNatsServer,
        tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG_TO_NOWHERE.format(port=free_port()))
    port = free_port()
    command = await Command.start("scheduler", "--kubeconfig", str(kubeconfig),
                                  "--nats", nats_server.url, "--listen", f"127.0.0.1:{port}",
                                  "--metrics", f"127.0.0.1:{free_port()}", "--resync-wait", "0.2")
    commands.append(command)
    await command.logged("rebuilding the ledger failed, trying again")
    assert await get(http, f"http://127.0.0.1:{port}/readyz") == (503, "rebuilding the ledger\n")
    code, seconds = await command.stop(signal.SIGTERM)
    assert (code, seconds < STOP_LIMIT_S) == (0, True), "".join(command.log)
