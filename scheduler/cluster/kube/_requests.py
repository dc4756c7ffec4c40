"""The request bodies pyhami sends the API server, and the pure checks that decide them.

Plain JSON (dicts and lists) built from values: nothing here calls the API.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeAlias

from common.core.annotations import (
    BIND_PHASE_ANNOTATION,
)
from common.core.names import SUBDOMAIN_MAX
from common.core.workloads import Workload, check_message
from scheduler.cluster.kube._wire import PodToBind
from scheduler.cluster.port import CAPACITY_FREED_ANNOTATION, CheckUpdate, EventType

EVENT_MESSAGE_LIMIT = 1024  # bytes: the API server refuses a longer event message
EVENT_DIGEST_LENGTH = 16

Json: TypeAlias = "str | int | float | bool | Sequence[Json] | Mapping[str, Json] | None"
JsonObject: TypeAlias = dict[str, Json]


# Pods -----------------------------------------------------------------------------------


def _with_uid(fields: JsonObject, uid: str) -> JsonObject:
    # uid is immutable: a patch that carries it fails (422) on a pod re-created under the
    # same name instead of annotating the wrong pod.
    return {**fields, "uid": uid} if uid else fields


def _guarded(fields: JsonObject, uid: str, resource_version: str | None) -> JsonObject:
    # resourceVersion in a patch or a Binding is a precondition: the API answers 409 when the
    # pod changed since that version was read, rather than writing over the change.
    fields = _with_uid(fields, uid)
    return {**fields, "resourceVersion": resource_version} if resource_version else fields


def annotation_patch(uid: str, resource_version: str | None,
                     annotations: Mapping[str, str | None]) -> JsonObject:
    """The merge patch that writes the allocation annotations (docs/decision-core.md) on the pod
    as it was read."""
    return {"metadata": _guarded({"annotations": dict(annotations)}, uid, resource_version)}


def bind_phase_patch(uid: str, phase: str,
                     annotations: Mapping[str, str] | None = None) -> JsonObject:
    """The merge patch that sets ``hami.io/bind-phase`` (and ``annotations``), only on the
    pod of that uid."""
    return {"metadata": _with_uid(
        {"annotations": {**(annotations or {}), BIND_PHASE_ANNOTATION: phase}}, uid)}


def bind_refusal(pod: PodToBind, uid: str, scheduler_name: str) -> str | None:
    """Why /bind, or a nudge to retry, must leave this pod alone, or None: only a pending
    pod of pyhami's scheduler name, on no node yet, is pyhami's to write on and bind."""
    if uid and pod.metadata.uid != uid:
        return f"the pod is uid {pod.metadata.uid}, not {uid} (re-created meanwhile)"
    if pod.spec.node_name:
        return f"the pod is already on node {pod.spec.node_name}"
    if pod.status.phase != "Pending":
        return f"the pod is {pod.status.phase}, not Pending"
    if pod.spec.scheduler_name != scheduler_name:
        return (f"the pod is for scheduler {pod.spec.scheduler_name!r}, "
                f"not {scheduler_name!r}")
    return None


def annotations_set(annotations: Mapping[str, str | None]) -> dict[str, str]:
    """The annotations a Binding writes: those with a value (None is a removal)."""
    return {key: value for key, value in annotations.items() if value is not None}


def binding_body(namespace: str, name: str, uid: str, node: str, *,
                 resource_version: str | None = None,
                 annotations: Mapping[str, str] | None = None,
                 labels: Mapping[str, str] | None = None) -> JsonObject:
    """A v1.Binding of the pod to ``node``, carrying ``annotations`` (and ``labels``) for
    the API server to write on the pod in the same update; with ``uid`` and
    ``resource_version``, the API refuses (409) a pod that is no longer the one read.

    kube-apiserver copies a Binding's labels onto the pod from Kubernetes 1.35 on (the
    ``PodTopologyLabelsAdmission`` feature gate, on by default); an older one drops them.
    """
    metadata: JsonObject = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = dict(annotations)
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": _guarded(metadata, uid, resource_version),
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def node_annotation_patch(key: str, value: str | None) -> JsonObject:
    """The merge patch that sets one annotation of a Node (None removes it), whatever the
    Node holds besides: a Node's annotations are its kubelet's and other controllers'."""
    return {"metadata": {"annotations": {key: value}}}


def capacity_freed_patch(stamp: str, uid: str, resource_version: str | None) -> JsonObject:
    """The merge patch that stamps a waiting pod, so that kube-scheduler tries it again;
    only the pod as it was read."""
    return {"metadata": _guarded({"annotations": {CAPACITY_FREED_ANNOTATION: stamp}}, uid,
                                 resource_version)}


# Events ---------------------------------------------------------------------------------


def _truncate_utf8(text: str, limit: int) -> str:
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    marker = "..."
    return encoded[:limit - len(marker)].decode(errors="ignore") + marker


