"""The one module that speaks to the ``kubernetes`` client: its API classes as the
blocking calls pyhami makes, and its errors mapped to the project's.

Every call answers the raw body (``_preload_content=False``), for ``_wire`` to decode.
What a failed call raises is one of ``API_FAILURES``; ``describe_failure`` puts it in
one line, ``answered_with`` tells an HTTP status the caller expects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeAlias, cast

import msgspec
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from scheduler.cluster import ClusterError, ClusterPod
from scheduler.kube._bodies import Json, JsonObject
from scheduler.kube._wire import PodList, Status, cluster_pod

ApiClient: TypeAlias = client.ApiClient

LIST_PAGE_SIZE = 500
WATCH_TIMEOUT_SECONDS = 60

Timeout: TypeAlias = tuple[float, float]  # seconds to connect, seconds to read
REQUEST_TIMEOUT: Timeout = (10.0, 30.0)
# The server ends a watch after WATCH_TIMEOUT_SECONDS; the read timeout only catches a
# connection that died silently.
WATCH_REQUEST_TIMEOUT: Timeout = (10.0, WATCH_TIMEOUT_SECONDS + 30.0)
_MERGE_PATCH = "application/merge-patch+json"
_JSON_PATCH = "application/json-patch+json"

GONE = 410
NOT_FOUND = 404
CONFLICT = 409

# What a failed API call raises: an HTTP error status, a transport failure, or an answer
# that does not decode.
API_FAILURES = (ApiException, urllib3.exceptions.HTTPError, OSError, msgspec.DecodeError)


def answered_with(error: BaseException, status: int) -> bool:
    """Whether the API server answered the failed call with this HTTP status."""
    return isinstance(error, ApiException) and error.status == status


def describe_failure(error: BaseException) -> str:
    """One line for a failed API call: the HTTP status with the API's reason and message."""
    if isinstance(error, ApiException):
        code: int = error.status or 0
        reason = str(error.reason or "")
        body: object = error.body
        if isinstance(body, bytes | str) and body:
            try:
                status = msgspec.json.decode(body, type=Status)
            except msgspec.DecodeError:
                return f"HTTP {code} {reason}: {str(body)[:200]}"
            return f"HTTP {code} {status.reason or reason}: {status.message}"
        return f"HTTP {code} {reason}"
    return f"{type(error).__name__}: {error}"


# Connecting -----------------------------------------------------------------------------


def load_kubeconfig(path: str, context: str | None) -> ApiClient:
    """A client for the cluster a kubeconfig names. Raises ``ClusterError``."""
    configuration = client.Configuration()
    try:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, client_configuration=configuration,
            persist_config=False)
    except Exception as error:  # a file that is no kubeconfig fails in many ways
        raise ClusterError(f"cannot load kubeconfig {path}: {error}") from error
    return client.ApiClient(configuration)


