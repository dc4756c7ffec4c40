"""``pyhami scheduler``: the decision daemon beside kube-scheduler (or standalone)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
from pathlib import Path

import uvloop

from common.arguments import (
    Subcommands,
    add_policy_defaults,
    address,
    defaults_from,
)
from common.busaccess import BusCredentials, CredentialsError
from common.core.errors import SettingsError
from common.core.names import InvalidName, check_label, check_subdomain
from common.deviceconfig import add_device_config_argument, device_config_from
from common.logs import add_log_arguments, configure_logging
from common.messaging import add_nats_arguments, nats_settings
from common.settings import add_settings, settings_from
from common.stopping import stop_on_signals
from scheduler.busauth import DEFAULT_AGENT_SERVICE_ACCOUNT, DEFAULT_TOKEN_AUDIENCE
from scheduler.config import (
    BusAuthConfig,
    ClusterMode,
    DaemonConfig,
    ExtenderTls,
    LeadershipConfig,
    WebhookConfig,
)
from scheduler.daemon import run_daemon
from scheduler.errors import StartupError
from scheduler.leadership import check_lease_timing
from scheduler.service import ServiceSettings
from scheduler.tls.files import TlsError

logger = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "pyhami-system"


def register(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "scheduler", help="run the decision daemon (kube-scheduler extender)")
    add_nats_arguments(parser)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--kubeconfig",
                      help="serve a Kubernetes cluster through this kubeconfig")
    mode.add_argument("--in-cluster", action="store_true",
                      help="serve the cluster this pod runs in")
    mode.add_argument("--standalone", action="store_true",
                      help="no Kubernetes: pods in a NATS JetStream bucket, submitted over "
                           "/api/pods")
    add_settings(parser, DaemonConfig, "listen", "metrics", "url_prefix")
    add_policy_defaults(parser)
    add_device_config_argument(parser)
    add_settings(parser, ServiceSettings, "node_timeout", "node_retention")
    add_settings(parser, DaemonConfig, "nats_grace")
    add_settings(parser, ServiceSettings, "filter_nodes", "reservation_ttl", "group_ttl",
                 "group_patience", "group_turn")
    parser.add_argument("--kueue-admission-check", action="store_true",
                        help="Kubernetes with Kueue: answer the AdmissionChecks whose "
                             "controllerName is pyhami.io/placement: a workload is admitted "
                             "only once its pods' cards are held (docs/kueue.md)")
    add_settings(parser, ServiceSettings, "kueue_retry_after")
    add_settings(parser, DaemonConfig, "resync_wait", "retry_period")
    parser.add_argument("--no-pending-loop", action="store_true",
                        help="standalone: only answer the extender verbs, as when another "
                             "program plays kube-scheduler")
    parser.add_argument("--no-node-registration", action="store_true",
                        help="Kubernetes: do not write the Nodes' hami.io/node-nvidia-register "
                             "annotation that HAMi-WebUI reads (written by the leader unless "
                             "this is given; needs the nodes patch right)")
    parser.add_argument("--no-success-events", action="store_true",
                        help="write no Normal Events, HAMi's FilteringSucceed and "
                             "BindingSucceed on every pod placed (two API writes a pod; "
                             "written unless this is given); the Warnings stay")
    add_log_arguments(parser)
    add_settings(parser, DaemonConfig, "scheduler_name")
    parser.add_argument("--namespace", metavar="NS",
                        help="the daemon's namespace, where the webhook's Secret is "
                             f"(default: $POD_NAMESPACE, else {DEFAULT_NAMESPACE})")
    add_settings(parser.add_argument_group(
        "high availability", "several daemons, one decider at a time (docs/ha.md)"),
        LeadershipConfig)
    _add_bus_auth_arguments(parser.add_argument_group(
        "NATS auth callout", "admit each agent as its own node's, from its token "
        "(docs/security.md)"))
    _add_extender_tls_arguments(parser.add_argument_group(
        "extender TLS", "serve --listen over HTTPS, with mutual TLS when a client CA is given "
        "(docs/scheduler.md, TLS)"))
    _add_webhook_arguments(parser.add_argument_group(
        "mutating webhook", "gives pods that ask for nvidia.com/* GPU resources and name no "
        "scheduler of their own --scheduler-name (docs/scheduler.md, Webhook)"))
    parser.set_defaults(handler=run)


def _add_extender_tls_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--extender-cert-file", metavar="FILE",
                       help="the extender's serving certificate (PEM), with "
                            "--extender-key-file; read again when it changes")
    group.add_argument("--extender-key-file", metavar="FILE",
                       help="the private key of --extender-cert-file (PEM)")
    group.add_argument("--extender-client-ca-file", metavar="FILE",
                       help="mutual TLS: answer only clients presenting a certificate this CA "
                            "(PEM) signed, as kube-scheduler's tlsConfig certFile")


def _extender_tls(args: argparse.Namespace) -> ExtenderTls | None:
    """Raises ``SettingsError`` for files that are missing, cannot be read or do not load."""
    cert_file, key_file = args.extender_cert_file or None, args.extender_key_file or None
    client_ca_file = args.extender_client_ca_file or None
    if (cert_file is None) != (key_file is None):
        raise SettingsError("--extender-cert-file and --extender-key-file go together")
    if cert_file is None or key_file is None:
        if client_ca_file is not None:
            raise SettingsError("--extender-client-ca-file needs --extender-cert-file and "
                                "--extender-key-file: client certificates are asked for "
                                "over HTTPS only")
        return None
    tls = ExtenderTls(cert_file, key_file, client_ca_file)
    try:
        tls.files()
    except TlsError as error:
        raise SettingsError(str(error)) from None
    return tls


def _add_webhook_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--webhook-listen", type=address, metavar="HOST:PORT",
                       help="serve the webhook over HTTPS at HOST:PORT, path /webhook "
                            "(off when unset)")
    group.add_argument("--tls-cert-file", metavar="FILE",
                       help="the webhook's serving certificate (PEM), with "
                            "--tls-private-key-file; read again when it changes. Without "
                            "both, on Kubernetes the daemon makes and keeps its own")
    group.add_argument("--tls-private-key-file", metavar="FILE",
                       help="the private key of --tls-cert-file (PEM)")
    add_settings(group, WebhookConfig)


def _add_bus_auth_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--nats-auth-dir", metavar="DIR",
                       help="answer nats-server's auth callout with the credentials `pyhami "
                            "nats-auth init DIR` wrote (the issuer key; the daemon connects "
                            "as pyhami-daemon with its password); off when unset")
    group.add_argument("--nats-auth-secret", metavar="NAME",
                       help="Kubernetes: answer the auth callout with the issuer key kept in "
                            "this Secret of --namespace, with the daemon's and the watchers' "
                            "passwords and the nats-server configuration (auth.conf) naming "
                            "them; the first daemon makes it. The daemon then connects as "
                            "pyhami-daemon with that password")
    group.add_argument("--agent-token-audience", metavar="AUDIENCE",
                       default=DEFAULT_TOKEN_AUDIENCE,
                       help="Kubernetes: the audience of the agents' projected ServiceAccount "
                            f"tokens (default {DEFAULT_TOKEN_AUDIENCE})")
    group.add_argument("--agent-service-account", metavar="NAMESPACE/NAME",
                       help="Kubernetes: the agents' ServiceAccount (default "
                            "<--namespace>/pyhami-agent)")


def _stored_credentials(directory: Path) -> BusCredentials:
    try:
        return BusCredentials.read(directory)
    except CredentialsError as error:
        raise SettingsError(f"--nats-auth-dir {error} (`pyhami nats-auth init DIR` writes "
                            "them)") from None


def _bus_auth_config(args: argparse.Namespace, mode: ClusterMode,
                     namespace: str) -> BusAuthConfig | None:
    """Raises ``SettingsError`` for an unusable seed, Secret or ServiceAccount."""
    if not args.nats_auth_dir and not args.nats_auth_secret:
        return None
    if args.nats_auth_dir and args.nats_auth_secret:
        raise SettingsError("--nats-auth-dir and --nats-auth-secret: give one")
    credentials, secret = None, None
    if args.nats_auth_secret:
        if mode == "standalone":
            raise SettingsError("--nats-auth-secret is a Kubernetes Secret: with --standalone "
                                "use --nats-auth-dir")
        secret = args.nats_auth_secret
        try:
            check_subdomain("--nats-auth-secret", secret)
        except InvalidName as error:
            raise SettingsError(str(error)) from None
    else:
        credentials = _stored_credentials(Path(args.nats_auth_dir))
    account = args.agent_service_account or f"{namespace}/{DEFAULT_AGENT_SERVICE_ACCOUNT}"
    agent_namespace, agent_name = _namespaced_name("--agent-service-account", account,
                                                   "expected NAMESPACE/NAME")
    if not args.agent_token_audience.strip():
        raise SettingsError("--agent-token-audience: must not be empty")
    return BusAuthConfig(credentials, secret, namespace, audience=args.agent_token_audience,
                         agent_namespace=agent_namespace, agent_service_account=agent_name)


def _webhook_config(args: argparse.Namespace, mode: ClusterMode) -> WebhookConfig | None:
    """Raises ``SettingsError`` for webhook settings that do not fit together."""
    cert_file, key_file = args.tls_cert_file or None, args.tls_private_key_file or None
    if (cert_file is None) != (key_file is None):
        raise SettingsError("--tls-cert-file and --tls-private-key-file go together")
    if args.webhook_listen is None:
        if cert_file is not None:
            raise SettingsError("--tls-cert-file serves the webhook: set --webhook-listen too")
        return None
    if mode == "standalone" and cert_file is None:
        raise SettingsError("--webhook-listen with --standalone needs --tls-cert-file and "
                            "--tls-private-key-file: without Kubernetes there is no Secret "
                            "to keep a certificate of its own in")
    namespace = daemon_namespace(args)
    try:
        check_label("--webhook-service", args.webhook_service)
        check_subdomain("--webhook-tls-secret", args.webhook_tls_secret)
        check_subdomain("--webhook-configuration", args.webhook_configuration)
    except InvalidName as error:
        raise SettingsError(str(error)) from None
    listen = args.webhook_listen
    return settings_from(
        WebhookConfig, args, listen=listen if isinstance(listen, tuple) else address(listen),
        cert_file=cert_file, key_file=key_file, namespace=namespace)


def _leadership_config(args: argparse.Namespace, mode: ClusterMode) -> LeadershipConfig:
    """Raises ``SettingsError`` for a name or lease timing that cannot work."""
    identity = args.identity
    if identity is not None and (not identity or len(identity) > 253 or not identity.isprintable()
                                 or any(c.isspace() for c in identity)):
        raise SettingsError(f"--identity: {identity!r} must be 1 to 253 printable characters "
                            "without spaces")
    lease = args.leader_lease
    if mode == "standalone":
        if lease is not None:
            raise SettingsError("--leader-lease follows kube-scheduler's Lease: with "
                                "--standalone the daemons hold a lease in NATS (--lease-*)")
        # A LeaseSettingsError is a SettingsError: it names the flags.
        check_lease_timing(args.lease_ttl, args.lease_renew_period, args.lease_renew_deadline)
    elif args.bucket_replicas is not None:
        raise SettingsError("--bucket-replicas: only --standalone keeps buckets in NATS (on "
                            "Kubernetes the pods are in the API server)")
    elif lease is None:
        lease = f"{daemon_namespace(args)}/{args.scheduler_name}"
    elif lease != "none":
        _namespaced_name("--leader-lease", lease, "expected NAMESPACE/NAME, or none")
    return settings_from(LeadershipConfig, args, leader_lease=lease)


def _namespaced_name(flag: str, value: str, expected: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` split and checked as Kubernetes checks them; raises
    ``SettingsError`` naming the flag, the part and what was ``expected``."""
    namespace, _, name = value.partition("/")
    try:
        check_label(f"{flag} namespace", namespace)
        check_subdomain(f"{flag} name", name)
    except InvalidName as error:
        raise SettingsError(f"{error} ({expected})") from None
    return namespace, name


