"""The API's JSON, decoded by msgspec to the few fields pyhami reads.

Fields pyhami does not read are skipped by the decoder, never built: see the package's
docstring for why the client's own models are not used.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from common.core import PodManifest
from common.core.pod import ObjectMeta, PodSpec
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


class PodList(msgspec.Struct):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Pod] = []


class Node(msgspec.Struct):
    """A Node, or any object read for its metadata alone (a watch bookmark)."""

    metadata: Metadata = msgspec.field(default_factory=Metadata)


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
                      started=started.timestamp() if started is not None else 0.0)


def decode_pod(data: bytes | str) -> ClusterPod:
    """A pod from the API's JSON (a v1.Pod). Raises ``msgspec.DecodeError``."""
    return cluster_pod(msgspec.json.decode(data, type=Pod))


def disruption_budget(budget: PodDisruptionBudget) -> DisruptionBudget:
    selector = budget.spec.selector
    return DisruptionBudget(
        namespace=budget.metadata.namespace or "", selected=selector is not None,
        match_labels=dict((selector.match_labels or {}) if selector else {}),
        match_expressions=tuple(
            LabelRequirement(r.key, r.operator, tuple(r.values or ()))
            for r in ((selector.match_expressions or []) if selector else [])),
        disruptions_allowed=budget.status.disruptions_allowed)
