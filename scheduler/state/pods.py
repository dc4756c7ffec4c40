"""The pods in flight: what the daemon remembers of pods between the verbs and the cluster's
changes, beyond the cards booked for them (``cache``).

kube-scheduler keeps the same kinds of memory in its scheduling queue (the pods that did
not fit, moved back when the cluster changes) and its cache (the pods bound to nodes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from common.core import PodManifest
from scheduler.cluster import ClusterPod

ENDS_REMEMBERED = 4096
"""Pods whose end is remembered (``end_mark``), the most recent."""


class PodsInFlight:
    """Per pod, by ``namespace/name``; ``ended`` forgets a pod everywhere at once."""

    def __init__(self) -> None:
        self._filtered: dict[str, PodManifest] = {}
        # Pods /filter refused, to have retried when cards are freed: kube-scheduler may
        # have retried them a moment before pyhami saw the release, and then waits minutes.
        self._unschedulable: dict[str, tuple[str, str]] = {}
        self._bound: dict[str, ClusterPod] = {}
        # The bound pods by uid: the node's agent names measured usage by it.
        self._bound_by_uid: dict[str, ClusterPod] = {}
        self._allocate_answered: set[str] = set()
        self._ends = 0
        self._last_end: dict[str, int] = {}
        """Per pod, the number of its last end (of all the ends seen), the most recent
        ``ENDS_REMEMBERED`` pods: a bind under way when its pod ended tells by it."""

    # /filter, then /bind ------------------------------------------------------------------

    def filtered(self, key: str, manifest: PodManifest) -> None:
        """/filter saw the pod: /bind can decide again without asking the cluster."""
        self._filtered[key] = manifest

    def manifest(self, key: str) -> PodManifest | None:
        """The pod as /filter last saw it."""
        return self._filtered.get(key)

    def forget_manifest(self, key: str) -> None:
        self._filtered.pop(key, None)

    # The pods that did not fit ------------------------------------------------------------

    def unschedulable(self, key: str, namespace: str, name: str) -> None:
        """/filter found no node for the pod: it is asked for again when cards are freed."""
        self._unschedulable[key] = (namespace, name)

    def scheduled(self, key: str) -> None:
        """/filter found the pod a node: nothing to ask for again."""
        self._unschedulable.pop(key, None)

    def any_unschedulable(self) -> bool:
        return bool(self._unschedulable)

    def take_unschedulable(self) -> list[tuple[str, str]]:
        """The pods to ask the cluster to retry, as (namespace, name), forgotten here."""
        waiting = list(self._unschedulable.values())
        self._unschedulable.clear()
        return waiting

    # The pods bound to nodes --------------------------------------------------------------

    def bound(self, pod: ClusterPod) -> None:
        """A pod bound to a node that asks for GPUs, as last seen: who may be preempted,
        with the priority and start time preemption weighs."""
        before = self._bound.get(pod.key)
        if before is not None:
            self._bound_by_uid.pop(before.uid, None)
        self._bound[pod.key] = pod
        self._bound_by_uid[pod.uid] = pod

    def bound_pods(self) -> Mapping[str, ClusterPod]:
        """The bound GPU pods by key, read-only."""
        return MappingProxyType(self._bound)

    def bound_by_uid(self, uid: str) -> ClusterPod | None:
        """The bound GPU pod of this uid, if the daemon knows one."""
        return self._bound_by_uid.get(uid)

    def keep_bound(self, keys: Iterable[str]) -> None:
        """Keep only these of the bound pods (a rebuilt ledger holds no others)."""
        self._bound = {key: self._bound[key] for key in keys if key in self._bound}
        self._bound_by_uid = {pod.uid: pod for pod in self._bound.values()}

    def allocate_answered(self, key: str) -> None:
        """The node's device plugin answered the kubelet's Allocate for the pod (its
        bind-phase is success or failed): an allocations request no longer reads it."""
        self._allocate_answered.add(key)

    def is_allocate_answered(self, key: str) -> bool:
        return key in self._allocate_answered

    # A pod that ended ---------------------------------------------------------------------

    def end_mark(self, key: str) -> int:
        """The number of the pod's last end (0: none remembered). Read before an await and
        again after it: a different number says the pod ended meanwhile."""
        return self._last_end.get(key, 0)

    def ended(self, key: str) -> None:
        """The pod was deleted or finished: nothing of it is kept (but that it ended)."""
        self._ends += 1
        self._last_end.pop(key, None)
        self._last_end[key] = self._ends
        if len(self._last_end) > ENDS_REMEMBERED:
            del self._last_end[next(iter(self._last_end))]
        self._filtered.pop(key, None)
        self._unschedulable.pop(key, None)
        self._allocate_answered.discard(key)
        pod = self._bound.pop(key, None)
        if pod is not None:
            self._bound_by_uid.pop(pod.uid, None)