def timestamp(now: datetime) -> str:
    """An Event's firstTimestamp or lastTimestamp: UTC, whole seconds."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class ObjectEvent:
    """One Event about an object (a pod, a ResourceQuota), as it is written again each
    time it recurs.

    Its name is derived from everything that makes two Events the same one, the fields
    client-go's event correlator compares (the source, the object with its uid, the type,
    the reason, the message): a repeat finds it by name, in this process or the next.
    """

    namespace: str
    involved: str
    """The name of the object it is about."""
    uid: str | None
    kind: EventType
    reason: str
    message: str
    component: str
    involved_kind: str = "Pod"

    @classmethod
    def of(cls, namespace: str, involved: str, *, uid: str | None, kind: EventType,
           reason: str, message: str, component: str,
           involved_kind: str = "Pod") -> ObjectEvent:
        return cls(namespace, involved, uid, kind, reason,
                   _truncate_utf8(message, EVENT_MESSAGE_LIMIT), component, involved_kind)

    @property
    def name(self) -> str:
        """``<object>.<16 hex digits>``: a DNS subdomain, however long the object's name."""
        fields: tuple[str, ...] = (self.component, self.namespace, self.involved,
                                   self.uid or "", self.kind, self.reason, self.message)
        if self.involved_kind != "Pod":
            # Told apart from an Event about a pod of the same name; a pod's Events keep
            # the names they had before other kinds had any, which a restart counts on.
            fields += (self.involved_kind,)
        digest = hashlib.sha256("\0".join(fields).encode()).hexdigest()[:EVENT_DIGEST_LENGTH]
        # The object's name is a DNS subdomain: cut short, it must still end in a letter
        # or digit.
        base = self.involved[:SUBDOMAIN_MAX - EVENT_DIGEST_LENGTH - 1].rstrip(".-")
        return f"{base}.{digest}"

    @property
    def series_key(self) -> str:
        """What the daemon remembers the Event's series under: its namespace and name."""
        return f"{self.namespace}/{self.name}"

    def body(self, *, instance: str, count: int, first: str, last: str) -> JsonObject:
        """The core/v1 Event, in the style ``kubectl describe`` lists.

        ``eventTime`` stays unset: set, it makes the API server demand the events.k8s.io
        fields (action and the rest) too, and the client re-serializes it without the
        microseconds its format requires whenever they happen to be zero.
        """
        involved: JsonObject = {"apiVersion": "v1", "kind": self.involved_kind,
                                "namespace": self.namespace, "name": self.involved}
        if self.uid:
            involved["uid"] = self.uid  # kubectl describe matches events on the object's uid
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "involvedObject": involved,
            "reason": self.reason,
            "message": self.message,
            "type": self.kind,
            "source": {"component": self.component},
            "firstTimestamp": first,
            "lastTimestamp": last,
            "count": count,
            "reportingComponent": self.component,
            "reportingInstance": instance,
        }


def recurrence_patch(count: int, last: str) -> JsonObject:
    """The merge patch that counts one more occurrence of an Event."""
    return {"count": count, "lastTimestamp": last}


# The webhook's certificate --------------------------------------------------------------


def secret_body(name: str, data: Mapping[str, bytes], *, secret_type: str,
                component: str) -> JsonObject:
    """A Secret the daemon makes: the webhook's ``kubernetes.io/tls`` one (``tls.crt``,
    ``tls.key``, ...) or the ``Opaque`` one of the NATS credentials."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "pyhami",
                                              "app.kubernetes.io/component": component}},
        "type": secret_type,
        "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
    }


def ca_bundle_patch(webhooks: Sequence[tuple[int, str]], ca: bytes) -> list[Json]:
    """The JSON patch that sets the ``caBundle`` of these webhooks (position, name) where
    they are. Mutating webhooks run in the order listed, so the list is never rewritten;
    each position is tested first, so a list changed meanwhile fails the patch (422)."""
    encoded = base64.b64encode(ca).decode()
    operations: list[Json] = []
    for index, name in webhooks:
        operations += [
            {"op": "test", "path": f"/webhooks/{index}/name", "value": name},
            {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": encoded},
        ]
    return operations


def token_review_body(token: str, audiences: Sequence[str]) -> JsonObject:
    """A TokenReview asking whether ``token`` is valid for one of ``audiences``."""
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": list(audiences)}}


# Kueue ------------------------------------------------------------------------------------

KUEUE_API = "kueue.x-k8s.io/v1beta2"


def check_state_body(workload: Workload, check: str, update: CheckUpdate,
                     now: datetime) -> JsonObject:
    """The server-side apply of one check's entry in a Workload's
    ``status.admissionChecks`` (a list keyed by name: the other checks' entries are
    left to their owners). The transition time moves only when the state does."""
    since = timestamp(now)
    current = workload.check((check,))
    if current is not None and current.state == update.state and current.last_transition_time:
        since = current.last_transition_time
    entry: JsonObject = {"name": check, "state": update.state.value,
                         "message": check_message(update.message),
                         "lastTransitionTime": since}
    if update.pod_set_updates:
        entry["podSetUpdates"] = [
            {"name": u.name, **({"annotations": dict(u.annotations)} if u.annotations else {}),
             **({"labels": dict(u.labels)} if u.labels else {})}
            for u in update.pod_set_updates]
    return {"apiVersion": KUEUE_API, "kind": "Workload",
            "metadata": {"name": workload.metadata.name,
                         "namespace": workload.metadata.namespace},
            "status": {"admissionChecks": [entry]}}


def check_active_body(name: str, message: str, now: datetime) -> JsonObject:
    """The server-side apply of an AdmissionCheck's ``Active`` condition."""
    return {"apiVersion": KUEUE_API, "kind": "AdmissionCheck", "metadata": {"name": name},
            "status": {"conditions": [{"type": "Active", "status": "True",
                                       "reason": "Active", "message": message,
                                       "lastTransitionTime": timestamp(now)}]}}

