"""``pyhami agent`` as a process: clear errors with exit code 2, and a clean drain on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import nats
import pytest

from common.wire import INVENTORY_SUBJECTS, Inventory, decode_inventory
from pyhami.natsserver import LocalNatsServer


def _environment(**extra: str) -> dict[str, str]:
    environment = {name: value for name, value in os.environ.items()
                   if name != "NODE_NAME" and not name.startswith("PYHAMI_")}
    environment.update(extra)
    return environment


def _agent(*args: str,
           environment: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyhami.cli", "agent", *args],
                          capture_output=True, text=True, timeout=60, check=False,
                          env=environment or _environment())


@pytest.mark.parametrize(("args", "message"), [
    (["--node", "n", "--inventory", "sim:v100x2"],
     "pyhami agent: error: argument --inventory: unknown simulated profile 'v100x2' "
     "(known: a100x8-mig, a100x8-nvswitch, h100x8-islands, h100x8-mig, h200x8-mig, "
     "h200x8-nvswitch, t4x4; or "
     "sim:FILE.yaml)"),
    (["--node", "n", "--inventory", "gpu"],
     "pyhami agent: error: argument --inventory: 'gpu': expected nvml, sim:PROFILE "
     "or sim:FILE.yaml"),
    (["--node", "n", "--poll-interval", "-1"],
     "pyhami agent: error: argument --poll-interval: '-1' must be above 0"),
    (["--node", "n", "--heartbeat-interval", "often"],
     "pyhami agent: error: argument --heartbeat-interval: 'often' is not a number of seconds"),
    (["--node", "n", "--device-split-count", "0"],
     "pyhami agent: error: argument --device-split-count: '0' must be at least 1"),
    (["--node", "n", "--device-split-count", "65537"],
     "pyhami agent: error: argument --device-split-count: '65537' must be at most 65536"),
    (["--node", "n", "--frobnicate"], "pyhami: error: unrecognized arguments: --frobnicate"),
    (["--inventory", "sim:t4x4"],
     "pyhami agent: no node name: pass --node, or set PYHAMI_NODE or NODE_NAME"),
    (["--node", "GPU Node 1", "--inventory", "sim:t4x4"],
     "pyhami agent: node name: 'GPU Node 1' is not a valid DNS-1123 subdomain: lower-case "
     "letters, digits, '-' and '.', each dot-separated part starting and ending with a "
     "letter or digit"),
    (["--node", "n", "--inventory", "sim:t4x4", "--nats", "http://nats:4222"],
     "pyhami agent: --nats (PYHAMI_NATS): 'http://nats:4222' is not a NATS URL "
     "(expected nats|tls|ws|wss://HOST[:PORT])"),
])
def test_a_bad_flag_or_profile_exits_2_with_one_clear_line(args: list[str], message: str) -> None:
    done = _agent(*args)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == message
    assert "Traceback" not in done.stderr


def test_a_bad_simulation_file_exits_2_naming_the_file_and_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("- {type: NVIDIA-A10, memroy: 23028}\n")
    done = _agent("--node", "n", "--inventory", f"sim:{path}")
    assert done.returncode == 2
    assert done.stderr == (f"pyhami agent: --inventory: {path}: Object contains unknown field "
                           "`memroy` - at `$[0]`\n")
    missing = _agent("--node", "n", "--inventory", f"sim:{tmp_path}/absent.yml")
    assert missing.returncode == 2
    assert missing.stderr == (f"pyhami agent: --inventory: {tmp_path}/absent.yml: "
                              "No such file or directory\n")


def test_a_bad_variable_exits_2_naming_it() -> None:
    done = _agent("--node", "n", "--inventory", "sim:t4x4",
                  environment=_environment(PYHAMI_NATS_CERT="/nonexistent/cert.pem"))
    assert done.returncode == 2
    assert done.stderr == ("pyhami agent: --nats-cert (PYHAMI_NATS_CERT): /nonexistent/cert.pem "
                           "is not a readable file\n")


async def _agent_until_its_first_inventory(
        nats_server: LocalNatsServer, *args: str,
        **environment: str) -> tuple[Inventory, int | None, str]:
    """Runs ``pyhami agent ARGS`` until its first inventory arrives, then stops it with
    SIGTERM: that inventory, the exit code and what it wrote on stderr."""
    client = await nats.connect(nats_server.url)
    subscription = await client.subscribe(INVENTORY_SUBJECTS)
    await client.flush()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pyhami.cli", "agent", *args,
        env=_environment(PYHAMI_NATS=nats_server.url, **environment),
        stderr=asyncio.subprocess.PIPE)
    try:
        message = decode_inventory((await subscription.next_msg(timeout=30)).data)
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 10)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await client.close()
    return message, process.returncode, stderr.decode()


async def test_the_node_name_comes_from_node_name_and_sigterm_drains(
        nats_server: LocalNatsServer) -> None:
    message, returncode, log = await _agent_until_its_first_inventory(
        nats_server, "--inventory", "sim:h100x8-islands", "--poll-interval", "0.2",
        NODE_NAME="worker-7.example.internal")
    assert (message.node, message.reason, len(message.cards)) == (
        "worker-7.example.internal", "start", 8)
    assert returncode == 0
    assert "SIGTERM received: draining" in log
    assert "NATS connection drained" in log


async def test_json_logs_are_one_object_per_line(nats_server: LocalNatsServer) -> None:
    _, returncode, log = await _agent_until_its_first_inventory(
        nats_server, "--node", "n1", "--inventory", "sim:t4x4", "--log-format", "json")
    assert returncode == 0
    records = [json.loads(line) for line in log.splitlines()]
    assert all(set(record) >= {"time", "level", "logger", "message"} for record in records)
    assert {"level": "INFO", "logger": "agent.cli", "message": "SIGTERM received: draining"} in [
        {key: record[key] for key in ("level", "logger", "message")} for record in records]
