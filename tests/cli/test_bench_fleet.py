"""``pyhami bench fleet`` on a small scale: every field of its report present and sane."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pyhami.bench.fleet import Share, home_first, pods_room

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")

ROOT = Path(__file__).resolve().parents[2]


def bench_fleet(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyhami.cli", "bench", "fleet", *arguments],
                          capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)


PODS = 20


@pytest.mark.slow  # a benchmark: thirty agents over three servers, restarted, taken over
def test_thirty_agents_over_three_servers_are_all_seen_before_and_after_a_restart() -> None:
    done = bench_fleet("--agents", "30", "--heartbeat", "0.5", "--duration", "2",
                       "--processes", "2", "--resync-wait", "0.5", "--pods", str(PODS),
                       "--standby")
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
    assert report["pods"] == PODS and report["pods_placed_per_s"] > 0
    restart = report["restart"]
    assert 0 < restart["ready_s"] <= restart["all_nodes_s"] <= restart["all_pods_s"] < 60
    assert 0 <= restart["nodes_at_ready"] <= 30
    # The ledger is rebuilt from the store before the daemon is ready: every pod is back.
    assert restart["pods_at_ready"] == PODS
    standby = report["standby"]
    assert standby["lease_ttl_s"] == 4
    assert standby["standby_start_s"] > 0 and standby["old_leader_back_as_standby_s"] > 0
    # Each takeover places one pod more: the second standby finds it too.
    for case, pods in (("sigterm", PODS), ("sigkill", PODS + 1)):
        takeover = standby[case]
        assert 0 <= takeover["lease_taken_s"] <= takeover["ready_s"], case
        assert takeover["ready_s"] <= takeover["all_pods_s"] <= takeover["first_filter_s"], case
        assert takeover["takeover_s"] == pytest.approx(
            takeover["ready_s"] - takeover["lease_taken_s"], abs=0.002), case
        assert takeover["pods_at_ready"] == pods, case
        assert takeover["leader_exit_s"] >= 0 and takeover["standby_cpu_s"] >= 0, case
    # SIGTERM hands the lease on; after SIGKILL it is taken once it expired (renewed every
    # second, it lives 4 s: 3 to 4 s after the kill).
    assert standby["sigterm"]["lease_taken_s"] < 2
    assert 2.5 <= standby["sigkill"]["lease_taken_s"] <= 6


def test_more_processes_than_agents_are_refused_in_one_line() -> None:
    done = bench_fleet("--agents", "2", "--processes", "3")
    assert done.returncode == 2
    assert done.stderr == "pyhami bench fleet: --processes 3 is more than --agents 2\n"
    assert done.stdout == ""


@pytest.mark.parametrize(("arguments", "refusal"), [
    (("--pods", "-1"), "--pods -1 is below 0"),
    (("--agents", "2", "--pods", "81"),
     "--pods 81 is more than 2 nodes of t4x4 hold (80 pods of 1000 MiB)"),
])
def test_pods_out_of_range_are_refused_in_one_line(arguments: tuple[str, ...],
                                                   refusal: str) -> None:
    done = bench_fleet(*arguments)
    assert done.returncode == 2
    assert done.stderr == f"pyhami bench fleet: {refusal}\n"
    assert done.stdout == ""


def test_the_fleet_holds_pods_by_each_cards_memory_and_slots() -> None:
    # T4: 15 GiB, ten slots (slots bound); A100 80 GB: ten slots of its eighty pods' worth.
    assert pods_room(3, "t4x4") == 3 * 4 * 10
    assert pods_room(2, "a100x8-nvswitch") == 2 * 8 * 10


def test_each_agent_has_its_own_server_first_round_robin_and_every_server_after() -> None:
    servers = ("nats://a:4222", "nats://b:4222", "nats://c:4222")
    assert home_first(servers, 0) == list(servers)
    assert home_first(servers, 4) == ["nats://b:4222", "nats://c:4222", "nats://a:4222"]
    share = Share(servers, first=1, step=2, total=6, heartbeat=2.0, profile="t4x4")
    assert list(share.numbers) == [1, 3, 5]
