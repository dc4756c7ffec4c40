"""The ``Cluster`` port on Kubernetes, and the other ports the daemon needs of the API
server, spoken over HTTP/1.1 on the daemon's event loop (a lean client of its own;
aiohttp's through a proxy).

Every API call is an async request on one connection pool and the pod watch an asyncio
task: no worker thread holds the GIL while the loop answers kube-scheduler. The
``kubernetes`` package only loads the kubeconfig or the in-cluster configuration.

Responses are read raw and decoded by msgspec straight into the few fields pyhami reads.
The client's own route, JSON into its generated ``V1Pod`` models, then
``sanitize_for_serialization`` back to a dict, then ``msgspec.convert``, took 1.3 ms for a
typical pod against 10 us for msgspec alone (client 37): over 100 times the work on every
list page and watch event, for fields that are thrown away.

Private modules in layers, each importing only those below it (modules on one line
import none of each other):

- ``_kubernetes``: ``Kubernetes``, what the daemon opens: the ports below built over one
  transport, closed together;
- the ports: ``_cluster`` (``KubernetesCluster``, the ``Cluster`` port: pods and
  ResourceQuotas, and the read of kube-scheduler's Lease), ``_secrets``
  (``KubernetesSecrets``, the ``WebhookCluster`` port: the daemon's own Secrets and the
  webhook's caBundle), ``_kueue`` (``KueueWorkloads``, the ``KueueApi`` port: Kueue's
  Workloads and AdmissionChecks), ``_tokens`` (``KubernetesTokenReviewer``, bus auth's TokenReview
  port);
- ``_binding`` (``PodBinder``, a pod bound only when it is pyhami's to bind), ``_watch``
  (the list-and-watch task, of pods and of ResourceQuotas alike), ``_events`` (Events
  counted on repeat, as client-go's recorder does);
- ``_client``: one async function per API call, its REST path written out, and the
  configuration loaded through the ``kubernetes`` package (the only module to use it);
- ``_transport``: ``ApiTransport``, calls and watch streams over the HTTP client chosen
  when it is built, HTTP errors mapped to the project's;
- ``_lean`` (the lean HTTP/1.1 client: asyncio protocols, pooled kept-alive
  connections), ``_aiohttp`` (aiohttp's client, for an API server behind an HTTP proxy);
- ``_response``: the lean client's reader of an HTTP answer, pure;
- ``_http``: the port both clients implement (``HttpClient``), its failures, timeouts;
- ``_requests``: the request bodies, pure;
- ``_wire``: the API's JSON as msgspec shapes, pure.
"""

from scheduler.cluster.kube._cluster import KubernetesCluster
from scheduler.cluster.kube._events import EventSeries, SeriesCache
from scheduler.cluster.kube._kubernetes import Kubernetes
from scheduler.cluster.kube._kueue import KueueWorkloads
from scheduler.cluster.kube._requests import (
    ObjectEvent,
    annotation_patch,
    bind_refusal,
    binding_body,
    recurrence_patch,
)
from scheduler.cluster.kube._secrets import KubernetesSecrets
from scheduler.cluster.kube._tokens import KubernetesTokenReviewer
from scheduler.cluster.kube._transport import ApiStatusError, describe_failure
from scheduler.cluster.kube._wire import PodToBind, decode_pod

__all__ = [
    "ApiStatusError",
    "EventSeries",
    "Kubernetes",
    "KubernetesCluster",
    "KubernetesSecrets",
    "KubernetesTokenReviewer",
    "KueueWorkloads",
    "ObjectEvent",
    "PodToBind",
    "SeriesCache",
    "annotation_patch",
    "bind_refusal",
    "binding_body",
    "decode_pod",
    "describe_failure",
    "recurrence_patch",
]
