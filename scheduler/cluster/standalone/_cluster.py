"""``StandaloneCluster``: the ``Cluster`` port over the pods of a ``PodBucket`` and the
ResourceQuotas of a ``QuotaBucket`` (the same bucket), the Events kept in memory, and the
queries and writes the pod API and the pending loop need."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping

import msgspec
from nats.aio.client import Client

from common.core import PodManifest
from common.core.annotations import BIND_PHASE_ANNOTATION
from common.core.groups import GroupRef
from common.core.quota import ResourceQuotaManifest
from scheduler.cluster.port import (
    AllocationPhase,
    ClusterError,
    ClusterPod,
    DisruptionBudget,
    EventType,
    PodChange,
    QuotaChange,
)
from scheduler.cluster.standalone._bucket import BUCKET, SETTLE_PERIOD_S, PodBucket, open_bucket
from scheduler.cluster.standalone._quotas import QuotaBucket
from scheduler.cluster.standalone._wire import (
    PodEvent,
    StoredPod,
    StoredQuota,
    pod_key,
    quota_key,
)

EVENTS_KEPT = 20


class StandaloneCluster:
    """The pods of a ``PodBucket`` and the ResourceQuotas of a ``QuotaBucket`` as the
    ``Cluster`` port offers them, and the Events recorded on them (in memory, the last
    ``EVENTS_KEPT`` of each)."""

    def __init__(self, bucket: PodBucket, quotas: QuotaBucket) -> None:
        self._bucket = bucket
        self._quotas = quotas
        self._events: dict[str, deque[PodEvent]] = {}
        self._quota_events: dict[str, deque[PodEvent]] = {}

    @classmethod
    async def open(cls, connection: Client, refusal: Callable[[], str | None],
                   bucket: str = BUCKET, replicas: int = 1) -> StandaloneCluster:
        """The cluster over the bucket ``bucket`` (made when missing, kept on ``replicas``
        servers), every pod and quota read.

        ``refusal`` says why this daemon may not write the bucket now (a standby); None
        when it may."""
        kv = await open_bucket(connection, bucket, replicas)
        pods = PodBucket(kv, connection, bucket, refusal)
        quotas = QuotaBucket(kv, connection, bucket, refusal)
        await pods.load()
        await quotas.load()
        return cls(pods, quotas)

    def refusal(self) -> str | None:
        """Why this daemon may not write the bucket now (a standby); None when it may."""
        return self._bucket.refusal()

    async def reattach(self, connection: Client) -> None:
        """Use the bucket through a new NATS client (the old one was closed for good)."""
        await self._bucket.reattach(connection)
        await self._quotas.reattach(connection)

    async def reload(self) -> None:
        """Read every pod and quota afresh (this daemon was elected: another may have
        written)."""
        await self._bucket.reload()
        await self._quotas.reload()

    async def fence(self) -> int:
        """Write every pod no node holds again, unchanged, so that a bind the previous
        lease holder sent can no longer land (``FencedBucket.fence``); returns how many had
        been bound meanwhile. Raises what the bucket raises when it does not answer."""
        return await self._bucket.fence(lambda pod: pod.node is None)

    async def catch_up(self) -> int:
        """Take the pods written in a newer version than this daemon read (a predecessor's
        write that landed after this daemon's ``reload``), each told as a change, so that
        the ledger books a bind it lacks; returns how many."""
        return await self._bucket.catch_up()

    async def keep_settled(self, period: float = SETTLE_PERIOD_S) -> None:
        """Undo the writes that got no answer, once the bucket answers; runs forever."""
        await asyncio.gather(self._bucket.keep_settled(period),
                             self._quotas.keep_settled(period))

    # The Cluster port ---------------------------------------------------------

    async def list_pods(self) -> list[ClusterPod]:
        return [pod.cluster_pod() for pod in self._bucket.pods()]

    async def get_pod(self, namespace: str, name: str) -> ClusterPod | None:
        pod = self._bucket.get(pod_key(namespace, name))
        return pod.cluster_pod() if pod is not None else None

    async def device_cordons(self) -> dict[str, frozenset[str]]:
        """Standalone has no Node objects: cards are cordoned by their agent (--cordon)."""
        return {}

    async def node_registrations(self) -> dict[str, str]:
        """Standalone has no Node objects, hence no register annotation to read."""
        return {}

    async def register_node(self, node: str, value: str | None) -> None:
        """Standalone has no Node objects: HAMi-WebUI reads Kubernetes only."""

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: Mapping[str, str | None], *,
                   labels: Mapping[str, str] | None = None) -> None:
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
                             phase: AllocationPhase,
                             annotations: Mapping[str, str] | None = None) -> None:
        key = pod_key(namespace, name)
        what = f"setting the bind-phase of pod {namespace}/{name} to {phase}"
        async with self._bucket.writing(key) as pod:
            if pod is None:
                raise ClusterError(f"{what}: the pod no longer exists")
            if pod.uid != uid:
                raise ClusterError(f"{what}: uid {uid} is not the pod's ({pod.uid})")
            await self._bucket.replace(key, msgspec.structs.replace(
                pod, annotations={**pod.annotations, **(annotations or {}),
                                  BIND_PHASE_ANNOTATION: phase}), what)

    async def record_event(self, namespace: str, name: str, kind: EventType, reason: str,
                           message: str) -> None:
        _record(self._events, pod_key(namespace, name), kind, reason, message)

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

    async def group_size(self, group: GroupRef) -> int | None:
        """None: standalone keeps no PodGroup objects (its pod API refuses pods that
        declare a group by one; Kueue's count is on the pods themselves)."""
        return None

    async def list_quotas(self) -> list[ResourceQuotaManifest]:
        return [stored.manifest for stored in self._quotas.quotas()]

    def quota_changes(self) -> AsyncIterator[QuotaChange]:
        """The quotas' changes, this daemon's writes and, through the bucket's watch, every
        other daemon's."""
        return self._quotas.changes()

    async def record_quota_event(self, namespace: str, name: str, kind: EventType,
                                 reason: str, message: str) -> None:
        _record(self._quota_events, quota_key(namespace, name), kind, reason, message)

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

    # What the pod API needs of ResourceQuotas -------------------------------------

    async def put_quota(self, quota: StoredQuota, *, replace: bool) -> bool:
        """Store a quota; True when it is new. ``replace`` False: ``ClusterError`` when one
        exists under its name. The quota applies once stored (``quota_changes``).

        Raises ``StoreUnavailable`` (nothing applied) and ``EntryTooLarge``."""
        namespace, name = quota.manifest.namespace, quota.manifest.metadata.name
        key = quota_key(namespace, name)
        async with self._quotas.writing(key) as existing:
            verb = "create" if existing is None else "replace"
            what = f"{verb} ResourceQuota {namespace}/{name}"
            if existing is None:
                if not await self._quotas.create(key, quota, what):
                    raise ClusterError(f"ResourceQuota {namespace}/{name} was created "
                                       "meanwhile; try again")
                return True
            if not replace:
                raise ClusterError(f"ResourceQuota {namespace}/{name} already exists")
            await self._quotas.replace(key, quota, what)
            return False

    async def quotas_applied(self, timeout: float) -> bool:
        """Whether every quota change this daemon knows of was applied within ``timeout``
        seconds (``quota_changes`` read past it)."""
        applied = asyncio.ensure_future(self._quotas.applied())
        done, _ = await asyncio.wait({applied}, timeout=timeout)
        applied.cancel()
        return bool(done)

    async def delete_quota(self, namespace: str, name: str) -> bool:
        """Delete the quota and its Events; False when there is no such quota."""
        key = quota_key(namespace, name)
        async with self._quotas.writing(key):
            deleted = await self._quotas.delete(key, f"delete ResourceQuota {namespace}/{name}")
            if deleted:
                self._quota_events.pop(key, None)
            return deleted

    def quotas(self) -> list[StoredQuota]:
        """Every quota, by namespace and name."""
        return sorted(self._quotas.quotas(), key=lambda q: (q.manifest.namespace,
                                                            q.manifest.metadata.name))

    def quota(self, namespace: str, name: str) -> StoredQuota | None:
        return self._quotas.get(quota_key(namespace, name))

    def quota_events(self, namespace: str, name: str) -> list[PodEvent]:
        """The quota's Events (a quota this daemon refused to apply), the latest last."""
        return list(self._quota_events.get(quota_key(namespace, name), ()))


def _record(kept: dict[str, deque[PodEvent]], key: str, kind: EventType, reason: str,
            message: str) -> None:
    """One Event on the object under ``key``; a repeat raises the count of its entry."""
    events = kept.setdefault(key, deque(maxlen=EVENTS_KEPT))
    now = time.time()
    for event in events:
        if (event.type, event.reason, event.message) == (kind, reason, message):
            events.remove(event)  # a repeat: moved to the end, as the latest
            event.count += 1
            event.last_time = now
            events.append(event)
            return
    events.append(PodEvent(kind, reason, message, 1, now, now))
