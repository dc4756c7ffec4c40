"""``--device-config`` on every command that decides or reports cards, and the agent's
``--node-config``: a bad file stops the command at start with exit 2 and one line naming
the flag, the file, the key and the value; HAMi's chart file changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import EXAMPLES, REPO

HAMI = REPO / "tests" / "common" / "hami"
LAB = EXAMPLES / "lab-cluster.json"
POD = EXAMPLES / "binpack-pod.yaml"
REFUSAL = "--device-config {path}: nvidia.deviceSplitCount is 0: must be from 1 to 65536"

# Each command as far as it needs to get to read the file; nothing else is wrong with it.
COMMANDS = {
    "scheduler": ["scheduler", "--standalone"],
    "agent": ["agent", "--node", "gpu-1", "--inventory", "sim:t4x4"],
    "decide": ["decide", "--cluster", LAB, "--pod", POD],
    "explain": ["explain", POD, "--cluster", LAB],
    "simulate": ["simulate", "--cluster", LAB, "--workload", POD, "--policy", "spread"],
}


def pyhami(*args: str | Path, environ: dict[str, str] | None = None,
           ) -> subprocess.CompletedProcess[str]:
    clean = {name: value for name, value in os.environ.items()
             if not name.startswith("PYHAMI_")}
    return subprocess.run([sys.executable, "-m", "pyhami.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**clean, **(environ or {})}, cwd=REPO)


@pytest.fixture
def bad_file(tmp_path: Path) -> Path:
    path = tmp_path / "device-config.yaml"
    path.write_text("nvidia:\n  deviceSplitCount: 0\n")
    return path


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_bad_device_config_stops_the_command_with_one_line(name: str,
                                                              bad_file: Path) -> None:
    done = pyhami(*COMMANDS[name], "--device-config", bad_file)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"pyhami {name}: " + REFUSAL.format(path=bad_file)]
    assert done.stdout == ""


def test_the_variable_names_the_file_too(bad_file: Path) -> None:
    done = pyhami(*COMMANDS["decide"], environ={"PYHAMI_DEVICE_CONFIG": str(bad_file)})
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["pyhami decide: " + REFUSAL.format(path=bad_file)]


def test_a_bad_node_config_stops_the_agent_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"nodeconfig": [{"name": "gpu-1", "operatingmode": "mps"}]}))
    done = pyhami(*COMMANDS["agent"], "--node-config", path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"pyhami agent: --node-config {path}: nodeconfig[0].operatingmode is 'mps': must be "
        "one of 'hami-core', 'mig'"]


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    done = pyhami(*COMMANDS["decide"], "--device-config", tmp_path / "absent.yaml")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"pyhami decide: --device-config {tmp_path / 'absent.yaml'}: No such file or directory"]


def test_the_charts_file_decides_as_no_file_does() -> None:
    plain = pyhami(*COMMANDS["decide"])
    charted = pyhami(*COMMANDS["decide"], "--device-config", HAMI / "device-config.yaml")
    assert plain.returncode == charted.returncode == 0
    assert json.loads(charted.stdout) == json.loads(plain.stdout)
