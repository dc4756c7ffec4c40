"""The ResourceQuota gauges of /metrics against HAMi's definition (its
``collectQuotaMetrics``; hami-v2.10-reference.md 1.6) and pyhami's per-quota gauges.

The fleet is real: pods are placed by the decision core and booked as the daemon books
them, quotas read by ``parse_quota`` from ResourceQuota manifests; the text is the
registry's own exposition, read back with prometheus_client's parser.

HAMi's gauges are per namespace and resource: ``hami_resource_quota_used`` is what every
pod of the namespace holding cards is charged (MiB of ``nvidia.com/gpumem``, percent of a
card of ``nvidia.com/gpucores``; a namespace with use and no quota too, ``limit="0"``),
``hami_resource_quota_limit`` only where a limit is set. HAMi keeps one limit per
namespace; pyhami applies every quota, and its HAMi gauge shows the tightest.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.core import Fleet, PodManifest, decide, parse_pod
from common.core.deviceconfig import DeviceConfig
from common.core.pod import Defaults
from common.core.quota import ResourceQuotaManifest, parse_quota
from common.core.vendors import ResourceNames
from pyhami.sandbox import DEFAULTS
from scheduler.metrics import Metrics, Sources
from tests.builders import T4_MEMORY, fleet_of, node

MEMORY = "nvidia.com/gpumem"
CORES = "nvidia.com/gpucores"
HAMI_USED = "hami_resource_quota_used"
HAMI_LIMIT = "hami_resource_quota_limit"
OWN_USED = "pyhami_resource_quota_used"
OWN_LIMIT = "pyhami_resource_quota_limit"
HAMI_USED_LABELS = {"namespace", "quota_name", "limit", "zone"}
HAMI_LIMIT_LABELS = {"namespace", "quota_name", "zone"}
OWN_LABELS = {"namespace", "resource_quota", "resource"}

Series = dict[tuple[str, ...], float]


def quota_manifest(namespace: str, name: str, hard: dict[str, int | str],
                   priority_classes: list[str] | None = None) -> ResourceQuotaManifest:
    """A ResourceQuota as ``kubectl get resourcequota -o json`` prints it (the fields
    pyhami reads), scoped to the priority classes when given."""
    spec: dict[str, Any] = {"hard": hard}
    if priority_classes is not None:
        spec["scopeSelector"] = {"matchExpressions": [
            {"scopeName": "PriorityClass", "operator": "In", "values": priority_classes}]}
    return msgspec.convert({"metadata": {"namespace": namespace, "name": name}, "spec": spec},
                           ResourceQuotaManifest)


def gpu_pod(namespace: str, name: str, containers: list[dict[str, int]],
            priority_class: str | None = None, count: str = "nvidia.com/gpu") -> PodManifest:
    """A binpacking pod whose containers each take the limits given (one card each of the
    ``count`` resource)."""
    spec: dict[str, Any] = {"containers": [
        {"name": f"c{i}", "image": "busybox",
         "resources": {"limits": {count: 1, **limits}}}
        for i, limits in enumerate(containers)]}
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    return msgspec.convert({"metadata": {"namespace": namespace, "name": name, "annotations": {
        "hami.io/gpu-scheduler-policy": "binpack"}}, "spec": spec}, PodManifest)


class Scraped:
    """A fleet with quotas, its daemon's metrics, and what a scrape reads."""

    def __init__(self, nodes: int = 2, device: DeviceConfig | None = None) -> None:
        """``device``: the daemon's device configuration (HAMi's chart defaults when None),
        which the quotas and pods are read under and the metrics name."""
        self.device = device or DeviceConfig()
        self.fleet: Fleet = fleet_of(*(node(f"gpu-{i}", 4) for i in range(nodes)))
        self.metrics = Metrics(Sources(fleet=lambda: self.fleet, last_heard=dict,
                                       stale=frozenset, ready=lambda: True,
                                       leading=lambda: True, slices_enforced=dict),
                               self.device.resources)

    def quota(self, manifest: ResourceQuotaManifest) -> None:
        self.fleet.quotas.set_quota(parse_quota(manifest, self.device))

    def place(self, pod: PodManifest) -> None:
        """Decide and book the allocation, as the daemon does at /filter."""
        defaults = Defaults(DEFAULTS.gpu_policy, DEFAULTS.node_policy, self.device)
        decision = decide(self.fleet, parse_pod(pod, defaults))
        assert decision.allocation is not None, decision.failed_nodes
        self.fleet.allocate(decision.pod, decision.allocation)

    def end(self, namespace: str, name: str) -> None:
        """The pod ended (Succeeded, Failed or deleted): the daemon releases its cards."""
        assert self.fleet.release(f"{namespace}/{name}") is not None

    def families(self) -> dict[str, dict[tuple[str, ...], float]]:
        """Per quota family, its samples: label values in the family's label order."""
        order = {HAMI_USED: ("namespace", "quota_name", "limit", "zone"),
                 HAMI_LIMIT: ("namespace", "quota_name", "zone"),
                 OWN_USED: ("namespace", "resource_quota", "resource"),
                 OWN_LIMIT: ("namespace", "resource_quota", "resource")}
        expected = {HAMI_USED: HAMI_USED_LABELS, HAMI_LIMIT: HAMI_LIMIT_LABELS,
                    OWN_USED: OWN_LABELS, OWN_LIMIT: OWN_LABELS}
        found: dict[str, Series] = {}
        text = self.metrics.exposition().decode()
        for family in text_string_to_metric_families(text):
            if family.name not in order:
                continue
            assert family.type == "gauge", family.name
            samples: Series = {}
            for sample in family.samples:
                assert set(sample.labels) == expected[family.name], sample
                assert sample.name == family.name
                samples[tuple(sample.labels[label] for label in order[family.name])] = \
                    sample.value
            found[family.name] = samples
        assert set(found) == set(order), "every quota family is exposed, even empty"
        return found