def load_in_cluster() -> ApiClient:
    """A client for the cluster this pod runs in. Raises ``ClusterError``."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration)
    except (config.ConfigException, OSError) as error:
        raise ClusterError(f"cannot load the in-cluster configuration: {error}") from error
    return client.ApiClient(configuration)


def close(api_client: ApiClient) -> None:
    api_client.close()  # type: ignore[no-untyped-call]


# The API classes, as they behave here ---------------------------------------------------


class CoreApi(Protocol):
    """The calls of ``client.CoreV1Api`` used here, as they behave here.

    With ``_preload_content=False`` they return the raw urllib3 response, not the models
    their annotations promise, and they take plain JSON bodies (the client validates a
    dict into its model).
    """

    def list_pod_for_all_namespaces(
        self, *, limit: int | None = None, _continue: str | None = None,
        watch: bool | None = None, allow_watch_bookmarks: bool | None = None,
        resource_version: str | None = None, timeout_seconds: int | None = None,
        _preload_content: bool, _request_timeout: Timeout,
    ) -> urllib3.BaseHTTPResponse: ...

    def list_node(self, *, _preload_content: bool,
                  _request_timeout: Timeout) -> urllib3.BaseHTTPResponse: ...

    def read_namespaced_pod(self, name: str, namespace: str, *, _preload_content: bool,
                            _request_timeout: Timeout) -> urllib3.BaseHTTPResponse: ...

    def patch_namespaced_pod(self, name: str, namespace: str, body: JsonObject, *,
                             _content_type: str, _preload_content: bool,
                             _request_timeout: Timeout) -> urllib3.BaseHTTPResponse: ...

    def create_namespaced_pod_binding(
        self, name: str, namespace: str, body: JsonObject, *, _preload_content: bool,
        _request_timeout: Timeout,
    ) -> urllib3.BaseHTTPResponse: ...

    def delete_namespaced_pod(self, name: str, namespace: str, *, body: JsonObject,
                              _preload_content: bool,
                              _request_timeout: Timeout) -> urllib3.BaseHTTPResponse: ...

    def create_namespaced_event(self, namespace: str, body: JsonObject, *,
                                _preload_content: bool,
                                _request_timeout: Timeout) -> urllib3.BaseHTTPResponse: ...

    def read_namespaced_event(self, name: str, namespace: str, *, _preload_content: bool,
                              _request_timeout: Timeout) -> urllib3.BaseHTTPResponse: ...

    def patch_namespaced_event(self, name: str, namespace: str, body: JsonObject, *,
                               _content_type: str, _preload_content: bool,
                               _request_timeout: Timeout) -> urllib3.BaseHTTPResponse: ...

    def read_namespaced_secret(self, name: str, namespace: str, *, _preload_content: bool,
                               _request_timeout: Timeout) -> urllib3.BaseHTTPResponse: ...

    def create_namespaced_secret(self, namespace: str, body: JsonObject, *,
                                 _preload_content: bool,
                                 _request_timeout: Timeout) -> urllib3.BaseHTTPResponse: ...


class AdmissionApi(Protocol):
    """The calls of ``client.AdmissionregistrationV1Api`` used here, as ``CoreApi``."""

    def read_mutating_webhook_configuration(
        self, name: str, *, _preload_content: bool, _request_timeout: Timeout,
    ) -> urllib3.BaseHTTPResponse: ...

    def patch_mutating_webhook_configuration(
        self, name: str, body: list[Json], *, _content_type: str, _preload_content: bool,
        _request_timeout: Timeout,
    ) -> urllib3.BaseHTTPResponse: ...


class AuthenticationApi(Protocol):
    """The call of ``client.AuthenticationV1Api`` used here, as ``CoreApi``."""

    def create_token_review(self, body: JsonObject, *, _preload_content: bool,
                            _request_timeout: Timeout) -> urllib3.BaseHTTPResponse: ...


class PolicyApi(Protocol):
    """The call of ``client.PolicyV1Api`` used here, as ``CoreApi``."""

    def list_pod_disruption_budget_for_all_namespaces(
        self, *, _preload_content: bool, _request_timeout: Timeout,
    ) -> urllib3.BaseHTTPResponse: ...


class CoordinationApi(Protocol):
    """The call of ``client.CoordinationV1Api`` used here, as ``CoreApi``."""

    def read_namespaced_lease(self, name: str, namespace: str, *, _preload_content: bool,
                              _request_timeout: Timeout) -> urllib3.BaseHTTPResponse: ...


def core_api(api_client: ApiClient) -> CoreApi:
    return cast(CoreApi, client.CoreV1Api(api_client))


def admission_api(api_client: ApiClient) -> AdmissionApi:
    return cast(AdmissionApi, client.AdmissionregistrationV1Api(api_client))


def authentication_api(api_client: ApiClient) -> AuthenticationApi:
    return cast(AuthenticationApi, client.AuthenticationV1Api(api_client))


def policy_api(api_client: ApiClient) -> PolicyApi:
    return cast(PolicyApi, client.PolicyV1Api(api_client))


def coordination_api(api_client: ApiClient) -> CoordinationApi:
    return cast(CoordinationApi, client.CoordinationV1Api(api_client))


def _drain(response: urllib3.BaseHTTPResponse) -> bytes:
    try:
        return response.data
    finally:
        response.release_conn()


# Pods and nodes -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every pod, and the resourceVersion to watch on from."""

    pods: list[ClusterPod]
    resource_version: str


