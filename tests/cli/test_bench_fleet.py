"""``pyhami bench fleet`` on a small scale: every field of its report present and sane."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pyhami.bench.fleet import Share, home_first

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")

ROOT = Path(__file__).resolve().parents[2]


def bench_fleet(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyhami.cli", "bench", "fleet", *arguments],
                          capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)


@pytest.mark.slow  # a benchmark: thirty agents over three servers, restarted
def test_thirty_agents_over_three_servers_are_all_seen_before_and_after_a_restart() -> None:
    done = bench_fleet("--agents", "30", "--heartbeat", "0.5", "--duration", "2",
                       "--processes", "2", "--resync-wait", "0.5")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["agents"] == 30 and report["processes"] == 2 and report["servers"] == 3
    # Thirty agents every half second: sixty inventories a second, each accepted.
    assert report["expected_inventories_per_s"] == 60
    assert 30 <= report["ingest_inventories_per_s"] <= 90
    assert report["ingest_cards_per_s"] == pytest.approx(report["ingest_inventories_per_s"] * 4)
    assert report["failed_publishes"] == 0
    assert report["daemon_cpu_s_per_s"] > 0
    assert 0 < report["daemon_rss_mb"] <= report["daemon_peak_rss_mb"]
    assert report["simulator_cpu_s_per_s"] > 0 and report["simulator_rss_mb"] > 0
    servers = report["nats_servers"]
    assert len(servers) == 3
    # Each agent's own server first, round-robin: ten agents on each.
    assert sum(server["clients"] for server in servers) >= 30
    for server in servers:
        assert server["clients"] >= 10
        assert server["varz_mem_mb"] > 0 and server["rss_mb"] > 0
        assert server["cpu_s_per_s"] is not None
    restart = report["restart"]
    assert 0 < restart["ready_s"] <= restart["all_nodes_s"] < 60
    assert 0 <= restart["nodes_at_ready"] <= 30


def test_more_processes_than_agents_are_refused_in_one_line() -> None:
    done = bench_fleet("--agents", "2", "--processes", "3")
    assert done.returncode == 2
    assert done.stderr == "pyhami bench fleet: --processes 3 is more than --agents 2\n"
    assert done.stdout == ""


def test_each_agent_has_its_own_server_first_round_robin_and_every_server_after() -> None:
    servers = ("nats://a:4222", "nats://b:4222", "nats://c:4222")
    assert home_first(servers, 0) == list(servers)
    assert home_first(servers, 4) == ["nats://b:4222", "nats://c:4222", "nats://a:4222"]
    share = Share(servers, first=1, step=2, total=6, heartbeat=2.0, profile="t4x4")
    assert list(share.numbers) == [1, 3, 5]
