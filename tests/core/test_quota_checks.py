"""The quota over the kept card checks: what ``PodView.first_checks`` answers under a
quota (the kept capacity checks, with the quota applied over them, a fixed request judged
once on plain integers) is what judging every card afresh answers (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.core import Allocation, Fleet, Node, PodManifest, parse_pod
from common.core.placement import PodView
from common.core.quota import Quota
from common.core.reasons import CHECK_COUNT, CardCheck
from pyhami.sandbox import DEFAULTS
from tests.builders import manifest
from tests.core.test_properties import allocations, nodes

LIMITS_MIB = [0, 500, 999, 1000, 3000, 4000, 12000]
LIMITS_CORES = [0, 29, 30, 100, 200]


@st.composite
def quotas(draw: st.DrawFn) -> Quota:
    memory = draw(st.sampled_from([None, *LIMITS_MIB]))
    cores = draw(st.sampled_from(LIMITS_CORES if memory is None else [None, *LIMITS_CORES]))
    return Quota("default", "gpu-quota", memory=memory, cores=cores)


@st.composite
def quota_pods(draw: st.DrawFn) -> PodManifest:
    """One GPU container, its memory fixed or a percentage of the card."""
    limits: dict[str, int | str] = {"nvidia.com/gpu": draw(st.integers(1, 3)),
                                    "nvidia.com/gpucores": draw(st.sampled_from([0, 30, 100]))}
    if draw(st.booleans()):
        limits["nvidia.com/gpumem"] = draw(st.sampled_from([500, 1000, 4000]))
    else:
        limits["nvidia.com/gpumem-percentage"] = draw(st.sampled_from([10, 25, 50]))
    return manifest(containers=[limits])


scenario = st.shared(nodes(), key="cluster")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=scenario, booked=scenario.flatmap(allocations), quota=quotas(),
       pod=quota_pods())
def test_the_kept_checks_under_a_quota_are_the_checks_made_afresh(
    cluster: list[Node], booked: dict[str, Allocation], quota: Quota, pod: PodManifest,
) -> None:
    fleet = Fleet()
    for node in cluster:
        fleet.upsert_node(node)
    fleet.quotas.set_quota(quota)
    for key, allocation in booked.items():  # every one charged to namespace default
        fleet.allocate(key, allocation)
    request = parse_pod(pod, DEFAULTS)
    left = fleet.quotas.left(request.subject)
    assert left is not None
    snapshot = fleet.snapshot
    for _ in range(2):  # made, then taken from what the snapshot keeps
        view = PodView(snapshot, request, left)
        codes, by_node = view.first_checks()
        afresh = view.card_codes(request.gpu_containers[0], slice(None))
        assert codes.tolist() == afresh.tolist()
        counts = np.bincount(snapshot.check_base + afresh,
                             minlength=len(snapshot.node_names) * CHECK_COUNT)
        assert by_node.tolist() == counts.reshape(-1, CHECK_COUNT).tolist()
        refused = bool((afresh == CardCheck.QUOTA_NOT_FIT).any())
        assert view.quota_refused_first == refused
