"""``KubernetesCluster``: the ``Cluster`` port, and the Lease read that follows
kube-scheduler's leader, each call an async request on the daemon's event loop."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from datetime import UTC, datetime

import msgspec

from common.core.annotations import cordoned_uuids
from common.core.groups import GroupRef, GroupSource
from common.core.quota import ResourceQuotaManifest
from common.core.vendors import NVIDIA
from common.locks import KeyedLocks
from scheduler.cluster.kube import _client
from scheduler.cluster.kube._binding import PodBinder
from scheduler.cluster.kube._client import PODS, QUOTAS, Snapshot
from scheduler.cluster.kube._events import SeriesCache, write_event
from scheduler.cluster.kube._requests import (
    ObjectEvent,
    bind_phase_patch,
    bind_refusal,
    capacity_freed_patch,
    node_annotation_patch,
    timestamp,
)
from scheduler.cluster.kube._transport import (
    API_FAILURES,
    CONFLICT,
    NOT_FOUND,
    ApiTransport,
    answered_with,
    describe_failure,
)
from scheduler.cluster.kube._watch import UnreadableLog, follow
from scheduler.cluster.kube._wire import (
    CoschedulingPodGroup,
    DisruptionBudgetList,
    Lease,
    NodeList,
    PodToBind,
    WorkloadPodGroup,
    decode_pod,
    disruption_budget,
)
from scheduler.cluster.port import (
    SCHEDULER_NAME,
    AllocationPhase,
    ClusterError,
    ClusterPod,
    DisruptionBudget,
    EventType,
    PodChange,
    QuotaChange,
)

# The package's name: log lines name the package, not its private modules.
logger = logging.getLogger("scheduler.cluster.kube")

UID_CACHE_SIZE = 4096


class KubernetesCluster:
    """The ``Cluster`` port on a Kubernetes API server, and ``FollowedLease``'s read of
    kube-scheduler's Lease (``LeaseReader``). Built by ``Kubernetes`` over the transport its
    other parts share, which closes it."""

    def __init__(self, api: ApiTransport, *,
                 scheduler_name: str = SCHEDULER_NAME, instance: str | None = None) -> None:
        self._api = api
        self.scheduler_name = scheduler_name
        self.instance = (instance or f"{scheduler_name}-{socket.gethostname()}")[:128]
        # Pod uids for events, most recently seen last; touched on the event loop only.
        self._uids: dict[str, str] = {}
        # Events written, to count their repeats; touched on the event loop only.
        self._event_series = SeriesCache()
        self._event_writes = KeyedLocks()
        # The pods changes() has delivered, by "namespace/name", while it is iterated: what
        # /bind checks without reading the pod. Touched on the event loop only.
        self._watched: dict[str, ClusterPod] = {}
        # The last list_pods(): changes() watches on from it, so nothing in between is lost.
        self._snapshot: Snapshot[ClusterPod] | None = None
        # The same for list_quotas() and quota_changes().
        self._quota_snapshot: Snapshot[ResourceQuotaManifest] | None = None
        # ResourceQuota uids by "namespace/name", as last listed or watched, for the Events
        # on them (involvedObject.uid); touched on the event loop only.
        self._quota_uids: dict[str, str] = {}
        self.unreadable = UnreadableLog((PODS.noun, QUOTAS.noun))
        """The objects the API sent that did not decode, logged and counted."""
        self._binder = PodBinder(api, scheduler_name)

    # Reads ---------------------------------------------------------------------------

    async def list_pods(self) -> list[ClusterPod]:
        try:
            snapshot = await _client.list_all(self._api, PODS)
        except API_FAILURES as error:
            raise ClusterError(f"listing pods failed: {describe_failure(error)}") from error
        self.unreadable.report(PODS.noun, snapshot.unreadable)
        self._snapshot = snapshot
        return snapshot.items

    async def list_quotas(self) -> list[ResourceQuotaManifest]:
        try:
            snapshot = await _client.list_all(self._api, QUOTAS)
        except API_FAILURES as error:
            raise ClusterError(
                f"listing ResourceQuotas failed: {describe_failure(error)}") from error
        self.unreadable.report(QUOTAS.noun, snapshot.unreadable)
        self._quota_snapshot = snapshot
        self._quota_uids = {quota.key: quota.metadata.uid for quota in snapshot.items
                            if quota.metadata.uid}
        return snapshot.items

    async def get_pod(self, namespace: str, name: str) -> ClusterPod | None:
        try:
            pod = decode_pod(await _client.read_pod(self._api, namespace, name))
        except API_FAILURES as error:
            if answered_with(error, NOT_FOUND):
                return None
            raise ClusterError(
                f"reading pod {namespace}/{name} failed: {describe_failure(error)}") from error
        self._remember_uid(pod.key, pod.uid)
        return pod

    async def device_cordons(self) -> dict[str, frozenset[str]]:
        try:
            data = await _client.list_nodes(self._api)
            nodes = msgspec.json.decode(data, type=NodeList).items
        except API_FAILURES as error:
            raise ClusterError(f"listing nodes failed: {describe_failure(error)}") from error
        return {node.metadata.name: cordoned_uuids(node.metadata.annotations or {})
                for node in nodes}

    async def node_registrations(self) -> dict[str, str]:
        try:
            data = await _client.list_nodes(self._api)
            nodes = msgspec.json.decode(data, type=NodeList).items
        except API_FAILURES as error:
            raise ClusterError(f"listing nodes failed: {describe_failure(error)}") from error
        return {node.metadata.name: registered
                for node in nodes
                if (registered := (node.metadata.annotations or {}).get(NVIDIA.register_annotation))
                is not None}

    async def register_node(self, node: str, value: str | None) -> None:
        action = "removing" if value is None else "writing"
        what = f"{action} {NVIDIA.register_annotation} on node {node}"
        try:
            await _client.patch_node(self._api, node,
                                     node_annotation_patch(NVIDIA.register_annotation, value))
        except API_FAILURES as error:
            if value is None and answered_with(error, NOT_FOUND):
                return  # the Node is gone, and its annotation with it
            raise ClusterError(f"{what} failed: {describe_failure(error)}") from error

    async def lease_holder(self, namespace: str, name: str) -> str | None:
        try:
            data = await _client.read_lease(self._api, namespace, name)
            return msgspec.json.decode(data, type=Lease).spec.holder_identity or ""
        except API_FAILURES as error:
            if answered_with(error, NOT_FOUND):
                return None
            raise ClusterError(f"reading Lease {namespace}/{name} failed: "
                               f"{describe_failure(error)}") from error

    # Writes --------------------------------------------------------------------------

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: Mapping[str, str | None], *,
                   labels: Mapping[str, str] | None = None) -> None:
        key = f"{namespace}/{name}"
        await self._binder.bind(namespace, name, uid, node, dict(annotations),
                                watched=self._watched.get(key), labels=labels)
        self._remember_uid(key, uid)

    async def retry_pod(self, namespace: str, name: str, stamp: str) -> None:
        try:
            await self._retry_pod(namespace, name, stamp)
        except API_FAILURES as error:
            # Gone, or changed since it was read: nothing to nudge (a change is a retry).
            if not (answered_with(error, NOT_FOUND) or answered_with(error, CONFLICT)):
                logger.warning("pod %s/%s not nudged to retry: %s", namespace, name,
                               describe_failure(error))

    async def _retry_pod(self, namespace: str, name: str, stamp: str) -> None:
        """Stamp the pod as read, if it is pyhami's: the pod /filter was sent is the
        caller's word, whoever the caller was, never a licence to write on any pod."""
        pod = msgspec.json.decode(await _client.read_pod(self._api, namespace, name),
                                  type=PodToBind)
        refusal = bind_refusal(pod, "", self.scheduler_name)
        if refusal is not None:
            logger.info("pod %s/%s not nudged to retry: %s", namespace, name, refusal)
            return
        await _client.patch_pod(self._api, namespace, name, capacity_freed_patch(
            stamp, pod.metadata.uid or "", pod.metadata.resource_version))

    async def set_bind_phase(self, namespace: str, name: str, uid: str,
                             phase: AllocationPhase,
                             annotations: Mapping[str, str] | None = None) -> None:
        what = f"setting the bind-phase of pod {namespace}/{name} to {phase}"
        try:
            await _client.patch_pod(self._api, namespace, name,
                                    bind_phase_patch(uid, phase, annotations))
        except API_FAILURES as error:
            if answered_with(error, NOT_FOUND):
                raise ClusterError(f"{what}: the pod no longer exists") from error
            raise ClusterError(f"{what}: {describe_failure(error)}") from error

    async def record_event(self, namespace: str, name: str, kind: EventType, reason: str,
                           message: str) -> None:
        """Write the Event, or count one more of it when it was written before
        (``_events``)."""
        # Best effort by contract: whatever goes wrong is logged, never raised.
        try:
            uid = await self._pod_uid(namespace, name)
            await self._record(ObjectEvent.of(namespace, name, uid=uid, kind=kind,
                                              reason=reason, message=message,
                                              component=self.scheduler_name))
        except Exception as error:
            logger.warning("event %s on pod %s/%s not recorded: %s", reason, namespace, name,
                           describe_failure(error))

    async def record_quota_event(self, namespace: str, name: str, kind: EventType,
                                 reason: str, message: str) -> None:
        """The same, about a ResourceQuota; its uid as last listed or watched (the daemon
        may list and watch ResourceQuotas, not read one)."""
        try:
            await self._record(ObjectEvent.of(
                namespace, name, uid=self._quota_uids.get(f"{namespace}/{name}"), kind=kind,
                reason=reason, message=message, component=self.scheduler_name,
                involved_kind="ResourceQuota"))
        except Exception as error:
            logger.warning("event %s on ResourceQuota %s/%s not recorded: %s", reason,
                           namespace, name, describe_failure(error))

    async def _record(self, event: ObjectEvent) -> None:
        key = event.series_key
        async with self._event_writes.hold(key):  # one write of an Event at a time
            series = await write_event(self._api, event, self._event_series.get(key),
                                       timestamp(datetime.now(UTC)), instance=self.instance)
            self._event_series.put(key, series)

    async def evict(self, namespace: str, name: str, uid: str) -> None:
        try:
            await _client.delete_pod(self._api, namespace, name, uid)
        except API_FAILURES as error:
            if answered_with(error, NOT_FOUND):
                return  # gone already: what eviction wanted
            raise ClusterError(f"deleting pod {namespace}/{name} to preempt it failed: "
                               f"{describe_failure(error)}") from error

    async def disruption_budgets(self) -> list[DisruptionBudget]:
        try:
            data = await _client.list_disruption_budgets(self._api)
            budgets = msgspec.json.decode(data, type=DisruptionBudgetList).items
        except API_FAILURES as error:
            raise ClusterError(f"listing PodDisruptionBudgets failed: "
                               f"{describe_failure(error)}") from error
        return [disruption_budget(budget) for budget in budgets]

    async def group_size(self, group: GroupRef) -> int | None:
        coscheduling = group.source is GroupSource.COSCHEDULING
        group_api = (_client.COSCHEDULING_POD_GROUPS if coscheduling
                     else _client.WORKLOAD_POD_GROUPS)
        try:
            data = await _client.read_pod_group(self._api, group_api, group.namespace,
                                                group.name)
            if coscheduling:
                return msgspec.json.decode(data, type=CoschedulingPodGroup).spec.min_member
            return msgspec.json.decode(data, type=WorkloadPodGroup).count
        except API_FAILURES as error:
            if answered_with(error, NOT_FOUND):
                return None
            raise ClusterError(f"reading PodGroup {group.key} ({group_api}) failed: "
                               f"{describe_failure(error)}") from error
        except msgspec.DecodeError as error:
            raise ClusterError(f"PodGroup {group.key} ({group_api}) is unreadable: "
                               f"{error}") from error

    async def _pod_uid(self, namespace: str, name: str) -> str | None:
        uid = self._uids.get(f"{namespace}/{name}")
        if uid is None:
            try:
                pod = await self.get_pod(namespace, name)
            except ClusterError as error:
                logger.debug("uid of pod %s/%s unknown: %s", namespace, name, error)
                return None
            uid = pod.uid if pod is not None else None
        return uid

    def _remember_uid(self, key: str, uid: str) -> None:
        if not uid:
            return
        self._uids.pop(key, None)
        self._uids[key] = uid
        if len(self._uids) > UID_CACHE_SIZE:
            del self._uids[next(iter(self._uids))]

    # Changes -------------------------------------------------------------------------

    async def changes(self) -> AsyncIterator[PodChange]:
        """Pod changes from a watch on all namespaces, for as long as it is iterated.

        Starts after the last ``list_pods()`` when there was one; otherwise (and whenever
        the watch has expired) with a list, given as deletions of the pods that are gone
        then changes for every pod there is.
        """
        snapshot, self._snapshot = self._snapshot, None
        try:
            async with aclosing(follow(self._api, PODS, snapshot, self.unreadable)) as changes:
                async for change in changes:
                    key = change.pod.key
                    if change.deleted:
                        self._uids.pop(key, None)
                        if ((gone := self._watched.get(key)) is not None
                                and gone.uid == change.pod.uid):
                            del self._watched[key]
                    else:
                        self._remember_uid(key, change.pod.uid)
                        self._watched[key] = change.pod
                    yield change
        finally:
            self._watched.clear()  # no longer kept up to date

    async def quota_changes(self) -> AsyncIterator[QuotaChange]:
        """ResourceQuota changes from a watch on all namespaces, as ``changes()`` gives the
        pods': after the last ``list_quotas()``, else (and after a 410) from a list."""
        snapshot, self._quota_snapshot = self._quota_snapshot, None
        async with aclosing(follow(self._api, QUOTAS, snapshot, self.unreadable)) as changes:
            async for change in changes:
                quota = change.quota
                if change.deleted:
                    self._quota_uids.pop(quota.key, None)
                elif quota.metadata.uid:
                    self._quota_uids[quota.key] = quota.metadata.uid
                yield change
