"""The ``Cluster`` port on Kubernetes, spoken over aiohttp on the daemon's event loop.

Every API call is an async request on one connection pool and the pod watch an asyncio
task: no worker thread holds the GIL while the loop answers kube-scheduler. The
``kubernetes`` package only loads the kubeconfig or the in-cluster configuration.

Responses are read raw and decoded by msgspec straight into the few fields pyhami reads.
The client's own route, JSON into its generated ``V1Pod`` models, then
``sanitize_for_serialization`` back to a dict, then ``msgspec.convert``, took 1.3 ms for a
typical pod against 10 us for msgspec alone (client 37): over 100 times the work on every
list page and watch event, for fields that are thrown away.

One private module per layer, each importing only those below it:

- ``_cluster``: ``KubernetesCluster``, the async facade the daemon uses;
- ``_binding``: ``PodBinder``, a pod bound only when it is pyhami's to bind;
- ``_watch``: the list-and-watch task;
- ``_events``: Events counted on repeat, as client-go's recorder does;
- ``_client``: one async function per API call, its REST path written out, and the
  configuration loaded through the ``kubernetes`` package (the only module to use it);
- ``_transport``: the aiohttp session, and HTTP errors mapped to the project's;
- ``_requests``: the request bodies, pure;
- ``_wire``: the API's JSON as msgspec shapes, pure.
"""

from scheduler.cluster.kube._cluster import KubernetesCluster
from scheduler.cluster.kube._events import EventSeries, SeriesCache
from scheduler.cluster.kube._requests import (
    PodEvent,
    annotation_patch,
    bind_refusal,
    binding_body,
    recurrence_patch,
)
from scheduler.cluster.kube._transport import ApiStatusError, describe_failure
from scheduler.cluster.kube._wire import PodToBind, decode_pod

__all__ = [
    "ApiStatusError",
    "EventSeries",
    "KubernetesCluster",
    "PodEvent",
    "PodToBind",
    "SeriesCache",
    "annotation_patch",
    "bind_refusal",
    "binding_body",
    "decode_pod",
    "describe_failure",
    "recurrence_patch",
]
