"""The GPU checks' plumbing: each check is given a ``CheckLog`` (fixture ``seen``), and
once the run ends the report is written where ``PYHAMI_GPU_REPORT`` says, with every
check marked ``gpu`` that ran: passed, failed, or skipped with its reason.

The checks skip themselves, module by module, where NVML cannot start
(``tests.gpu.machine.driver_absent``), so the ordinary suite collects them and skips them
with that reason on a machine without a GPU.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gpu.machine import machine_facts
from tests.gpu.report import REPORT_ENV, CheckLog, CheckResult, Outcome, Report

_logs: dict[str, CheckLog] = {}
_results: dict[str, CheckResult] = {}
_started = time.monotonic()


@pytest.fixture
def seen(request: pytest.FixtureRequest) -> Iterator[CheckLog]:
    """The running check's log: what it records goes into the report, passed or not."""
    log = _logs.setdefault(request.node.nodeid, CheckLog())
    yield log


def _name(nodeid: str) -> str:
    """``tests/gpu/test_inventory.py::test_x[a]`` as ``inventory::test_x[a]``."""
    path, _, test = nodeid.partition("::")
    return f"{Path(path).stem.removeprefix('test_')}::{test}"


def _reason(report: pytest.TestReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    text = message if isinstance(message, str) else str(report.longrepr or "")
    return " ".join(text.split())[:1000]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """One result per check: its call's, or the setup's or teardown's where those failed or
    skipped; its seconds summed over the three phases."""
    if "gpu" not in report.keywords:
        return
    result = _results.get(report.nodeid)
    if result is None:
        result = _results[report.nodeid] = CheckResult(_name(report.nodeid), "passed", 0.0)
    result.seconds += report.duration
    if report.skipped:
        result.outcome, result.reason = "skipped", _reason(report)
    elif report.failed:
        outcome: Outcome = "failed" if report.when == "call" else "error"
        if result.outcome != "failed":
            result.outcome = outcome
        result.reason = result.reason or _reason(report)


def pytest_sessionfinish(session: pytest.Session) -> None:
    folder = os.environ.get(REPORT_ENV)
    if not folder or not _results:
        return
    for nodeid, result in _results.items():
        log = _logs.get(nodeid)
        if log is not None:
            result.observations, result.differences = log.observations, log.differences
    report = Report(machine_facts(), list(_results.values()), time.monotonic() - _started)
    report.write(Path(folder))
