"""The Kubernetes adapter's parts beside the pods, against the stub API server: the
Secrets (``KubernetesSecrets``), the TokenReview (``KubernetesTokenReviewer``) and the
Lease ``FollowedLease`` reads (``KubernetesCluster.lease_holder``)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from scheduler.busauth import NODE_NAME_EXTRA, ReviewedToken
from scheduler.cluster.kube import Kubernetes
from tests.fakes.apiserver import StubApiServer, serve, write_kubeconfig


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[tuple[StubApiServer, Kubernetes]]:
    api = StubApiServer()
    async with serve(api) as port:
        kubernetes = Kubernetes.from_kubeconfig(str(write_kubeconfig(tmp_path / "kc", port)))
        yield api, kubernetes
        await kubernetes.close()


async def test_a_secret_is_made_once_and_read_back(
        parts: tuple[StubApiServer, Kubernetes]) -> None:
    api, kubernetes = parts
    secrets = kubernetes.secrets
    assert await secrets.read_secret("pyhami-system", "webhook-tls") is None
    data = {"tls.crt": b"certificate", "tls.key": b"key"}
    assert await secrets.create_tls_secret("pyhami-system", "webhook-tls", data) is True
    # A second daemon making it at the same moment is told it exists (409), not failed.
    assert await secrets.create_tls_secret("pyhami-system", "webhook-tls",
                                           {"tls.crt": b"other"}) is False
    assert await secrets.read_secret("pyhami-system", "webhook-tls") == data
    stored = api.secrets["pyhami-system/webhook-tls"]
    assert stored["type"] == "kubernetes.io/tls"
    assert base64.b64decode(stored["data"]["tls.key"]) == b"key"
    assert await secrets.create_opaque_secret("pyhami-system", "nats", {"seed": b"s"}) is True
    assert api.secrets["pyhami-system/nats"]["type"] == "Opaque"


@pytest.mark.parametrize(("status", "expected"), [
    ({"authenticated": True,
      "user": {"username": "system:serviceaccount:pyhami-system:pyhami-agent",
               "extra": {NODE_NAME_EXTRA: ["gpu-node-1"]}}},
     ReviewedToken(True, "system:serviceaccount:pyhami-system:pyhami-agent", "gpu-node-1")),
    ({"authenticated": True, "user": {"username": "system:serviceaccount:x:y",
                                      "extra": {NODE_NAME_EXTRA: ["a", "b"]}}},
     ReviewedToken(True, "system:serviceaccount:x:y", None)),
    (None, ReviewedToken(False, "", None, "invalid bearer token")),
], ids=["one-node", "two-nodes-name-none", "unknown-token"])
async def test_a_token_review_says_who_and_on_which_node(
        parts: tuple[StubApiServer, Kubernetes], status: dict[str, object] | None,
        expected: ReviewedToken) -> None:
    api, kubernetes = parts
    if status is not None:
        api.reviews["the-token"] = status
    assert await kubernetes.token_reviewer.review_token("the-token", ["nats"]) == expected
    [sent] = api.sent("POST", "/tokenreviews")
    assert sent.body["spec"] == {"token": "the-token", "audiences": ["nats"]}


async def test_the_lease_holder_is_read_and_a_missing_lease_is_none(
        parts: tuple[StubApiServer, Kubernetes]) -> None:
    api, kubernetes = parts
    assert await kubernetes.cluster.lease_holder("pyhami-system", "pyhami-scheduler") is None
    api.leases["pyhami-system/pyhami-scheduler"] = {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "pyhami-scheduler", "namespace": "pyhami-system"},
        "spec": {"holderIdentity": "scheduler-0_7f3c"}}
    assert await kubernetes.cluster.lease_holder(
        "pyhami-system", "pyhami-scheduler") == "scheduler-0_7f3c"
