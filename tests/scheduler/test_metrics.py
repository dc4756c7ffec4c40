"""/metrics of a running daemon: HAMi's scheduler metrics under HAMi's names, labels and
scales (HAMi's cmd/scheduler/metrics.go), pyhami's own, OpenMetrics, and the dashboard."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import platform
import re
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.parser import text_string_to_metric_families

from agent.vendors.nvidia.simulated import profile_cards
from common.core.annotations import ALLOCATED_ANNOTATION, decode_devices
from common.core.fleet import Fleet
from pyhami.natsserver import LocalNatsServer, free_port
from pyhami.sandbox import DEFAULTS, RunningDaemon, SimulatedAgent, standalone_config
from scheduler.metrics import Metrics, Sources
from scheduler.service import SchedulerService, ServiceSettings
from tests.harness import PodClient, eventually
from tests.paths import REPO

NODE = "gpu-node-1"
PROFILE = "t4x4"
MIB = 1024 * 1024
# Short, so the stale test is quick; the agent's heartbeat (0.5 s) keeps it well inside.
NODE_TIMEOUT_S = 3.0
DASHBOARD = REPO / "charts/pyhami/dashboards/pyhami.json"

# The label names HAMi's scheduler gives each metric (cmd/scheduler/metrics.go), plus the
# ``zone`` its registry wraps around them all.
HAMI_CARD = {"node", "device_uuid", "device_index", "device_type", "zone"}
HAMI_CONTAINER = {"namespace", "node", "pod", "container_index", "device_uuid", "zone"}
HAMI_LABELS = {
    "hami_gpu_memory_limit_bytes": HAMI_CARD,
    "hami_gpu_core_limit_ratio": HAMI_CARD,
    "hami_gpu_memory_allocated_bytes": HAMI_CARD | {"device_cores"},
    "hami_gpu_shared_count": HAMI_CARD,
    "hami_gpu_core_allocated_ratio": HAMI_CARD,
    "hami_node_gpu_overview": HAMI_CARD | {"device_cores", "device_memory_limit"},
    "hami_node_gpu_memory_allocated_ratio": HAMI_CARD,
    "hami_vgpu_memory_allocated_bytes": HAMI_CONTAINER,
    "hami_vgpu_core_allocated_ratio": HAMI_CONTAINER,
}


@dataclass
class Metered:
    nats: LocalNatsServer
    node: SimulatedAgent
    daemon: RunningDaemon
    pods: PodClient
    metrics_url: str

    @property
    def service(self) -> SchedulerService:
        assert self.daemon.service is not None
        return self.daemon.service


@pytest.fixture
async def metered(jetstream_server: LocalNatsServer,
                  http: aiohttp.ClientSession) -> AsyncIterator[Metered]:
    metrics_port = free_port()
    node = SimulatedAgent.start(NODE, jetstream_server.url, PROFILE)
    daemon = await RunningDaemon(standalone_config(
        jetstream_server.url, metrics=("127.0.0.1", metrics_port),
        service=ServiceSettings(DEFAULTS, node_timeout=NODE_TIMEOUT_S))).start()
    metered = Metered(jetstream_server, node, daemon, PodClient(http, daemon.url),
                      f"http://127.0.0.1:{metrics_port}/metrics")
    yield metered
    await daemon.stop()
    await metered.node.halt()


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[str, Metric]:
    async with http.get(url) as response:
        assert response.status == 200
        return {family.name: family
                for family in text_string_to_metric_families(await response.text())}


def series(family: Metric) -> dict[frozenset[tuple[str, str]], float]:
    return {frozenset(sample.labels.items()): sample.value for sample in family.samples}


def value(families: dict[str, Metric], name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    found = [sample.value for sample in families[name].samples
             if labels.items() <= sample.labels.items()]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def pod(namespace: str, name: str, containers: list[tuple[int, int]]) -> dict[str, Any]:
    """A binpacking pod whose containers each ask one card with (MiB, cores %)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "annotations": {"hami.io/gpu-scheduler-policy": "binpack"}},
            "spec": {"containers": [
                {"name": f"c{index}", "image": "ubuntu:22.04", "resources": {"limits": {
                    "nvidia.com/gpu": 1, "nvidia.com/gpumem": memory,
                    "nvidia.com/gpucores": cores}}}
                for index, (memory, cores) in enumerate(containers)]}}


async def placed_cards(pods: PodClient, namespace: str, name: str) -> list[str]:
    """The card each container of the placed pod was given."""
    placed: dict[str, Any] = {}

    async def bound() -> bool:
        nonlocal placed
        placed = await pods.get(name, namespace)
        return placed["node"] is not None

    await eventually(bound, f"pod {namespace}/{name} to be placed")
    assert placed["node"] == NODE
    containers = decode_devices(placed["annotations"][ALLOCATED_ANNOTATION])
    assert all(len(grants) == 1 for grants in containers)
    return [grants[0].uuid for grants in containers]


