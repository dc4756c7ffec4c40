"""The ``Cluster`` port on Kubernetes, through the official (synchronous) ``kubernetes`` client.

Every API call runs in a worker thread (``asyncio.to_thread``) and the pod watch in a thread
of its own, so the event loop never waits on the API server.

Responses are read raw (``_preload_content=False``) and decoded by msgspec straight into
the few fields pyhami reads. The client's own route, JSON into its generated ``V1Pod``
models, then ``sanitize_for_serialization`` back to a dict, then ``msgspec.convert``, took
1.3 ms for a typical pod against 10 us for msgspec alone (client 37): over 100 times the
work on every list page and watch event, for fields that are thrown away.

One private module per layer, each importing only those below it:

- ``_cluster``: ``KubernetesCluster``, the async facade the daemon uses;
- ``_watch``: the blocking list-and-watch thread, as stacked generators;
- ``_events``: Events counted on repeat, as client-go's recorder does;
- ``_client``: the only module that speaks to the ``kubernetes`` client, one blocking
  function per API call, and its errors mapped to the project's;
- ``_bodies``: the request bodies, pure;
- ``_wire``: the API's JSON as msgspec shapes, pure.
"""

from scheduler.kube._bodies import (
    PodEvent,
    annotation_patch,
    bind_refusal,
    binding_body,
    recurrence_patch,
)
from scheduler.kube._client import describe_failure
from scheduler.kube._cluster import KubernetesCluster
from scheduler.kube._events import EventSeries, SeriesCache
from scheduler.kube._wire import PodToBind, decode_pod

__all__ = [
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
