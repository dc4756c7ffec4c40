"""HAMi's scheduler Events from the live daemon: three simulated four-T4 nodes, the
standalone daemon and its pending loop (which sends every node to /filter, as
kube-scheduler sends the nodes it kept), every step over the pod API.

A placed pod gets ``FilteringSucceed`` and ``BindingSucceed`` (Normal) in HAMi's words; a
refused one HAMi's per-reason ``FilteringFailed`` Events, then its summary carrying
pyhami's sentence; ``--no-success-events`` leaves the Normal ones out.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from pyhami.cli import build_parser
from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsServer
from pyhami.sandbox import DEFAULTS, RunningDaemon, SimulatedAgent, standalone_config
from scheduler.cli import config_from
from scheduler.service import SchedulerService
from scheduler.service.shared import ServiceSettings
from tests.harness import PodClient, eventually
from tests.harness import group_member as member

NODES = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]




class Stand:
    def __init__(self, daemon: RunningDaemon, pods: PodClient) -> None:
        self.daemon = daemon
        self.pods = pods

    @property
    def service(self) -> SchedulerService:
        assert self.daemon.service is not None
        return self.daemon.service

    def node_score(self, node: str) -> float:
        """The node's score now, as the core compares it (before the next pod)."""
        snapshot = self.service.state.fleet.snapshot
        return float(snapshot.node_scores()[snapshot.node_position[node]])

    async def events(self, name: str, count: int) -> list[tuple[str, str, str]]:
        """The pod's (type, reason, message), once it has ``count`` of them (those written
        after /bind's answer included)."""
        found: list[tuple[str, str, str]] = []

        async def written() -> bool:
            nonlocal found
            pod = await self.pods.get(name)
            found = [(e["type"], e["reason"], e["message"]) for e in pod["events"]]
            return len(found) >= count

        await eventually(written, f"{count} Events on {name}")
        return found


async def stand_up(server: LocalNatsServer, http: aiohttp.ClientSession,
                   success_events: bool) -> AsyncIterator[Stand]:
    nodes = [SimulatedAgent.start(name, server.url) for name in NODES]
    daemon = await RunningDaemon(standalone_config(
        server.url, service=ServiceSettings(DEFAULTS, success_events=success_events))).start()
    stand = Stand(daemon, PodClient(http, daemon.url))

    async def every_node() -> bool:
        return len(list(stand.service.state.fleet.nodes())) == len(NODES)

    await eventually(every_node, "the three inventories")
    yield stand
    await daemon.stop()
    for node in nodes:
        await node.halt()


@pytest.fixture
async def stand(jetstream_server: LocalNatsServer,
                http: aiohttp.ClientSession) -> AsyncIterator[Stand]:
    async for running in stand_up(jetstream_server, http, success_events=True):
        yield running


@pytest.fixture
async def quiet(jetstream_server: LocalNatsServer,
                http: aiohttp.ClientSession) -> AsyncIterator[Stand]:
    async for running in stand_up(jetstream_server, http, success_events=False):
        yield running


async def test_a_placed_pod_has_hamis_two_normal_events(stand: Stand) -> None:
    await stand.pods.submit_and_place(lab_pod("first"))
    # Binpack, the nodes idle: every node fits with score 0, the first by name chosen,
    # listed last as HAMi's sort leaves it.
    assert sorted(await stand.events("first", 2)) == [
        ("Normal", "BindingSucceed", "Successfully binding node [gpu-node-1] to default/first"),
        ("Normal", "FilteringSucceed", "find fit node(gpu-node-1), 0 nodes not fit, 3 nodes "
         "fit(gpu-node-3:0.00,gpu-node-2:0.00,gpu-node-1:0.00)"),
    ]
    score = stand.node_score("gpu-node-1")
    assert score > 0
    await stand.pods.submit_and_place(lab_pod("second"))
    events = dict(((kind, reason), message)
                  for kind, reason, message in await stand.events("second", 2))
    assert events == {
        ("Normal", "BindingSucceed"): "Successfully binding node [gpu-node-1] to default/second",
        ("Normal", "FilteringSucceed"): "find fit node(gpu-node-1), 0 nodes not fit, 3 nodes "
                                        f"fit(gpu-node-3:0.00,gpu-node-2:0.00,"
                                        f"gpu-node-1:{score:.2f})",
    }


