"""``pyhami bench monitor``: it measures a node of eight cards and reports every figure."""

from __future__ import annotations

import json

import pytest

from pyhami.cli import main


def test_the_monitor_bench_reports_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "monitor", "--containers", "12", "--rounds", "2"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert (figures["cards"], figures["containers"], figures["measured_containers"]) == (
        8, 12, 12)
    assert figures["inventory_with_usage_bytes"] > figures["inventory_bytes"] > 0
    assert figures["round_cpu_ms"] > 0 and figures["scrape_cpu_ms"] > 0
    assert figures["exposition_bytes"] > 0
