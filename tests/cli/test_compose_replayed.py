"""docker-compose.yml played without containers: every service's own command, as processes.

No container engine runs here, so the stack is replayed as compose would start it, in
its order: the paths of the shared volume moved into a temporary folder, the service
names and ports moved onto free loopback ports, nothing else changed. NATS with TLS and
the auth callout, the daemon with the folder's credentials, the three agents with their
tokens; then the demo service plays the article's lab on sim-t4.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.controlplane import Process, wait_for
from pyhami.bench.loopback import http_get
from pyhami.natsserver import free_port, nats_server_binary
from tests.cli.test_demo import assert_the_lab_played_on
from tests.paths import REPO

pytestmark = pytest.mark.slow  # the compose stack replayed, in processes

SHARED = "/var/lib/pyhami"
START_S = 60.0


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in reversed(started):
        process.stop()


def replayed(command: list[str], moves: dict[str, str]) -> list[str]:
    out = []
    for word in command:
        moved = word
        for old, new in moves.items():
            moved = moved.replace(old, new)
        out.append(moved)
    return out


def statusz(url: str) -> dict[str, Any]:
    status, body = http_get(f"{url}/statusz")
    if status != 200:
        raise ValueError(f"/statusz answered {status}")
    document: dict[str, Any] = json.loads(body)
    return document


def test_the_compose_stack_runs_secured_and_plays_the_lab(tmp_path: Path,
                                                          processes: list[Process]) -> None:
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    nats_port, listen, metrics = free_port(), free_port(), free_port()
    moves = {SHARED: str(tmp_path / "shared"), "nats:4222": f"127.0.0.1:{nats_port}",
             "0.0.0.0:8888": f"127.0.0.1:{listen}", "0.0.0.0:9395": f"127.0.0.1:{metrics}",
             "http://scheduler:8888": f"http://127.0.0.1:{listen}"}
    pyhami = [sys.executable, "-m", "pyhami.cli"]

    def run(name: str, command: list[str]) -> Process:
        process = Process(name, command, tmp_path / f"{name}.log").start()
        processes.append(process)
        return process

    for step in ("certificates", "credentials"):
        done = run(step, [*pyhami, *replayed(services[step]["command"], moves)[1:]])
        assert done.popen is not None and done.popen.wait(60) == 0, done.describe()
    nats = replayed(services["nats"]["command"], moves)
    nats[nats.index("--store_dir") + 1] = str(tmp_path / "jetstream")
    nats[nats.index("--port") + 1] = str(nats_port)
    nats[nats.index("--http_port") + 1] = str(free_port())
    run("nats", [str(nats_server_binary()), "-a", "127.0.0.1", *nats])
    agents = [name for name in services if name.startswith("agent-")]
    for name in ["scheduler", *agents]:
        run(name, [*pyhami, *replayed(services[name]["command"], moves)[1:]])
    daemon = f"http://127.0.0.1:{listen}"
    wait_for(lambda: statusz(daemon).get("nodes") == len(agents),
             "the daemon hearing the three agents over TLS", START_S, watch=processes[2:])
    demo = run("demo", [*pyhami, *replayed(services["demo"]["command"], moves)[1:]])
    assert demo.popen is not None and demo.popen.wait(120) == 0, demo.describe()
    assert_the_lab_played_on(demo.log.read_text(), "sim-t4")
    log = (tmp_path / "scheduler.log").read_text()
    assert log.count("admitted as the agent of node") == len(agents)
