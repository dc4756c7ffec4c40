"""Standalone mode's cluster: no Kubernetes, pods and ResourceQuotas in a NATS JetStream
key-value bucket.

``StandaloneCluster`` is the ``Cluster`` port over that bucket, plus what the pod API
(``scheduler.web.pods``, ``scheduler.web.quotas``) and the pending loop
(``scheduler.pending``, kube-scheduler's part) need: submit, delete, the pending pods,
every pod and its Events; store, delete and read the quotas. One private module per
layer: ``_cluster`` (the port and those queries), ``_quotas`` (``QuotaBucket``: the
quotas, fenced as the pods are and watched by every daemon), ``_bucket``
(``FencedBucket``, the bucket's fencing protocol: writes guarded by revision, settled
when they got no answer, every entry read again once elected; ``PodBucket``), ``_wire``
(the shapes it stores).
"""

from scheduler.cluster.standalone._bucket import BUCKET, EntryTooLarge
from scheduler.cluster.standalone._cluster import StandaloneCluster
from scheduler.cluster.standalone._wire import PodEvent, StoredPod, StoredQuota

__all__ = ["BUCKET", "EntryTooLarge", "PodEvent", "StandaloneCluster", "StoredPod",
           "StoredQuota"]
