"""The API's JSON, decoded by msgspec to the few fields pyhami reads.

Fields pyhami does not read are skipped by the decoder, never built: see the package's
docstring for why the client's own models are not used.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import msgspec

from common.core import PodManifest
from common.core.pod import ObjectMeta, PodSpec
from common.core.quota import QuotaSpec, ResourceQuotaManifest
from scheduler.cluster.port import ClusterPod, DisruptionBudget, LabelRequirement


class Metadata(msgspec.Struct, rename="camel"):
    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    resource_version: str | None = None
    creation_timestamp: datetime | None = None


class PodStatus(msgspec.Struct, rename="camel"):
    phase: str = "Unknown"
    start_time: datetime | None = None


class Pod(msgspec.Struct):
    metadata: Metadata = msgspec.field(default_factory=Metadata)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus = msgspec.field(default_factory=PodStatus)


class SchedulingSpec(msgspec.Struct, rename="camel"):
    node_name: str | None = None
    scheduler_name: str = "default-scheduler"  # the API server's default


class PodToBind(msgspec.Struct):
    """What /bind checks on the pod before writing to it."""

    metadata: Metadata = msgspec.field(default_factory=Metadata)
    spec: SchedulingSpec = msgspec.field(default_factory=SchedulingSpec)
    status: PodStatus = msgspec.field(default_factory=PodStatus)


def pod_to_bind(pod: ClusterPod) -> PodToBind:
    """What /bind checks, from a pod the watch delivered."""
    spec = SchedulingSpec(node_name=pod.node)
    if pod.manifest.spec.scheduler_name is not None:
        spec.scheduler_name = pod.manifest.spec.scheduler_name
    return PodToBind(metadata=Metadata(uid=pod.uid), spec=spec,
                     status=PodStatus(phase=pod.phase))


class ListMeta(msgspec.Struct):
    resource_version: str = msgspec.field(default="", name="resourceVersion")
    continue_token: str = msgspec.field(default="", name="continue")


class RawList(msgspec.Struct):
    """One page of a list, its items left raw: each is decoded on its own, so that one
    that does not decode costs that one alone, not the page."""

    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[msgspec.Raw] = []


class Node(msgspec.Struct):
    """A Node, or any object read for its metadata alone (a watch bookmark)."""

    metadata: Metadata = msgspec.field(default_factory=Metadata)


class ResourceQuota(msgspec.Struct):
    """A v1 ResourceQuota as the API sends it: what pyhami applies (``spec``), and the
    metadata the watch and the Events on it need."""

    metadata: Metadata = msgspec.field(default_factory=Metadata)
    spec: QuotaSpec = msgspec.field(default_factory=QuotaSpec)


class NodeList(msgspec.Struct):
    items: list[Node] = []


class Requirement(msgspec.Struct):
    key: str = ""
    operator: str = ""
    values: list[str] | None = None


class Selector(msgspec.Struct, rename="camel"):
    match_labels: dict[str, str] | None = None
    match_expressions: list[Requirement] | None = None


class BudgetSpec(msgspec.Struct):
    selector: Selector | None = None


class BudgetStatus(msgspec.Struct, rename="camel"):
    disruptions_allowed: int = 0


class PodDisruptionBudget(msgspec.Struct):
    """A policy/v1 PodDisruptionBudget as the API sends it."""

    metadata: Metadata = msgspec.field(default_factory=Metadata)
    spec: BudgetSpec = msgspec.field(default_factory=BudgetSpec)
    status: BudgetStatus = msgspec.field(default_factory=BudgetStatus)


class _CoschedulingSpec(msgspec.Struct, rename="camel"):
    min_member: int = 0


class CoschedulingPodGroup(msgspec.Struct):
    """The coscheduling plugin's PodGroup (``scheduling.x-k8s.io/v1alpha1``), as far as
    pyhami reads it."""

    spec: _CoschedulingSpec = msgspec.field(default_factory=_CoschedulingSpec)


class _Gang(msgspec.Struct, rename="camel"):
    min_count: int = 0


class _GroupPolicy(msgspec.Struct):
    gang: _Gang | None = None
    basic: dict[str, object] | None = None


class _WorkloadGroupSpec(msgspec.Struct, rename="camel"):
    scheduling_policy: _GroupPolicy = msgspec.field(default_factory=_GroupPolicy)


class WorkloadPodGroup(msgspec.Struct):
    """Kubernetes' own PodGroup (``scheduling.k8s.io/v1alpha2``), as far as pyhami reads
    it: a ``gang`` policy's ``minCount``; ``basic`` is no gang (a count of 1)."""

    spec: _WorkloadGroupSpec = msgspec.field(default_factory=_WorkloadGroupSpec)

    @property
    def count(self) -> int:
        policy = self.spec.scheduling_policy
        return policy.gang.min_count if policy.gang is not None else 1


class DisruptionBudgetList(msgspec.Struct):
    items: list[PodDisruptionBudget] = []


class LeaseSpec(msgspec.Struct, rename="camel"):
    holder_identity: str | None = None


class Lease(msgspec.Struct):
    spec: LeaseSpec = msgspec.field(default_factory=LeaseSpec)


class Secret(msgspec.Struct):
    data: dict[str, bytes] | None = None  # base64 on the wire


class ClientConfig(msgspec.Struct, rename="camel"):
    ca_bundle: bytes = b""  # base64 on the wire


