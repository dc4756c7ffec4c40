"""Fuzz target for the pod-group door: whatever a pod's labels, annotations and
``spec.schedulingGroup`` hold, ``group_of`` either reads a group whose name is a label
value and whose count is within bounds, reads none, or refuses in one line naming the
field, never a traceback (hypothesis). The same pods through the JSON decoder the pod API
and the extender use."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.core import PodRejected
from common.core.groups import (
    COSCHEDULING_GROUP_LABEL,
    GROUP_MAX,
    KUEUE_COUNT_ANNOTATION,
    KUEUE_GROUP_LABEL,
    group_of,
)
from common.core.names import check_label_value
from common.core.pod import ObjectMeta, PodManifest, PodSpec, SchedulingGroup

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
    for manifest in (pod, decoded):
        try:
            group = group_of(manifest)
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
