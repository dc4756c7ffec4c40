"""The API calls pyhami makes, each an async function on ``ApiTransport`` with its REST
path written out, and the one place the ``kubernetes`` package is used: to load a
kubeconfig or the in-cluster configuration.

Every call answers the raw body, for ``_wire`` to decode. What a failed call raises is
one of ``API_FAILURES`` (``_transport``).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import msgspec
from kubernetes import client, config

from common.core.quota import ResourceQuotaManifest
from common.core.workloads import AdmissionCheck, Workload
from scheduler.cluster.kube._requests import Json, JsonObject
from scheduler.cluster.kube._transport import (
    WATCH_TIMEOUT_SECONDS,
    ApiTransport,
    CachedAuthorization,
    Endpoint,
)
from scheduler.cluster.kube._wire import (
    RawList,
    Unreadable,
    pod_and_version,
    pod_event,
    quota_and_version,
    quota_event,
)
from scheduler.cluster.port import (
    AdmissionCheckChange,
    ClusterError,
    ClusterPod,
    PodChange,
    QuotaChange,
    WorkloadChange,
)

LIST_PAGE_SIZE = 500
_JSON = "application/json"
_MERGE_PATCH = "application/merge-patch+json"
_JSON_PATCH = "application/json-patch+json"
_APPLY_PATCH = "application/apply-patch+yaml"
FIELD_MANAGER = "pyhami-scheduler"
"""The field manager of what pyhami applies (server-side apply)."""


# Connecting -----------------------------------------------------------------------------


def load_kubeconfig(path: str, context: str | None) -> ApiTransport:
    """The API server a kubeconfig names. Raises ``ClusterError``."""
    configuration = client.Configuration()
    try:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, client_configuration=configuration,
            persist_config=False)
        return ApiTransport(_endpoint(configuration))
    except Exception as error:  # a file that is no kubeconfig fails in many ways
        raise ClusterError(f"cannot load kubeconfig {path}: {error}") from error


def load_in_cluster() -> ApiTransport:
    """The API server of the cluster this pod runs in. Raises ``ClusterError``."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration)
        return ApiTransport(_endpoint(configuration))
    except (config.ConfigException, OSError, ssl.SSLError) as error:
        raise ClusterError(f"cannot load the in-cluster configuration: {error}") from error


def _endpoint(configuration: client.Configuration) -> Endpoint:
    host: str = configuration.host.rstrip("/")
    context = None
    if host.startswith("https:"):
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
        if configuration.cert_file:
            context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
        if not configuration.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE

    def read_authorization() -> str | None:
        # Runs the configuration's refresh hook: in a pod, the rotated token file is read
        # again; from a kubeconfig, an expired exec or OIDC token is fetched anew.
        key: str | None = configuration.get_api_key_with_prefix(
            "BearerToken", alias="authorization")
        return key

    authorization = CachedAuthorization(read_authorization)
    return Endpoint(base_url=host, ssl_context=context,
                    server_name=getattr(configuration, "tls_server_name", None) or None,
                    proxy=configuration.proxy or None, authorization=authorization,
                    forget_authorization=authorization.forget)


def _part(name: str) -> str:
    """A name as one segment of a path."""
    return quote(name, safe="")


def _encode(body: JsonObject | list[Json]) -> bytes:
    return msgspec.json.encode(body)


# Pods and quotas, listed and watched ------------------------------------------------------

Item = TypeVar("Item")
Change = TypeVar("Change")


@dataclass(frozen=True, slots=True)
class Collection(Generic[Item, Change]):
    """The objects of one kind in every namespace, as they are listed and watched: where,
    how one decodes, what tells two apart, the change it makes."""

    noun: str
    """What log lines call one: ``pod``, ``ResourceQuota``."""
    path: str
    read: Callable[[bytes], tuple[Item, str | None]]
    """The object and its resourceVersion; raises ``msgspec.DecodeError``."""
    read_event: Callable[[bytes], tuple[str, Item, str | None]]
    """A watch event whose object is one, in one pass: its type, the object and its
    resourceVersion; raises ``msgspec.DecodeError``."""
    uid: Callable[[Item], str]
    change: Callable[[Item, bool], Change]
    """The change it makes, added or changed (False) or deleted (True)."""

    @property
    def watch_task(self) -> str:
        """The name of the task that watches them."""
        return f"pyhami-{self.noun.lower()}-watch"