class Webhook(msgspec.Struct, rename="camel"):
    name: str
    client_config: ClientConfig = msgspec.field(default_factory=ClientConfig)


class WebhookConfiguration(msgspec.Struct):
    webhooks: list[Webhook] | None = None


class WatchEvent(msgspec.Struct):
    type: str
    object: msgspec.Raw


class StoredEvent(msgspec.Struct, rename="camel"):
    """What a repeat reads of an Event this daemon wrote before it last started."""

    count: int = 1
    first_timestamp: str | None = None


class ReviewedUser(msgspec.Struct):
    username: str = ""
    extra: dict[str, list[str]] | None = None


class TokenReviewStatus(msgspec.Struct):
    authenticated: bool = False
    user: ReviewedUser = msgspec.field(default_factory=ReviewedUser)
    audiences: list[str] | None = None
    error: str = ""


class TokenReview(msgspec.Struct):
    status: TokenReviewStatus = msgspec.field(default_factory=TokenReviewStatus)


class Status(msgspec.Struct):
    """metav1.Status: the body of an API error and of a watch ERROR event."""

    code: int = 0
    reason: str = ""
    message: str = ""


def cluster_pod(pod: Pod) -> ClusterPod:
    meta = pod.metadata
    annotations = meta.annotations or {}
    manifest = PodManifest(
        metadata=ObjectMeta(name=meta.name, namespace=meta.namespace, uid=meta.uid,
                            annotations=annotations, labels=meta.labels),
        spec=pod.spec,
    )
    # Not started yet (or no kubelet reports it): when it was created.
    started = pod.status.start_time or meta.creation_timestamp
    return ClusterPod(manifest=manifest, uid=meta.uid or "", node=pod.spec.node_name,
                      phase=pod.status.phase, annotations=annotations,
                      started=started.timestamp() if started is not None else 0.0,
                      version=meta.resource_version)


_pods = msgspec.json.Decoder(Pod)  # kept: every pod of a watch or a list goes through it


def decode_pod(data: bytes | str) -> ClusterPod:
    """A pod from the API's JSON (a v1.Pod). Raises ``msgspec.DecodeError``."""
    return cluster_pod(_pods.decode(data))


def pod_and_version(data: bytes) -> tuple[ClusterPod, str | None]:
    """A pod of a list or a watch event, and its resourceVersion. Raises
    ``msgspec.DecodeError``."""
    pod = _pods.decode(data)
    return cluster_pod(pod), pod.metadata.resource_version


class _PodEvent(msgspec.Struct):
    """A watch event of a pod, decoded whole in one pass."""

    type: str
    object: Pod


class _QuotaEvent(msgspec.Struct):
    type: str
    object: ResourceQuota


_pod_events = msgspec.json.Decoder(_PodEvent)
_quota_events = msgspec.json.Decoder(_QuotaEvent)


def pod_event(line: bytes) -> tuple[str, ClusterPod, str | None]:
    """A watch event whose object is a pod: its type, the pod, its resourceVersion.
    Raises ``msgspec.DecodeError``, for the event read again in steps (``WatchEvent``)."""
    event = _pod_events.decode(line)
    return event.type, cluster_pod(event.object), event.object.metadata.resource_version


def quota_event(line: bytes) -> tuple[str, ResourceQuotaManifest, str | None]:
    """A watch event whose object is a ResourceQuota, as ``pod_event`` reads a pod's."""
    event = _quota_events.decode(line)
    return (event.type, *_quota_manifest(event.object))


def quota_and_version(data: bytes) -> tuple[ResourceQuotaManifest, str | None]:
    """A ResourceQuota of a list or a watch event, as the decision core reads it, and its
    resourceVersion. Raises ``msgspec.DecodeError``."""
    return _quota_manifest(msgspec.json.decode(data, type=ResourceQuota))


def _quota_manifest(quota: ResourceQuota) -> tuple[ResourceQuotaManifest, str | None]:
    meta = quota.metadata
    manifest = ResourceQuotaManifest(
        metadata=ObjectMeta(name=meta.name, namespace=meta.namespace, uid=meta.uid),
        spec=quota.spec)
    return manifest, meta.resource_version


@dataclass(frozen=True, slots=True)
class Unreadable:
    """An object the API sent that does not decode, named as far as its metadata allows."""

    key: str
    """``namespace/name``; ``?`` where even its metadata does not decode."""
    uid: str
    resource_version: str
    error: str

    @classmethod
    def of(cls, data: bytes, error: msgspec.DecodeError) -> Unreadable:
        try:
            meta = msgspec.json.decode(data, type=Node).metadata
        except msgspec.DecodeError:
            return cls("?", "", "", str(error))
        key = f"{meta.namespace}/{meta.name}" if meta.namespace else meta.name or "?"
        return cls(key, meta.uid or "", meta.resource_version or "", str(error))


def disruption_budget(budget: PodDisruptionBudget) -> DisruptionBudget:
    selector = budget.spec.selector
    return DisruptionBudget(
        namespace=budget.metadata.namespace or "", selected=selector is not None,
        match_labels=dict((selector.match_labels or {}) if selector else {}),
        match_expressions=tuple(
            LabelRequirement(r.key, r.operator, tuple(r.values or ()))
            for r in ((selector.match_expressions or []) if selector else [])),
        disruptions_allowed=budget.status.disruptions_allowed)
