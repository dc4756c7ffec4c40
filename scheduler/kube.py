"""The ``Cluster`` port on Kubernetes, through the official (synchronous) ``kubernetes`` client.

Every API call runs in a worker thread (``asyncio.to_thread``) and the pod watch in a thread
of its own, so the event loop never waits on the API server.

Responses are read raw (``_preload_content=False``) and decoded by msgspec straight into
the few fields pyhami reads. The client's own route, JSON into its generated ``V1Pod``
models, then ``sanitize_for_serialization`` back to a dict, then ``msgspec.convert``, took
1.3 ms for a typical pod against 10 us for msgspec alone (client 37): over 100 times the
work on every list page and watch event, for fields that are thrown away.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import socket
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, TypeAlias, cast

import msgspec
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from common.core import PodManifest
from common.core.annotations import (
    ALLOCATED_ANNOTATION,
    BIND_PHASE_ANNOTATION,
    CORDON_ANNOTATION,
    TO_ALLOCATE_ANNOTATION,
)
from common.core.names import SUBDOMAIN_MAX
from common.core.pod import ObjectMeta, PodSpec
from scheduler.cluster import (
    CAPACITY_FREED_ANNOTATION,
    SCHEDULER_NAME,
    ClusterError,
    ClusterPod,
    EventType,
    PodChange,
    cordon_list,
)
from scheduler.service import KeyedLocks

logger = logging.getLogger(__name__)

LIST_PAGE_SIZE = 500
WATCH_TIMEOUT_SECONDS = 60
EVENT_MESSAGE_LIMIT = 1024  # bytes: the API server refuses a longer event message
EVENT_CACHE_SIZE = 4096  # Events whose count is remembered, as many as client-go's correlator
EVENT_DIGEST_LENGTH = 16
RETRY_FIRST_DELAY = 1.0
RETRY_MAX_DELAY = 30.0
UID_CACHE_SIZE = 4096

_REQUEST_TIMEOUT = (10.0, 30.0)
# The server ends a watch after WATCH_TIMEOUT_SECONDS; the read timeout only catches a
# connection that died silently.
_WATCH_REQUEST_TIMEOUT = (10.0, WATCH_TIMEOUT_SECONDS + 30.0)
_MERGE_PATCH = "application/merge-patch+json"
_JSON_PATCH = "application/json-patch+json"
_GONE = 410
_NOT_FOUND = 404
_CONFLICT = 409
WITHDRAW_ATTEMPTS = 3

Json: TypeAlias = "str | int | float | bool | Sequence[Json] | Mapping[str, Json] | None"
JsonObject: TypeAlias = dict[str, Json]
_Timeout: TypeAlias = tuple[float, float]  # seconds to connect, seconds to read

# What a failed API call raises: an HTTP error status, a transport failure, or an answer
# that does not decode.
_API_FAILURES = (ApiException, urllib3.exceptions.HTTPError, OSError, msgspec.DecodeError)


class _CoreApi(Protocol):
    """The calls of ``client.CoreV1Api`` used here, as they behave here.

    With ``_preload_content=False`` they return the raw urllib3 response, not the models
    their annotations promise, and they take plain JSON bodies (the client validates a
    dict into its model).
    """

    def list_pod_for_all_namespaces(
        self, *, limit: int | None = None, _continue: str | None = None,
        watch: bool | None = None, allow_watch_bookmarks: bool | None = None,
        resource_version: str | None = None, timeout_seconds: int | None = None,
        _preload_content: bool, _request_timeout: _Timeout,
    ) -> urllib3.BaseHTTPResponse: ...

    def list_node(self, *, _preload_content: bool,
                  _request_timeout: _Timeout) -> urllib3.BaseHTTPResponse: ...

    def read_namespaced_pod(self, name: str, namespace: str, *, _preload_content: bool,
                            _request_timeout: _Timeout) -> urllib3.BaseHTTPResponse: ...

    def patch_namespaced_pod(self, name: str, namespace: str, body: JsonObject, *,
                             _content_type: str, _preload_content: bool,
                             _request_timeout: _Timeout) -> urllib3.BaseHTTPResponse: ...

    def create_namespaced_pod_binding(
        self, name: str, namespace: str, body: JsonObject, *, _preload_content: bool,
        _request_timeout: _Timeout,
    ) -> urllib3.BaseHTTPResponse: ...

    def create_namespaced_event(self, namespace: str, body: JsonObject, *,
                                _preload_content: bool,
                                _request_timeout: _Timeout) -> urllib3.BaseHTTPResponse: ...

    def read_namespaced_event(self, name: str, namespace: str, *, _preload_content: bool,
                              _request_timeout: _Timeout) -> urllib3.BaseHTTPResponse: ...

    def patch_namespaced_event(self, name: str, namespace: str, body: JsonObject, *,
                               _content_type: str, _preload_content: bool,
                               _request_timeout: _Timeout) -> urllib3.BaseHTTPResponse: ...

    def read_namespaced_secret(self, name: str, namespace: str, *, _preload_content: bool,
                               _request_timeout: _Timeout) -> urllib3.BaseHTTPResponse: ...

    def create_namespaced_secret(self, namespace: str, body: JsonObject, *,
                                 _preload_content: bool,
                                 _request_timeout: _Timeout) -> urllib3.BaseHTTPResponse: ...


class _AdmissionApi(Protocol):
    """The calls of ``client.AdmissionregistrationV1Api`` used here, as ``_CoreApi``."""

    def read_mutating_webhook_configuration(
        self, name: str, *, _preload_content: bool, _request_timeout: _Timeout,
    ) -> urllib3.BaseHTTPResponse: ...

    def patch_mutating_webhook_configuration(
        self, name: str, body: list[Json], *, _content_type: str, _preload_content: bool,
        _request_timeout: _Timeout,
    ) -> urllib3.BaseHTTPResponse: ...


# The API's JSON, decoded to what pyhami reads ------------------------------------------


class _Metadata(msgspec.Struct, rename="camel"):
    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    annotations: dict[str, str] | None = None
    resource_version: str | None = None


class _PodStatus(msgspec.Struct):
    phase: str = "Unknown"


class _Pod(msgspec.Struct):
    metadata: _Metadata = msgspec.field(default_factory=_Metadata)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: _PodStatus = msgspec.field(default_factory=_PodStatus)


class _SchedulingSpec(msgspec.Struct, rename="camel"):
    node_name: str | None = None
    scheduler_name: str = "default-scheduler"  # the API server's default


class PodToBind(msgspec.Struct):
    """What /bind checks on the pod before writing to it."""

    metadata: _Metadata = msgspec.field(default_factory=_Metadata)
    spec: _SchedulingSpec = msgspec.field(default_factory=_SchedulingSpec)
    status: _PodStatus = msgspec.field(default_factory=_PodStatus)


class _ListMeta(msgspec.Struct):
    resource_version: str = msgspec.field(default="", name="resourceVersion")
    continue_token: str = msgspec.field(default="", name="continue")


class _PodList(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[_Pod] = []


class _Node(msgspec.Struct):
    """A Node, or any object read for its metadata alone (a watch bookmark)."""

    metadata: _Metadata = msgspec.field(default_factory=_Metadata)


class _NodeList(msgspec.Struct):
    items: list[_Node] = []


class _Secret(msgspec.Struct):
    data: dict[str, bytes] | None = None  # base64 on the wire


class _ClientConfig(msgspec.Struct, rename="camel"):
    ca_bundle: bytes = b""  # base64 on the wire


class _Webhook(msgspec.Struct, rename="camel"):
    name: str
    client_config: _ClientConfig = msgspec.field(default_factory=_ClientConfig)


class _WebhookConfiguration(msgspec.Struct):
    webhooks: list[_Webhook] | None = None


class _WatchEvent(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _Event(msgspec.Struct, rename="camel"):
    """What a repeat reads of an Event this daemon wrote before it last started."""

    count: int = 1
    first_timestamp: str | None = None


class _Status(msgspec.Struct):
    """metav1.Status: the body of an API error and of a watch ERROR event."""

    code: int = 0
    reason: str = ""
    message: str = ""


def _cluster_pod(pod: _Pod) -> ClusterPod:
    meta = pod.metadata
    annotations = meta.annotations or {}
    manifest = PodManifest(
        metadata=ObjectMeta(name=meta.name, namespace=meta.namespace, uid=meta.uid,
                            annotations=annotations),
        spec=pod.spec,
    )
    return ClusterPod(manifest=manifest, uid=meta.uid or "", node=pod.spec.node_name,
                      phase=pod.status.phase, annotations=annotations)


def decode_pod(data: bytes | str) -> ClusterPod:
    """A pod from the API's JSON (a v1.Pod). Raises ``msgspec.DecodeError``."""
    return _cluster_pod(msgspec.json.decode(data, type=_Pod))


