"""``KubernetesSecrets``: the Secrets the daemon keeps its own credentials in (the
webhook's self-managed certificate, the NATS credentials) and the caBundle of the webhook
configuration that has the API server trust that certificate: the ``WebhookCluster`` port,
and bus auth's ``SecretStore``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from scheduler.cluster.kube import _client
from scheduler.cluster.kube._requests import JsonObject, ca_bundle_patch, secret_body
from scheduler.cluster.kube._transport import (
    API_FAILURES,
    CONFLICT,
    NOT_FOUND,
    ApiTransport,
    answered_with,
    describe_failure,
)
from scheduler.cluster.kube._wire import Secret, WebhookConfiguration
from scheduler.cluster.port import ClusterError


class KubernetesSecrets:
    """The ``WebhookCluster`` port (and bus auth's ``SecretStore``) on a Kubernetes API
    server: Secrets read and created, a MutatingWebhookConfiguration's caBundle read and
    set. Every call raises ``ClusterError`` when the API fails."""

    def __init__(self, api: ApiTransport) -> None:
        self._api = api

    async def read_secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        try:
            data = await _client.read_secret(self._api, namespace, name)
            return msgspec.json.decode(data, type=Secret).data or {}
        except API_FAILURES as error:
            if answered_with(error, NOT_FOUND):
                return None
            raise ClusterError(f"reading Secret {namespace}/{name} failed: "
                               f"{describe_failure(error)}") from error

    async def create_tls_secret(self, namespace: str, name: str,
                                data: Mapping[str, bytes]) -> bool:
        return await self._create_secret(namespace, name, secret_body(
            name, data, secret_type="kubernetes.io/tls", component="webhook"))

    async def create_opaque_secret(self, namespace: str, name: str,
                                   data: Mapping[str, bytes]) -> bool:
        return await self._create_secret(namespace, name, secret_body(
            name, data, secret_type="Opaque", component="scheduler"))

    async def _create_secret(self, namespace: str, name: str, body: JsonObject) -> bool:
        """False when the Secret exists already."""
        try:
            await _client.create_secret(self._api, namespace, body)
        except API_FAILURES as error:
            if answered_with(error, CONFLICT):
                return False
            raise ClusterError(f"creating Secret {namespace}/{name} failed: "
                               f"{describe_failure(error)}") from error
        return True

    async def webhook_ca_bundles(self, configuration: str) -> list[tuple[str, bytes]] | None:
        try:
            data = await _client.read_webhook_configuration(self._api, configuration)
            webhooks = msgspec.json.decode(data, type=WebhookConfiguration).webhooks or []
        except API_FAILURES as error:
            if answered_with(error, NOT_FOUND):
                return None
            raise ClusterError(f"reading MutatingWebhookConfiguration {configuration} "
                               f"failed: {describe_failure(error)}") from error
        return [(webhook.name, webhook.client_config.ca_bundle) for webhook in webhooks]

    async def set_webhook_ca_bundle(self, configuration: str,
                                    webhooks: Sequence[tuple[int, str]], ca: bytes) -> None:
        patch = ca_bundle_patch(webhooks, ca)
        try:
            await _client.patch_webhook_configuration(self._api, configuration, patch)
        except API_FAILURES as error:
            raise ClusterError(f"patching the caBundle of MutatingWebhookConfiguration "
                               f"{configuration} failed: {describe_failure(error)}") from error
