"""A node whose agent falls silent takes no new pods until it reports again."""

from __future__ import annotations

import time

import aiohttp

from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsServer
from pyhami.sandbox import DEFAULTS, RunningDaemon, SimulatedAgent, standalone_config
from scheduler.service import ServiceSettings
from tests.harness import PodClient, eventually, filtering_failed, refusal_sentence


async def test_a_silent_node_gets_no_pods_until_it_reports_again(
    jetstream_server: LocalNatsServer, http: aiohttp.ClientSession,
) -> None:
    settings = ServiceSettings(DEFAULTS, node_timeout=1.0)
    node = SimulatedAgent.start("gpu-node-1", jetstream_server.url)
    daemon = await RunningDaemon(standalone_config(jetstream_server.url, service=settings,
                                        retry_period=0.2)).start()
    pods = PodClient(http, daemon.url)
    try:
        await pods.submit_and_place(lab_pod("before"))
        await node.halt()
        service = daemon.service
        assert service is not None

        async def stale() -> bool:
            return "gpu-node-1" in service.state.nodes.stale_nodes(time.monotonic())

        await eventually(stale, "the node to go stale", timeout=5)
        await pods.submit(lab_pod("during"))
        pending = await pods.pending_with("during", "FilteringFailed")
        # A stale node has HAMi's per-reason Event, as the core's reasons have.
        assert filtering_failed(pending)[0] == "1 nodes NodeInventoryStale(gpu-node-1)"
        message = refusal_sentence(pending)
        assert message.startswith("asked for 1 card with 1000 MiB; gpu-node-1: "
                                  "NodeInventoryStale: no inventory from the node's agent for ")
        assert message.endswith("(limit 1s)")
        assert pending["node"] is None

        node = SimulatedAgent.start("gpu-node-1", jetstream_server.url)
        placed = await pods.placed("during")
        assert placed["node"] == "gpu-node-1"
    finally:
        await daemon.stop()
        await node.halt()