PODS: Collection[ClusterPod, PodChange] = Collection(
    "pod", "/api/v1/pods", pod_and_version, pod_event, lambda pod: pod.uid, PodChange)
QUOTAS: Collection[ResourceQuotaManifest, QuotaChange] = Collection(
    "ResourceQuota", "/api/v1/resourcequotas", quota_and_version, quota_event,
    # The API server gives every object a uid; the key stands in where a server gave none.
    lambda quota: quota.metadata.uid or quota.key, QuotaChange)


Kueue = TypeVar("Kueue", Workload, AdmissionCheck)


def _kueue_objects(noun: str, plural: str, kind: type[Kueue],
                   change: Callable[[Kueue, bool], Change]) -> Collection[Kueue, Change]:
    """A collection of Kueue's objects (``kueue.x-k8s.io/v1beta2``), each told apart by its
    uid (its key where the server gave none)."""
    objects = msgspec.json.Decoder(kind)
    # A watch event of this kind, read in one pass (made at run time: ``kind`` varies).
    events: msgspec.json.Decoder[Any] = msgspec.json.Decoder(
        msgspec.defstruct(f"{noun}Event", [("type", str), ("object", kind)]))

    def read(data: bytes) -> tuple[Kueue, str | None]:
        item = objects.decode(data)
        return item, item.metadata.resource_version or None

    def read_event(line: bytes) -> tuple[str, Kueue, str | None]:
        event = events.decode(line)
        item: Kueue = event.object
        return event.type, item, item.metadata.resource_version or None

    return Collection(noun, f"/apis/kueue.x-k8s.io/v1beta2/{plural}", read, read_event,
                      lambda item: item.metadata.uid or item.key, change)


WORKLOADS = _kueue_objects("Workload", "workloads", Workload, WorkloadChange)
ADMISSION_CHECKS = _kueue_objects("AdmissionCheck", "admissionchecks", AdmissionCheck,
                                  AdmissionCheckChange)


@dataclass(frozen=True, slots=True)
class Snapshot(Generic[Item]):
    """Every object of a collection, the resourceVersion to watch on from, and the
    objects listed that did not decode (``unreadable``)."""

    items: list[Item]
    resource_version: str
    unreadable: list[Unreadable] = field(default_factory=list)


async def list_all(api: ApiTransport, collection: Collection[Item, Change]) -> Snapshot[Item]:
    """Every object of the collection, a page at a time; the resourceVersion is the one to
    watch from."""
    items: list[Item] = []
    unreadable: list[Unreadable] = []
    query = {"limit": str(LIST_PAGE_SIZE)}
    while True:
        page = msgspec.json.decode(await api.call("GET", collection.path, query=query),
                                   type=RawList)
        for raw in page.items:
            try:
                items.append(collection.read(raw)[0])
            except msgspec.DecodeError as error:
                unreadable.append(Unreadable.of(raw, error))
        if not page.metadata.continue_token:
            return Snapshot(items, page.metadata.resource_version, unreadable)
        query = {"limit": str(LIST_PAGE_SIZE), "continue": page.metadata.continue_token}


def watch_query(resource_version: str | None) -> dict[str, str]:
    """The query of one watch on a collection, newline-delimited watch events; the server
    ends it after ``WATCH_TIMEOUT_SECONDS``."""
    query = {"watch": "true", "allowWatchBookmarks": "true",
             "timeoutSeconds": str(WATCH_TIMEOUT_SECONDS)}
    if resource_version is not None:
        query["resourceVersion"] = resource_version
    return query


# Pods and nodes -------------------------------------------------------------------------


