"""Standalone mode's cluster: no Kubernetes, pods in a NATS JetStream key-value bucket.

``StandaloneCluster`` is the ``Cluster`` port over that bucket, plus what the pod API
(``scheduler.web.pods``) and the pending loop (``scheduler.pending``, kube-scheduler's
part) need: submit, delete, the pending pods, every pod and its Events. One private
module per layer: ``_cluster`` (the port and those queries), ``_bucket`` (``PodBucket``,
the bucket's fencing protocol: writes guarded by revision, settled when they got no
answer, every pod read again once elected), ``_wire`` (the shapes it stores).
"""

from scheduler.cluster.standalone._bucket import BUCKET
from scheduler.cluster.standalone._cluster import StandaloneCluster
from scheduler.cluster.standalone._wire import PodEvent, StoredPod

__all__ = ["BUCKET", "PodEvent", "StandaloneCluster", "StoredPod"]