def test_hamis_gauges_carry_hamis_names_labels_and_scales() -> None:
    scraped = Scraped()
    scraped.quota(quota_manifest("team-a", "gpu-quota",
                                 {f"limits.{MEMORY}": 16384, f"limits.{CORES}": 200}))
    scraped.place(gpu_pod("team-a", "two", [{MEMORY: 1000, CORES: 30},
                                            {MEMORY: 2000, CORES: 20}]))
    # A percentage is charged its MiB on the card it got: 10 % of a T4.
    scraped.place(gpu_pod("team-a", "share", [{"nvidia.com/gpumem-percentage": 10}]))
    # A namespace with use and no quota: HAMi still shows its use, under limit "0".
    scraped.place(gpu_pod("free", "one", [{MEMORY: 4000, CORES: 25}]))
    families = scraped.families()
    share = T4_MEMORY * 10 // 100
    assert families[HAMI_USED] == {
        ("team-a", MEMORY, "16384", "vGPU"): 3000 + share,
        ("team-a", CORES, "200", "vGPU"): 50,
        ("free", MEMORY, "0", "vGPU"): 4000,
        ("free", CORES, "0", "vGPU"): 25,
    }
    # Only where a quota sets the limit.
    assert families[HAMI_LIMIT] == {("team-a", MEMORY, "vGPU"): 16384,
                                    ("team-a", CORES, "vGPU"): 200}
    assert families[OWN_USED] == {("team-a", "gpu-quota", MEMORY): 3000 + share,
                                  ("team-a", "gpu-quota", CORES): 50}
    assert families[OWN_LIMIT] == {("team-a", "gpu-quota", MEMORY): 16384,
                                   ("team-a", "gpu-quota", CORES): 200}


def test_a_quota_without_use_shows_its_limit_and_zero_used() -> None:
    scraped = Scraped()
    scraped.quota(quota_manifest("idle", "gpu-quota", {f"limits.{MEMORY}": "0"}))
    families = scraped.families()
    # An explicit 0 is a limit (it refuses every card), unlike no quota.
    assert families[HAMI_USED] == {("idle", MEMORY, "0", "vGPU"): 0}
    assert families[HAMI_LIMIT] == {("idle", MEMORY, "vGPU"): 0}
    assert families[OWN_USED] == {("idle", "gpu-quota", MEMORY): 0}
    assert families[OWN_LIMIT] == {("idle", "gpu-quota", MEMORY): 0}


def test_two_quotas_in_a_namespace_each_shown_and_hamis_gauge_the_tighter() -> None:
    scraped = Scraped()
    scraped.quota(quota_manifest("team-a", "wide", {f"limits.{MEMORY}": 20000,
                                                    f"limits.{CORES}": 100}))
    scraped.quota(quota_manifest("team-a", "narrow", {f"limits.{MEMORY}": 6000}))
    scraped.place(gpu_pod("team-a", "p", [{MEMORY: 2500, CORES: 40}]))
    families = scraped.families()
    assert families[HAMI_USED] == {("team-a", MEMORY, "6000", "vGPU"): 2500,
                                   ("team-a", CORES, "100", "vGPU"): 40}
    assert families[HAMI_LIMIT] == {("team-a", MEMORY, "vGPU"): 6000,
                                    ("team-a", CORES, "vGPU"): 100}
    assert families[OWN_USED] == {("team-a", "wide", MEMORY): 2500,
                                  ("team-a", "wide", CORES): 40,
                                  ("team-a", "narrow", MEMORY): 2500}
    assert families[OWN_LIMIT] == {("team-a", "wide", MEMORY): 20000,
                                   ("team-a", "wide", CORES): 100,
                                   ("team-a", "narrow", MEMORY): 6000}


