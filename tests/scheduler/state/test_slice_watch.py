"""Measured usage in the live state: each node's latest measurement kept (and forgotten with
the node), the uid index of the bound pods, and ``SliceWatch``: which containers use more
memory than their slice, and which to tell of, once per window."""

from __future__ import annotations

import pytest

from common.core import Allocation, CardGrant
from common.wire import SCHEMA_VERSION, Inventory, Measured, MeasuredContainer, ReportedCard
from scheduler.cluster import ClusterPod
from scheduler.state import LiveState, OverSlice, SliceWatch
from scheduler.state.pods import PodsInFlight
from tests.builders import manifest

NODE = "gpu-node-1"
# The pod: init container init0 (card A, 500 MiB), then c0 (card A 1000, card B 2000) and
# c1 (card A 3000).
POD = ClusterPod(manifest=manifest("train", containers=[{}, {}], init_containers=[{}]),
                 uid="uid-train", node=NODE, phase="Running", annotations={})
ALLOCATION = Allocation(NODE, (
    (CardGrant("GPU-A", 500, 0),),
    (CardGrant("GPU-A", 1000, 0), CardGrant("GPU-B", 2000, 0)),
    (CardGrant("GPU-A", 3000, 0),)), init_containers=1)


def _entry(container: str, uuid: str, used: int, uid: str = "uid-train") -> MeasuredContainer:
    return MeasuredContainer(pod_uid=uid, container=container, device_uuid=uuid,
                             memory_used=used, utilization=0, source="nvml")


def _check(watch: SliceWatch, *entries: MeasuredContainer, now: float = 0.0,
           allocation: Allocation = ALLOCATION) -> tuple[list[OverSlice], int]:
    result = watch.check(NODE, Measured(at=now, containers=list(entries)),
                         {POD.uid: POD}.get, {POD.key: allocation}.get, now)
    return result.announce, result.unmatched


@pytest.mark.parametrize(("entry", "over", "unmatched"), [
    (_entry("c0", "GPU-A", 1001), OverSlice("default", "train", "c0", "GPU-A", 1001, 1000), 0),
    (_entry("c0", "GPU-B", 2500), OverSlice("default", "train", "c0", "GPU-B", 2500, 2000), 0),
    (_entry("c0", "GPU-A", 1000), None, 0),
    (_entry("c1", "GPU-A", 200), None, 0),
    (_entry("init0", "GPU-A", 600), OverSlice("default", "train", "init0", "GPU-A", 600, 500),
     0),
    # Containers not told apart: the pod's footprint on the card (app containers summed,
    # init ones at their peak), 4000 MiB on card A.
    (_entry("", "GPU-A", 4001), OverSlice("default", "train", "", "GPU-A", 4001, 4000), 0),
    (_entry("", "GPU-A", 3999), None, 0),
    (_entry("c0", "GPU-A", 9999, uid="uid-unknown"), None, 1),
    (_entry("c1", "GPU-B", 9999), None, 1),
    (_entry("sidecar", "GPU-A", 9999), None, 1),
    (_entry("", "GPU-C", 9999), None, 1),
], ids=["over-its-slice", "over-on-its-second-card", "at-its-slice", "under-its-slice",
        "init-container-over", "pod-over-its-footprint", "pod-under-its-footprint",
        "unknown-pod", "card-not-booked-for-the-container", "container-not-in-the-pod",
        "card-not-booked-for-the-pod"])
def test_a_container_over_its_slice_is_found_and_what_cannot_be_compared_is_counted(
        entry: MeasuredContainer, over: OverSlice | None, unmatched: int) -> None:
    watch = SliceWatch()
    assert _check(watch, entry) == ([] if over is None else [over], unmatched)
    assert watch.over({NODE}) == ([] if over is None else [over])
    assert watch.counts({NODE}) == {NODE: 0 if over is None else 1}


