"""What the daemon tells the outside: telemetry on NATS, Events, metrics and logs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import msgspec
import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common import telemetry
from common.wire import (
    RESYNC_SUBJECT,
    SCHEMA_VERSION,
    Inventory,
    ReportedCard,
    ResyncRequest,
    encode,
    inventory_subject,
)
from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsServer, free_port
from pyhami.sandbox import RunningDaemon, SimulatedAgent, standalone_config
from tests.harness import Lab, PodClient, eventually


async def test_every_decision_and_usage_change_is_published(lab: Lab) -> None:
    client = await nats.connect(lab.nats.url)
    decisions: list[telemetry.DecisionEvent] = []
    usage: list[telemetry.UsageEvent] = []

    async def on_decision(message: nats.aio.msg.Msg) -> None:
        decisions.append(telemetry.decode_decision(message.data))

    async def on_usage(message: nats.aio.msg.Msg) -> None:
        usage.append(telemetry.decode_usage(message.data))

    await client.subscribe(telemetry.DECISIONS_SUBJECT, cb=on_decision)
    await client.subscribe(telemetry.USAGE_SUBJECTS, cb=on_usage)
    await client.flush()
    try:
        binpack = {"hami.io/gpu-scheduler-policy": "binpack"}
        await lab.pods.submit_and_place(lab_pod("a", binpack))
        await lab.pods.submit_and_place(lab_pod("b", binpack))

        async def both_seen() -> bool:
            return len([d for d in decisions if d.scheduled]) >= 2

        await eventually(both_seen, "two decisions on NATS")
        second = [d for d in decisions if d.pod == "default/b"][-1]
        assert second.verb == "filter" and second.node == "gpu-node-1"
        assert [[c.index for c in cards] for cards in second.cards] == [[0]]
        rows = {row.index: row for row in second.explain}
        assert sorted(rows) == [0, 1, 2, 3]
        assert rows[0].score == 1.651042 and rows[0].chosen and rows[0].rank == 1
        assert rows[1].score == 0.0 and not rows[1].chosen

        async def usage_seen() -> bool:
            return any(c.tenants == 2 for e in usage for c in e.cards if c.index == 0)

        await eventually(usage_seen, "the usage of GPU 0 with two tenants")
        latest = [e for e in usage if e.node == "gpu-node-1"][-1]
        first = latest.cards[0]
        assert (first.index, first.tenants, first.usedmem) == (0, 2, 2000)
    finally:
        await client.close()


async def test_ignored_policies_become_an_event(lab: Lab) -> None:
    await lab.pods.submit_and_place(lab_pod("p", {"hami.io/gpu-scheduler-policy": "binpack,turbo"}))
    pod = await lab.pods.get("p")
    ignored = [e for e in pod["events"] if e["reason"] == "PolicyIgnored"]
    assert ignored and "turbo" in ignored[0]["message"]
    assert ignored[0]["type"] == "Warning"


async def test_a_clamped_share_is_placed_and_becomes_an_event(lab: Lab) -> None:
    # HAMi's scheduler reads a share of 150 as 100: placed, with a Warning saying so.
    await lab.pods.submit_and_place(lab_pod("p", limits={
        "nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 150}))
    pod = await lab.pods.get("p")
    adjusted = [e for e in pod["events"] if e["reason"] == "RequestAdjusted"]
    assert adjusted and adjusted[0]["type"] == "Warning"
    assert adjusted[0]["message"] == (
        "request read as HAMi reads it: spec.containers[0].resources.limits"
        "[nvidia.com/gpumem-percentage]: 150 is above 100: read as 100 (HAMi's scheduler "
        "clamps it)")


async def test_computer_score_lines_are_logged_at_debug(lab: Lab,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="scheduler.service"):
        await lab.pods.submit_and_place(lab_pod("p"))
    lines = [r.getMessage() for r in caplog.records if "computer score is" in r.getMessage()]
    assert len(lines) == 4
    assert any("card 0 (GPU-gpu-node-1-0): computer score is 0.000000" in line for line in lines)


@dataclass
class Metered:
    """The lab with the daemon's /metrics listener on."""

    nats: LocalNatsServer
    node: SimulatedAgent
    pods: PodClient
    metrics_url: str