# Request bodies -------------------------------------------------------------------------


def _with_uid(fields: JsonObject, uid: str) -> JsonObject:
    # uid is immutable: a patch that carries it fails (422) on a pod re-created under the
    # same name instead of annotating the wrong pod.
    return {**fields, "uid": uid} if uid else fields


def _guarded(fields: JsonObject, uid: str, resource_version: str | None) -> JsonObject:
    # resourceVersion in a patch is a precondition: the API answers 409 Conflict when the
    # pod changed since that version was read, rather than writing over the change.
    fields = _with_uid(fields, uid)
    return {**fields, "resourceVersion": resource_version} if resource_version else fields


def annotation_patch(uid: str, resource_version: str | None,
                     annotations: Mapping[str, str | None]) -> JsonObject:
    """The merge patch that writes the allocation annotations (docs/decision-core.md) on the pod
    as it was read."""
    return {"metadata": _guarded({"annotations": dict(annotations)}, uid, resource_version)}


def undo_annotation_patch(uid: str, resource_version: str | None) -> JsonObject:
    """The merge patch that withdraws an allocation whose binding failed (null deletes),
    only from the pod as this bind left it."""
    return {"metadata": _guarded({"annotations": {
        BIND_PHASE_ANNOTATION: "failed",
        ALLOCATED_ANNOTATION: None,
        TO_ALLOCATE_ANNOTATION: None,
    }}, uid, resource_version)}


