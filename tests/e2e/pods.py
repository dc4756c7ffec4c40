"""What a user does with kubectl in the lab, through the API: create, wait, read, delete."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.controlplane import SCHEDULER_NAME, WAIT_S, ApiError, wait_for
from pyhami.demo import lab_pod as demo_lab_pod
from tests.e2e.controlplane import NODE, TEST_NAMESPACE, ControlPlane

PODS = f"/api/v1/namespaces/{TEST_NAMESPACE}/pods"
EVENTS = f"/api/v1/namespaces/{TEST_NAMESPACE}/events"

ALLOCATED = "hami.io/vgpu-devices-allocated"
POLICY = "hami.io/gpu-scheduler-policy"
USE_UUID = "nvidia.com/use-gpuuuid"
LAB_LIMITS = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}
HAMI_EXAMPLE = Path(__file__).parent / "hami" / "default_use.yaml"
"""HAMi v2.10.0's own example pod, byte for byte (test_hami_scheduler_name.py says where
it comes from and pins its digest)."""


def card_uuid(index: int) -> str:
    """The simulated agent's card uuids: ``GPU-<node>-<index>``."""
    return f"GPU-{NODE}-{index}"


def lab_pod(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """The demo's lab pod (``pyhami.demo.lab_pod``: one container asking one card with a
    1000 MiB slice) as a real cluster runs it: in the test namespace, for pyhami-scheduler,
    its quantities written as kubectl writes them, its container sleeping until the pod is
    deleted, and gone at once when it is."""
    pod = demo_lab_pod(name, dict(annotations or {}))
    pod["metadata"]["namespace"] = TEST_NAMESPACE
    pod["spec"].update(schedulerName=SCHEDULER_NAME, automountServiceAccountToken=False,
                       terminationGracePeriodSeconds=0)
    container = pod["spec"]["containers"][0]
    container["command"] = ["sleep", "infinity"]
    container["resources"]["limits"] = dict(LAB_LIMITS)
    return pod


@dataclass(frozen=True)
class Placement:
    name: str
    node: str
    allocated: str
    annotations: dict[str, str]

    @property
    def card(self) -> int:
        """The index of the one card of a one-container, one-card allocation."""
        cards = [part for part in self.allocated.split(";") if part]
        assert len(cards) == 1 and cards[0].count(":") == 1, (
            f"pod {self.name}: expected one container with one card, got {self.allocated!r}")
        uuid = cards[0].split(",", 1)[0]
        prefix = f"GPU-{self.node}-"
        assert uuid.startswith(prefix), f"pod {self.name}: card {uuid!r} is not on {self.node}"
        return int(uuid[len(prefix):])


class ClusterLab:
    """The pods of one test in one namespace (the suite's by default), created and read as
    a user would, on the real control plane: the e2e suite's ``lab`` fixture (conftest.py).
    The standalone lab, without Kubernetes, is ``tests.harness.Lab``."""

    def __init__(self, plane: ControlPlane, namespace: str = TEST_NAMESPACE) -> None:
        self.plane = plane
        self.api = plane.api
        self.namespace = namespace
        self.pods = f"/api/v1/namespaces/{namespace}/pods"
        self._events = f"/api/v1/namespaces/{namespace}/events"

    def create(self, name: str, annotations: dict[str, str] | None = None) -> None:
        self.create_manifest(lab_pod(name, annotations))

    def create_manifest(self, pod: dict[str, Any]) -> None:
        """Create the pod in the lab's namespace (whatever namespace it names)."""
        pod["metadata"]["namespace"] = self.namespace
        self.api.create(self.pods, pod)

    def read(self, name: str) -> dict[str, Any]:
        """The pod as the API returns it, as ``kubectl get pod -o json`` shows it."""
        return self.api.get(f"{self.pods}/{name}")

    def bound(self, name: str) -> dict[str, Any] | None:
        pod = self.read(name)
        return pod if pod["spec"].get("nodeName") else None

    def wait_placed(self, name: str, timeout: float = WAIT_S) -> Placement:
        """Until ``spec.nodeName`` is set; the pod's node and allocation annotation."""
        pod = wait_for(lambda: self.bound(name), f"pod {name} to be bound (spec.nodeName set)",
                       timeout, watch=self.plane.all_processes())
        node: str = pod["spec"]["nodeName"]
        annotations: dict[str, str] = dict(pod["metadata"].get("annotations") or {})
        assert ALLOCATED in annotations, (
            f"pod {name} is bound to {node} without {ALLOCATED}: {annotations}")
        return Placement(name, node, annotations[ALLOCATED], annotations)

    def place(self, name: str, annotations: dict[str, str] | None = None) -> Placement:
        self.create(name, annotations)
        return self.wait_placed(name)

    def delete(self, name: str) -> None:
        self.api.delete(f"{self.pods}/{name}", gracePeriodSeconds="0")

        def gone() -> bool:
            try:
                self.read(name)
            except ApiError as error:
                if error.status == 404:
                    return True
                raise
            return False

        wait_for(gone, f"pod {name} to be deleted")

    def events(self, name: str) -> list[dict[str, Any]]:
        """The core/v1 Events about the pod, as ``kubectl describe pod`` lists them."""
        found: list[dict[str, Any]] = self.api.get(
            self._events, fieldSelector=f"involvedObject.name={name}")["items"]
        return found

    def wait_event(self, name: str, reason: str, *needles: str,
                   timeout: float = WAIT_S) -> dict[str, Any]:
        """Until the pod has an event ``reason`` whose message holds every needle."""

        def matching() -> dict[str, Any] | None:
            for event in self.events(name):
                message = event.get("message") or ""
                if event.get("reason") == reason and all(n in message for n in needles):
                    return event
            return None

        try:
            return wait_for(matching, f"a {reason} event on pod {name} naming {needles}",
                            timeout, interval=0.5, watch=self.plane.all_processes())
        except AssertionError as error:
            seen = [(e.get("reason"), e.get("message")) for e in self.events(name)]
            raise AssertionError(f"{error}\nevents on {name}: {seen}") from None

    def assert_pending(self, name: str) -> None:
        pod = self.read(name)
        node = pod["spec"].get("nodeName")
        assert not node, f"pod {name} should be Pending, is on {node}"
        annotations = pod["metadata"].get("annotations") or {}
        assert ALLOCATED not in annotations, (
            f"pending pod {name} carries an allocation: {annotations}")

    def explain(self, name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
        """pyhami's selection path for a pod like ``name`` now; books nothing."""
        status, document = self.plane.post_extender("/explain", lab_pod(name, annotations))
        assert status == 200, f"/explain answered {status}: {document}"
        assert isinstance(document, dict)
        return document


def scores(document: dict[str, Any]) -> dict[int, float]:
    return {row["index"]: row["score"] for row in document["explain"] if row["node"] == NODE}


def filtered(document: dict[str, Any]) -> dict[int, str | None]:
    return {row["index"]: row["filtered_by"] for row in document["explain"]
            if row["node"] == NODE}


def chosen_card(document: dict[str, Any]) -> int:
    devices = document["devices"]
    assert document["scheduled"] and devices and len(devices[0]) == 1, (
        f"explain did not choose one card: {document}")
    index: int = devices[0][0]["index"]
    return index


def elapsed_since(start: float) -> float:
    return round(time.monotonic() - start, 1)
