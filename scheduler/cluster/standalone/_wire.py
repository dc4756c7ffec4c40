"""What the standalone pod bucket holds: each pod (``StoredPod``, msgpack) under its key
(``pod_key``), each ResourceQuota (``StoredQuota``) under its own (``quota_key``); and
``PodEvent``, the Events kept beside them, in memory only."""

from __future__ import annotations

import msgspec

from common.core import PodManifest
from common.core.quota import ResourceQuotaManifest
from scheduler.cluster.port import ClusterPod

RESERVED_PREFIX = "_"
"""Keys that start with it hold no pod: a pod's key starts with its namespace, a DNS-1123
label, which cannot."""
QUOTA_PREFIX = RESERVED_PREFIX + "resourcequota."


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


class StoredQuota(msgspec.Struct, kw_only=True):
    """A ResourceQuota as the bucket stores it: the manifest as the pod API was given it
    (JSON, what it answers), and the part of it pyhami reads."""

    manifest: ResourceQuotaManifest
    given: bytes


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


def quota_key(namespace: str, name: str) -> str:
    """The ResourceQuota's key in the bucket: never a pod's (see ``RESERVED_PREFIX``), and
    unique as ``pod_key`` is."""
    return f"{QUOTA_PREFIX}{namespace}.{name}"


def holds_pod(key: str) -> bool:
    """Whether the key is a pod's (else a ResourceQuota's, or another kind's to come)."""
    return not key.startswith(RESERVED_PREFIX)
