"""``pyhami bench agent``: the agent's CPU cost per publish, and how fast one subscriber
decodes the inventories of a thousand agents.

Both parts run against a real nats-server (a local one unless ``--nats`` is given).
The thousand agents are one publisher process sending as 1000 distinct nodes,
each with its own instance id and sequence; its messages are encoded before the
clock starts, so the subscriber, not the publisher, sets the pace.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import time

import nats
from nats.aio.msg import Msg

from agent.report import Report
from agent.vendors.nvidia.simulated import profile_cards
from common.arguments import Subcommands, positive_int
from common.wire import INVENTORY_SUBJECTS, Inventory, decode_inventory, encode, inventory_subject
from pyhami.natsserver import LocalNatsServer

PROFILE = "a100x8-nvswitch"  # eight cards, every pair linked: the largest message of the profiles
FLUSH_EVERY = 100


def register(benches: Subcommands) -> None:
    parser = benches.add_parser("agent", help="time the agent's publishing and a subscriber's "
                                              "decoding of many agents' inventories")
    parser.add_argument("--publishes", type=positive_int, default=20000,
                        help="publishes timed for the per-publish CPU cost (default 20000)")
    parser.add_argument("--agents", type=positive_int, default=1000,
                        help="simulated agents whose inventories the subscriber decodes "
                             "(default 1000)")
    parser.add_argument("--rounds", type=positive_int, default=10,
                        help="messages each simulated agent sends (default 10)")
    parser.add_argument("--nats", metavar="URL", help="an existing server (default: start one)")
    parser.set_defaults(handler=run)


def _report(node: str) -> Report:
    report = Report(node, f"bench-{node}", 10.0, version="bench")
    report.observe(profile_cards(PROFILE, node))
    return report


async def publish_cost(url: str, publishes: int) -> dict[str, object]:
    """CPU seconds per message built, encoded and published by one agent (8 cards)."""
    report = _report("bench-node")
    subject = inventory_subject("bench-node")
    started = time.process_time()
    for _ in range(publishes):
        encode(report.message("heartbeat", time.time()))
    encode_only = (time.process_time() - started) / publishes
    client = await nats.connect(url)
    try:
        started = time.process_time()
        for number in range(publishes):
            message = report.message("heartbeat", time.time())
            await client.publish(subject, encode(message))
            report.confirm(message)
            if number % FLUSH_EVERY == FLUSH_EVERY - 1:
                await client.flush()
        await client.flush()
        total = (time.process_time() - started) / publishes
    finally:
        await client.close()
    size = len(encode(report.message("heartbeat", 0.0)))
    return {"cards": len(report.cards), "message_bytes": size,
            "build_encode_cpu_us": round(encode_only * 1e6, 1),
            "build_encode_publish_cpu_us": round(total * 1e6, 1)}


def _encoded_rounds(agents: int, rounds: int) -> list[tuple[str, bytes]]:
    reports = [_report(f"node-{number:04d}") for number in range(agents)]
    messages = []
    for _ in range(rounds):
        for report in reports:
            message = report.message("heartbeat", time.time())
            report.confirm(message)
            messages.append((inventory_subject(report.node), encode(message)))
    return messages


def _publish_as_agents(url: str, agents: int, rounds: int) -> None:
    async def publish() -> None:
        messages = _encoded_rounds(agents, rounds)
        client = await nats.connect(url)
        for number, (subject, data) in enumerate(messages):
            await client.publish(subject, data)
            if number % FLUSH_EVERY == FLUSH_EVERY - 1:
                await client.flush()
        await client.flush()
        await client.close()

    asyncio.run(publish())


class _Tally:
    """What the subscriber saw: counts, per-node order, and when it started and stopped."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.received = 0
        self.out_of_order = 0
        self.last_sequence: dict[str, int] = {}
        self.first_at = self.last_at = self.cpu_started = 0.0
        self.done = asyncio.Event()

    def count(self, inventory: Inventory) -> None:
        if inventory.sequence <= self.last_sequence.get(inventory.node, 0):
            self.out_of_order += 1
        self.last_sequence[inventory.node] = inventory.sequence
        self.received += 1
        self.last_at = time.perf_counter()
        if self.received >= self.expected:
            self.done.set()


async def subscriber_rate(url: str, agents: int, rounds: int) -> dict[str, object]:
    """Messages per second one subscriber decodes (to ``Inventory`` and on to ``Node``)."""
    tally = _Tally(agents * rounds)

    async def receive(message: Msg) -> None:
        if not tally.received:
            tally.first_at, tally.cpu_started = time.perf_counter(), time.process_time()
        inventory = decode_inventory(message.data)
        inventory.to_node()
        tally.count(inventory)

    client = await nats.connect(url)
    try:
        await client.subscribe(INVENTORY_SUBJECTS, cb=receive)
        await client.flush()
        publisher = multiprocessing.get_context("spawn").Process(
            target=_publish_as_agents, args=(url, agents, rounds))
        publisher.start()
        with contextlib.suppress(TimeoutError):  # a shortfall shows in "received"
            await asyncio.wait_for(tally.done.wait(), timeout=120)
        cpu = time.process_time() - tally.cpu_started
        publisher.join(timeout=30)
    finally:
        await client.close()
    elapsed = max(tally.last_at - tally.first_at, 1e-9)
    return {"agents": agents, "messages": tally.expected, "received": tally.received,
            "out_of_order": tally.out_of_order,
            "decoded_per_s": round(tally.received / elapsed),
            "subscriber_cpu_us_per_message": round(cpu / max(tally.received, 1) * 1e6, 1)}


def decode_rate(agents: int) -> dict[str, object]:
    """The decoding alone, without NATS: bytes to ``Inventory`` to ``Node``."""
    messages = [data for _, data in _encoded_rounds(agents, 1)]
    started = time.perf_counter()
    for data in messages:
        inventory: Inventory = decode_inventory(data)
        inventory.to_node()
    return {"decode_to_node_per_s": round(len(messages) / (time.perf_counter() - started))}


async def bench(url: str, publishes: int, agents: int, rounds: int) -> dict[str, object]:
    return {"publish": await publish_cost(url, publishes),
            "subscriber": await subscriber_rate(url, agents, rounds),
            "decode_only": decode_rate(agents)}


def run(args: argparse.Namespace) -> int:
    if args.nats:
        result = asyncio.run(bench(args.nats, args.publishes, args.agents, args.rounds))
    else:
        with LocalNatsServer() as server:
            result = asyncio.run(bench(server.url, args.publishes, args.agents, args.rounds))
    print(json.dumps(result, indent=2))
    return 0
