"""``KubernetesTokenReviewer``: bus auth's ``TokenReviewer`` port, an agent's token
checked by the API server with a TokenReview."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from scheduler.busauth import NODE_NAME_EXTRA, ReviewedToken
from scheduler.cluster.kube import _client
from scheduler.cluster.kube._requests import token_review_body
from scheduler.cluster.kube._transport import API_FAILURES, ApiTransport, describe_failure
from scheduler.cluster.kube._wire import TokenReview
from scheduler.cluster.port import ClusterError


class KubernetesTokenReviewer:
    """Asks the API server who a token is (a TokenReview) and on which node its pod runs."""

    def __init__(self, api: ApiTransport) -> None:
        self._api = api

    async def review_token(self, token: str, audiences: Sequence[str]) -> ReviewedToken:
        try:
            data = await _client.review_token(self._api, token_review_body(token, audiences))
            status = msgspec.json.decode(data, type=TokenReview).status
        except API_FAILURES as error:
            raise ClusterError(f"TokenReview failed: {describe_failure(error)}") from error
        nodes = (status.user.extra or {}).get(NODE_NAME_EXTRA) or []
        return ReviewedToken(authenticated=status.authenticated,
                             username=status.user.username,
                             node=nodes[0] if len(nodes) == 1 else None, error=status.error)
