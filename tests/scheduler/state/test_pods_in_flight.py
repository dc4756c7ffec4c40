"""``PodsInFlight``: what the daemon remembers of pods beyond their cards, forgotten
everywhere at once when a pod ends."""

from __future__ import annotations

from scheduler.cluster import ClusterPod
from scheduler.state.pods import PodsInFlight
from tests.builders import manifest


def bound_pod(name: str) -> ClusterPod:
    return ClusterPod(manifest=manifest(name), uid=f"u-{name}", node="gpu-node-1",
                      phase="Running", annotations={})


def remembered(pods: PodsInFlight, key: str) -> dict[str, bool]:
    return {"manifest": pods.manifest(key) is not None,
            "bound": key in pods.bound_pods(),
            "allocate_answered": pods.is_allocate_answered(key)}


def test_a_pod_that_ends_is_forgotten_everywhere() -> None:
    pods = PodsInFlight()
    for name in ("a", "b"):
        pod = bound_pod(name)
        pods.filtered(pod.key, pod.manifest)
        pods.unschedulable(pod.key, pod.namespace, pod.name)
        pods.bound(pod)
        pods.allocate_answered(pod.key)
    pods.ended("default/a")
    assert remembered(pods, "default/a") == dict.fromkeys(remembered(pods, "default/a"), False)
    assert remembered(pods, "default/b") == dict.fromkeys(remembered(pods, "default/b"), True)
    assert pods.take_unschedulable() == [("default", "b")]


def test_the_unschedulable_pods_are_taken_once_and_a_scheduled_one_is_not() -> None:
    pods = PodsInFlight()
    pods.unschedulable("default/a", "default", "a")
    pods.unschedulable("default/b", "default", "b")
    pods.scheduled("default/a")
    assert pods.any_unschedulable()
    assert pods.take_unschedulable() == [("default", "b")]
    assert not pods.any_unschedulable() and pods.take_unschedulable() == []


def test_a_rebuilt_ledger_keeps_only_its_bound_pods() -> None:
    pods = PodsInFlight()
    for name in ("a", "b", "c"):
        pods.bound(bound_pod(name))
    pods.keep_bound(["default/a", "default/c", "default/gone"])
    assert sorted(pods.bound_pods()) == ["default/a", "default/c"]