async def test_a_refused_pod_has_hamis_reason_events_then_the_summary(stand: Stand) -> None:
    await stand.pods.submit(lab_pod("big", limits={"nvidia.com/gpu": 5,
                                                   "nvidia.com/gpumem": 1000}))
    pod = await stand.pods.pending_with("big", "FilteringFailed")
    assert [(e["type"], e["reason"], e["message"]) for e in pod["events"]] == [
        ("Warning", "FilteringFailed",
         "3 nodes NodeInsufficientDevice(gpu-node-1,gpu-node-2,gpu-node-3)"),
        ("Warning", "FilteringFailed",
         "no available node, 3 nodes do not meet: asked for 5 cards with 1000 MiB each; "
         "gpu-node-1, gpu-node-2 and gpu-node-3 each have 4 cards (NodeInsufficientDevice)"),
    ]


async def test_without_success_events_only_the_warnings_are_written(quiet: Stand) -> None:
    await quiet.pods.submit_and_place(lab_pod("placed"))
    await quiet.pods.submit(lab_pod("big", limits={"nvidia.com/gpu": 5}))
    refused = await quiet.pods.pending_with("big", "FilteringFailed")
    assert {e["type"] for e in refused["events"]} == {"Warning"}
    # The refused pod's Events came after the placed pod's /bind: any Normal Event of the
    # placed pod would have been written by then.
    assert (await quiet.pods.get("placed"))["events"] == []


async def test_each_member_of_a_group_placed_together_has_filtering_succeed(
        stand: Stand) -> None:
    names = [f"m-{i}" for i in range(4)]
    for name in names:
        await stand.pods.submit(member(name, "train", len(names)))
    placed = {name: (await stand.pods.placed(name))["node"] for name in names}
    scored = 0
    for name, node in placed.items():
        succeeded = [m for kind, reason, m in await stand.events(name, 2)
                     if (kind, reason) == ("Normal", "FilteringSucceed")]
        assert len(succeeded) == 1, succeeded
        # The member whose /filter placed the group names the nodes that held it there;
        # the others, whose cards were held for them, their node alone.
        held = f"find fit node({node}), 2 nodes not fit, 1 nodes fit({node})"
        fitting = re.fullmatch(rf"find fit node\({node}\), \d nodes not fit, \d nodes "
                               rf"fit\((gpu-node-\d:\d+\.\d\d,)*{node}:\d+\.\d\d\)",
                               succeeded[0])
        assert succeeded[0] == held or fitting, succeeded[0]
        scored += fitting is not None
    assert scored == 1


def config(args: list[str], environ: dict[str, str]) -> Any:
    return config_from(build_parser(environ).parse_args(["scheduler", "--standalone", *args]))


@pytest.mark.parametrize(("args", "environ", "written"), [
    ([], {}, True),  # HAMi writes them: on by default
    (["--no-success-events"], {}, False),
    ([], {"PYHAMI_NO_SUCCESS_EVENTS": "true"}, False),
    ([], {"PYHAMI_NO_SUCCESS_EVENTS": "no"}, True),
])
def test_the_success_events_setting(args: list[str], environ: dict[str, str],
                                    written: bool) -> None:
    assert config(args, environ).service.success_events is written


def test_a_bad_switch_value_is_refused_naming_the_variable(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        config([], {"PYHAMI_NO_SUCCESS_EVENTS": "off"})
    assert ("PYHAMI_NO_SUCCESS_EVENTS (for --no-success-events): 'off' is not a switch value"
            in capsys.readouterr().err)