def daemon_namespace(args: argparse.Namespace) -> str:
    namespace: str = args.namespace or os.environ.get("POD_NAMESPACE") or DEFAULT_NAMESPACE
    try:
        check_label("--namespace", namespace)
    except InvalidName as error:
        raise SettingsError(str(error)) from None
    return namespace


def config_from(args: argparse.Namespace) -> DaemonConfig:
    """Raises ``SettingsError`` for settings that do not fit together."""
    mode: ClusterMode
    if args.standalone:
        mode = "standalone"
    elif args.in_cluster:
        mode = "in-cluster"
    elif args.kubeconfig:
        mode = "kubeconfig"
    else:
        raise SettingsError("choose the cluster: --kubeconfig PATH, --in-cluster or --standalone")
    if mode == "kubeconfig" and not os.path.isfile(args.kubeconfig):
        raise SettingsError(f"--kubeconfig: {args.kubeconfig} is not a readable file")
    node_timeout, node_retention = args.node_timeout, args.node_retention
    if mode == "standalone" and node_retention <= node_timeout:
        raise SettingsError(f"--node-retention ({node_retention:g}s) must be longer than "
                            f"--node-timeout ({node_timeout:g}s)")
    try:
        check_subdomain("--scheduler-name", args.scheduler_name)
    except InvalidName as error:
        raise SettingsError(str(error)) from None
    defaults = defaults_from(args, device_config_from(args))
    kubernetes = mode != "standalone"
    if args.kueue_admission_check and not kubernetes:
        raise SettingsError("--kueue-admission-check needs Kubernetes (Kueue's Workloads "
                            "are Kubernetes objects): use it with --kubeconfig or --in-cluster")
    return settings_from(
        DaemonConfig, args, nats=nats_settings(args), mode=mode,
        # Kubernetes lists its Nodes: a node is forgotten when its Node is deleted.
        service=settings_from(ServiceSettings, args, defaults=defaults,
                              node_retention=None if kubernetes else node_retention,
                              nodes_listed=kubernetes,
                              # Standalone has no Node objects to annotate.
                              node_registration=kubernetes and not args.no_node_registration,
                              registration_retention=node_retention,
                              success_events=not args.no_success_events,
                              kueue_admission_check=args.kueue_admission_check),
        listen=args.listen, metrics=args.metrics, kubeconfig=args.kubeconfig,
        drive_pending=not args.no_pending_loop,
        webhook=_webhook_config(args, mode), extender_tls=_extender_tls(args),
        bus_auth=_bus_auth_config(args, mode, daemon_namespace(args)),
        leadership=_leadership_config(args, mode),
    )


