"""Preemption for GPU pods on the real control plane (docs/preemption.md).

PriorityClasses made by the test; the lab node's four cards filled with low-priority
one-card pods pinned to their cards (``nvidia.com/use-gpuuuid``), card 3 holding the
fewest. kube-scheduler v1.36.3 cannot preempt for them (its dry run finds no victim on a
node only the extender rejects), so the daemon does: it deletes the tenants of the card
the high-priority pod can take at least cost, and the pod lands there. A pod of equal
priority, and one no set of victims can make fit, preempt nobody. The time from the
preemptor's creation to its binding is printed and kept in ``preemption.jsonl`` in the
suite's log folder.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.controlplane import NODE, TEST_NAMESPACE, ControlPlane
from tests.e2e.pods import PODS, POLICY, USE_UUID, ClusterLab, card_uuid, lab_pod

LOW, HIGH = "pyhami-e2e-low", "pyhami-e2e-high"
PRIORITIES = {LOW: 100, HIGH: 1000}
TENANTS = {0: 3, 1: 3, 2: 3, 3: 2}
"""Low-priority tenants per card: card 3 has the fewest."""
QUIET_S = 6.0
"""A pod that may not preempt is watched this long (the daemon acts 1 s after /filter)."""
CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"


@pytest.fixture
def priority_classes(control_plane: ControlPlane) -> Iterator[None]:
    for name, value in PRIORITIES.items():
        control_plane.api.create(CLASSES, {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value,
            "description": "made by pyhami's end-to-end preemption test"})
    yield
    for name in PRIORITIES:
        control_plane.api.delete(f"{CLASSES}/{name}")


def gpu_pod(name: str, priority_class: str, annotations: dict[str, str] | None = None,
            memory: str = "1000") -> dict[str, Any]:
    pod = lab_pod(name, annotations)
    pod["metadata"]["labels"] = {"card": name.split("-")[1] if name.startswith("low-") else ""}
    pod["spec"]["priorityClassName"] = priority_class
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = memory
    return pod


def fill_the_node(lab: ClusterLab) -> dict[str, int]:
    tenants = {f"low-{card}-{n}": card for card, count in TENANTS.items() for n in range(count)}
    for name, card in tenants.items():
        lab.create_manifest(gpu_pod(name, LOW, {USE_UUID: card_uuid(card)}))
    for name, card in tenants.items():
        assert lab.wait_placed(name).card == card
    return tenants


def pod_names(lab: ClusterLab) -> set[str]:
    return {item["metadata"]["name"] for item in lab.api.get(PODS)["items"]}


@pytest.mark.usefixtures("priority_classes", "clean_namespace")
def test_a_high_priority_mutex_pod_preempts_exactly_the_tenants_of_one_card(
        lab: ClusterLab, control_plane: ControlPlane) -> None:
    tenants = fill_the_node(lab)
    victims = {name for name, card in tenants.items() if card == 3}
    created = time.monotonic()
    lab.create_manifest(gpu_pod("urgent", HIGH, {POLICY: "mutex"}))
    placed = lab.wait_placed("urgent")
    seconds = time.monotonic() - created
    assert placed.card == 3
    assert pod_names(lab) == (tenants.keys() - victims) | {"urgent"}
    assert lab.read("urgent")["spec"]["priority"] == PRIORITIES[HIGH]
    lab.wait_event("urgent", "Preempting", *sorted(victims))
    record = {"creation_to_binding_s": round(seconds, 3), "victims": len(victims)}
    with (control_plane.logs / "preemption.jsonl").open("a") as out:
        out.write(json.dumps(record) + "\n")
    print("preemption:", json.dumps(record))


def assert_nobody_preempted(lab: ClusterLab, name: str, expected: set[str]) -> None:
    time.sleep(QUIET_S)
    assert pod_names(lab) == expected
    lab.assert_pending(name)
    assert not [e for e in lab.events(name) if e.get("reason") == "Preempting"]


@pytest.mark.usefixtures("priority_classes", "clean_namespace")
def test_a_pod_of_equal_priority_preempts_nobody(lab: ClusterLab) -> None:
    tenants = fill_the_node(lab)
    lab.create_manifest(gpu_pod("peer", LOW, {POLICY: "mutex"}))
    lab.wait_event("peer", "FilteringFailed")
    assert_nobody_preempted(lab, "peer", set(tenants) | {"peer"})


@pytest.mark.usefixtures("priority_classes", "clean_namespace")
def test_a_request_no_victims_can_satisfy_preempts_nobody(lab: ClusterLab) -> None:
    tenants = fill_the_node(lab)
    # More memory than a T4 has: emptying any card would not make room.
    lab.create_manifest(gpu_pod("too-big", HIGH, memory="20000"))
    lab.wait_event("too-big", "FilteringFailed")
    assert_nobody_preempted(lab, "too-big", set(tenants) | {"too-big"})



@pytest.mark.usefixtures("priority_classes", "clean_namespace")
def test_the_preempt_verb_names_the_tenants_of_one_card(
        lab: ClusterLab, control_plane: ControlPlane) -> None:
    """As kube-scheduler from the release with the fix would ask: the node offered with
    no victims, pyhami names them (uids of real pods, which kube-scheduler resolves)."""
    tenants = fill_the_node(lab)
    uids = {name: lab.read(name)["metadata"]["uid"] for name in tenants}
    preemptor = gpu_pod("urgent", HIGH, {POLICY: "mutex"})
    preemptor["spec"]["priority"] = PRIORITIES[HIGH]  # as the API server would have set it
    status, answer = control_plane.post_extender("/preempt", {
        "Pod": preemptor, "NodeNameToMetaVictims": {NODE: {"Pods": [], "NumPDBViolations": 0}}})
    assert status == 200, answer
    named = answer["NodeNameToMetaVictims"][NODE]
    by_uid = {uid: name for name, uid in uids.items()}
    assert sorted(by_uid.get(p["UID"], p["UID"]) for p in named["Pods"]) == sorted(
        name for name, card in tenants.items() if card == 3), answer
    assert named["NumPDBViolations"] == 0
    assert pod_names(lab) == set(tenants)  # answering evicts nobody: kube-scheduler does


BUDGETS = f"/apis/policy/v1/namespaces/{TEST_NAMESPACE}/poddisruptionbudgets"


@pytest.fixture
def card_3_budget(control_plane: ControlPlane) -> Iterator[None]:
    """A PodDisruptionBudget that lets none of card 3's tenants go."""
    control_plane.api.create(BUDGETS, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "card-3"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"card": "3"}}}})
    yield
    control_plane.api.delete(f"{BUDGETS}/card-3")


@pytest.mark.usefixtures("priority_classes", "card_3_budget", "clean_namespace")
def test_a_card_whose_tenants_a_budget_protects_is_spared(lab: ClusterLab) -> None:
    """Fewest budget violations come first: card 0's three tenants go, not card 3's two."""
    tenants = fill_the_node(lab)
    lab.create_manifest(gpu_pod("urgent", HIGH, {POLICY: "mutex"}))
    assert lab.wait_placed("urgent").card == 0
    assert pod_names(lab) == {n for n, card in tenants.items() if card != 0} | {"urgent"}
