"""``Kubernetes``: the one way the daemon opens a Kubernetes API server, its parts built
over one transport and closed together."""

from __future__ import annotations

from typing import Final

from scheduler.cluster.kube import _client
from scheduler.cluster.kube._cluster import KubernetesCluster
from scheduler.cluster.kube._kueue import KueueWorkloads
from scheduler.cluster.kube._secrets import KubernetesSecrets
from scheduler.cluster.kube._tokens import KubernetesTokenReviewer
from scheduler.cluster.kube._transport import ApiTransport
from scheduler.cluster.port import SCHEDULER_NAME


class Kubernetes:
    """One API server, one pool of connections, each port the daemon needs of it:
    ``cluster`` (the pods and kube-scheduler's Lease), ``secrets`` (the daemon's own
    credentials and the webhook's caBundle), ``token_reviewer`` (agents' tokens),
    ``kueue`` (Kueue's Workloads and AdmissionChecks, for the admission check)."""

    def __init__(self, api: ApiTransport, *, scheduler_name: str = SCHEDULER_NAME) -> None:
        self._api = api
        # Plain attributes, never rebound (Final): each is handed to what uses that port.
        self.cluster: Final = KubernetesCluster(api, scheduler_name=scheduler_name)
        self.secrets: Final = KubernetesSecrets(api)
        self.token_reviewer: Final = KubernetesTokenReviewer(api)
        self.kueue: Final = KueueWorkloads(api, unreadable=self.cluster.unreadable)

    @classmethod
    def from_kubeconfig(cls, path: str, *, context: str | None = None,
                        scheduler_name: str = SCHEDULER_NAME) -> Kubernetes:
        """The API server a kubeconfig names. Raises ``ClusterError``."""
        return cls(_client.load_kubeconfig(path, context), scheduler_name=scheduler_name)

    @classmethod
    def in_cluster(cls, *, scheduler_name: str = SCHEDULER_NAME) -> Kubernetes:
        """The API server of the cluster this pod runs in. Raises ``ClusterError``."""
        return cls(_client.load_in_cluster(), scheduler_name=scheduler_name)

    async def close(self) -> None:
        """Close the connections to the API server, every part's."""
        await self._api.close()