def bind_refusal(pod: PodToBind, uid: str, scheduler_name: str) -> str | None:
    """Why /bind must leave this pod alone, or None: only a pending pod of pyhami's
    scheduler name, on no node yet, is pyhami's to bind."""
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


def binding_body(namespace: str, name: str, uid: str, node: str) -> JsonObject:
    """A v1.Binding of the pod to ``node``; with ``uid``, the API refuses another pod."""
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": _with_uid({"name": name, "namespace": namespace}, uid),
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


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
class PodEvent:
    """One Event about a pod, as it is written again each time it recurs.

    Its name is derived from everything that makes two Events the same one, the fields
    client-go's event correlator compares (the source, the pod with its uid, the type,
    the reason, the message): a repeat finds it by name, in this process or the next.
    """

    namespace: str
    pod: str
    uid: str | None
    kind: EventType
    reason: str
    message: str
    component: str

    @classmethod
    def of(cls, namespace: str, pod: str, *, uid: str | None, kind: EventType, reason: str,
           message: str, component: str) -> PodEvent:
        return cls(namespace, pod, uid, kind, reason,
                   _truncate_utf8(message, EVENT_MESSAGE_LIMIT), component)

    @property
    def name(self) -> str:
        """``<pod>.<16 hex digits>``: a DNS subdomain, however long the pod's name."""
        fields = (self.component, self.namespace, self.pod, self.uid or "", self.kind,
                  self.reason, self.message)
        digest = hashlib.sha256("\0".join(fields).encode()).hexdigest()[:EVENT_DIGEST_LENGTH]
        # The pod's name is a DNS subdomain: cut short, it must still end in a letter or digit.
        base = self.pod[:SUBDOMAIN_MAX - EVENT_DIGEST_LENGTH - 1].rstrip(".-")
        return f"{base}.{digest}"

    def body(self, *, instance: str, count: int, first: str, last: str) -> JsonObject:
        """The core/v1 Event, in the style ``kubectl describe pod`` lists.

        ``eventTime`` stays unset: set, it makes the API server demand the events.k8s.io
        fields (action and the rest) too, and the client re-serializes it without the
        microseconds its format requires whenever they happen to be zero.
        """
        involved: JsonObject = {"apiVersion": "v1", "kind": "Pod", "namespace": self.namespace,
                                "name": self.pod}
        if self.uid:
            involved["uid"] = self.uid  # kubectl describe matches events on the pod's uid
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


@dataclass(frozen=True, slots=True)
class EventSeries:
    """What the API holds of an Event this daemon wrote: how often, since when."""

    count: int
    first: str