def _pod(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{_part(namespace)}/pods/{_part(name)}"


async def read_pod(api: ApiTransport, namespace: str, name: str) -> bytes:
    return await api.call("GET", _pod(namespace, name))


async def patch_pod(api: ApiTransport, namespace: str, name: str, patch: JsonObject) -> bytes:
    return await api.call("PATCH", _pod(namespace, name), body=_encode(patch),
                          content_type=_MERGE_PATCH)


async def create_binding(api: ApiTransport, namespace: str, name: str,
                         body: JsonObject) -> None:
    await api.call("POST", _pod(namespace, name) + "/binding", body=_encode(body),
                   content_type=_JSON)


async def delete_pod(api: ApiTransport, namespace: str, name: str, uid: str) -> None:
    """Delete the pod only if it is still uid ``uid`` (a pod re-created under the name is
    left alone), with its own grace period, as kube-scheduler deletes a victim."""
    await api.call("DELETE", _pod(namespace, name),
                   body=_encode({"preconditions": {"uid": uid}}), content_type=_JSON)


COSCHEDULING_POD_GROUPS = "/apis/scheduling.x-k8s.io/v1alpha1"
"""The coscheduling plugin's PodGroups (scheduler-plugins' CRD)."""
WORKLOAD_POD_GROUPS = "/apis/scheduling.k8s.io/v1alpha2"
"""Kubernetes' own PodGroups (v1.36, feature gate GenericWorkload)."""


async def read_pod_group(api: ApiTransport, group_api: str, namespace: str,
                         name: str) -> bytes:
    return await api.call(
        "GET", f"{group_api}/namespaces/{_part(namespace)}/podgroups/{_part(name)}")


async def list_disruption_budgets(api: ApiTransport) -> bytes:
    return await api.call("GET", "/apis/policy/v1/poddisruptionbudgets")


async def list_nodes(api: ApiTransport) -> bytes:
    return await api.call("GET", "/api/v1/nodes")


async def patch_node(api: ApiTransport, name: str, patch: JsonObject) -> None:
    await api.call("PATCH", f"/api/v1/nodes/{_part(name)}", body=_encode(patch),
                   content_type=_MERGE_PATCH)


# Events ---------------------------------------------------------------------------------


def _events(namespace: str) -> str:
    return f"/api/v1/namespaces/{_part(namespace)}/events"


async def create_event(api: ApiTransport, namespace: str, body: JsonObject) -> None:
    await api.call("POST", _events(namespace), body=_encode(body), content_type=_JSON)


async def read_event(api: ApiTransport, namespace: str, name: str) -> bytes:
    return await api.call("GET", f"{_events(namespace)}/{_part(name)}")


async def patch_event(api: ApiTransport, namespace: str, name: str,
                      patch: JsonObject) -> None:
    await api.call("PATCH", f"{_events(namespace)}/{_part(name)}", body=_encode(patch),
                   content_type=_MERGE_PATCH)


# The webhook's certificate --------------------------------------------------------------


def _secrets(namespace: str) -> str:
    return f"/api/v1/namespaces/{_part(namespace)}/secrets"


async def read_secret(api: ApiTransport, namespace: str, name: str) -> bytes:
    return await api.call("GET", f"{_secrets(namespace)}/{_part(name)}")


async def create_secret(api: ApiTransport, namespace: str, body: JsonObject) -> None:
    await api.call("POST", _secrets(namespace), body=_encode(body), content_type=_JSON)


def _webhook_configuration(name: str) -> str:
    return ("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
            + _part(name))


async def read_webhook_configuration(api: ApiTransport, name: str) -> bytes:
    return await api.call("GET", _webhook_configuration(name))


async def patch_webhook_configuration(api: ApiTransport, name: str,
                                      patch: list[Json]) -> None:
    await api.call("PATCH", _webhook_configuration(name), body=_encode(patch),
                   content_type=_JSON_PATCH)


# kube-scheduler's leader election ------------------------------------------------------


async def read_lease(api: ApiTransport, namespace: str, name: str) -> bytes:
    return await api.call(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{_part(namespace)}/leases/"
               f"{_part(name)}")


# Agents' tokens -------------------------------------------------------------------------


async def review_token(api: ApiTransport, body: JsonObject) -> bytes:
    return await api.call("POST", "/apis/authentication.k8s.io/v1/tokenreviews",
                          body=_encode(body), content_type=_JSON)


# Kueue ------------------------------------------------------------------------------------


async def _apply(api: ApiTransport, path: str, body: JsonObject) -> None:
    """Server-side apply of ``body`` as pyhami's field manager, taking the fields over."""
    await api.call("PATCH", path, query={"fieldManager": FIELD_MANAGER, "force": "true"},
                   body=_encode(body), content_type=_APPLY_PATCH)


async def apply_workload_status(api: ApiTransport, namespace: str, name: str,
                                body: JsonObject) -> None:
    await _apply(api, f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{_part(namespace)}"
                      f"/workloads/{_part(name)}/status", body)


async def apply_admission_check_status(api: ApiTransport, name: str, body: JsonObject) -> None:
    await _apply(api, f"/apis/kueue.x-k8s.io/v1beta2/admissionchecks/{_part(name)}/status",
                 body)
