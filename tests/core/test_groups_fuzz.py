"""Fuzz target for the pod-group door: whatever a pod's labels, annotations and
``spec.schedulingGroup`` hold, ``group_of`` either reads a group whose name is a label
value and whose count is within bounds, reads none, or refuses in one line naming the
field, never a traceback (hypothesis). The same pods through the JSON decoder the pod API
and the extender use."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.core import Fleet, PodRejected, parse_pod
from common.core.groups import (
    COSCHEDULING_GROUP_LABEL,
    GROUP_MAX,
    KUEUE_COUNT_ANNOTATION,
    KUEUE_GROUP_LABEL,
    group_of,
    idle_placement_steps,
    place_group,
    run_to_end,
)
from common.core.names import check_label_value
from common.core.pod import ObjectMeta, PodManifest, PodSpec, SchedulingGroup
from common.core.quota import Quota
from pyhami.sandbox import DEFAULTS
from tests.builders import fleet_of, gpu_limits, hold, manifest, node

pytestmark = pytest.mark.slow  # long fuzzing

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FIELDS = ("metadata.labels", "metadata.annotations", "spec.schedulingGroup",
          "the pod declares two groups")

names = st.one_of(st.text(max_size=70), st.sampled_from(
    ["train-a", "A.b_c-1", "", "-x", "x-", "g" * 63, "g" * 64, "ünï", "a b", "a/b"]))
counts = st.one_of(st.text(max_size=12), st.integers(-5, 3000).map(str), st.sampled_from(
    ["0", "1", "4", "1024", "1025", "-1", "4.0", " 4", "٤", "1e3", "0x10", "+4"]))


@FUZZ
@given(kueue=st.none() | names, coscheduling=st.none() | names, count=st.none() | counts,
       pod_group=st.none() | names, other=st.dictionaries(st.text(max_size=20), names,
                                                          max_size=3))
def test_any_declaration_is_read_whole_or_refused_in_one_line(
        kueue: str | None, coscheduling: str | None, count: str | None,
        pod_group: str | None, other: dict[str, str]) -> None:
    labels = dict(other)
    annotations: dict[str, str] = {}
    if kueue is not None:
        labels[KUEUE_GROUP_LABEL] = kueue
    if coscheduling is not None:
        labels[COSCHEDULING_GROUP_LABEL] = coscheduling
    if count is not None:
        annotations[KUEUE_COUNT_ANNOTATION] = count
    pod = PodManifest(
        metadata=ObjectMeta(name="worker", namespace="lab", labels=labels,
                            annotations=annotations),
        spec=PodSpec(scheduling_group=None if pod_group is None
                     else SchedulingGroup(pod_group_name=pod_group)))
    # Through the decoder too: what arrives over HTTP is read the same.
    decoded = msgspec.json.decode(msgspec.json.encode(pod), type=PodManifest)
    for read in (pod, decoded):
        try:
            group = group_of(read)
        except PodRejected as error:
            message = str(error)
            assert "\n" not in message and len(message) < 1000, message
            assert message.startswith(FIELDS), message
            continue
        if group is None:
            assert kueue is None and coscheduling is None and pod_group is None
            continue
        check_label_value("name", group.name)  # raises if not a label value
        assert group.namespace == "lab"
        assert group.count is None or 1 <= group.count <= GROUP_MAX


# The idle placement that decides whether a group may go ahead of others (issue 45), on
# any fleet: the group placed as on the same nodes holding no pod, under the same quotas,
# the fleet itself left as it is. (It is not bound to fit whenever the placement now does:
# members are placed greedily, and on idle cards the first ones may take cards a later one
# needed. A group that fits now is placed then; the idle placement is asked only of one
# that does not.)
_SHAPES = st.tuples(st.integers(1, 4), st.integers(0, 100))  # cards, percent (0: 1000 MiB)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(st.integers(1, 8), min_size=1, max_size=4),
       held=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 7), st.integers(1, 15000)),
                     max_size=10),
       members=st.lists(_SHAPES, min_size=1, max_size=12),
       quota_mib=st.none() | st.integers(1000, 200_000))
def test_the_idle_placement_is_the_placement_on_the_same_nodes_holding_nothing(
        nodes: list[int], held: list[tuple[int, int, int]], members: list[tuple[int, int]],
        quota_mib: int | None) -> None:
    def built() -> Fleet:
        fleet = fleet_of(*(node(f"n{i}", cards) for i, cards in enumerate(nodes)))
        if quota_mib is not None:
            fleet.quotas.set_quota(Quota("default", "gpu", memory=quota_mib))
        return fleet

    fleet = built()
    for k, (at, card, mib) in enumerate(held):
        if at < len(nodes) and card < nodes[at]:
            hold(fleet, f"default/tenant-{k}", f"n{at}", f"GPU-n{at}-{card}", memory=mib)
    requests = [parse_pod(manifest(f"m{i}", containers=[
        gpu_limits(1000, cards=cards) if percent == 0 else gpu_limits(cards=cards,
                                                                      percent=percent)]),
                          DEFAULTS) for i, (cards, percent) in enumerate(members)]
    before = fleet.allocations()
    idle = run_to_end(idle_placement_steps(fleet, "g", requests))
    assert fleet.allocations() == before
    assert idle == place_group(built(), "g", requests)
    assert (idle.message is None) == idle.placed