@pytest.fixture
async def metered(jetstream_server: LocalNatsServer,
                  http: aiohttp.ClientSession) -> AsyncIterator[Metered]:
    metrics_port = free_port()
    node = SimulatedAgent.start("gpu-node-1", jetstream_server.url)
    daemon = await RunningDaemon(standalone_config(
        jetstream_server.url, metrics=("127.0.0.1", metrics_port))).start()
    yield Metered(jetstream_server, node, PodClient(http, daemon.url),
                  f"http://127.0.0.1:{metrics_port}/metrics")
    await daemon.stop()
    await node.halt()


async def test_bad_inventory_is_counted_and_dropped_and_a_vanished_card_reported(
    metered: Metered, http: aiohttp.ClientSession,
) -> None:
    pods, node = metered.pods, metered.node
    client = await nats.connect(metered.nats.url)
    try:
        await pods.submit_and_place(lab_pod("pinned", {
            "nvidia.com/use-gpuuuid": "GPU-gpu-node-1-3"}))
        await client.publish(inventory_subject("gpu-node-1"), b"\x93not an inventory")
        await client.publish(inventory_subject("gpu-node-1"), msgspec.msgpack.encode(
            {"schema": SCHEMA_VERSION, "node": "gpu-node-1"}))
        # The node's agent is replaced by one that no longer sees GPU 3.
        await node.halt()
        cards = [ReportedCard(uuid=f"GPU-gpu-node-1-{i}", index=i, type="NVIDIA-Tesla T4",
                              memory=15360, numa=0, links={}) for i in range(3)]
        await client.publish(inventory_subject("gpu-node-1"), encode(Inventory(
            schema=SCHEMA_VERSION, node="gpu-node-1", agent_version="test", instance="new",
            sequence=1, timestamp=time.time(), reason="start", heartbeat_interval=10.0,
            cards=cards)))
        await client.flush()
        vanished = await pods.pending_with("pinned", "CardVanished")
        message = next(e["message"] for e in vanished["events"] if e["reason"] == "CardVanished")
        assert "GPU-gpu-node-1-3" in message

        async with http.get(metered.metrics_url) as response:
            text = await response.text()
        assert 'pyhami_inventory_messages_total{result="rejected"} 2.0' in text
        assert "pyhami_allocations_on_vanished_cards 1.0" in text
        # The daemon still answers, and still places pods on the cards that remain.
        await pods.submit_and_place(lab_pod("after"))
    finally:
        await client.close()