class SeriesCache:
    """The Events written lately, least recently used first; at most ``size`` of them."""

    def __init__(self, size: int = EVENT_CACHE_SIZE) -> None:
        self._size = size
        self._series: OrderedDict[str, EventSeries] = OrderedDict()

    def get(self, key: str) -> EventSeries | None:
        series = self._series.get(key)
        if series is not None:
            self._series.move_to_end(key)
        return series

    def put(self, key: str, series: EventSeries) -> None:
        self._series[key] = series
        self._series.move_to_end(key)
        if len(self._series) > self._size:
            self._series.popitem(last=False)

    def __len__(self) -> int:
        return len(self._series)


def tls_secret_body(name: str, data: Mapping[str, bytes]) -> JsonObject:
    """A ``kubernetes.io/tls`` Secret holding ``data`` (``tls.crt``, ``tls.key``, ...)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "pyhami",
                                              "app.kubernetes.io/component": "webhook"}},
        "type": "kubernetes.io/tls",
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


def describe_failure(error: BaseException) -> str:
    """One line for a failed API call: the HTTP status with the API's reason and message."""
    if isinstance(error, ApiException):
        code: int = error.status or 0
        reason = str(error.reason or "")
        body: object = error.body
        if isinstance(body, bytes | str) and body:
            try:
                status = msgspec.json.decode(body, type=_Status)
            except msgspec.DecodeError:
                return f"HTTP {code} {reason}: {str(body)[:200]}"
            return f"HTTP {code} {status.reason or reason}: {status.message}"
        return f"HTTP {code} {reason}"
    return f"{type(error).__name__}: {error}"


# The client -----------------------------------------------------------------------------


def _drain(response: urllib3.BaseHTTPResponse) -> bytes:
    try:
        return response.data
    finally:
        response.release_conn()


@dataclass(frozen=True, slots=True)
class _Snapshot:
    pods: list[ClusterPod]
    resource_version: str


def _list_all_pods(core: _CoreApi) -> _Snapshot:
    """Every pod, a page at a time; the resourceVersion is the one to watch from."""
    pods: list[ClusterPod] = []
    token: str | None = None
    while True:
        response = core.list_pod_for_all_namespaces(
            limit=LIST_PAGE_SIZE, _continue=token, _preload_content=False,
            _request_timeout=_REQUEST_TIMEOUT)
        page = msgspec.json.decode(_drain(response), type=_PodList)
        pods.extend(_cluster_pod(pod) for pod in page.items)
        if not page.metadata.continue_token:
            return _Snapshot(pods, page.metadata.resource_version)
        token = page.metadata.continue_token