async def test_hami_metrics_carry_hamis_names_labels_and_scales(
        metered: Metered, http: aiohttp.ClientSession) -> None:
    requests = {("team-a", "two"): [(1000, 30), (2000, 20)], ("default", "one"): [(4000, 25)]}
    given: dict[tuple[str, str, int], str] = {}
    for (namespace, name), containers in requests.items():
        await metered.pods.submit(pod(namespace, name, containers))
        for index, uuid in enumerate(await placed_cards(metered.pods, namespace, name)):
            given[namespace, name, index] = uuid
    booked: dict[str, tuple[int, int, int]] = {}  # uuid -> containers, MiB, cores
    for (namespace, name, index), uuid in given.items():
        memory, cores = requests[namespace, name][index]
        tenants, mib, share = booked.get(uuid, (0, 0, 0))
        booked[uuid] = (tenants + 1, mib + memory, share + cores)
    assert max(tenants for tenants, _, _ in booked.values()) >= 2  # binpack shares a card

    families = await scrape(http, metered.metrics_url)
    for name, labels in HAMI_LABELS.items():
        assert families[name].type == "gauge"
        assert families[name].samples, name
        assert {frozenset(s.labels) for s in families[name].samples} == {frozenset(labels)}, name
        assert {s.labels["zone"] for s in families[name].samples} == {"vGPU"}

    cards = profile_cards(PROFILE, NODE)
    assert len(series(families["hami_gpu_memory_limit_bytes"])) == len(cards)
    for card in cards:
        at = {"node": NODE, "device_uuid": card.uuid, "device_index": str(card.index),
              "device_type": card.type}
        tenants, mib, cores = booked.get(card.uuid, (0, 0, 0))
        assert value(families, "hami_gpu_memory_limit_bytes", **at) == card.memory * MIB
        assert value(families, "hami_gpu_core_limit_ratio", **at) == card.cores == 100
        assert value(families, "hami_gpu_memory_allocated_bytes", **at,
                     device_cores=str(card.cores)) == mib * MIB
        assert value(families, "hami_gpu_core_allocated_ratio", **at) == cores
        assert value(families, "hami_gpu_shared_count", **at) == tenants
        assert value(families, "hami_node_gpu_memory_allocated_ratio", **at) == (
            mib / card.memory)
        assert value(families, "hami_node_gpu_overview", **at, device_cores=str(card.cores),
                     device_memory_limit=str(card.memory)) == mib * MIB

    expected_vgpu = {(namespace, name, str(index), uuid): requests[namespace, name][index]
                     for (namespace, name, index), uuid in given.items()}
    for family, scale in (("hami_vgpu_memory_allocated_bytes", 0),
                          ("hami_vgpu_core_allocated_ratio", 1)):
        found = {(s.labels["namespace"], s.labels["pod"], s.labels["container_index"],
                  s.labels["device_uuid"]): s.value for s in families[family].samples}
        assert found == {key: (memory * MIB, cores)[scale]
                         for key, (memory, cores) in expected_vgpu.items()}
        assert {s.labels["node"] for s in families[family].samples} == {NODE}


async def test_pyhami_metrics_follow_prometheus_conventions(
        metered: Metered, http: aiohttp.ClientSession) -> None:
    await metered.pods.submit(pod("default", "p", [(1000, 10)]))
    await placed_cards(metered.pods, "default", "p")
    families = await scrape(http, metered.metrics_url)
    build = families["pyhami_build_info"]
    assert [(s.labels, s.value) for s in build.samples] == [
        ({"version": importlib.metadata.version("pyhami"),
          "python_version": platform.python_version()}, 1.0)]
    assert value(families, "pyhami_ready") == 1.0
    assert value(families, "pyhami_node_stale", node=NODE) == 0.0
    assert value(families, "pyhami_nats_connected") == 1.0
    for verb in ("filter", "bind"):
        histogram = families[f"pyhami_{verb}_duration_seconds"]
        assert histogram.type == "histogram"
        assert value(families, f"pyhami_{verb}_duration_seconds", le="+Inf") == 1.0
    decisions = families["pyhami_decisions"]
    assert decisions.type == "counter"
    assert {s.name for s in decisions.samples} >= {"pyhami_decisions_total"}
    assert value(families, "pyhami_decisions", verb="filter", outcome="scheduled") == 1.0
    # Counters end in _total; no gauge ends in _count except HAMi's own name.
    for family in families.values():
        if not family.name.startswith("pyhami_"):
            continue
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
        if family.type == "gauge":
            assert not family.name.endswith(("_count", "_total")), family.name
    for result in ("accepted", "rejected", "wrong_subject", "card_conflict", "out_of_order",
                   "sequence_jump"):
        assert any(s.labels == {"result": result}
                   for s in families["pyhami_inventory_messages"].samples)