GC_YOUNG_THRESHOLD = 20_000
"""Allocations, net of frees, between two collections of the youngest generation."""


def run(args: argparse.Namespace) -> int:
    configure_logging(args)  # first: reading --device-config logs the keys it ignores
    try:
        config = config_from(args)
    except SettingsError as error:
        print(f"pyhami scheduler: {error}", file=sys.stderr)
        return 2

    async def main() -> None:
        stop = asyncio.Event()
        stop_on_signals(stop.set, logger)  # first, so stopping works in every state
        await run_daemon(config, stop, started=lambda _: gc.freeze())

    # The process's own collector settings, not the daemon's (in-process tests run many
    # daemons in one interpreter). Each pod allocates thousands of short-lived objects:
    # at Python's default threshold (700) the young generation was collected several
    # times a pod, and the older ones scanned the start-up's objects (modules, the
    # inventories) again and again; frozen once the daemon answers, they are left out.
    # 30 to 40 us a /filter at 1,000 nodes (docs/performance.md).
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])

    try:
        uvloop.run(main())
    except StartupError as error:
        one_line = " ".join(str(error).split())  # a YAML error spans several lines
        print(f"pyhami scheduler: {one_line}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"pyhami scheduler: {error}", file=sys.stderr)
        return 1
    return 0
