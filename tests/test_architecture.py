"""The layers hold: common imports neither agent nor scheduler, the core does no I/O; what
needs minutes is marked slow."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept() -> None:
    linter = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert linter is not None, "import-linter is installed with the test extra"
    done = subprocess.run([linter, "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


# Fixtures that start what makes a test slow: a cluster of three nats-servers, the control
# plane (kube-apiserver, kube-scheduler) or its binaries; and the same started by a test.
SLOW_FIXTURES = frozenset({"nats_cluster", "control_plane", "control_plane_binaries"})
SLOW_STARTS = frozenset({"LocalNatsCluster", "running_control_plane"})
LONGEST_QUICK_TIMEOUT_S = 120
"""pytest's own timeout (pyproject); a module that needs more is slow."""

_COLLECT = """
import json, sys
import pytest

class Audit:
    def pytest_collection_finish(self, session):
        rows = []
        for item in session.items:
            timeout = item.get_closest_marker("timeout")
            rows.append({
                "id": item.nodeid,
                "slow": item.get_closest_marker("slow") is not None,
                "fixtures": sorted(getattr(item, "fixturenames", ())),
                "timeout": timeout.args[0] if timeout and timeout.args else None,
            })
        print("AUDIT " + json.dumps(rows))

sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
                     plugins=[Audit()]))
"""


def _tests_starting_slow_things() -> set[str]:
    """``path::name`` of each test function that itself calls one of ``SLOW_STARTS``."""
    found: set[str] = set()
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                    and node.name.startswith("test_")):
                continue
            called = {call.func.id if isinstance(call.func, ast.Name) else
                      call.func.attr if isinstance(call.func, ast.Attribute) else ""
                      for call in ast.walk(node) if isinstance(call, ast.Call)}
            if SLOW_STARTS & called:
                found.add(f"{path.relative_to(ROOT).as_posix()}::{node.name}")
    return found


def test_what_needs_minutes_is_marked_slow() -> None:
    """``pytest -m "not slow"`` stays quick: a test that starts a nats-server cluster or
    the control plane, or that its module lets run past pytest's timeout, is marked
    ``slow`` (all of tests/e2e by its conftest)."""
    done = subprocess.run([sys.executable, "-c", _COLLECT], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (line,) = [row for row in done.stdout.splitlines() if row.startswith("AUDIT ")]
    items = json.loads(line.removeprefix("AUDIT "))
    assert len(items) > 1000  # the whole suite was collected
    starting = _tests_starting_slow_things()
    unmarked = sorted(
        item["id"] for item in items if not item["slow"] and (
            SLOW_FIXTURES.intersection(item["fixtures"])
            or _function_of(item["id"]) in starting
            or (item["timeout"] is not None
                and (item["timeout"] == 0 or item["timeout"] > LONGEST_QUICK_TIMEOUT_S))))
    assert not unmarked, "mark these pytest.mark.slow:\n" + "\n".join(unmarked)
    assert all(item["slow"] for item in items if item["id"].startswith("tests/e2e/"))


def _function_of(node_id: str) -> str:
    """``path::name`` of a collected test's function (its class and parameters dropped)."""
    path, *names = node_id.split("[", 1)[0].split("::")
    return f"{path}::{names[-1]}"
