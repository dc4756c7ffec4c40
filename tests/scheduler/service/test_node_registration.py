"""The leader writes each Node's ``hami.io/node-nvidia-register`` from its agent's inventory,
against the stub API server: on the first inventory, again only when it changes, never
from a standby, removed once the agent is gone for good; a failed write is counted and
tried again. A GPU pod it binds carries HAMi's ``hami.io/vgpu-node`` label."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from common.core.registration import decode_register, registered_card
from common.core.vendors import NVIDIA
from common.wire import inventory_subject
from pyhami.sandbox import DEFAULTS
from scheduler.cluster import SCHEDULER_NAME
from scheduler.cluster.kube import Kubernetes, KubernetesCluster
from scheduler.leadership import FollowedLease, Leadership
from scheduler.service import SchedulerService, ServiceSettings
from tests.builders import manifest
from tests.fakes.apiserver import StubApiServer, pod_json, serve, write_kubeconfig
from tests.fakes.clock import Clock
from tests.fakes.node_list import inventory, silent

REGISTER_ANNOTATION = NVIDIA.register_annotation

RETENTION = 600.0
SETTINGS = ServiceSettings(defaults=DEFAULTS, node_retention=None, nodes_listed=True,
                           node_registration=True, registration_retention=RETENTION)
LEASE = "kube-system/kube-scheduler"


@dataclass
class StubCluster:
    """The stub API server, the Kubernetes cluster client pointed at it, and the clock the
    services made here run on (not the standalone lab of tests/harness.py)."""

    api: StubApiServer
    cluster: KubernetesCluster
    clock: Clock

    def service(self, leadership: Leadership | None = None) -> SchedulerService:
        service = SchedulerService(SETTINGS, self.cluster, silent, clock=self.clock,
                                   wall_clock=self.clock, leadership=leadership)
        service.shared.ready = True  # the ledger is empty: nothing to rebuild
        return service

    def node_patches(self) -> list[Any]:
        return [r.body for r in self.api.requests
                if r.method == "PATCH" and r.path.startswith("/api/v1/nodes/")]

    def annotation(self, node: str) -> str | None:
        [entry] = [n for n in self.api.nodes if n["metadata"]["name"] == node]
        value: str | None = entry["metadata"].get("annotations", {}).get(REGISTER_ANNOTATION)
        return value


@pytest.fixture
async def stub(tmp_path: Path) -> AsyncIterator[StubCluster]:
    api = StubApiServer(nodes=[{"metadata": {"name": "n1", "annotations": {"kept": "x"}}},
                               {"metadata": {"name": "n2"}}])
    async with serve(api) as port:
        kubernetes = Kubernetes.from_kubeconfig(str(write_kubeconfig(tmp_path / "kc", port)))
        yield StubCluster(api, kubernetes.cluster, Clock(100.0))
        await kubernetes.close()


def report(service: SchedulerService, node: str, sequence: int, *,
           unhealthy: int | None = None) -> None:
    sent = inventory(node, sequence)
    if unhealthy is not None:
        cards = [msgspec.structs.replace(card, health=card.index != unhealthy)
                 for card in sent.cards]
        sent = msgspec.structs.replace(sent, cards=cards)
    assert service.handlers.inventories.ingest(inventory_subject(node),
                                    msgspec.msgpack.encode(sent)) is not None


def counted(service: SchedulerService, result: str) -> float:
    return service.metrics.registrations.labels(result)._value.get()


async def test_the_first_inventory_is_written_as_hamis_device_plugin_writes_it(
        stub: StubCluster) -> None:
    service = stub.service()
    report(service, "n1", 1)
    await service.registration.refresh()
    written = stub.annotation("n1")
    assert written is not None
    node = service.state.fleet.node("n1")
    assert node is not None
    # Read back by HAMi-WebUI's rules (and HAMi's), the same cards the agent reported.
    assert decode_register(written) == [registered_card(card) for card in node.cards]
    assert written.startswith('[{"id":"') and '"mode":"hami-core"' in written
    assert stub.api.nodes[0]["metadata"]["annotations"]["kept"] == "x"  # a merge patch
    assert stub.annotation("n2") is None  # no agent there: not written
    assert counted(service, "written") == 1


async def test_it_is_written_again_only_when_it_changes(stub: StubCluster) -> None:
    service = stub.service()
    report(service, "n1", 1)
    await service.registration.refresh()
    report(service, "n1", 2)  # a heartbeat: the same cards
    await service.registration.refresh()
    assert len(stub.node_patches()) == 1
    report(service, "n1", 3, unhealthy=2)
    await service.registration.refresh()
    assert len(stub.node_patches()) == 2
    after = decode_register(stub.annotation("n1") or "")
    assert [card.health for card in after] == [True, True, False, True]


async def test_a_restarted_daemon_does_not_write_what_the_node_already_holds(
        stub: StubCluster) -> None:
    first = stub.service()
    report(first, "n1", 1)
    await first.registration.refresh()
    again = stub.service()  # a new process: nothing remembered but the Node's annotation
    report(again, "n1", 1)
    await again.registration.refresh()
    assert len(stub.node_patches()) == 1
    assert counted(again, "written") == 0


async def test_it_is_removed_once_the_agent_is_silent_beyond_the_retention(
        stub: StubCluster, caplog: pytest.LogCaptureFixture) -> None:
    service = stub.service()
    report(service, "n1", 1)
    report(service, "n2", 1)
    await service.registration.refresh()
    stub.clock.now += RETENTION / 2
    report(service, "n2", 2)
    stub.clock.now += RETENTION / 2 + 1  # n1 silent beyond the retention, n2 not
    with caplog.at_level(logging.INFO):
        await service.registration.refresh()
    assert stub.node_patches()[-1] == {"metadata": {"annotations": {REGISTER_ANNOTATION: None}}}
    assert stub.annotation("n1") is None and stub.annotation("n2") is not None
    assert f"node n1: {REGISTER_ANNOTATION} removed" in caplog.text
    await service.registration.refresh()
    assert len(stub.node_patches()) == 3  # removed once
    report(service, "n1", 2)  # the agent is back
    await service.registration.refresh()
    assert stub.annotation("n1") is not None


async def test_a_node_deleted_from_the_cluster_is_forgotten_without_error(
        stub: StubCluster) -> None:
    service = stub.service()
    report(service, "n1", 1)
    await service.registration.refresh()
    stub.api.nodes = [node for node in stub.api.nodes if node["metadata"]["name"] != "n1"]
    stub.clock.now += 1
    await service.handlers.cordons.refresh_cordons()  # the Node list no longer names n1
    await service.registration.refresh()
    assert stub.node_patches()[-1] == {"metadata": {"annotations": {REGISTER_ANNOTATION: None}}}
    assert (counted(service, "removed"), counted(service, "failed")) == (1, 0)
    await service.registration.refresh()
    assert len(stub.node_patches()) == 2


async def test_a_standby_writes_nothing(stub: StubCluster) -> None:
    stub.api.leases[LEASE] = {"spec": {"holderIdentity": "other-pod_1234"}}
    namespace, name = LEASE.split("/")
    leadership = FollowedLease(stub.cluster, namespace, name, "this-pod")
    await leadership.start()
    assert not leadership.leading()
    service = stub.service(leadership)
    report(service, "n1", 1)
    await service.registration.refresh()
    assert stub.node_patches() == []
    assert stub.api.sent("GET", "/api/v1/nodes") == []
    stub.api.leases[LEASE] = {"spec": {"holderIdentity": "this-pod_5678"}}
    await leadership.refresh()  # elected: the Nodes read, then written
    await service.registration.refresh()
    assert stub.annotation("n1") is not None


async def test_a_failed_write_is_counted_logged_and_tried_again(
        stub: StubCluster, caplog: pytest.LogCaptureFixture) -> None:
    service = stub.service()
    report(service, "n1", 1)
    stub.api.node_patch_statuses = [500]
    await service.registration.refresh()
    assert stub.annotation("n1") is None
    assert counted(service, "failed") == 1
    assert f"writing {REGISTER_ANNOTATION} on node n1 failed: HTTP 500" in caplog.text
    await service.registration.refresh()  # the next refresh tries again
    assert stub.annotation("n1") is not None
    assert counted(service, "written") == 1


async def test_a_bound_gpu_pod_carries_hamis_node_label(stub: StubCluster) -> None:
    service = stub.service()
    report(service, "n1", 1)
    pod = manifest("p")
    stub.api.pods[pod.key] = pod_json("p", namespace=pod.namespace, uid="u-p",
                                     scheduler=SCHEDULER_NAME)
    filtered = await service.verbs.filter(pod, ("n1",))
    assert filtered.passing == ["n1"]
    refused = await service.verbs.bind(namespace=pod.namespace, name="p", uid="u-p",
                                       node="n1")
    assert refused is None
    assert stub.api.pods[pod.key]["metadata"]["labels"]["hami.io/vgpu-node"] == "n1"
