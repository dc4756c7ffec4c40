"""``pyhami watch``: the model folding telemetry into a view, and the command on a real NATS."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys
import time
from pathlib import Path

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from rich.console import Console

from common import telemetry
from common.core import Defaults, NodePolicy, decide, fleet_from_cluster, parse_default_chain
from common.core import parse_pod as parse_pod_request
from common.core.pod import Container, ObjectMeta, PodManifest, PodSpec, ResourceRequirements
from common.files import load_cluster, load_pod
from common.natsserver import LocalNatsServer, free_port
from common.telemetry import CardUsage, DecisionEvent, UsageEvent
from common.wire import RESYNC_SUBJECT, Card, Inventory, decode_resync, inventory_subject
from common.wire import encode as encode_wire
from pyhami.watch import WatchModel, render

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NOW = 1_700_000_000.0
NODE = "gpu-node-1"
T4 = "NVIDIA-Tesla T4"


def lab_decision(pod: str | PodManifest) -> DecisionEvent:
    """A real decision of the core on the article's lab (an example file or a manifest),
    as the daemon publishes it."""
    fleet = fleet_from_cluster(load_cluster(EXAMPLES / "lab-cluster.json"))
    defaults = Defaults(parse_default_chain("spread"), NodePolicy.BINPACK)
    manifest = load_pod(EXAMPLES / pod) if isinstance(pod, str) else pod
    request = parse_pod_request(manifest, defaults)
    return DecisionEvent.of(decide(fleet, request, explain=True), "filter", NOW - 2, 0.84)


def too_big_for_the_lab() -> PodManifest:
    limits: dict[str, str | int | float] = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 90000}
    return PodManifest(metadata=ObjectMeta(name="huge", namespace="default"),
                       spec=PodSpec(containers=[
                           Container(name="app", resources=ResourceRequirements(limits=limits))]))


def lab_usage(tenants: tuple[int, ...] = (2, 1, 0, 0), unhealthy: int | None = None) -> UsageEvent:
    return UsageEvent(node=NODE, timestamp=NOW, cards=[
        CardUsage(uuid=f"GPU-{i}", index=i, type=T4, tenants=n, used=n, usedmem=1000 * n,
                  memory=15360, usedcores=0, cores=100, count=10, health=i != unhealthy)
        for i, n in enumerate(tenants)])


def lab_inventory(cards: int = 4, timestamp: float = NOW - 3, unhealthy: str = "",
                  cordoned: tuple[str, ...] = ()) -> Inventory:
    return Inventory(
        schema=1, node=NODE, agent_version="0.1.0", instance="a1", sequence=1,
        timestamp=timestamp, reason="heartbeat", heartbeat_interval=10.0,
        cards=[Card(uuid=f"GPU-{i}", index=i, type=T4, memory=15360,
                    health=not (unhealthy and i == 3),
                    health_detail=unhealthy if i == 3 else "") for i in range(cards)],
        cordoned=list(cordoned))


def pending(pod: str, failed_nodes: dict[str, str], reason: str | None = None) -> DecisionEvent:
    return DecisionEvent(pod=pod, verb="filter", scheduled=False, node=None, cards=[],
                         failed_nodes=failed_nodes, ignored_policies=["fancy"], reason=reason,
                         explain=[], timestamp=NOW - 1, duration_ms=1.25)


def text_of(model: WatchModel, width: int = 120, now: float = NOW) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(render(model, now))
    return out.getvalue()


def line_with(text: str, *needles: str) -> str:
    """The one line of ``text`` that holds every needle."""
    lines = [line for line in text.splitlines() if all(n in line for n in needles)]
    assert len(lines) == 1, f"{needles} on {len(lines)} lines of:\n{text}"
    return lines[0]


class TestModel:
    def test_usage_shows_each_card_with_its_tenants_and_memory(self) -> None:
        model = WatchModel()
        model.apply_usage(lab_usage())
        card = model.nodes[NODE].cards["GPU-0"]
        assert card.usage is not None and card.usage.tenants == 2
        text = text_of(model)
        row = line_with(text, "2000/15360")
        assert NODE in row and T4 in row and "2/10" in row and "0/100" in row and "ok" in row
        assert "1/10" in line_with(text, "1000/15360")
        assert len([line for line in text.splitlines() if "0/15360" in line]) == 4

    def test_a_new_usage_event_replaces_the_nodes_cards(self) -> None:
        model = WatchModel()
        model.apply_usage(lab_usage())
        model.apply_usage(lab_usage((0, 3)))
        assert sorted(model.nodes[NODE].cards) == ["GPU-0", "GPU-1"]
        text = text_of(model)
        assert "3/10" in line_with(text, "3000/15360")
        assert "2000/15360" not in text

    def test_inventory_sets_health_and_last_heard_and_keeps_the_usage(self) -> None:
        model = WatchModel()
        model.apply_usage(lab_usage())
        model.apply_inventory(lab_inventory(unhealthy="XID 79", cordoned=("GPU-2",)))
        node = model.nodes[NODE]
        assert node.heard_at == NOW - 3
        assert not node.cards["GPU-3"].health
        text = text_of(model)
        assert "heard 3s ago" in text
        assert "2/10" in line_with(text, "2000/15360")  # the usage survived the inventory
        assert "0/10" in line_with(text, "XID 79")
        assert "0/10" in line_with(text, "cordoned")

    def test_usage_after_an_inventory_keeps_the_health_detail_and_cordon(self) -> None:
        model = WatchModel()
        model.apply_inventory(lab_inventory(unhealthy="XID 79", cordoned=("GPU-2",)))
        model.apply_usage(lab_usage(unhealthy=3))
        text = text_of(model)
        assert "0/10" in line_with(text, "XID 79")
        assert "0/10" in line_with(text, "cordoned")
        assert "heard 3s ago" in text

    def test_inventory_alone_lists_cards_with_usage_unknown(self) -> None:
        model = WatchModel()
        model.apply_inventory(lab_inventory(cards=2))
        text = text_of(model)
        assert "heard 3s ago" in text
        assert "-" in line_with(text, NODE, T4) and "/15360" not in text

    def test_a_node_silent_for_three_heartbeats_is_flagged(self) -> None:
        model = WatchModel()
        model.apply_inventory(lab_inventory(timestamp=NOW - 45))
        assert "silent 45s" in text_of(model)
        assert "silent" not in text_of(model, now=NOW - 30)

    def test_scheduled_decision_shows_pod_card_and_selection_path(self) -> None:
        model = WatchModel()
        event = lab_decision("mutex-binpack-pod.yaml")
        model.apply_decision(event)
        assert model.last_explained is event
        text = text_of(model)
        assert f"{NODE} GPU 2" in line_with(text, "default/mutex-binpack", "0.8")
        assert "ExclusiveDeviceAllocateConflict" in line_with(text, "3.302083")
        assert "ExclusiveDeviceAllocateConflict" in line_with(text, "1.651042")
        chosen = line_with(text, "chosen")
        assert chosen.split()[:2] == ["2", "0"] and "0.000000" in chosen

    def test_pending_decision_shows_the_shortest_failure_reason(self) -> None:
        model = WatchModel()
        model.apply_decision(pending("default/big", {
            "gpu-node-1": "4/4 CardInsufficientMemory, 1/4 CardNotHealth",
            "gpu-node-2": "2/2 CardInsufficientMemory"}))
        row = line_with(text_of(model), "default/big")
        assert "Pending (gpu-node-2: 2/2 CardInsufficientMemory; +1 node)" in row
        assert "fancy" in row and "1.2" in row
        assert model.last_explained is None

    def test_a_rejected_pod_shows_its_own_reason(self) -> None:
        model = WatchModel()
        model.apply_decision(pending("default/odd", {}, reason="nvidia.com/gpu: not a number"))
        assert "Pending (nvidia.com/gpu: not a number)" in text_of(model)

    def test_selection_path_stays_with_the_last_scheduled_decision(self) -> None:
        model = WatchModel()
        model.apply_decision(lab_decision("mutex-binpack-pod.yaml"))
        huge = lab_decision(too_big_for_the_lab())
        assert not huge.scheduled and huge.explain  # a pending decision may explain too
        model.apply_decision(huge)
        text = text_of(model)
        assert "Pending (gpu-node-1: 4/4 CardInsufficientMemory)" in line_with(text, "default/huge")
        assert "selection path of default/mutex-binpack" in text
        assert "ExclusiveDeviceAllocateConflict" in line_with(text, "3.302083")
        unexplained = msgspec.structs.replace(lab_decision("binpack-pod.yaml"), explain=[])
        model.apply_decision(unexplained)
        text = text_of(model)
        assert f"{NODE} GPU 0" in line_with(text, "default/plain-binpack")
        assert "selection path of default/mutex-binpack" in text
        assert "3 decisions seen, 1 pending" in text

    def test_only_the_last_n_decisions_are_shown_newest_first(self) -> None:
        model = WatchModel(decisions=2)
        for name in ("first", "second", "third"):
            model.apply_decision(pending(f"default/{name}", {NODE: "4/4 CardInsufficientMemory"}))
        text = text_of(model)
        assert "default/first" not in text
        assert text.index("default/third") < text.index("default/second")
        assert "3 decisions seen" in text

    def test_footer_counts_undecodable_messages_and_names_the_server(self) -> None:
        model = WatchModel(source="nats://10.0.0.5:4222")
        assert "undecodable" not in text_of(model)
        model.note_undecodable()
        model.note_undecodable()
        footer = line_with(text_of(model), "nats://10.0.0.5:4222")
        assert "2 undecodable messages" in footer and "connecting" in footer

    def test_at_100_columns_every_value_is_whole(self) -> None:
        model = WatchModel()
        model.apply_usage(lab_usage())
        model.apply_decision(lab_decision("mutex-binpack-pod.yaml"))
        text = text_of(model, width=100)
        assert all(len(line) <= 100 for line in text.splitlines())
        for value in (T4, "2000/15360", "█", "default/mutex-binpack", "3.302083",
                      "ExclusiveDeviceAllocateConflict"):
            assert value in text
        assert "…" not in text


async def run_watch(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pyhami.cli", "watch", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "120"})


async def resync_request(server: LocalNatsServer) -> tuple[Client, asyncio.Future[Msg]]:
    """A connection to publish on, and the resync request ``pyhami watch`` sends once it has
    subscribed: from then on it hears whatever is published."""
    client = await nats.connect(server.url)
    asked: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()

    async def on_resync(message: Msg) -> None:
        if not asked.done():
            asked.set_result(message)

    await client.subscribe(RESYNC_SUBJECT, cb=on_resync)
    await client.flush()
    return client, asked


class TestCommand:
    async def test_once_prints_what_was_published_while_it_listened(
            self, nats_server: LocalNatsServer) -> None:
        client, asked = await resync_request(nats_server)
        watch = await run_watch("--nats", nats_server.url, "--once", "--wait", "1.5")
        try:
            request = decode_resync((await asyncio.wait_for(asked, 10)).data)
            assert request.requested_by == "pyhami-watch" and request.nodes == []
            await client.publish(telemetry.usage_subject(NODE), telemetry.encode(lab_usage()))
            await client.publish(telemetry.DECISIONS_SUBJECT,
                                 telemetry.encode(lab_decision("mutex-binpack-pod.yaml")))
            await client.publish(inventory_subject(NODE),
                                 encode_wire(lab_inventory(timestamp=time.time())))
            await client.publish(telemetry.DECISIONS_SUBJECT, b"\xc1 not msgpack")
            future = UsageEvent(schema=telemetry.SCHEMA_VERSION + 1, node="future-node",
                                timestamp=NOW, cards=[])
            await client.publish(telemetry.usage_subject("future-node"), telemetry.encode(future))
            await client.flush()
            out, err = await asyncio.wait_for(watch.communicate(), 15)
        finally:
            await client.close()
        text = out.decode()
        assert watch.returncode == 0, err.decode()
        assert "2/10" in line_with(text, NODE, "2000/15360")
        assert f"{NODE} GPU 2" in line_with(text, "default/mutex-binpack", "0.8")
        assert "ExclusiveDeviceAllocateConflict" in line_with(text, "3.302083")
        assert "heard" in line_with(text, "1000/15360")  # the inventory, and it is fresh
        footer = line_with(text, nats_server.url)
        assert "connected" in footer and "2 undecodable messages" in footer
        assert "future-node" not in text

    async def test_unreachable_nats_is_one_line_naming_the_url_and_exit_1(self) -> None:
        url = f"nats://127.0.0.1:{free_port()}"
        watch = await run_watch("--nats", url, "--once", "--wait", "0.5")
        out, err = await asyncio.wait_for(watch.communicate(), 15)
        assert watch.returncode == 1
        assert out == b""
        lines = err.decode().splitlines()
        assert len(lines) == 1 and url in lines[0] and "cannot reach NATS" in lines[0]

    async def test_live_view_ends_cleanly_on_sigterm(self, nats_server: LocalNatsServer) -> None:
        client, asked = await resync_request(nats_server)
        watch = await run_watch("--nats", nats_server.url)
        try:
            await asyncio.wait_for(asked, 10)
            watch.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(watch.communicate(), 10)
        finally:
            await client.close()
        assert watch.returncode == 0
        assert b"Traceback" not in err

    async def test_bad_flags_exit_2(self) -> None:
        watch = await run_watch("--once", "--decisions", "0")
        _, err = await asyncio.wait_for(watch.communicate(), 15)
        assert watch.returncode == 2
        assert "--decisions" in err.decode()
