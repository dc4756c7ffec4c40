"""What the standalone pod bucket holds: each pod (``StoredPod``, msgpack) under its key
(``pod_key``); and ``PodEvent``, the Events kept beside the pods, in memory only."""

from __future__ import annotations

import msgspec

from common.core import PodManifest
from scheduler.cluster.port import ClusterPod


class StoredPod(msgspec.Struct, kw_only=True):
    """A pod as the bucket stores it: its manifest, the uid and time the pod API gave it,
    and what binding it wrote (the node, the phase, the annotations)."""

    manifest: PodManifest
    uid: str
    submitted: float
    node: str | None = None
    phase: str = "Pending"
    annotations: dict[str, str] = {}

    def cluster_pod(self) -> ClusterPod:
        return ClusterPod(manifest=self.manifest, uid=self.uid, node=self.node,
                          phase=self.phase, annotations=self.annotations,
                          started=self.submitted)


class PodEvent(msgspec.Struct):
    """One Event, counted as kubectl shows it: a repeat raises ``count`` and ``last_time``."""

    type: str
    reason: str
    message: str
    count: int
    first_time: float
    last_time: float


def pod_key(namespace: str, name: str) -> str:
    """The pod's key in the bucket."""
    # The pod API lets in only names Kubernetes accepts: a namespace (a DNS-1123 label)
    # holds no dot, so the first dot separates the two and no two pods share a key; both
    # hold only characters NATS accepts in a key, 317 of them at most.
    return f"{namespace}.{name}"
