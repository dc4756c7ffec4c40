"""``StandaloneCluster``: the ``Cluster`` port over the pods of a ``PodBucket``, the Events
kept in memory, and the queries and writes the pod API and the pending loop need."""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping

import msgspec
from nats.aio.client import Client

from common.core import PodManifest
from common.core.annotations import BIND_PHASE_ANNOTATION
from scheduler.cluster.port import (
    AllocationPhase,
    ClusterError,
    ClusterPod,
    DisruptionBudget,
    EventType,
    PodChange,
)
from scheduler.cluster.standalone._bucket import BUCKET, SETTLE_PERIOD_S, PodBucket
from scheduler.cluster.standalone._wire import PodEvent, StoredPod, pod_key

EVENTS_KEPT = 20


class StandaloneCluster:
    """The pods of a ``PodBucket`` as the ``Cluster`` port offers them, and the Events
    recorded on them (in memory, the last ``EVENTS_KEPT`` of each pod)."""

    def __init__(self, bucket: PodBucket) -> None:
        self._bucket = bucket
        self._events: dict[str, deque[PodEvent]] = {}

    @classmethod
    async def open(cls, connection: Client, refusal: Callable[[], str | None],
                   bucket: str = BUCKET) -> StandaloneCluster:
        """The cluster over the bucket ``bucket`` (made when missing), every pod read.

        ``refusal`` says why this daemon may not write the bucket now (a standby); None
        when it may."""
        return cls(await PodBucket.open(connection, refusal, bucket))

    def refusal(self) -> str | None:
        """Why this daemon may not write the bucket now (a standby); None when it may."""
        return self._bucket.refusal()

    async def reattach(self, connection: Client) -> None:
        """Use the bucket through a new NATS client (the old one was closed for good)."""
        await self._bucket.reattach(connection)

    async def reload(self) -> None:
        """Read every pod afresh (this daemon was elected: another may have written)."""
        await self._bucket.reload()

    async def keep_settled(self, period: float = SETTLE_PERIOD_S) -> None:
        """Undo the writes that got no answer, once the bucket answers; runs forever."""
        await self._bucket.keep_settled(period)

    # The Cluster port ---------------------------------------------------------

    async def list_pods(self) -> list[ClusterPod]:
        return [pod.cluster_pod() for pod in self._bucket.pods()]

    async def get_pod(self, namespace: str, name: str) -> ClusterPod | None:
        pod = self._bucket.get(pod_key(namespace, name))
        return pod.cluster_pod() if pod is not None else None

    async def device_cordons(self) -> dict[str, frozenset[str]]:
        """Standalone has no Node objects: cards are cordoned by their agent (--cordon)."""
        return {}

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: Mapping[str, str | None]) -> None:
        key = pod_key(namespace, name)
        what = f"bind {namespace}/{name}"
        async with self._bucket.writing(key) as pod:
            if pod is None:
                raise ClusterError(f"{what}: the pod no longer exists")
            if uid and pod.uid != uid:
                raise ClusterError(f"{what}: uid {uid} is not the pod's ({pod.uid})")
            if pod.node is not None:
                raise ClusterError(f"{what}: already bound to {pod.node}")
            merged = {**pod.annotations, **annotations}
            bound = msgspec.structs.replace(pod, node=node, phase="Running", annotations={
                annotation: value for annotation, value in merged.items() if value is not None})
            await self._bucket.replace(key, bound, what)

    async def set_bind_phase(self, namespace: str, name: str, uid: str,
                             phase: AllocationPhase) -> None:
        key = pod_key(namespace, name)
        what = f"setting the bind-phase of pod {namespace}/{name} to {phase}"
        async with self._bucket.writing(key) as pod:
            if pod is None:
                raise ClusterError(f"{what}: the pod no longer exists")
            if pod.uid != uid:
                raise ClusterError(f"{what}: uid {uid} is not the pod's ({pod.uid})")
            await self._bucket.replace(key, msgspec.structs.replace(
                pod, annotations={**pod.annotations, BIND_PHASE_ANNOTATION: phase}), what)

    async def record_event(self, namespace: str, name: str, kind: EventType, reason: str,
                           message: str) -> None:
        events = self._events.setdefault(pod_key(namespace, name), deque(maxlen=EVENTS_KEPT))
        now = time.time()
        for event in events:
            if (event.type, event.reason, event.message) == (kind, reason, message):
                events.remove(event)  # a repeat: moved to the end, as the latest
                event.count += 1
                event.last_time = now
                events.append(event)
                return
        events.append(PodEvent(kind, reason, message, 1, now, now))

    async def evict(self, namespace: str, name: str, uid: str) -> None:
        pod = self._bucket.get(pod_key(namespace, name))
        if pod is None or pod.uid != uid:
            return  # gone, or another pod under the name now
        await self.delete(namespace, name)

    async def disruption_budgets(self) -> list[DisruptionBudget]:
        return []

    async def retry_pod(self, namespace: str, name: str, stamp: str) -> None:
        """Nothing to do: the pending loop tries waiting pods whenever cards are freed."""

    def changes(self) -> AsyncIterator[PodChange]:
        return self._bucket.changes()

    # What the pod API and the pending loop need ------------------------------------

    async def submit(self, manifest: PodManifest) -> StoredPod:
        """Store a new pod, pending, under a fresh uid; ``ClusterError`` when one exists
        under its name."""
        namespace, name = manifest.namespace, manifest.metadata.name
        key = pod_key(namespace, name)
        async with self._bucket.writing(key) as existing:
            if existing is not None:
                raise ClusterError(f"pod {namespace}/{name} already exists")
            metadata = msgspec.structs.replace(manifest.metadata, namespace=namespace,
                                               uid=str(uuid.uuid4()))
            manifest = msgspec.structs.replace(manifest, metadata=metadata)
            pod = StoredPod(manifest=manifest, uid=metadata.uid or "", submitted=time.time(),
                            annotations=dict(manifest.metadata.annotations or {}))
            if not await self._bucket.create(key, pod, f"submit {namespace}/{name}"):
                raise ClusterError(f"pod {namespace}/{name} already exists")
            return pod

    async def delete(self, namespace: str, name: str) -> bool:
        """Delete the pod and its Events; False when there is no such pod."""
        key = pod_key(namespace, name)
        async with self._bucket.writing(key):
            deleted = await self._bucket.delete(key, f"delete {namespace}/{name}")
            if deleted:
                self._events.pop(key, None)
            return deleted

    def pending(self) -> list[StoredPod]:
        """The pods bound to no node yet, the longest waiting first."""
        waiting = [p for p in self._bucket.pods() if p.node is None and p.phase == "Pending"]
        return sorted(waiting, key=lambda p: p.submitted)

    def pods(self) -> list[StoredPod]:
        """Every pod, the first submitted first."""
        return sorted(self._bucket.pods(), key=lambda p: p.submitted)

    def events(self, namespace: str, name: str) -> list[PodEvent]:
        """The pod's Events, the latest last."""
        return list(self._events.get(pod_key(namespace, name), ()))