class KubernetesCluster:
    """The ``Cluster`` port on a Kubernetes API server."""

    def __init__(self, api_client: client.ApiClient, *,
                 scheduler_name: str = SCHEDULER_NAME, instance: str | None = None) -> None:
        self._api_client = api_client
        self._core = cast(_CoreApi, client.CoreV1Api(api_client))
        self._admission = cast(_AdmissionApi, client.AdmissionregistrationV1Api(api_client))
        self.scheduler_name = scheduler_name
        self.instance = (instance or f"{scheduler_name}-{socket.gethostname()}")[:128]
        # Pod uids for events, most recently seen last; touched on the event loop only.
        self._uids: dict[str, str] = {}
        # Events written, to count their repeats; touched on the event loop only.
        self._event_series = SeriesCache()
        self._event_writes = KeyedLocks()
        # The last list_pods(): changes() watches on from it, so nothing in between is lost.
        self._snapshot: _Snapshot | None = None

    @classmethod
    def from_kubeconfig(cls, path: str, *, context: str | None = None,
                        scheduler_name: str = SCHEDULER_NAME) -> KubernetesCluster:
        configuration = client.Configuration()
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context, client_configuration=configuration,
                persist_config=False)
        except Exception as error:  # a file that is no kubeconfig fails in many ways
            raise ClusterError(f"cannot load kubeconfig {path}: {error}") from error
        return cls(client.ApiClient(configuration), scheduler_name=scheduler_name)

    @classmethod
    def in_cluster(cls, *, scheduler_name: str = SCHEDULER_NAME) -> KubernetesCluster:
        configuration = client.Configuration()
        try:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration)
        except (config.ConfigException, OSError) as error:
            raise ClusterError(f"cannot load the in-cluster configuration: {error}") from error
        return cls(client.ApiClient(configuration), scheduler_name=scheduler_name)

    def close(self) -> None:
        self._api_client.close()  # type: ignore[no-untyped-call]

    # Reads ---------------------------------------------------------------------------

    async def list_pods(self) -> list[ClusterPod]:
        try:
            snapshot = await asyncio.to_thread(_list_all_pods, self._core)
        except _API_FAILURES as error:
            raise ClusterError(f"listing pods failed: {describe_failure(error)}") from error
        self._snapshot = snapshot
        return snapshot.pods

    async def get_pod(self, namespace: str, name: str) -> ClusterPod | None:
        try:
            pod = decode_pod(await asyncio.to_thread(self._read_pod, namespace, name))
        except _API_FAILURES as error:
            if isinstance(error, ApiException) and error.status == _NOT_FOUND:
                return None
            raise ClusterError(
                f"reading pod {namespace}/{name} failed: {describe_failure(error)}") from error
        self._remember_uid(pod.key, pod.uid)
        return pod

    async def device_cordons(self) -> dict[str, frozenset[str]]:
        try:
            data = await asyncio.to_thread(self._list_nodes)
            nodes = msgspec.json.decode(data, type=_NodeList).items
        except _API_FAILURES as error:
            raise ClusterError(f"listing nodes failed: {describe_failure(error)}") from error
        return {node.metadata.name: cordon_list((node.metadata.annotations or {}).get(
                    CORDON_ANNOTATION, "")) for node in nodes}

    def _list_nodes(self) -> bytes:
        return _drain(self._core.list_node(_preload_content=False,
                                           _request_timeout=_REQUEST_TIMEOUT))

    def _read_pod(self, namespace: str, name: str) -> bytes:
        return _drain(self._core.read_namespaced_pod(
            name, namespace, _preload_content=False, _request_timeout=_REQUEST_TIMEOUT))

    # Writes --------------------------------------------------------------------------

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: Mapping[str, str | None]) -> None:
        await asyncio.to_thread(self._bind, namespace, name, uid, node, dict(annotations))
        self._remember_uid(f"{namespace}/{name}", uid)

    def _bind(self, namespace: str, name: str, uid: str, node: str,
              annotations: dict[str, str | None]) -> None:
        """Read the pod, check it is pyhami's to bind, annotate it as read, bind it."""
        what = f"binding pod {namespace}/{name} to node {node}"
        try:
            pod = msgspec.json.decode(self._read_pod(namespace, name), type=PodToBind)
        except _API_FAILURES as error:
            if isinstance(error, ApiException) and error.status == _NOT_FOUND:
                raise ClusterError(f"{what}: the pod no longer exists") from error
            raise ClusterError(f"{what}: reading the pod failed: "
                               f"{describe_failure(error)}") from error
        refusal = bind_refusal(pod, uid, self.scheduler_name)
        if refusal is not None:
            raise ClusterError(f"{what}: {refusal}")
        uid = uid or pod.metadata.uid or ""
        version = pod.metadata.resource_version
        present = pod.metadata.annotations or {}
        # A removal of an annotation the pod does not carry is no write at all.
        annotations = {name: value for name, value in annotations.items()
                       if value is not None or name in present}
        if annotations:
            try:
                patched = msgspec.json.decode(self._patch_pod(
                    namespace, name, annotation_patch(uid, version, annotations)), type=_Pod)
            except _API_FAILURES as error:
                raise ClusterError(f"{what}: writing the allocation annotations failed: "
                                   f"{describe_failure(error)}") from error
            version = patched.metadata.resource_version
        try:
            # Raw answer: the client fails to decode the Status the API returns for a
            # Binding; a refused binding still raises ApiException.
            _drain(self._core.create_namespaced_pod_binding(
                name, namespace, binding_body(namespace, name, uid, node),
                _preload_content=False, _request_timeout=_REQUEST_TIMEOUT))
        except _API_FAILURES as error:
            failure = f"{what}: creating the Binding failed: {describe_failure(error)}"
            allocated = annotations.get(ALLOCATED_ANNOTATION)
            if not allocated:
                raise ClusterError(failure) from error
            try:
                outcome = self._withdraw(namespace, name, uid, version, allocated)
            except _API_FAILURES as undo_error:
                raise ClusterError(f"{failure}; withdrawing the allocation annotations failed "
                                   f"too: {describe_failure(undo_error)}") from error
            raise ClusterError(f"{failure} ({outcome})") from error

    def _withdraw(self, namespace: str, name: str, uid: str, version: str | None,
                  allocated: str) -> str:
        """Take back the annotations a failed bind wrote, unless the pod moved on since:
        a Binding that did go through after all, or another bind that placed the pod."""
        for _ in range(WITHDRAW_ATTEMPTS):
            try:
                self._patch_pod(namespace, name, undo_annotation_patch(uid, version))
                return "allocation annotations withdrawn"
            except ApiException as error:
                if error.status == _NOT_FOUND:
                    return "the pod is gone"
                if error.status != _CONFLICT:
                    raise
            pod = msgspec.json.decode(self._read_pod(namespace, name), type=PodToBind)
            ours = (pod.metadata.annotations or {}).get(ALLOCATED_ANNOTATION) == allocated
            if pod.spec.node_name or not ours:
                return "the pod changed meanwhile; its annotations are left as they are"
            version = pod.metadata.resource_version
        return "the pod kept changing; its allocation annotations are left on it unbound"

    def _patch_pod(self, namespace: str, name: str, patch: JsonObject) -> bytes:
        return _drain(self._core.patch_namespaced_pod(
            name, namespace, patch, _content_type=_MERGE_PATCH, _preload_content=False,
            _request_timeout=_REQUEST_TIMEOUT))

    async def retry_pod(self, namespace: str, name: str, stamp: str) -> None:
        patch: JsonObject = {"metadata": {"annotations": {CAPACITY_FREED_ANNOTATION: stamp}}}
        try:
            await asyncio.to_thread(self._patch_pod, namespace, name, patch)
        except _API_FAILURES as error:
            if not (isinstance(error, ApiException) and error.status == _NOT_FOUND):
                logger.warning("pod %s/%s not nudged to retry: %s", namespace, name,
                               describe_failure(error))

    async def record_event(self, namespace: str, name: str, kind: EventType, reason: str,
                           message: str) -> None:
        """Write the Event, or count one more of it when it was written before.

        As client-go's recorder does: an Event with the same source, pod, type, reason and
        message is patched (``count`` + 1, ``lastTimestamp``) rather than created again.
        """
        # Best effort by contract: whatever goes wrong is logged, never raised.
        try:
            uid = await self._pod_uid(namespace, name)
            event = PodEvent.of(namespace, name, uid=uid, kind=kind, reason=reason,
                                message=message, component=self.scheduler_name)
            key = f"{namespace}/{event.name}"
            async with self._event_writes.hold(key):  # one write of an Event at a time
                series = await asyncio.to_thread(self._write_event, event,
                                                 self._event_series.get(key),
                                                 timestamp(datetime.now(UTC)))
                self._event_series.put(key, series)
        except Exception as error:
            logger.warning("event %s on pod %s/%s not recorded: %s", reason, namespace, name,
                           describe_failure(error))

    def _write_event(self, event: PodEvent, known: EventSeries | None, now: str) -> EventSeries:
        if known is not None:
            count = known.count + 1
            try:
                self._patch_event(event, recurrence_patch(count, now))
                return EventSeries(count, known.first)
            except ApiException as error:
                if error.status != _NOT_FOUND:
                    raise
            # Gone (the API server's --event-ttl, or deleted): written anew, its count and
            # first time carried on, as client-go does.
            self._create_event(event, event.body(instance=self.instance, count=count,
                                                 first=known.first, last=now))
            return EventSeries(count, known.first)
        try:
            self._create_event(event, event.body(instance=self.instance, count=1, first=now,
                                                 last=now))
            return EventSeries(1, now)
        except ApiException as error:
            if error.status != _CONFLICT:
                raise
        # Written before this daemon remembered it (a restart, or a series the cache let
        # go): count on from what the API server holds.
        held = msgspec.json.decode(_drain(self._core.read_namespaced_event(
            event.name, event.namespace, _preload_content=False,
            _request_timeout=_REQUEST_TIMEOUT)), type=_Event)
        count = held.count + 1
        self._patch_event(event, recurrence_patch(count, now))
        return EventSeries(count, held.first_timestamp or now)

    def _create_event(self, event: PodEvent, body: JsonObject) -> None:
        _drain(self._core.create_namespaced_event(
            event.namespace, body, _preload_content=False, _request_timeout=_REQUEST_TIMEOUT))

    def _patch_event(self, event: PodEvent, patch: JsonObject) -> None:
        _drain(self._core.patch_namespaced_event(
            event.name, event.namespace, patch, _content_type=_MERGE_PATCH,
            _preload_content=False, _request_timeout=_REQUEST_TIMEOUT))

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

    # The webhook's certificate (the WebhookCluster port) --------------------------------

    async def read_secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        try:
            data = await asyncio.to_thread(lambda: _drain(self._core.read_namespaced_secret(
                name, namespace, _preload_content=False, _request_timeout=_REQUEST_TIMEOUT)))
            return msgspec.json.decode(data, type=_Secret).data or {}
        except _API_FAILURES as error:
            if isinstance(error, ApiException) and error.status == _NOT_FOUND:
                return None
            raise ClusterError(f"reading Secret {namespace}/{name} failed: "
                               f"{describe_failure(error)}") from error

    async def create_tls_secret(self, namespace: str, name: str,
                                data: Mapping[str, bytes]) -> bool:
        body = tls_secret_body(name, data)
        try:
            await asyncio.to_thread(lambda: _drain(self._core.create_namespaced_secret(
                namespace, body, _preload_content=False, _request_timeout=_REQUEST_TIMEOUT)))
        except _API_FAILURES as error:
            if isinstance(error, ApiException) and error.status == _CONFLICT:
                return False
            raise ClusterError(f"creating Secret {namespace}/{name} failed: "
                               f"{describe_failure(error)}") from error
        return True

    async def webhook_ca_bundles(self, configuration: str) -> list[tuple[str, bytes]] | None:
        try:
            data = await asyncio.to_thread(lambda: _drain(
                self._admission.read_mutating_webhook_configuration(
                    configuration, _preload_content=False, _request_timeout=_REQUEST_TIMEOUT)))
            webhooks = msgspec.json.decode(data, type=_WebhookConfiguration).webhooks or []
        except _API_FAILURES as error:
            if isinstance(error, ApiException) and error.status == _NOT_FOUND:
                return None
            raise ClusterError(f"reading MutatingWebhookConfiguration {configuration} "
                               f"failed: {describe_failure(error)}") from error
        return [(webhook.name, webhook.client_config.ca_bundle) for webhook in webhooks]

    async def set_webhook_ca_bundle(self, configuration: str,
                                    webhooks: Sequence[tuple[int, str]], ca: bytes) -> None:
        patch = ca_bundle_patch(webhooks, ca)
        try:
            await asyncio.to_thread(lambda: _drain(
                self._admission.patch_mutating_webhook_configuration(
                    configuration, patch, _content_type=_JSON_PATCH,
                    _preload_content=False, _request_timeout=_REQUEST_TIMEOUT)))
        except _API_FAILURES as error:
            raise ClusterError(f"patching the caBundle of MutatingWebhookConfiguration "
                               f"{configuration} failed: {describe_failure(error)}") from error

    # Changes -------------------------------------------------------------------------

    async def changes(self) -> AsyncIterator[PodChange]:
        """Pod changes from a watch on all namespaces, for as long as it is iterated.

        Starts after the last ``list_pods()`` when there was one; otherwise (and whenever
        the watch has expired) with a list, given as deletions of the pods that are gone
        then changes for every pod there is.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[PodChange] = asyncio.Queue()

        def deliver(change: PodChange) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, change)

        snapshot, self._snapshot = self._snapshot, None
        watcher = _PodWatcher(self._core, deliver, snapshot)
        thread = threading.Thread(target=watcher.run, name="pyhami-pod-watch", daemon=True)
        thread.start()
        try:
            while True:
                change = await queue.get()
                if change.deleted:
                    self._uids.pop(change.pod.key, None)
                else:
                    self._remember_uid(change.pod.key, change.pod.uid)
                yield change
        finally:
            watcher.stop()


class _Expired(Exception):
    """The watch's resourceVersion is gone from the API server's history: list again."""


class _WatchFailed(Exception):
    """An ERROR event other than 410 in the watch stream."""


class _PodWatcher:
    """The blocking list-and-watch loop, run in its own thread until ``stop()``."""

    def __init__(self, core: _CoreApi, deliver: Callable[[PodChange], None],
                 start: _Snapshot | None) -> None:
        self._core = core
        self._deliver = deliver
        self._stopping = threading.Event()
        self._response: urllib3.BaseHTTPResponse | None = None
        self._version: str | None = start.resource_version if start else None
        self._known: dict[str, ClusterPod] = {p.uid: p for p in start.pods} if start else {}
        self._delay = RETRY_FIRST_DELAY

    def stop(self) -> None:
        """Ask the thread to end; a watch blocked on the socket is woken at once."""
        self._stopping.set()
        response = self._response
        if response is not None:
            # Already closed, or urllib3 older than 2.3 (no shutdown): the watch then ends
            # at its timeout.
            with contextlib.suppress(AttributeError, OSError, RuntimeError, ValueError):
                response.shutdown()

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                if self._version is None:
                    self._relist()
                self._watch()
            except _Expired:
                logger.info("pod watch: resourceVersion %s expired; listing pods again",
                            self._version)
                self._version = None
            except Exception as error:
                if self._stopping.is_set():
                    break
                logger.warning("pod watch failed, retrying in %.0f s: %s", self._delay,
                               describe_failure(error),
                               exc_info=not isinstance(error, (*_API_FAILURES, _WatchFailed)))
                self._stopping.wait(self._delay)
                self._delay = min(self._delay * 2, RETRY_MAX_DELAY)

    def _emit(self, change: PodChange) -> None:
        if self._stopping.is_set():
            return
        try:
            self._deliver(change)
        except RuntimeError:  # the consumer's event loop is closed
            self._stopping.set()

    def _relist(self) -> None:
        snapshot = _list_all_pods(self._core)
        current = {pod.uid: pod for pod in snapshot.pods}
        # Deletions first: a pod re-created under the same name must not be dropped after.
        for uid, pod in self._known.items():
            if uid not in current:
                self._emit(PodChange(pod, deleted=True))
        for pod in snapshot.pods:
            self._emit(PodChange(pod, deleted=False))
        self._known = current
        self._version = snapshot.resource_version

    def _watch(self) -> None:
        """One watch request, until the server ends it (``timeout_seconds``) or ``stop()``."""
        try:
            response = self._core.list_pod_for_all_namespaces(
                watch=True, allow_watch_bookmarks=True, resource_version=self._version,
                timeout_seconds=WATCH_TIMEOUT_SECONDS, _preload_content=False,
                _request_timeout=_WATCH_REQUEST_TIMEOUT)
        except ApiException as error:
            if error.status == _GONE:
                raise _Expired from error
            raise
        self._response = response
        self._delay = RETRY_FIRST_DELAY
        try:
            if self._stopping.is_set():  # stop() came before there was a response to shut
                return
            for line in response:
                if self._stopping.is_set():
                    break
                if line.strip():
                    self._handle(line)
        finally:
            self._response = None
            response.close()  # an unfinished stream must not go back to the pool
            response.release_conn()

    def _handle(self, line: bytes) -> None:
        event = msgspec.json.decode(line, type=_WatchEvent)
        if event.type == "ERROR":
            status = msgspec.json.decode(event.object, type=_Status)
            if status.code == _GONE:
                raise _Expired
            raise _WatchFailed(f"ERROR event {status.code} {status.reason}: {status.message}")
        if event.type == "BOOKMARK":
            # Only moves the resourceVersion on; its object is a pod skeleton
            # (``spec.containers: null``) that does not decode as a pod.
            bookmark = msgspec.json.decode(event.object, type=_Node)
            if bookmark.metadata.resource_version:
                self._version = bookmark.metadata.resource_version
            return
        pod = msgspec.json.decode(event.object, type=_Pod)
        if pod.metadata.resource_version:
            self._version = pod.metadata.resource_version
        if event.type == "DELETED":
            gone = _cluster_pod(pod)
            self._known.pop(gone.uid, None)
            self._emit(PodChange(gone, deleted=True))
        elif event.type in ("ADDED", "MODIFIED"):
            present = _cluster_pod(pod)
            self._known[present.uid] = present
            self._emit(PodChange(present, deleted=False))
