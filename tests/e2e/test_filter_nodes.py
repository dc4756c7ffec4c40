"""``--filter-nodes all`` on the real control plane: kube-scheduler's own scoring counts
for a GPU pod (HAMi's issue #2264).

Two replicas (two pods of one app label, as a Deployment would create them; no
kube-controller-manager runs here) prefer to be on different nodes through a preferred pod
anti-affinity. With HAMi's answer, /filter names one node, the busiest that holds the pod
under binpack, and the preference never counts: both replicas land on one node. With
every fitting node answered, kube-scheduler's InterPodAffinity plugin sees both nodes and
puts the second replica beside no other.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harness.controlplane import create_ready_node, wait_for
from tests.e2e.controlplane import NODE, ControlPlane
from tests.e2e.pods import ClusterLab, lab_pod

SECOND_NODE = "gpu-node-3"
AGENT = f"agent-{SECOND_NODE}"
APP = "anti-affine"


@pytest.fixture(scope="module")
def two_nodes(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """A second GPU node with its own simulated agent (four T4s, as the first); gone
    after the module, the session's daemon and kube-scheduler as they were."""
    plane = control_plane
    create_ready_node(plane.api, SECOND_NODE, {"cpu": "16", "memory": "64Gi", "pods": "110",
                                               "nvidia.com/gpu": "40"}, labels={"gpu": "on"})
    agent = plane.run(AGENT, [*plane.pyhami_command(), "agent", "--node", SECOND_NODE,
                              "--nats", plane.nats_url, "--inventory", "sim:t4x4",
                              "--nats-token-file", str(plane.agent_token(SECOND_NODE))])
    wait_for(lambda: plane.statusz()["nodes"] == 2, f"the daemon to know {SECOND_NODE}",
             watch=[agent, *plane.all_processes()])
    yield plane
    agent.stop()
    plane.api.delete(f"/api/v1/nodes/{SECOND_NODE}")
    plane.restart_scheduler(nodes=1)


def replica(name: str) -> dict[str, Any]:
    pod = lab_pod(name)
    pod["metadata"]["labels"] = {"app": APP}
    pod["spec"]["affinity"] = {"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "podAffinityTerm": {
                "labelSelector": {"matchLabels": {"app": APP}},
                "topologyKey": "kubernetes.io/hostname"}}]}}
    return pod


def place_two_replicas(lab: ClusterLab) -> set[str]:
    nodes = set()
    for name in ("replica-0", "replica-1"):
        lab.create_manifest(replica(name))
        nodes.add(lab.wait_placed(name).node)
    for name in ("replica-0", "replica-1"):
        lab.delete(name)
    return nodes


def test_the_one_node_answer_ignores_a_preferred_anti_affinity(
        two_nodes: ControlPlane, clean_namespace: None) -> None:
    two_nodes.restart_scheduler(nodes=2)
    assert place_two_replicas(ClusterLab(two_nodes)) == {NODE}


def test_every_fitting_node_answered_lets_kube_scheduler_spread_the_replicas(
        two_nodes: ControlPlane, clean_namespace: None) -> None:
    two_nodes.restart_scheduler("--filter-nodes", "all", nodes=2)
    assert place_two_replicas(ClusterLab(two_nodes)) == {NODE, SECOND_NODE}