def list_all_pods(core: CoreApi) -> Snapshot:
    """Every pod, a page at a time; the resourceVersion is the one to watch from."""
    pods: list[ClusterPod] = []
    token: str | None = None
    while True:
        response = core.list_pod_for_all_namespaces(
            limit=LIST_PAGE_SIZE, _continue=token, _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT)
        page = msgspec.json.decode(_drain(response), type=PodList)
        pods.extend(cluster_pod(pod) for pod in page.items)
        if not page.metadata.continue_token:
            return Snapshot(pods, page.metadata.resource_version)
        token = page.metadata.continue_token


def watch_pods(core: CoreApi, resource_version: str | None) -> urllib3.BaseHTTPResponse:
    """The open stream of one watch on all pods, newline-delimited watch events; the
    server ends it after ``WATCH_TIMEOUT_SECONDS``. The caller closes it."""
    return core.list_pod_for_all_namespaces(
        watch=True, allow_watch_bookmarks=True, resource_version=resource_version,
        timeout_seconds=WATCH_TIMEOUT_SECONDS, _preload_content=False,
        _request_timeout=WATCH_REQUEST_TIMEOUT)


def read_pod(core: CoreApi, namespace: str, name: str) -> bytes:
    return _drain(core.read_namespaced_pod(
        name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))


def patch_pod(core: CoreApi, namespace: str, name: str, patch: JsonObject) -> bytes:
    return _drain(core.patch_namespaced_pod(
        name, namespace, patch, _content_type=_MERGE_PATCH, _preload_content=False,
        _request_timeout=REQUEST_TIMEOUT))


def create_binding(core: CoreApi, namespace: str, name: str, body: JsonObject) -> None:
    # Raw answer: the client fails to decode the Status the API returns for a Binding; a
    # refused binding still raises ApiException.
    _drain(core.create_namespaced_pod_binding(
        name, namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))


def delete_pod(core: CoreApi, namespace: str, name: str, uid: str) -> None:
    """Delete the pod only if it is still uid ``uid`` (a pod re-created under the name is
    left alone), with its own grace period, as kube-scheduler deletes a victim."""
    _drain(core.delete_namespaced_pod(
        name, namespace, body={"preconditions": {"uid": uid}}, _preload_content=False,
        _request_timeout=REQUEST_TIMEOUT))


def list_disruption_budgets(policy: PolicyApi) -> bytes:
    return _drain(policy.list_pod_disruption_budget_for_all_namespaces(
        _preload_content=False, _request_timeout=REQUEST_TIMEOUT))


def list_nodes(core: CoreApi) -> bytes:
    return _drain(core.list_node(_preload_content=False, _request_timeout=REQUEST_TIMEOUT))


# Events ---------------------------------------------------------------------------------


def create_event(core: CoreApi, namespace: str, body: JsonObject) -> None:
    _drain(core.create_namespaced_event(
        namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))


def read_event(core: CoreApi, namespace: str, name: str) -> bytes:
    return _drain(core.read_namespaced_event(
        name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))


def patch_event(core: CoreApi, namespace: str, name: str, patch: JsonObject) -> None:
    _drain(core.patch_namespaced_event(
        name, namespace, patch, _content_type=_MERGE_PATCH, _preload_content=False,
        _request_timeout=REQUEST_TIMEOUT))


# The webhook's certificate --------------------------------------------------------------


def read_secret(core: CoreApi, namespace: str, name: str) -> bytes:
    return _drain(core.read_namespaced_secret(
        name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))


def create_secret(core: CoreApi, namespace: str, body: JsonObject) -> None:
    _drain(core.create_namespaced_secret(
        namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))


def read_webhook_configuration(admission: AdmissionApi, name: str) -> bytes:
    return _drain(admission.read_mutating_webhook_configuration(
        name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))


def patch_webhook_configuration(admission: AdmissionApi, name: str,
                                patch: list[Json]) -> None:
    _drain(admission.patch_mutating_webhook_configuration(
        name, patch, _content_type=_JSON_PATCH, _preload_content=False,
        _request_timeout=REQUEST_TIMEOUT))


# kube-scheduler's leader election ------------------------------------------------------


def read_lease(coordination: CoordinationApi, namespace: str, name: str) -> bytes:
    return _drain(coordination.read_namespaced_lease(
        name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))


# Agents' tokens -------------------------------------------------------------------------


def review_token(authentication: AuthenticationApi, body: JsonObject) -> bytes:
    return _drain(authentication.create_token_review(
        body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))
