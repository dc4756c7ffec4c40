"""The daemon's configuration: what ``pyhami scheduler`` is started with.

Each setting is declared once, on the frozen dataclass that uses it, with its default,
flag and help (``common.settings``); ``scheduler.cli`` turns the command line into a
``DaemonConfig`` and refuses settings that do not fit together, and ``scheduler.daemon``
starts from it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Literal

from common.arguments import address, positive_seconds
from common.buckets import replica_count
from common.busaccess import BusCredentials
from common.messaging import NatsSettings
from common.settings import setting
from scheduler.busauth import DEFAULT_AGENT_SERVICE_ACCOUNT, DEFAULT_TOKEN_AUDIENCE
from scheduler.cluster import SCHEDULER_NAME
from scheduler.service import ServiceSettings
from scheduler.tls.files import DEFAULT_CHECK_PERIOD_S, CertificateFiles, TlsFlags

ClusterMode = Literal["kubeconfig", "in-cluster", "standalone"]


@dataclass(frozen=True)
class WebhookConfig:
    """The mutating webhook's listener and certificate (``--webhook-*``, ``--tls-*``)."""

    listen: tuple[str, int]
    # Both or neither; neither: the certificate is self-managed in ``tls_secret``.
    cert_file: str | None = None
    key_file: str | None = None
    namespace: str = "pyhami-system"
    tls_secret: str = setting(
        "pyhami-scheduler-webhook-tls", flag="--webhook-tls-secret", metavar="NAME",
        help="self-managed: the Secret in --namespace holding the CA and the serving "
             "certificate, created if absent (default {default})")
    service: str = setting(
        SCHEDULER_NAME, flag="--webhook-service", metavar="NAME",
        help="self-managed: the Service whose DNS names the certificate covers "
             "(default {default})")
    configuration: str = setting(
        SCHEDULER_NAME, flag="--webhook-configuration", metavar="NAME",
        help="self-managed: the MutatingWebhookConfiguration whose caBundle the daemon "
             "keeps set to its CA (default {default})")
    check_period: float = setting(
        DEFAULT_CHECK_PERIOD_S, flag="--webhook-check-period", parse=positive_seconds,
        metavar="SECONDS",
        help="how often the certificate files, or the configuration's caBundle, are looked "
             "at again (default {default})")


EXTENDER_FLAGS = TlsFlags("--extender-cert-file", "--extender-key-file",
                          "--extender-client-ca-file")


@dataclass(frozen=True)
class ExtenderTls:
    """The extender over HTTPS (``--extender-*-file``); with ``client_ca_file``, mutual TLS:
    a client that presents no certificate that CA signed gets no answer at all."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    check_period: float = DEFAULT_CHECK_PERIOD_S

    def files(self) -> CertificateFiles:
        """The files, read now; raises ``TlsError`` naming the flag and what is wrong."""
        return CertificateFiles("extender", EXTENDER_FLAGS, self.cert_file, self.key_file,
                                period=self.check_period, client_ca_file=self.client_ca_file)


@dataclass(frozen=True)
class BusAuthConfig:
    """The NATS auth callout the daemon answers (``--nats-auth-*``, ``--agent-*``)."""

    # The issuer key and the daemon's password: read from files (``--nats-auth-dir``), or
    # kept in the Secret ``secret`` of ``namespace``, made there by the first daemon.
    credentials: BusCredentials | None = None
    secret: str | None = None
    namespace: str = "pyhami-system"
    # Kubernetes: the agents' projected ServiceAccount tokens.
    audience: str = DEFAULT_TOKEN_AUDIENCE
    agent_namespace: str = "pyhami-system"
    agent_service_account: str = DEFAULT_AGENT_SERVICE_ACCOUNT


@dataclass(frozen=True)
class LeadershipConfig:
    """Several daemons, one decider at a time (docs/ha.md)."""

    identity: str | None = setting(
        None, metavar="NAME",
        help="this daemon's name, carried by every decision it publishes (default: on "
             "Kubernetes the host name, which in a pod is the pod's name and how its "
             "kube-scheduler names itself in its Lease; standalone HOST:PORT, the host name "
             "and --listen's port)")
    leader_lease: str | None = setting(
        None, metavar="NAMESPACE/NAME",
        help="Kubernetes: the Lease kube-scheduler's leader election holds; this daemon "
             "leads while its kube-scheduler holds it (default <--namespace>/"
             "<--scheduler-name>, as the shipped configuration names it; 'none': lead always)")
    lease_ttl: float = setting(
        4.0, parse=positive_seconds, metavar="SECONDS",
        help="standalone: the daemons' lease in NATS expires this long after its holder last "
             "renewed it; the same on every daemon (default {default})")
    lease_renew_period: float = setting(
        1.0, parse=positive_seconds, metavar="SECONDS",
        help="standalone: the holder renews the lease this often (default {default})")
    lease_renew_deadline: float = setting(
        2.5, parse=positive_seconds, metavar="SECONDS",
        help="standalone: the holder stops deciding this long after its last renewal was "
             "sent; shorter than --lease-ttl (default {default})")
    bucket_replicas: int | None = setting(
        None, parse=replica_count, metavar="N",
        help="standalone: the NATS servers keeping each of the daemon's buckets (the pods, "
             "the lease): 1, 3 or 5; a missing bucket is made with them, one with fewer is "
             "raised to them, and a cluster with fewer servers is refused at start (default: "
             "1 when --nats names one server, 3 when it names several)")
    """None: chosen from the number of servers --nats names
    (``common.buckets.default_replicas``)."""


@dataclass(frozen=True)
class DaemonConfig:
    """Everything ``pyhami scheduler`` is started with, checked by ``scheduler.cli``."""

    nats: NatsSettings
    mode: ClusterMode
    service: ServiceSettings
    listen: tuple[str, int] = setting(
        ("127.0.0.1", 8888), parse=address,
        help="extender address: the verbs bind pods, so only kube-scheduler should reach it "
             "(default 127.0.0.1:8888)")
    metrics: tuple[str, int] | None = setting(
        ("0.0.0.0", 9395), parse=address,
        help="Prometheus /metrics, /healthz and /readyz address (default 0.0.0.0:9395)")
    """None: no metrics listener (the tests' in-process daemons)."""
    kubeconfig: str | None = None
    url_prefix: str = setting("", help="path the extender verbs sit under")
    resync_wait: float = setting(
        2.0, parse=positive_seconds,
        help="how long to collect inventories before answering (default {default})")
    retry_period: float = setting(
        5.0, parse=positive_seconds,
        help="standalone: try pending pods again at least this often (default {default})")
    # Standalone: place submitted pods ourselves (off when an outside driver calls the verbs).
    drive_pending: bool = True
    nats_grace: float = setting(
        30.0, parse=positive_seconds,
        help="/readyz fails once NATS has been gone this long (default {default})")
    scheduler_name: str = setting(
        SCHEDULER_NAME, metavar="NAME",
        help="the schedulerName pyhami serves: the webhook writes it, /bind takes only pods "
             "that name it (default {default})")
    webhook: WebhookConfig | None = None
    bus_auth: BusAuthConfig | None = None
    extender_tls: ExtenderTls | None = None
    leadership: LeadershipConfig = field(default_factory=LeadershipConfig)

    @property
    def identity(self) -> str:
        if self.leadership.identity:
            return self.leadership.identity
        host = socket.gethostname()
        return host if self.mode != "standalone" else f"{host}:{self.listen[1]}"