async def test_a_stale_node_shows_in_metrics_and_is_logged_once_each_way(
        metered: Metered, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="scheduler.service")

    async def stale() -> float:
        return value(await scrape(http, metered.metrics_url), "pyhami_node_stale", node=NODE)

    def logged(start: str) -> int:
        return sum(r.getMessage().startswith(f"node {NODE} {start}") for r in caplog.records)

    assert await stale() == 0.0
    await metered.node.halt()

    async def went_stale() -> bool:
        return await stale() == 1.0 and logged("is stale") > 0

    await eventually(went_stale, "the node to be stale in metrics and in the log")
    heard = value(await scrape(http, metered.metrics_url),
                  "pyhami_node_last_heard_timestamp_seconds", node=NODE)
    # More checks and scrapes while it stays stale log nothing more.
    for _ in range(3):
        metered.service.handlers.inventories.check_nodes()
        assert await stale() == 1.0
    assert logged("is stale") == 1

    metered.node = SimulatedAgent.start(NODE, metered.nats.url, PROFILE)

    async def heard_again() -> bool:
        return await stale() == 0.0 and logged("is heard from again") > 0

    await eventually(heard_again, "the node to be fresh again in metrics and in the log")
    accepted = metered.service.inventory_accepted

    async def heartbeats() -> bool:
        metered.service.handlers.inventories.check_nodes()
        return metered.service.inventory_accepted >= accepted + 2

    await eventually(heartbeats, "two more heartbeats from the node")
    assert logged("is heard from again") == 1
    assert logged("is stale") == 1
    assert value(await scrape(http, metered.metrics_url),
                 "pyhami_node_last_heard_timestamp_seconds", node=NODE) > heard


async def test_the_endpoint_negotiates_openmetrics(
        metered: Metered, http: aiohttp.ClientSession) -> None:
    accept = "application/openmetrics-text; version=1.0.0; charset=utf-8"
    async with http.get(metered.metrics_url, headers={"Accept": accept}) as response:
        assert response.status == 200
        assert response.content_type == "application/openmetrics-text"
        text = await response.text()
    assert text.endswith("# EOF\n")
    parsed = openmetrics_parser.text_string_to_metric_families(text)  # type: ignore[no-untyped-call]
    names = {family.name for family in parsed}
    assert {"hami_gpu_memory_limit_bytes", "pyhami_decisions", "pyhami_build_info"} <= names
    async with http.get(metered.metrics_url) as response:
        assert response.content_type == "text/plain"
        assert "# EOF" not in await response.text()


def queried_names(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, metric name) for every pyhami or HAMi metric the dashboard's queries name."""
    panels = list(dashboard["panels"])
    for panel in panels:
        panels.extend(panel.get("panels", []))
    texts = [(f"panel {p['title']!r}", t["expr"]) for p in panels for t in p.get("targets", [])]
    texts += [(f"variable {v['name']!r}", v["query"]["query"])
              for v in dashboard["templating"]["list"] if v["type"] == "query"]
    for where, text in texts:
        for name in re.findall(r"\b(?:py)?hami_[a-z0-9_]+", text):
            yield where, name


def exposed_names(families: dict[str, Metric]) -> set[str]:
    """Every series name the families can carry, sampled yet or not."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    names = {sample.name for family in families.values() for sample in family.samples}
    for family in families.values():
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return names


async def test_the_dashboard_queries_only_what_the_daemon_exposes(
        metered: Metered, http: aiohttp.ClientSession) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queried = list(queried_names(dashboard))
    exposed = exposed_names(await scrape(http, metered.metrics_url))
    assert [(where, name) for where, name in queried if name not in exposed] == []
    names = Counter(name for _, name in queried)
    for needed in ("pyhami_filter_duration_seconds_bucket", "pyhami_bind_duration_seconds_bucket",
                   "pyhami_decisions_total", "hami_gpu_memory_allocated_bytes",
                   "hami_gpu_memory_limit_bytes", "hami_gpu_core_allocated_ratio",
                   "pyhami_node_stale", "pyhami_nats_connected", "pyhami_build_info",
                   "hami_resource_quota_used", "hami_resource_quota_limit",
                   "pyhami_resource_quota_used", "pyhami_resource_quota_limit"):
        assert names[needed], f"no panel queries {needed}"
    # One data source variable, which every panel and query uses: it imports anywhere.
    sources = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert [(v["name"], v["query"]) for v in sources] == [("DS_PROMETHEUS", "prometheus")]
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    for panel in panels:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" for t in panel["targets"])


def test_the_latency_histograms_reach_a_minute() -> None:
    """A bind that waits 20 s on a busy API server lands below the top bucket, so its
    quantiles can tell 3 s from 20 s."""
    metrics = Metrics(Sources(fleet=Fleet, last_heard=dict, stale=frozenset,
                              ready=lambda: True, leading=lambda: True,
                              slices_enforced=dict))
    metrics.bind_duration.observe(20.0)
    text = metrics.exposition().decode()
    assert 'pyhami_bind_duration_seconds_bucket{le="10.0"} 0.0' in text
    assert 'pyhami_bind_duration_seconds_bucket{le="30.0"} 1.0' in text
    assert 'pyhami_bind_duration_seconds_bucket{le="60.0"} 1.0' in text
