"""The ``Cluster`` port: what the daemon reads from and writes to the cluster it serves.

Two implementations: Kubernetes (``scheduler.cluster.kube``) and standalone
(``scheduler.cluster.standalone``, pods kept in a NATS JetStream key-value bucket). The
``WebhookCluster`` port, for the webhook's self-managed certificate, only on Kubernetes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from common.core import Allocation, AnnotationError, PodManifest
from common.core.annotations import ALLOCATED_ANNOTATION, NODE_ANNOTATION, decode_allocation
from common.core.errors import ExternalFailure
from common.core.groups import GroupRef
from common.core.mig import MIG_ALLOCATIONS_ANNOTATION
from common.core.pod import DEFAULT_NAMES, QuotaSubject
from common.core.quota import ResourceQuotaManifest
from common.core.vendors import ResourceNames
from common.core.workloads import AdmissionCheck, CheckState, PodSetUpdate, Workload
from scheduler.errors import SchedulerError

SCHEDULER_NAME = "pyhami-scheduler"
"""The ``schedulerName`` pyhami serves unless ``--scheduler-name`` says otherwise."""
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
# Changing a pending pod makes kube-scheduler try it again at once; pyhami stamps
# this annotation on the pods it refused whenever cards are freed.
CAPACITY_FREED_ANNOTATION = "pyhami.io/capacity-freed"

EventType = Literal["Normal", "Warning"]
AllocationPhase = Literal["success", "failed"]
"""The ``hami.io/bind-phase`` a pod gets once its node's device plugin served it."""


class ClusterError(SchedulerError, ExternalFailure):
    """A cluster operation that failed or was refused; the message says which and why.
    The Kubernetes client's and NATS's own errors are mapped to it where they are called."""


class StoreUnavailable(ClusterError):
    """The pod store could not be written: nothing was applied, or what may have reached
    it is undone once it answers again. The pod API answers 503."""


