"""Only a node's own agent speaks for its node, on the real control plane.

The suite's agent runs with a ServiceAccount token the real kube-apiserver issued, bound
to a pod on gpu-node-1; the daemon checks it with a TokenReview and admits the agent as
gpu-node-1's, which every other end-to-end test relies on. Here: the same token cannot
publish another node's inventory, and a token for another audience admits nobody.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from harness.controlplane import SCHEDULER_SERVICE_ACCOUNT, Process, wait_for
from pyhami.bench.loopback import http_get
from tests.e2e.controlplane import NODE, ControlPlane
from tests.harness import metric_sample

OTHER_NODE = "gpu-node-2"


def metric(plane: ControlPlane, name: str) -> float:
    status, body = http_get(f"http://127.0.0.1:{plane.metrics_port}/metrics")
    assert status == 200
    return metric_sample(body.decode(), name) or 0.0


def agent(plane: ControlPlane, name: str, node: str, token: str) -> Process:
    return Process(name, [
        *plane.pyhami_command(), "agent", "--node", node, "--nats", plane.nats_url,
        "--inventory", "sim:t4x4", "--nats-token-file", token, "--poll-interval", "0.2",
        "--heartbeat-interval", "0.5",
    ], plane.logs / f"{name}.log").start()


def test_the_agent_of_one_node_is_refused_for_another(control_plane: ControlPlane) -> None:
    plane = control_plane
    assert plane.statusz()["nodes"] == 1  # the suite's agent, admitted as gpu-node-1's
    token = plane.agent_token(NODE, pod="pyhami-agent-impostor")
    accepted = metric(plane, 'pyhami_nats_auth_total{result="accepted"}')
    impostor = agent(plane, "agent-impostor", OTHER_NODE, str(token))
    try:
        wait_for(lambda: metric(plane, 'pyhami_nats_auth_total{result="accepted"}') > accepted,
                 "the impostor admitted as gpu-node-1's agent", watch=[impostor])
        wait_for(lambda: "permissions violation" in impostor.log.read_text().lower(),
                 "the server refusing its publish for gpu-node-2", watch=[impostor])
        time.sleep(2.0)  # four heartbeats' worth of refused publishes
        assert plane.statusz()["nodes"] == 1
    finally:
        impostor.stop()


@pytest.mark.parametrize(("case", "options", "why"), [
    ("audience", {"audience": "someone-else"}, "token not authenticated for audience"),
    ("account", {"service_account": SCHEDULER_SERVICE_ACCOUNT}, "not of the agent's"),
    ("unbound", {"bound": False}, "not bound to a pod on a node"),
])
def test_a_token_that_is_not_an_agents_pod_token_admits_nobody(
        control_plane: ControlPlane, case: str, options: dict[str, Any], why: str) -> None:
    plane = control_plane
    token = plane.agent_token(NODE, pod=f"pyhami-agent-{case}", **options)
    refused = metric(plane, 'pyhami_nats_auth_total{result="refused"}')
    stranger = agent(plane, f"agent-{case}", NODE, str(token))
    try:
        wait_for(lambda: metric(plane, 'pyhami_nats_auth_total{result="refused"}') > refused,
                 "the daemon refusing the token", watch=[stranger])
        wait_for(lambda: "authorization violation" in stranger.log.read_text().lower(),
                 "the agent told it is not authorized", watch=[stranger])
        # The daemon's answer carries the reason; nats-server logs it (the client is told
        # only that it is not authorized).
        wait_for(lambda: why in plane.nats_logs(),
                 f"a nats-server logging the daemon's reason {why!r}", watch=[stranger])
    finally:
        stranger.stop()
