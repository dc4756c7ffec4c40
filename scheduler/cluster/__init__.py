"""What the daemon needs from the cluster, and its two implementations.

The port (``Cluster``, ``WebhookCluster``, the pod and budget shapes) is defined in
``port`` and offered here; ``kube`` implements it on a Kubernetes API server and
``standalone`` on a JetStream key-value bucket. The daemon chooses one at start-up.
"""

from scheduler.cluster.port import (
    CAPACITY_FREED_ANNOTATION,
    FINISHED_PHASES,
    SCHEDULER_NAME,
    AdmissionCheckChange,
    AllocationPhase,
    CheckUpdate,
    Cluster,
    ClusterError,
    ClusterPod,
    DisruptionBudget,
    EventType,
    KueueApi,
    LabelRequirement,
    PodChange,
    QuotaChange,
    StoreUnavailable,
    WebhookCluster,
    WorkloadChange,
)

__all__ = [
    "CAPACITY_FREED_ANNOTATION",
    "FINISHED_PHASES",
    "SCHEDULER_NAME",
    "AdmissionCheckChange",
    "AllocationPhase",
    "CheckUpdate",
    "Cluster",
    "ClusterError",
    "ClusterPod",
    "DisruptionBudget",
    "EventType",
    "KueueApi",
    "LabelRequirement",
    "PodChange",
    "QuotaChange",
    "StoreUnavailable",
    "WebhookCluster",
    "WorkloadChange",
]