async def test_a_scaled_card_shows_its_registered_and_its_own_figures(
    metered: Metered, http: aiohttp.ClientSession,
) -> None:
    """An agent under deviceMemoryScaling 2 and deviceCoreScaling 1.5 registers its T4s at
    30720 MiB and 150 cores: HAMi's gauges report those, as HAMi's scheduler reports its
    registered figures; pyhami's gauges, /ledgerz and the usage on NATS the card's own."""
    mib = 1024 * 1024
    node = "gpu-node-1"
    client = await nats.connect(metered.nats.url)
    usage: list[telemetry.UsageEvent] = []

    async def on_usage(message: nats.aio.msg.Msg) -> None:
        usage.append(telemetry.decode_usage(message.data))

    try:
        await client.subscribe(telemetry.USAGE_SUBJECTS, cb=on_usage)
        await metered.node.halt()
        cards = [ReportedCard(uuid=f"GPU-{node}-{i}", index=i, type="NVIDIA-Tesla T4",
                              memory=30720, cores=150, numa=0, links={},
                              physical_memory=15360, physical_cores=100) for i in range(2)]
        await client.publish(inventory_subject(node), encode(Inventory(
            schema=SCHEMA_VERSION, node=node, agent_version="test", instance="scaled",
            sequence=1, timestamp=time.time(), reason="start", heartbeat_interval=10.0,
            cards=cards)))
        await client.flush()
        # Two pods of 15000 MiB share one 15360 MiB card registered at twice its size.
        binpack = {"hami.io/gpu-scheduler-policy": "binpack"}
        for name in ("a", "b"):
            await metered.pods.submit_and_place(lab_pod(name, binpack, {
                "nvidia.com/gpu": 1, "nvidia.com/gpumem": 15000}))

        async with http.get(metered.metrics_url) as response:
            text = await response.text()
        at = {"node": node, "device_uuid": f"GPU-{node}-0", "device_index": "0",
              "device_type": "NVIDIA-Tesla T4"}
        hami = {**at, "zone": "vGPU"}
        found = {(sample.name, frozenset(sample.labels.items())): sample.value
                 for family in text_string_to_metric_families(text)
                 for sample in family.samples}
        for name, labels, expected in (
                ("hami_gpu_memory_limit_bytes", hami, 30720 * mib),
                ("hami_gpu_core_limit_ratio", hami, 150),
                ("hami_gpu_memory_allocated_bytes", {**hami, "device_cores": "150"},
                 30000 * mib),
                ("pyhami_gpu_physical_memory_bytes", at, 15360 * mib),
                ("pyhami_gpu_physical_core_ratio", at, 100)):
            assert found[name, frozenset(labels.items())] == expected, name

        async with http.get(f"{metered.pods.url}/ledgerz") as response:
            ledger = await response.json()
        first = next(c for c in ledger["cards"] if c["index"] == 0)
        assert (first["memory"], first["cores"], first["physical_memory"],
                first["physical_cores"], first["usedmem"]) == (30720, 150, 15360, 100, 30000)

        async def usage_seen() -> bool:
            return any(c.usedmem == 30000 for e in usage for c in e.cards)

        await eventually(usage_seen, "the usage of the shared card")
        card = next(c for e in usage for c in e.cards if c.usedmem == 30000)
        assert (card.memory, card.cores, card.physical_memory, card.physical_cores) == (
            30720, 150, 15360, 100)
    finally:
        await client.close()


@pytest.mark.parametrize(("request_body", "replays"), [
    (encode(ResyncRequest(requested_by=telemetry.WATCH_CLIENT)), True),
    (encode(ResyncRequest(requested_by="pyhami-scheduler")), False),  # another daemon's
    (encode(ResyncRequest()), False),
    (b"\xc1 not msgpack", False),
    (b"", False),
    (msgspec.msgpack.encode({"requested_by": 5}), False),
    (msgspec.msgpack.encode(["pyhami-watch"]), False),
], ids=["watch", "daemon", "anonymous", "garbage", "empty", "wrong-type", "not-a-map"])
async def test_a_resync_request_replays_the_decisions_only_for_a_watcher(
        lab: Lab, request_body: bytes, replays: bool) -> None:
    await lab.pods.submit_and_place(lab_pod("before"))
    client = await nats.connect(lab.nats.url)
    replayed: list[telemetry.DecisionEvent] = []

    async def on_decision(message: nats.aio.msg.Msg) -> None:
        event = telemetry.decode_decision(message.data)
        if event.replayed:
            replayed.append(event)

    await client.subscribe(telemetry.DECISIONS_SUBJECT, cb=on_decision)
    await client.flush()
    try:
        await client.publish(RESYNC_SUBJECT, request_body)
        await client.flush()
        if replays:
            async def heard() -> bool:
                return bool(replayed)

            await eventually(heard, "the decisions replayed")
            assert {event.pod for event in replayed} == {"default/before"}
        else:
            await asyncio.sleep(0.5)
            assert replayed == []
        # Whatever came, the daemon goes on: a pod is still placed.
        await lab.pods.submit_and_place(lab_pod("after"))
    finally:
        await client.close()
