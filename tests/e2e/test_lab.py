"""The article's lab (docs/demo.md) on a real kube-apiserver and kube-scheduler.

Pods set ``schedulerName: pyhami-scheduler``; kube-scheduler calls pyhami's /filter and
/bind; pyhami writes the allocation annotations and creates the Binding. Each step checks
what a user checks with kubectl: ``spec.nodeName``, ``hami.io/vgpu-devices-allocated``,
the FailedScheduling event of a Pending pod, and each card's score in the selection path.
"""

from __future__ import annotations

import time

from harness.controlplane import SCHEDULER_NAME, wait_for
from tests.e2e.controlplane import NODE, ControlPlane
from tests.e2e.pods import (
    ALLOCATED,
    POLICY,
    USE_UUID,
    ClusterLab,
    card_uuid,
    chosen_card,
    elapsed_since,
    filtered,
    scores,
)

MUTEX_CONFLICT = "ExclusiveDeviceAllocateConflict"


def test_default_spread_lands_on_gpu_0_1_2_3_in_order(lab: ClusterLab) -> None:
    cards = []
    for i in range(4):
        placed = lab.place(f"spread-{i}")
        assert placed.node == NODE, f"spread-{i} bound to {placed.node}"
        cards.append(placed.card)
    assert cards == [0, 1, 2, 3], f"default spread placed the four pods on GPUs {cards}"


def test_bound_pod_carries_what_hami_writes(lab: ClusterLab) -> None:
    placed = lab.place("annotated")
    assert placed.allocated == f"{card_uuid(0)},NVIDIA,1000,0:;", placed.allocated
    assert placed.annotations.get("hami.io/vgpu-devices-to-allocate") == placed.allocated
    assert placed.annotations.get("hami.io/vgpu-node") == NODE
    assert placed.annotations.get("hami.io/bind-phase") == "allocating"
    for stamp in ("hami.io/vgpu-time", "hami.io/bind-time"):
        value = placed.annotations.get(stamp, "")
        assert value.isdigit() and abs(int(value) - time.time()) < 600, f"{stamp}={value!r}"
    assert lab.read("annotated")["spec"]["schedulerName"] == SCHEDULER_NAME


def test_binpack_stacks_three_pods_on_gpu_0(lab: ClusterLab) -> None:
    cards = [lab.place(f"binpack-{i}", {POLICY: "binpack"}).card for i in range(3)]
    assert cards == [0, 0, 0], f"binpack placed the three pods on GPUs {cards}"


def test_mutex_waits_then_takes_the_released_card(lab: ClusterLab) -> None:
    cards = [lab.place(f"tenant-{i}").card for i in range(4)]
    assert cards == [0, 1, 2, 3], f"the four tenants landed on GPUs {cards}"

    lab.create("mutex", {POLICY: "mutex"})
    event = lab.wait_event("mutex", "FailedScheduling", f"4/4 {MUTEX_CONFLICT}")
    assert event["type"] == "Warning", event
    lab.assert_pending("mutex")

    # Nobody touches the mutex pod: deleting the tenant of GPU 1 is enough.
    started = time.monotonic()
    lab.delete("tenant-1")
    placed = lab.wait_placed("mutex")
    assert placed.card == 1, f"after GPU 1 was freed the mutex pod took GPU {placed.card}"
    print(f"mutex pod bound {elapsed_since(started)} s after the tenant of GPU 1 was deleted")


def test_mutex_binpack_takes_gpu_2_where_binpack_takes_gpu_0(lab: ClusterLab) -> None:
    assert [lab.place(f"stack-{i}", {POLICY: "binpack"}).card for i in range(2)] == [0, 0]
    pinned = lab.place("pinned", {USE_UUID: card_uuid(1)})
    assert pinned.card == 1, f"the pod pinned to GPU 1 took GPU {pinned.card}"

    composed = lab.explain("composed", {POLICY: "mutex,binpack"})
    assert scores(composed) == {0: 3.302083, 1: 1.651042, 2: 0.0, 3: 0.0}, composed["explain"]
    assert filtered(composed) == {0: MUTEX_CONFLICT, 1: MUTEX_CONFLICT, 2: None, 3: None}, (
        composed["explain"])
    assert chosen_card(composed) == 2, composed
    plain = lab.explain("plain", {POLICY: "binpack"})
    assert chosen_card(plain) == 0, f"plain binpack would not take GPU 0: {plain}"

    placed = lab.place("composed", {POLICY: "mutex,binpack"})
    assert placed.card == 2, f"mutex,binpack took GPU {placed.card}"
    # The same pod with plain binpack, placed for real, then removed again.
    assert lab.place("plain", {POLICY: "binpack"}).card == 0
    lab.delete("plain")


def test_daemon_restart_rebuilds_the_ledger_from_annotations(
        lab: ClusterLab, control_plane: ControlPlane) -> None:
    assert [lab.place(f"before-{i}", {POLICY: "binpack"}).card for i in range(2)] == [0, 0]
    assert lab.place("before-pinned", {USE_UUID: card_uuid(1)}).card == 1

    assert control_plane.stop_daemon() == 0, "pyhami scheduler did not stop cleanly on SIGTERM"
    # A pod submitted while the extender is down waits: kube-scheduler cannot reach it.
    lab.create("during")
    lab.wait_event("during", "FailedScheduling", "/filter")
    lab.assert_pending("during")

    control_plane.start_daemon()
    status = control_plane.statusz()
    # 3 restored; 4 if kube-scheduler already retried the pod submitted meanwhile.
    assert status["pods_bound"] in (3, 4), f"after the restart the ledger holds {status}"
    # Spread with GPU 0 and GPU 1 busy: a daemon that forgot them would pick GPU 0.
    during = lab.wait_placed("during")
    assert during.card == 2, f"the pod submitted during the restart took GPU {during.card}"

    path = lab.explain("after", {POLICY: "binpack"})
    assert scores(path) == {0: 3.302083, 1: 1.651042, 2: 1.651042, 3: 0.0}, path["explain"]
    assert lab.place("after", {POLICY: "binpack"}).card == 0
    assert lab.place("after-mutex", {POLICY: "mutex"}).card == 3
    status = control_plane.statusz()
    assert status["pods_bound"] == 6, f"six pods hold cards, the daemon counts {status}"

    # Every card has a tenant now: a second mutex pod must wait, not double-book a card.
    lab.create("no-room", {POLICY: "mutex"})
    lab.wait_event("no-room", "FailedScheduling", f"4/4 {MUTEX_CONFLICT}")
    lab.assert_pending("no-room")


def test_pod_without_gpu_resources_is_bound_by_kube_scheduler(
        lab: ClusterLab, control_plane: ControlPlane) -> None:
    lab.create_manifest({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "no-gpu"},
        "spec": {"schedulerName": SCHEDULER_NAME, "automountServiceAccountToken": False,
                 "containers": [{"name": "app", "image": "ubuntu:22.04"}]}})
    pod = wait_for(lambda: lab.bound("no-gpu"), "the GPU-less pod to be bound",
                   watch=control_plane.all_processes())
    assert pod["spec"]["nodeName"] == NODE
    assert ALLOCATED not in (pod["metadata"].get("annotations") or {}), pod["metadata"]
