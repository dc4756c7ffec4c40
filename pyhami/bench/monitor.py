"""``pyhami bench monitor``: what the node monitor costs on a busy node, and what its
usage adds to the inventory.

A node of eight simulated cards (``a100x8-nvswitch``) runs ``--containers`` containers,
each with a HAMi-core cache file (layout v1, two processes, its share of a card) in a
temporary containers folder, named by a list of pods as the daemon would send it. Timed
with the process's CPU clock: a round (scan, feedback loop, NVML's processes), a scrape
(NVML's host figures and the exposition), and the agent's resident memory after them; then
the encoded inventory with and without the measured usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import struct
import tempfile
import time
import uuid
from pathlib import Path

from agent.monitor.cache import MAGIC, V1
from agent.monitor.containers import CacheSettings
from agent.monitor.monitor import MonitorSettings, NodeMonitor
from agent.report import Report
from agent.vendors.nvidia.simulated import SimulatedSource, profile_cards
from common.arguments import Subcommands, positive_int
from common.wire import HoldingContainer, HoldingPod, encode

PROFILE = "a100x8-nvswitch"
NODE = "bench-node"
MIB = 1024 * 1024


def register(benches: Subcommands) -> None:
    parser = benches.add_parser("monitor", help="time the node monitor's rounds and scrapes "
                                                "on a node of eight cards")
    parser.add_argument("--containers", type=positive_int, default=80,
                        help="containers on the node, each with its HAMi-core cache file "
                             "(default 80)")
    parser.add_argument("--rounds", type=positive_int, default=50,
                        help="monitor rounds and scrapes timed (default 50)")
    parser.set_defaults(handler=_run)


class _Pods:
    def __init__(self, pods: list[HoldingPod]) -> None:
        self._pods = pods

    async def holding_pods(self, node: str) -> list[HoldingPod]:
        return self._pods


def _cache_file(card_uuid: str, memory_mib: int) -> bytes:
    """A v1 region of one card and two busy processes."""
    data = bytearray(V1.size)
    struct.pack_into("<iII", data, 0, MAGIC, 1, 2)
    struct.pack_into("<Q", data, V1.device_num, 1)
    data[V1.uuids:V1.uuids + len(card_uuid)] = card_uuid.encode()
    struct.pack_into("<Q", data, V1.limit, 2 * memory_mib * MIB)
    for slot in range(2):
        at = V1.procs + slot * V1.slot_size
        struct.pack_into("<ii", data, at, 100 + slot, 2000 + slot)
        struct.pack_into("<5Q", data, at + V1.slot_used, MIB, MIB, memory_mib * MIB, 0,
                         memory_mib * MIB)
        struct.pack_into("<3Q", data, at + V1.slot_device_util, 0, 0, 20)
        struct.pack_into("<i", data, at + V1.slot_status, 1)
    struct.pack_into("<iiii", data, V1.proc_num, 2, 1, 2, 1)
    assert V1.last_kernel_time is not None  # v1 has it
    struct.pack_into("<q", data, V1.last_kernel_time, int(time.time()))
    return bytes(data)


def _node(root: Path, containers: int) -> tuple[SimulatedSource, list[HoldingPod]]:
    cards = profile_cards(PROFILE, NODE)
    pods = []
    for number in range(containers):
        card = cards[number % len(cards)]
        uid = str(uuid.UUID(int=number + 1))
        folder = root / f"{uid}_main"
        folder.mkdir(parents=True)
        (folder / f"{uid}.cache").write_bytes(_cache_file(card.uuid, 1000))
        pods.append(HoldingPod(namespace="bench", name=f"pod-{number}", uid=uid, containers=(
            HoldingContainer(name="main", cards=(card.uuid,)),)))
    return SimulatedSource(cards), pods


async def _measure(containers: int, rounds: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="pyhami-bench-monitor-") as scratch:
        root = Path(scratch) / "containers"
        source, pods = _node(root, containers)
        monitor = NodeMonitor(NODE, MonitorSettings(caches=CacheSettings(containers_dir=root)),
                              source, _Pods(pods))
        await monitor.round()  # warm: imports, first reads
        started = time.process_time()
        for _ in range(rounds):
            await monitor.round()
        round_cpu = (time.process_time() - started) / rounds
        started = time.process_time()
        size = 0
        for _ in range(rounds):
            size = len(await monitor.exposition())
        scrape_cpu = (time.process_time() - started) / rounds
        report = Report(NODE, "bench", 10.0, ())
        report.observe(source.read())
        bare = report.message("heartbeat", time.time())
        measured = monitor.measured()
        with_usage = report.message("heartbeat", time.time(), measured=measured)
        return {
            "cards": len(source.read()), "containers": containers, "rounds": rounds,
            "round_cpu_ms": round(round_cpu * 1000, 2),
            "scrape_cpu_ms": round(scrape_cpu * 1000, 2),
            "exposition_bytes": size,
            "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "inventory_bytes": len(encode(bare)),
            "inventory_with_usage_bytes": len(encode(with_usage)),
            "measured_containers": 0 if measured is None else len(measured.containers),
        }


def _run(args: argparse.Namespace) -> int:
    print(json.dumps(asyncio.run(_measure(args.containers, args.rounds)), indent=2))
    return 0