def test_a_scoped_quota_counts_only_the_pods_it_selects() -> None:
    scraped = Scraped()
    scraped.quota(quota_manifest("team-a", "high-only", {f"limits.{MEMORY}": 8000},
                                 priority_classes=["high"]))
    scraped.place(gpu_pod("team-a", "urgent", [{MEMORY: 3000}], priority_class="high"))
    scraped.place(gpu_pod("team-a", "batch", [{MEMORY: 1000}], priority_class="low"))
    scraped.place(gpu_pod("team-a", "plain", [{MEMORY: 500}]))
    families = scraped.families()
    # The quota's own gauge counts the pod its scope selects.
    assert families[OWN_USED] == {("team-a", "high-only", MEMORY): 3000}
    assert families[OWN_LIMIT] == {("team-a", "high-only", MEMORY): 8000}
    # HAMi's gauge, per namespace as HAMi's is, counts every pod of the namespace.
    assert families[HAMI_USED] == {("team-a", MEMORY, "8000", "vGPU"): 4500}
    assert families[HAMI_LIMIT] == {("team-a", MEMORY, "vGPU"): 8000}


@pytest.mark.parametrize(("quota", "after"), [
    pytest.param(True, {("team-a", MEMORY, "5000", "vGPU"): 1000}, id="under-a-quota"),
    pytest.param(False, {("team-a", MEMORY, "0", "vGPU"): 1000}, id="without-a-quota"),
])
def test_use_is_released_when_a_pod_ends(quota: bool, after: Series) -> None:
    scraped = Scraped()
    if quota:
        scraped.quota(quota_manifest("team-a", "gpu-quota", {f"limits.{MEMORY}": 5000}))
    scraped.place(gpu_pod("team-a", "first", [{MEMORY: 3000}]))
    scraped.place(gpu_pod("team-a", "second", [{MEMORY: 1000}]))
    used = scraped.families()[HAMI_USED]
    assert used == {key: 4000 for key in after}
    scraped.end("team-a", "first")
    assert scraped.families()[HAMI_USED] == after
    scraped.end("team-a", "second")
    families = scraped.families()
    if quota:
        # The quota stays, with nothing used under it.
        assert families[HAMI_USED] == {("team-a", MEMORY, "5000", "vGPU"): 0}
        assert families[OWN_USED] == {("team-a", "gpu-quota", MEMORY): 0}
    else:
        # No use and no quota: pyhami writes no series for the namespace (HAMi, which
        # keeps a namespace's entry once it has seen use, may go on showing a 0).
        assert families[HAMI_USED] == {}
        assert families[OWN_USED] == {}


CUSTOM = ResourceNames(count="example.com/vgpu", memory="example.com/vmem",
                       memory_percentage="example.com/vmem-share", cores="example.com/vcores",
                       priority="example.com/vprio")


@pytest.mark.parametrize("names", [
    pytest.param(ResourceNames(), id="hamis-default-names"),
    pytest.param(CUSTOM, id="configured-names"),
])
def test_the_gauges_name_the_configured_resources(names: ResourceNames) -> None:
    """A daemon configured with other resource names reads quotas under them and names
    them in every quota gauge and its help; HAMi's default names appear nowhere then."""
    scraped = Scraped(device=DeviceConfig(resources=names))
    scraped.quota(quota_manifest("team-a", "gpu-quota", {f"limits.{names.memory}": 8000,
                                                         f"limits.{names.cores}": 100}))
    scraped.place(gpu_pod("team-a", "p", [{names.memory: 3000, names.cores: 30}],
                          count=names.count))
    scraped.place(gpu_pod("free", "q", [{names.memory: 1000, names.cores: 10}],
                          count=names.count))
    families = scraped.families()
    assert families[HAMI_USED] == {("team-a", names.memory, "8000", "vGPU"): 3000,
                                   ("team-a", names.cores, "100", "vGPU"): 30,
                                   ("free", names.memory, "0", "vGPU"): 1000,
                                   ("free", names.cores, "0", "vGPU"): 10}
    assert families[HAMI_LIMIT] == {("team-a", names.memory, "vGPU"): 8000,
                                    ("team-a", names.cores, "vGPU"): 100}
    assert families[OWN_USED] == {("team-a", "gpu-quota", names.memory): 3000,
                                  ("team-a", "gpu-quota", names.cores): 30}
    text = scraped.metrics.exposition().decode()
    assert f"in its units (MiB of {names.memory}, percent of a card of {names.cores})" in text
    if names == CUSTOM:
        assert "nvidia.com" not in text
