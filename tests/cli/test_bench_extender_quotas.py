"""``pyhami bench extender --quota-namespaces N``: the namespaces its pods are spread over,
the ResourceQuotas it posts for them, and how it reads their standing from /metrics."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from common.core import Fleet
from common.core.quota import ResourceQuotaManifest, parse_quota
from pyhami.bench.extender import (
    CORES_LIMIT,
    POD_MEMORY_MIB,
    by_quota,
    namespaces_of,
    quota_manifests,
    quota_standing,
)
from scheduler.metrics import Metrics, Sources
from tests.builders import hold, lab_fleet

NAMES = [f"p-{i}" for i in range(4000)]


@pytest.mark.parametrize(("count", "half_without", "expected"), [
    pytest.param(None, False, {"bench": 4000}, id="no-quotas-one-namespace"),
    pytest.param(100, False, {f"bench-{i:02d}": 40 for i in range(100)}, id="100-namespaces"),
    pytest.param(3, False, {"bench-0": 1334, "bench-1": 1333, "bench-2": 1333}, id="uneven"),
    pytest.param(100, True, {"bench": 2000, **{f"bench-{i:02d}": 20 for i in range(100)}},
                 id="half-without-quota"),
])
def test_pods_are_spread_over_the_namespaces_in_turn(
        count: int | None, half_without: bool, expected: dict[str, int]) -> None:
    assert Counter(namespaces_of(NAMES, count, half_without).values()) == expected


def test_half_without_quota_alternates_and_splits_the_filter_times() -> None:
    names = NAMES[:6]
    namespaces = namespaces_of(names, 2, half_without=True)
    assert [namespaces[name] for name in names] == ["bench", "bench-0", "bench", "bench-1",
                                                    "bench", "bench-0"]
    # No quota for bench: its pods are the run's pods without one.
    assert [m["metadata"]["namespace"] for m in quota_manifests(namespaces.values())] == [
        "bench-0", "bench-1"]
    seconds = [0.001, 0.004, 0.002, 0.005, 0.003, 0.006]
    assert by_quota(names, seconds, namespaces) == {"filter_p50_ms_quota": 5.0,
                                                    "filter_p50_ms_no_quota": 2.0}


def test_every_quota_applies_and_lets_its_namespace_in_every_tenth_exactly() -> None:
    namespaces = namespaces_of(NAMES, 100)
    pods = Counter(namespaces.values())
    quotas = [parse_quota(msgspec.convert(manifest, ResourceQuotaManifest))
              for manifest in quota_manifests(namespaces.values())]
    assert sorted(q.namespace for q in quotas) == sorted(pods)
    exact = [q.namespace for q in quotas if q.memory == pods[q.namespace] * POD_MEMORY_MIB]
    roomy = [q.namespace for q in quotas if q.memory == 2 * pods[q.namespace] * POD_MEMORY_MIB]
    assert exact == [f"bench-{i:02d}" for i in range(0, 100, 10)]
    assert len(roomy) == 90
    assert {q.cores for q in quotas} == {CORES_LIMIT}


def test_the_standing_counts_limits_and_namespaces_that_spent_all_their_memory() -> None:
    fleet = lab_fleet()
    manifests = quota_manifests(["bench-0", "bench-0", "bench-1", "bench-1"])
    for manifest in manifests:
        fleet.quotas.set_quota(parse_quota(msgspec.convert(manifest, ResourceQuotaManifest)))
    # bench-0's limit is its two pods' memory; bench-1's twice that.
    for key in ("bench-0/p-0", "bench-0/p-1", "bench-1/p-2", "bench-1/p-3"):
        hold(fleet, key, "gpu-node-1", "GPU-gpu-node-1-0", memory=POD_MEMORY_MIB)
    text = exposition(fleet)
    assert quota_standing(text) == {"quota_limits": 4, "quota_namespaces_full": 1}
    fleet.release("bench-0/p-0")
    assert quota_standing(exposition(fleet)) == {"quota_limits": 4, "quota_namespaces_full": 0}


def exposition(fleet: Fleet) -> str:
    metrics = Metrics(Sources(fleet=lambda: fleet, last_heard=dict, stale=frozenset,
                              ready=lambda: True, leading=lambda: True, slices_enforced=dict))
    return metrics.exposition().decode()