def test_a_pod_booked_on_another_node_is_not_compared() -> None:
    elsewhere = Allocation("gpu-node-2", ALLOCATION.containers, init_containers=1)
    assert _check(SliceWatch(), _entry("c0", "GPU-A", 9999), allocation=elsewhere) == ([], 1)


def test_each_container_and_card_is_told_of_once_per_window() -> None:
    watch = SliceWatch(every=600.0)
    over_a, over_b = _entry("c0", "GPU-A", 1500), _entry("c0", "GPU-B", 2500)
    assert len(_check(watch, over_a, now=0.0)[0]) == 1
    assert _check(watch, over_a, now=10.0)[0] == []
    # Another card of the same container is another signal.
    assert [over.uuid for over in _check(watch, over_a, over_b, now=20.0)[0]] == ["GPU-B"]
    assert watch.counts({NODE}) == {NODE: 2}
    assert [over.uuid for over in _check(watch, over_a, over_b, now=600.0)[0]] == ["GPU-A"]
    # Back under: none is over now, and nothing is told.
    assert _check(watch, _entry("c0", "GPU-A", 10), now=700.0) == ([], 0)
    assert watch.counts({NODE}) == {NODE: 0}


def test_a_cleared_or_forgotten_node_has_none_over() -> None:
    watch = SliceWatch()
    _check(watch, _entry("c0", "GPU-A", 1500))
    assert watch.counts(set()) == {}  # the node is no longer known
    watch.clear(NODE)
    assert watch.counts({NODE}) == {}
    assert watch.over({NODE}) == []


def test_the_sentence_names_the_container_the_card_and_both_figures() -> None:
    sentence = OverSlice("default", "train", "c0", "GPU-A", 1500, 1000).sentence()
    assert sentence.startswith("container c0 uses 1500 MiB of card GPU-A, more than its "
                               "slice of 1000 MiB")
    assert OverSlice("default", "train", "", "GPU-A", 1, 0).sentence().startswith(
        "the pod's containers together use 1 MiB")


def _inventory(sequence: int, measured: Measured | None) -> Inventory:
    return Inventory(schema=SCHEMA_VERSION, node=NODE, agent_version="t", instance="i",
                     sequence=sequence, timestamp=1.0, reason="heartbeat",
                     heartbeat_interval=10.0, slices_enforced=False, measured=measured,
                     cards=[ReportedCard(uuid="GPU-A", index=0, type="T4", memory=15360)])


def test_the_registry_keeps_each_nodes_latest_measurement_until_the_node_is_forgotten(
        ) -> None:
    state = LiveState(node_timeout=30.0, reservation_ttl=60.0)
    first, second = Measured(at=1.0), Measured(at=2.0, dropped=3)
    state.nodes.ingest(_inventory(1, first), now=0.0)
    state.nodes.ingest(_inventory(2, second), now=1.0)
    assert state.nodes.measured == {NODE: second}
    state.nodes.ingest(_inventory(3, None), now=2.0)  # the agent stopped sending usage
    assert state.nodes.measured == {}
    state.nodes.ingest(_inventory(4, first), now=3.0)
    state.nodes.forget(NODE)
    assert state.nodes.measured == {}


def test_the_bound_pods_are_found_by_uid_until_they_end_or_are_replaced() -> None:
    pods = PodsInFlight()
    pods.bound(POD)
    assert pods.bound_by_uid("uid-train") is POD
    again = ClusterPod(manifest=POD.manifest, uid="uid-train-2", node=NODE, phase="Running",
                       annotations={})
    pods.bound(again)  # the same name, a new pod
    assert (pods.bound_by_uid("uid-train"), pods.bound_by_uid("uid-train-2")) == (None, again)
    pods.keep_bound([])
    assert pods.bound_by_uid("uid-train-2") is None
    pods.bound(POD)
    pods.ended(POD.key)
    assert pods.bound_by_uid("uid-train") is None