@dataclass(frozen=True, slots=True)
class ClusterPod:
    """A pod as the cluster holds it."""

    manifest: PodManifest
    uid: str
    node: str | None
    phase: str
    annotations: Mapping[str, str]
    started: float = 0.0
    """When it started (else when it was created), seconds since the epoch."""
    version: str | None = field(default=None, compare=False)
    """The resourceVersion it was read at, where the cluster has one (Kubernetes): a
    write can be made on condition that the pod is still this version."""

    @property
    def namespace(self) -> str:
        return self.manifest.namespace

    @property
    def name(self) -> str:
        return self.manifest.metadata.name

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def priority(self) -> int:
        return self.manifest.spec.priority or 0

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES

    def allocation(self, names: ResourceNames = DEFAULT_NAMES) -> Allocation | None:
        """The cards the pod holds, from its annotations; None when it holds none.

        Only a bound, unfinished pod that asks for a GPU holds cards: an allocation
        annotation its author wrote on a pod without GPUs books nothing. Raises
        ``AnnotationError``.
        """
        text = self.annotations.get(ALLOCATED_ANNOTATION)
        node = self.node or self.annotations.get(NODE_ANNOTATION)
        if (not text or self.node is None or node is None or self.finished
                or not self.manifest.asks_for_gpu(names)):
            return None
        containers = decode_allocation(text, self.annotations.get(MIG_ALLOCATIONS_ANNOTATION, ""))
        init_count = len(self.manifest.spec.init_containers or ())
        return Allocation(node, containers, min(init_count, len(containers)),
                          QuotaSubject.of(self.manifest))


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist
    values: tuple[str, ...] = ()

    def holds(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        return False  # an operator the API server would have refused


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    """A PodDisruptionBudget: which pods of its namespace it covers, and how many more of
    them may go now."""

    namespace: str
    selected: bool
    """False for a budget without a selector: it covers no pod."""
    match_labels: Mapping[str, str]
    match_expressions: tuple[LabelRequirement, ...]
    disruptions_allowed: int

    def covers(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether the budget covers a pod (an empty selector covers its whole namespace)."""
        return (self.selected and namespace == self.namespace
                and all(labels.get(key) == value for key, value in self.match_labels.items())
                and all(requirement.holds(labels) for requirement in self.match_expressions))


@dataclass(frozen=True, slots=True)
class PodChange:
    pod: ClusterPod
    deleted: bool


@dataclass(frozen=True, slots=True)
class QuotaChange:
    """A ResourceQuota added or changed (``deleted`` False) or deleted, as stored."""

    quota: ResourceQuotaManifest
    deleted: bool


class Cluster(Protocol):
    async def list_pods(self) -> list[ClusterPod]:
        """Every pod, to rebuild the ledger at start."""
        ...

    async def get_pod(self, namespace: str, name: str) -> ClusterPod | None: ...

    async def device_cordons(self) -> dict[str, frozenset[str]]:
        """Per node, the card UUIDs its ``hami.io/device-cordon`` annotation lists."""
        ...

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: Mapping[str, str | None], *,
                   labels: Mapping[str, str] | None = None) -> None:
        """Write ``annotations`` on the pod (None removes one), then bind it to ``node``;
        on Kubernetes the pod gets ``labels`` too (from 1.35, in the same write: docs/
        scheduler.md, "HAMi-WebUI and the node annotation"); standalone pods have none.

        Raises ``ClusterError`` when either step fails.
        """
        ...

    async def set_bind_phase(self, namespace: str, name: str, uid: str,
                             phase: AllocationPhase,
                             annotations: Mapping[str, str] | None = None) -> None:
        """Write ``hami.io/bind-phase: phase`` on the pod, only if it is still uid ``uid``,
        and ``annotations`` with it in the same write (the MIG reservations completed with
        the instances the node made).

        Raises ``ClusterError`` when the pod is gone, re-created, or the write fails.
        """
        ...

    async def record_event(self, namespace: str, name: str, kind: EventType, reason: str,
                           message: str) -> None:
        """Best effort: an event that cannot be written is logged, not raised."""
        ...

    async def node_registrations(self) -> dict[str, str]:
        """Per Node, its ``hami.io/node-nvidia-register`` annotation as the cluster holds it
        now (a Node without it is left out); empty where there are no Node objects
        (standalone). Raises ``ClusterError``."""
        ...

    async def register_node(self, node: str, value: str | None) -> None:
        """Set the Node's ``hami.io/node-nvidia-register`` annotation to ``value`` (None
        removes it), leaving the rest of the Node alone; a removal from a Node that no
        longer exists is done. Nothing where there are no Node objects (standalone).
        Raises ``ClusterError``."""
        ...

    async def evict(self, namespace: str, name: str, uid: str) -> None:
        """Delete the pod, only if it is still uid ``uid``, to preempt it; its cards are
        freed when its deletion is seen. Raises ``ClusterError``."""
        ...

    async def disruption_budgets(self) -> list[DisruptionBudget]:
        """Every PodDisruptionBudget (none outside Kubernetes). Raises ``ClusterError``."""
        ...

    async def retry_pod(self, namespace: str, name: str, stamp: str) -> None:
        """Ask the scheduler to try a waiting pod again, now that cards were freed.

        Best effort, like ``record_event``.
        """
        ...

    def changes(self) -> AsyncIterator[PodChange]:
        """Pod updates and deletions, for as long as the daemon runs."""
        ...

    async def group_size(self, group: GroupRef) -> int | None:
        """The member count of the PodGroup object ``group``'s declaration names (the
        coscheduling plugin's ``spec.minMember``, Kubernetes' own
        ``spec.schedulingPolicy.gang.minCount``, 1 for its ``basic`` policy), as stored,
        unchecked; None while there is no such object (and always where the cluster keeps
        none: standalone). Raises ``ClusterError`` when it cannot be read."""
        ...

    async def list_quotas(self) -> list[ResourceQuotaManifest]:
        """Every ResourceQuota of every namespace, whatever its keys, to read them at start.
        Raises ``ClusterError``."""
        ...

    def quota_changes(self) -> AsyncIterator[QuotaChange]:
        """ResourceQuota additions, updates and deletions, for as long as the daemon runs,
        from the last ``list_quotas`` on (after a lost watch: the quotas listed afresh,
        as changes, those gone as deletions)."""
        ...

    async def record_quota_event(self, namespace: str, name: str, kind: EventType,
                                 reason: str, message: str) -> None:
        """An Event on a ResourceQuota; best effort, like ``record_event``."""
        ...


class WebhookCluster(Protocol):
    """What the daemon reads and writes to serve its webhook with a certificate of its own
    (``scheduler.tls.webhook``). Every call raises ``ClusterError`` when it fails."""

    async def read_secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        """The Secret's data, decoded; None when there is no such Secret."""
        ...

    async def create_tls_secret(self, namespace: str, name: str,
                                data: Mapping[str, bytes]) -> bool:
        """Create a ``kubernetes.io/tls`` Secret holding ``data``; False when a Secret of
        that name exists already."""
        ...

    async def webhook_ca_bundles(self, configuration: str) -> list[tuple[str, bytes]] | None:
        """Each webhook of the MutatingWebhookConfiguration, in its order, with its
        ``clientConfig.caBundle`` (empty when unset); None when there is no such
        configuration."""
        ...

    async def set_webhook_ca_bundle(self, configuration: str,
                                    webhooks: Sequence[tuple[int, str]], ca: bytes) -> None:
        """Set to ``ca`` the ``caBundle`` of these webhooks (position in the configuration,
        name); nothing changes when the configuration no longer lists them there."""
        ...


# Kueue ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkloadChange:
    """A Kueue Workload added or changed (``deleted`` False) or deleted, as stored."""

    workload: Workload
    deleted: bool


@dataclass(frozen=True, slots=True)
class AdmissionCheckChange:
    """A Kueue AdmissionCheck added or changed, or deleted."""

    check: AdmissionCheck
    deleted: bool


@dataclass(frozen=True, slots=True)
class CheckUpdate:
    """What pyhami's check says on a Workload: its state, the message, and for ``Ready``
    the annotations Kueue adds to the pods of each pod set."""

    state: CheckState
    message: str
    pod_set_updates: tuple[PodSetUpdate, ...] = ()


class KueueApi(Protocol):
    """Kueue's objects, for pyhami's admission check (Kubernetes with Kueue only)."""

    def workload_changes(self) -> AsyncIterator[WorkloadChange]:
        """Every Workload from a list, then their changes, for as long as it is
        iterated."""
        ...

    def admission_check_changes(self) -> AsyncIterator[AdmissionCheckChange]:
        """Every AdmissionCheck from a list, then their changes."""
        ...

    async def set_check(self, workload: Workload, check: str, update: CheckUpdate) -> None:
        """Write the state of ``check`` on ``workload`` (its status, the check's entry
        alone). Raises ``ClusterError``."""

    async def activate_check(self, name: str, message: str) -> None:
        """Mark the AdmissionCheck ``name`` Active (Kueue holds back a ClusterQueue whose
        checks are not). Raises ``ClusterError``."""


__all__ = ["AdmissionCheckChange", "AllocationPhase", "AnnotationError", "CheckUpdate",
           "Cluster", "ClusterError", "ClusterPod", "DisruptionBudget", "KueueApi",
           "LabelRequirement", "PodChange", "QuotaChange", "StoreUnavailable",
           "WebhookCluster", "WorkloadChange"]
