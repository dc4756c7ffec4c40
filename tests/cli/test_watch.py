"""``pyhami watch``: the model folding telemetry into a view, and the command on a real NATS."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any, cast

import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from rich.console import Console

from common import telemetry
from common.core import decide, fleet_from_cluster
from common.core import parse_pod as parse_pod_request
from common.core.pod import Container, ObjectMeta, PodManifest, PodSpec, ResourceRequirements
from common.files import load_cluster, load_pod
from common.telemetry import CardUsage, DecisionEvent, UsageEvent
from common.wire import (
    RESYNC_SUBJECT,
    Inventory,
    Measured,
    MeasuredCard,
    ReportedCard,
    decode_resync,
    inventory_subject,
)
from common.wire import encode as encode_wire
from pyhami.demo import GPU_POLICY, lab_pod
from pyhami.natsserver import LocalNatsCluster, LocalNatsServer, free_port
from pyhami.output import print_json, stdout_console
from pyhami.sandbox import DEFAULTS
from pyhami.watch import WatchModel, render, snapshot_document
from pyhami.watch._shell import folding
from tests.harness import Lab, card_of
from tests.paths import EXAMPLES

NOW = 1_700_000_000.0
NODE = "gpu-node-1"
T4 = "NVIDIA-Tesla T4"


def lab_decision(pod: str | PodManifest) -> DecisionEvent:
    """A real decision of the core on the article's lab (an example file or a manifest),
    as the daemon publishes it."""
    fleet = fleet_from_cluster(load_cluster(EXAMPLES / "lab-cluster.json"))
    manifest = load_pod(EXAMPLES / pod) if isinstance(pod, str) else pod
    request = parse_pod_request(manifest, DEFAULTS)
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
        cards=[ReportedCard(uuid=f"GPU-{i}", index=i, type=T4, memory=15360,
                            health=not (unhealthy and i == 3),
                            health_detail=unhealthy if i == 3 else "") for i in range(cards)],
        cordoned=list(cordoned))


def pending(pod: str, failed_nodes: dict[str, str], reason: str | None = None) -> DecisionEvent:
    return DecisionEvent(pod=pod, verb="filter", scheduled=False, node=None, cards=[],
                         failed_nodes=failed_nodes, ignored_policies=["fancy"], reason=reason,
                         explain=[], timestamp=NOW - 1, duration_ms=1.25)


def text_of(model: WatchModel, width: int = 120, now: float = NOW) -> str:
    """The view as a terminal of ``width`` columns shows it (colours aside)."""
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, force_terminal=True).print(
        render(model, now))
    return out.getvalue()


def line_with(text: str, *needles: str) -> str:
    """The one line of ``text`` that holds every needle."""
    lines = [line for line in text.splitlines() if all(n in line for n in needles)]
    assert len(lines) == 1, f"{needles} on {len(lines)} lines of:\n{text}"
    return lines[0]


def measured_inventory() -> Inventory:
    """The lab's inventory with the agent's measurement: card 0 busy beyond what is booked
    on it, card 1 without NVML figures, cards 2 and 3 not measured."""
    return msgspec.structs.replace(lab_inventory(), measured=Measured(at=NOW - 3, cards=[
        MeasuredCard(uuid="GPU-0", memory_used=5000, utilization=87),
        MeasuredCard(uuid="GPU-1")]))


class TestMeasuredUsage:
    def test_the_table_shows_the_measured_memory_and_utilization_beside_the_booked(
            self) -> None:
        model = WatchModel()
        model.apply_usage(lab_usage())
        model.apply_inventory(measured_inventory())
        text = text_of(model, width=160)
        assert "booked MiB" in text and "used MiB" in text
        busy = line_with(text, "2000/15360")
        assert busy.split("2000/15360", 1)[1].split()[1:3] == ["5000", "87%"]
        assert line_with(text, "1000/15360").split("1000/15360", 1)[1].split()[1:3] == [
            "-", "-"]

    def test_a_usage_event_keeps_the_measurement_and_an_inventory_without_one_drops_it(
            self) -> None:
        model = WatchModel()
        model.apply_inventory(measured_inventory())
        model.apply_usage(lab_usage((3, 1, 0, 0)))
        [node] = snapshot_of(model)["nodes"]
        assert [card["measured"] for card in node["cards"]] == [
            {"memory_used": 5000, "utilization": 87},
            {"memory_used": None, "utilization": None}, None, None]
        assert node["cards"][0]["usage"]["usedmem"] == 3000
        model.apply_inventory(lab_inventory())
        [node] = snapshot_of(model)["nodes"]
        assert [card["measured"] for card in node["cards"]] == [None] * 4


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


    @pytest.mark.parametrize("width", [80, 60])
    def test_narrower_every_value_is_whole_and_no_column_is_lost(self, width: int) -> None:
        # At 80 the nodes' table wraps the type and a heading at their spaces; at 60 it
        # is stacked, a card a block: never a value cut short, never a column dropped.
        model = WatchModel()
        model.apply_usage(lab_usage())
        model.apply_inventory(lab_inventory(timestamp=NOW - 3))
        model.apply_decision(lab_decision("mutex-binpack-pod.yaml"))
        text = text_of(model, width=width)
        assert "…" not in text
        assert all(len(line) <= width for line in text.splitlines())
        for value in ("2000/15360", "1000/15360", "0/100", "default/mutex-binpack",
                      "3.302083", "ExclusiveDeviceAllocateConflict", "◀ chosen"):
            assert value in text
        assert text.count(" ok") == 4  # the health column, every card
        assert ("NVIDIA-Tesla T4" in text) == (width == 60)  # wrapped at its space at 80
        assert text.count("NVIDIA-Tesla") == 4


class TestReplayedDecisions:
    """The daemon replays its recent decisions to every watcher whenever one connects."""

    @staticmethod
    def replayed(pod: str, at: float) -> DecisionEvent:
        return msgspec.structs.replace(pending(pod, {NODE: "4/4 CardInsufficientMemory"}),
                                       timestamp=at, replayed=True)

    def test_taken_once_before_any_decision_heard_live(self) -> None:
        model = WatchModel()
        assert model.apply_decision(self.replayed("default/a", NOW - 9))
        assert model.apply_decision(self.replayed("default/b", NOW - 8))
        # Another watcher connects: the same replays again, left out.
        assert not model.apply_decision(self.replayed("default/a", NOW - 9))
        assert model.apply_decision(pending("default/live", {}))
        # Heard live since: later replays are old news to this watcher.
        assert not model.apply_decision(self.replayed("default/c", NOW - 7))
        assert [event.pod for event in model.decisions] == ["default/a", "default/b",
                                                            "default/live"]
        assert (model.decisions_seen, model.pending_seen) == (3, 3)

    def test_a_live_watcher_s_json_stream_leaves_the_replays_out(self) -> None:
        model = WatchModel()
        lines: list[dict[str, Any]] = []
        heard = folding(model, "decision", telemetry.decode_decision, model.apply_decision,
                        lines.append)

        async def hear(event: DecisionEvent) -> None:
            await heard(cast(Msg, SimpleNamespace(subject=telemetry.DECISIONS_SUBJECT,
                                                  data=telemetry.encode(event))))

        async def scenario() -> None:
            await hear(pending("default/live", {}))
            await hear(self.replayed("default/a", NOW - 9))

        asyncio.run(scenario())
        assert [(line["event"], line["pod"], line["replayed"]) for line in lines] == [
            ("decision", "default/live", False)]


class TestPlainOutput:
    """In a pipe or a file there is no window to fit: every value is whole, nothing is
    drawn (memory bars) or coloured."""

    def test_every_value_is_whole_and_nothing_is_drawn(self) -> None:
        node = "gpu-node-in-rack-17-row-b-of-the-second-data-hall"
        card_type = "NVIDIA-NVIDIA H100 80GB HBM3 with a long marketing suffix"
        pod = "team-vision-training/resnet-distributed-worker-0-attempt-3"
        usage = lab_usage()
        model = WatchModel()
        model.apply_usage(msgspec.structs.replace(usage, node=node, cards=[
            msgspec.structs.replace(card, type=card_type) for card in usage.cards]))
        model.apply_decision(pending(pod, {node: "4/4 CardInsufficientMemory"}))
        out = io.StringIO()
        stdout_console(out).print(render(model, NOW))
        text = out.getvalue()
        assert node in text
        assert card_type.removeprefix("NVIDIA-") in line_with(text, "2000/15360")
        assert f"Pending ({node}: 4/4 CardInsufficientMemory)" in line_with(text, pod)
        assert "█" not in text and "…" not in text and "\x1b[" not in text


def snapshot_of(model: WatchModel) -> dict[str, Any]:
    """The --once --output json line, printed and read back."""
    out = io.StringIO()
    print_json(snapshot_document(model, NOW), out, indent=None)
    assert out.getvalue().count("\n") == 1
    document: dict[str, Any] = json.loads(out.getvalue())
    return document


class TestJsonSnapshot:
    def test_the_snapshot_holds_what_the_table_shows(self) -> None:
        model = WatchModel(source="nats://n:4222")
        model.apply_inventory(lab_inventory(unhealthy="XID 79", cordoned=("GPU-2",),
                                            timestamp=NOW - 45))
        model.apply_usage(lab_usage(unhealthy=3))
        model.apply_decision(lab_decision("mutex-binpack-pod.yaml"))
        model.apply_decision(pending("default/big", {NODE: "4/4 CardInsufficientMemory"}))
        model.note_undecodable()
        document = snapshot_of(model)
        assert {key: document[key] for key in ("event", "time", "source", "connection",
                                               "decisions_seen", "pending_seen",
                                               "undecodable")} == {
            "event": "snapshot", "time": NOW, "source": "nats://n:4222",
            "connection": "connecting", "decisions_seen": 2, "pending_seen": 1,
            "undecodable": 1}
        [node] = document["nodes"]
        assert (node["node"], node["heard_at"], node["silent"]) == (NODE, NOW - 45, True)
        assert [card["index"] for card in node["cards"]] == [0, 1, 2, 3]
        assert node["cards"][0] == {
            "uuid": "GPU-0", "index": 0, "type": T4, "memory": 15360, "cores": 100,
            "count": 10, "health": True, "health_detail": "", "cordoned": False,
            "physical_memory": 15360, "physical_cores": 100,
            "usage": {"tenants": 2, "used": 2, "usedmem": 2000, "usedcores": 0},
            "measured": None}
        assert node["cards"][2]["cordoned"] is True
        assert (node["cards"][3]["health"], node["cards"][3]["health_detail"]) == (
            False, "XID 79")
        scheduled, refused = document["decisions"]  # oldest first
        assert (scheduled["pod"], scheduled["node"], scheduled["scheduled"]) == (
            "default/mutex-binpack", NODE, True)
        assert [card["index"] for card in scheduled["cards"][0]] == [2]
        assert any(row["chosen"] for row in scheduled["explain"])
        assert refused["failed_nodes"] == {NODE: "4/4 CardInsufficientMemory"}

    @pytest.mark.parametrize(("scaled", "row", "physical"), [
        pytest.param({}, "1000/15360 ", (15360, 100), id="unscaled"),
        pytest.param({"memory": 30720, "physical_memory": 15360},
                     "1000/30720 (15360 x2)", (15360, 100), id="memory-x2"),
        pytest.param({"memory": 27648, "physical_memory": 15360, "cores": 150,
                      "physical_cores": 100},
                     "1000/27648 (15360 x1.8)", (15360, 100), id="memory-x1.8-cores-x1.5"),
    ])
    def test_the_registered_figures_show_with_the_cards_own(
            self, scaled: dict[str, int], row: str, physical: tuple[int, int]) -> None:
        """Over-commit (HAMi's deviceMemoryScaling, deviceCoreScaling): the table shows
        the registered capacity and, beside it, the card's own and the factor; the
        snapshot both figures. From the usage stream and from the inventory alike."""
        figures: dict[str, Any] = {"memory": 15360, "cores": 100, **scaled}
        usage = UsageEvent(node=NODE, timestamp=NOW, cards=[CardUsage(
            uuid="GPU-0", index=0, type=T4, tenants=1, used=1, usedmem=1000, usedcores=10,
            count=10, health=True, **figures)])
        inventory = msgspec.structs.replace(lab_inventory(cards=1), cards=[ReportedCard(
            uuid="GPU-0", index=0, type=T4, **figures)])
        for first, then in ((usage, inventory), (inventory, usage)):
            model = WatchModel()
            for message in (first, then):
                if isinstance(message, UsageEvent):
                    model.apply_usage(message)
                else:
                    model.apply_inventory(message)
            line = line_with(text_of(model, width=160), row)
            cores = f"10/{figures['cores']}"
            if "physical_cores" in scaled:
                cores += f" ({physical[1]} x1.5)"
            assert cores in line
            [node] = snapshot_of(model)["nodes"]
            card = node["cards"][0]
            assert (card["memory"], card["cores"]) == (figures["memory"], figures["cores"])
            assert (card["physical_memory"], card["physical_cores"]) == physical

    def test_a_node_not_heard_from_has_no_time_and_cards_without_usage(self) -> None:
        model = WatchModel()
        model.apply_inventory(lab_inventory(cards=1, timestamp=NOW - 3))
        [node] = snapshot_of(model)["nodes"]
        assert (node["heard_at"], node["silent"]) == (NOW - 3, False)
        assert node["cards"][0]["usage"] is None
        model = WatchModel()
        model.apply_usage(lab_usage((1,)))
        [node] = snapshot_of(model)["nodes"]
        assert (node["heard_at"], node["silent"]) == (None, False)


async def run_watch(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pyhami.cli", "watch", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={name: value for name, value in os.environ.items()
             if not name.startswith("PYHAMI_") and name != "COLUMNS"})


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
            await client.publish(telemetry.usage_subject(NODE), telemetry.encode(lab_usage()))
            await client.flush()
            await asyncio.sleep(0.5)  # folded in: nothing to see before the signal in a pipe
            watch.send_signal(signal.SIGTERM)
            out, err = await asyncio.wait_for(watch.communicate(), 10)
        finally:
            await client.close()
        assert watch.returncode == 0
        assert b"Traceback" not in err
        # In a pipe the live view prints the view as it stood when stopped, once.
        text = out.decode()
        assert "2/10" in line_with(text, NODE, "2000/15360")
        assert "connected" in line_with(text, nats_server.url)

    async def test_once_in_json_prints_one_snapshot_line(
            self, nats_server: LocalNatsServer) -> None:
        client, asked = await resync_request(nats_server)
        watch = await run_watch("--nats", nats_server.url, "--once", "--wait", "1.5",
                                "--output", "json")
        try:
            await asyncio.wait_for(asked, 10)
            await client.publish(telemetry.usage_subject(NODE), telemetry.encode(lab_usage()))
            await client.publish(telemetry.DECISIONS_SUBJECT,
                                 telemetry.encode(lab_decision("mutex-binpack-pod.yaml")))
            await client.flush()
            out, err = await asyncio.wait_for(watch.communicate(), 15)
        finally:
            await client.close()
        assert watch.returncode == 0, err.decode()
        [line] = out.decode().splitlines()
        document = json.loads(line)
        assert (document["event"], document["connection"]) == ("snapshot", "connected")
        assert document["nodes"][0]["cards"][0]["usage"]["tenants"] == 2
        assert document["decisions"][0]["pod"] == "default/mutex-binpack"

    async def test_json_is_a_line_for_each_message_heard(
            self, nats_server: LocalNatsServer) -> None:
        client, asked = await resync_request(nats_server)
        watch = await run_watch("--nats", nats_server.url, "-o", "json")
        assert watch.stdout is not None
        try:
            await asyncio.wait_for(asked, 10)
            await client.publish(telemetry.usage_subject(NODE), telemetry.encode(lab_usage()))
            await client.publish(inventory_subject(NODE),
                                 encode_wire(lab_inventory(timestamp=time.time())))
            await client.publish(telemetry.DECISIONS_SUBJECT, b"\xc1 not msgpack")
            await client.publish(telemetry.DECISIONS_SUBJECT,
                                 telemetry.encode(lab_decision("mutex-binpack-pod.yaml")))
            await client.flush()
            lines: list[bytes] = []
            while not lines or json.loads(lines[-1])["event"] != "decision":
                lines.append(await asyncio.wait_for(watch.stdout.readline(), 10))
            watch.send_signal(signal.SIGTERM)
            rest, err = await asyncio.wait_for(watch.communicate(), 10)
        finally:
            await client.close()
        assert watch.returncode == 0, err.decode()
        events = [json.loads(line) for line in [*lines, *rest.splitlines()]]
        assert [e["event"] for e in events] == [
            "connection", "usage", "inventory", "undecodable", "decision"]
        connection, usage, inventory, undecodable, decision = events
        assert (connection["state"], connection["source"]) == ("connected", nats_server.url)
        assert usage["node"] == NODE and usage["cards"][0]["tenants"] == 2
        assert inventory["node"] == NODE and inventory["reason"] == "heartbeat"
        assert undecodable["subject"] == telemetry.DECISIONS_SUBJECT and undecodable["error"]
        assert (decision["pod"], decision["node"], decision["scheduled"]) == (
            "default/mutex-binpack", NODE, True)

    async def test_json_stops_quietly_when_its_reader_leaves(
            self, nats_server: LocalNatsServer) -> None:
        client, asked = await resync_request(nats_server)
        environment = {name: value for name, value in os.environ.items()
                       if not name.startswith("PYHAMI_")}
        watch = subprocess.Popen(
            [sys.executable, "-m", "pyhami.cli", "watch", "--nats", nats_server.url,
             "--output", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=environment)
        assert watch.stdout is not None and watch.stderr is not None
        try:
            await asyncio.wait_for(asked, 10)
            first = await asyncio.to_thread(watch.stdout.readline)
            assert json.loads(first)["event"] == "connection"
            watch.stdout.close()  # as `| head -n 1` does
            for _ in range(3):
                await client.publish(telemetry.usage_subject(NODE),
                                     telemetry.encode(lab_usage()))
            await client.flush()
            code = await asyncio.to_thread(watch.wait, 15)
            err = watch.stderr.read().decode()
        finally:
            await client.close()
            if watch.poll() is None:
                watch.kill()
                watch.wait()
            watch.stderr.close()
        assert code == 0, err
        assert err == ""

    async def test_bad_flags_exit_2(self) -> None:
        watch = await run_watch("--once", "--decisions", "0")
        _, err = await asyncio.wait_for(watch.communicate(), 15)
        assert watch.returncode == 2
        assert "--decisions" in err.decode()


SWITCH_BOUND_S = 5.0
"""A client reaches another server this soon after its own is killed (measured under
0.5 s; tests/scheduler/daemon/test_nats_cluster.py)."""


@pytest.mark.slow  # a cluster of three nats-servers
async def test_watch_keeps_receiving_after_its_nats_server_is_killed(
        nats_cluster: LocalNatsCluster) -> None:
    """Given every server's URL, ``pyhami watch`` moves to another server when its own is
    killed, says so, and goes on printing what is published there."""
    watch = await run_watch("--nats", nats_cluster.url, "-o", "json")
    assert watch.stdout is not None
    try:
        first = json.loads(await asyncio.wait_for(watch.stdout.readline(), 10))
        assert (first["event"], first["state"]) == ("connection", "connected")

        def server_of_watch() -> int | None:
            return next((index for index in nats_cluster.running()
                         if "pyhami-watch" in nats_cluster.client_names(index)), None)

        lost = await asyncio.to_thread(server_of_watch)
        assert lost is not None
        killed_at = time.monotonic()
        nats_cluster.kill(lost)
        states: list[str] = []
        while "connected" not in states:
            line = json.loads(await asyncio.wait_for(watch.stdout.readline(), SWITCH_BOUND_S))
            assert line["event"] == "connection", line
            states.append(line["state"])
        switch = time.monotonic() - killed_at
        assert states == ["disconnected, reconnecting", "connected"]
        now_on = await asyncio.to_thread(server_of_watch)
        assert now_on not in (None, lost)
        # Published through the third server: heard across the cluster.
        third = next(index for index in nats_cluster.running() if index != now_on)
        client = await nats.connect(nats_cluster.urls[third])
        try:
            await client.publish(telemetry.DECISIONS_SUBJECT,
                                 telemetry.encode(lab_decision("mutex-binpack-pod.yaml")))
            await client.flush()
            decision = json.loads(await asyncio.wait_for(watch.stdout.readline(), 10))
        finally:
            await client.close()
        assert (decision["event"], decision["pod"]) == ("decision", "default/mutex-binpack")
        print(f"pyhami watch on another server {switch:.2f} s after its own was killed")
        assert switch < SWITCH_BOUND_S
    finally:
        watch.send_signal(signal.SIGTERM)
        await asyncio.wait_for(watch.communicate(), 10)
    assert watch.returncode == 0


class TestOnTheLab:
    """``--once`` against the real standalone daemon and a simulated agent (tests/harness)."""

    async def test_once_shows_the_pods_bound_before_it_started(self, lab: Lab) -> None:
        # Two pods bound, their usage and decisions published, before the watcher
        # connects: it hears nothing change while it waits, yet shows the cards' tenants
        # as they stand and the decisions made, replayed.
        cards = [card_of(await lab.pods.submit_and_place(lab_pod(f"bound-{i}",
                                                                  {GPU_POLICY: "spread"})))
                 for i in range(2)]
        assert len(set(cards)) == 2  # spread: a card each
        await asyncio.sleep(0.5)  # their usage gone out, unheard by anyone
        watch = await run_watch("--nats", lab.nats.url, "--once", "--wait", "2",
                                "--output", "json")
        out, err = await asyncio.wait_for(watch.communicate(), 30)
        assert watch.returncode == 0, err.decode()
        snapshot = json.loads(out)
        (node,) = snapshot["nodes"]
        tenants = {card["uuid"]: card["usage"]["tenants"] for card in node["cards"]
                   if card["usage"] is not None}
        assert len(node["cards"]) == 4 and len(tenants) == 4  # every card's usage known
        assert tenants == {card["uuid"]: int(card["uuid"] in cards) for card in node["cards"]}
        assert {card["uuid"]: card["usage"]["usedmem"] for card in node["cards"]} == {
            card["uuid"]: 1000 * int(card["uuid"] in cards) for card in node["cards"]}
        decisions = snapshot["decisions"]
        assert {(d["pod"], d["scheduled"], d["node"], d["replayed"]) for d in decisions} == {
            (f"default/bound-{i}", True, NODE, True) for i in range(2)}
        assert {d["cards"][0][0]["uuid"] for d in decisions} == set(cards)
        assert snapshot["decisions_seen"] == len(decisions)  # each once
