"""Running the daemon: NATS in, HTTP in and out, the cluster port chosen at start-up.

The order makes stopping and probing work in every state: the CLI installs the
signal handlers first; then HTTP comes up on the extender's and the metrics' listeners
(``/healthz`` answers, ``/readyz`` says why it is not ready; the extender's over HTTPS
already when it is so configured); then the webhook, when asked for, once it has its
certificate;
then NATS is connected, the cluster opened and the ledger rebuilt, each step abandoned
at once when ``stop`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import socket
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeVar

import msgspec
import nats.errors
import nats.js.errors
import nkeys
from aiohttp import web
from nats.aio.client import Client
from nats.aio.msg import Msg

from common import telemetry
from common.arguments import positive_seconds
from common.busaccess import DAEMON_USER, BusCredentials, CredentialsError
from common.core.natsjwt import public_key
from common.messaging import Connection, NatsSettings
from common.settings import setting
from common.supervision import Supervisor
from common.wire import (
    ALLOCATED_SUBJECTS,
    ALLOCATIONS_SUBJECTS,
    INVENTORY_SUBJECTS,
    RESYNC_SUBJECT,
    ResyncRequest,
    encode,
)
from scheduler.busauth import (
    DEFAULT_AGENT_SERVICE_ACCOUNT,
    DEFAULT_TOKEN_AUDIENCE,
    AgentIdentities,
    AuthCallout,
    AuthResult,
    NodeTokens,
    ServiceAccountTokens,
    self_managed_credentials,
)
from scheduler.cluster import SCHEDULER_NAME, ClusterError, WebhookCluster
from scheduler.cluster.standalone import StandaloneCluster
from scheduler.errors import SchedulerError
from scheduler.leadership import (
    FollowedLease,
    Leadership,
    LeaseSettingsError,
    NatsLease,
    Sole,
)
from scheduler.metrics import ConnectionCollector
from scheduler.pending import PendingLoop
from scheduler.service import SchedulerService, ServiceSettings
from scheduler.tls.files import DEFAULT_CHECK_PERIOD_S, CertificateFiles, TlsError, TlsFlags
from scheduler.tls.webhook import (
    WEBHOOK_FLAGS,
    CaBundleKeeper,
    ServingTls,
    context_for,
    self_managed,
    service_names,
)
from scheduler.web.extender import extender_app, metrics_app
from scheduler.web.pods import pod_api
from scheduler.web.webhook import WEBHOOK_PATH, webhook_app

if TYPE_CHECKING:
    from scheduler.cluster.kube import KubernetesCluster

logger = logging.getLogger(__name__)

ClusterMode = Literal["kubeconfig", "in-cluster", "standalone"]
# Stopping must end within 10 s: each step of the shutdown has its share.
HTTP_SHUTDOWN_S = 2.0
SETTLE_S = 2.0
REBUILD_RETRY_S = 2.0
T = TypeVar("T")


class StartupError(SchedulerError):
    """A setting found unusable at start (a kubeconfig, the in-cluster configuration, a
    nats-server without JetStream); the CLI prints it on one line and exits 2."""


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


@dataclass(frozen=True)
class DaemonConfig:
    nats: NatsSettings
    mode: ClusterMode
    service: ServiceSettings
    listen: tuple[str, int]
    metrics: tuple[str, int] | None
    kubeconfig: str | None = None
    url_prefix: str = setting("", help="path the extender verbs sit under")
    resync_wait: float = setting(
        2.0, parse=positive_seconds,
        help="how long to collect inventories before answering (default {default})")
    retry_period: float = setting(
        5.0, parse=positive_seconds,
        help="standalone: try pending pods again at least this often (default {default})")
    noop_endpoint: bool = False
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


def telemetry_publisher(connection: Connection) -> Callable[
        [telemetry.DecisionEvent | telemetry.UsageEvent], Awaitable[None]]:
    """Telemetry never fails a request: what cannot go is counted by the connection."""

    async def publish(event: telemetry.DecisionEvent | telemetry.UsageEvent) -> None:
        subject = (telemetry.DECISIONS_SUBJECT if isinstance(event, telemetry.DecisionEvent)
                   else telemetry.usage_subject(event.node))
        await connection.publish(subject, telemetry.encode(event))

    return publish


async def _kubernetes(config: DaemonConfig) -> KubernetesCluster:
    from scheduler.cluster.kube import KubernetesCluster  # noqa: PLC0415 (heavy; loaded only when used)

    if config.mode == "in-cluster":
        try:
            return KubernetesCluster.in_cluster(scheduler_name=config.scheduler_name)
        except ClusterError as error:
            raise StartupError(f"--in-cluster: {error} (it works only in a pod of the cluster; "
                               "elsewhere use --kubeconfig)") from None
    assert config.kubeconfig is not None
    try:
        return KubernetesCluster.from_kubeconfig(config.kubeconfig,
                                                 scheduler_name=config.scheduler_name)
    except ClusterError as error:
        raise StartupError(f"--kubeconfig: {error}") from None


async def _callout_signer(config: BusAuthConfig, kubernetes: KubernetesCluster | None,
                         connection: Connection, phase: list[str]) -> nkeys.KeyPair:
    """The issuer key, the daemon's password set on ``connection``: from the files, or read
    (made first if need be) from the Secret, tried again while the API fails."""
    if config.credentials is not None:
        connection.authenticate(DAEMON_USER, config.credentials.daemon_password)
        return config.credentials.signer
    assert config.secret is not None, "checked by the CLI"
    assert kubernetes is not None, "checked by the CLI: the Secret is a Kubernetes one"
    phase[0] = f"reading the NATS credentials from Secret {config.namespace}/{config.secret}"
    secret = config.secret
    try:
        credentials = await _while_the_api_fails("NATS credentials", lambda: (
            self_managed_credentials(kubernetes, config.namespace, secret)))
    except CredentialsError as error:
        raise StartupError(f"--nats-auth-secret: {error}; delete the Secret to have the "
                           "daemon make a new one (and restart NATS)") from None
    connection.authenticate(DAEMON_USER, credentials.daemon_password)
    return credentials.signer


def _agent_identities(config: BusAuthConfig, kubernetes: KubernetesCluster | None,
                      signer: nkeys.KeyPair) -> AgentIdentities:
    if kubernetes is None:
        return NodeTokens(public_key(signer))
    return ServiceAccountTokens(kubernetes, audience=config.audience,
                                namespace=config.agent_namespace,
                                service_account=config.agent_service_account)


async def _open_bucket(client: Client,
                       refusal: Callable[[], str | None]) -> StandaloneCluster:
    try:
        return await StandaloneCluster.open(client, refusal)
    except (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError):
        url = client.connected_url
        raise StartupError(
            f"--standalone keeps pods in JetStream, which the nats-server at "
            f"{url.netloc if url else '?'} does not offer: start nats-server with -js "
            "(and -sd DIR to keep the pods on disk)") from None


# After a 413, aiohttp reads and drops the rest of the body for this long, so the client
# can still read the answer; its default of 10 s held a stopping daemon that long.
LINGER_S = 1.0


async def _serve(app: web.Application, address: tuple[str, int],
                 tls: ssl.SSLContext | None = None) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=HTTP_SHUTDOWN_S,
                           lingering_time=LINGER_S)
    await runner.setup()
    await web.TCPSite(runner, address[0], address[1], ssl_context=tls).start()
    return runner


def _certificate_files(config: WebhookConfig | None) -> CertificateFiles | None:
    """The webhook's certificate files, read at once: a bad one stops the start."""
    if config is None or config.cert_file is None or config.key_file is None:
        return None
    try:
        return CertificateFiles("webhook", WEBHOOK_FLAGS, config.cert_file, config.key_file,
                                period=config.check_period)
    except TlsError as error:
        raise StartupError(str(error)) from None


def _extender_files(config: ExtenderTls | None) -> CertificateFiles | None:
    """The extender's certificate files, read at once: a bad one stops the start."""
    if config is None:
        return None
    try:
        return config.files()
    except TlsError as error:
        raise StartupError(str(error)) from None


async def _self_managed_tls(config: WebhookConfig, cluster: WebhookCluster) -> ServingTls:
    """The certificate in the Secret, made first if need be; tried again while the API
    fails, refused (``StartupError``) when the Secret holds nothing servable."""
    names = service_names(config.service, config.namespace)
    try:
        return await _while_the_api_fails("webhook certificate", lambda: self_managed(
            cluster, config.namespace, config.tls_secret, names,
            datetime.datetime.now(datetime.UTC)))
    except TlsError as error:
        raise StartupError(f"--webhook-tls-secret: {error}; delete the Secret to have "
                           "the daemon make a new one") from None


async def _while_the_api_fails(what: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """``attempt()``'s result, tried again every ``REBUILD_RETRY_S`` while the cluster
    fails (``ClusterError``); any other error goes to the caller."""
    while True:
        try:
            return await attempt()
        except ClusterError as error:
            logger.warning("%s not obtained, trying again in %gs: %s", what, REBUILD_RETRY_S,
                           error)
            await asyncio.sleep(REBUILD_RETRY_S)


@dataclass
class _Webhook:
    runner: web.AppRunner
    status: Callable[[], dict[str, object]]


async def _start_webhook(config: DaemonConfig, files: CertificateFiles | None,
                         kubernetes: KubernetesCluster | None, supervisor: Supervisor,
                         phase: list[str]) -> _Webhook:
    webhook = config.webhook
    assert webhook is not None
    status: dict[str, object] = {"listen": f"{webhook.listen[0]}:{webhook.listen[1]}",
                                 "scheduler_name": config.scheduler_name}
    if files is not None:
        context = files.context
        status["certificate"] = files.describe()
        supervisor.start("webhook-certificate-files", files.follow)
        keeper = None
    else:
        assert kubernetes is not None, "checked by the CLI: standalone needs the files"
        phase[0] = (f"reading the webhook certificate from Secret "
                    f"{webhook.namespace}/{webhook.tls_secret}")
        tls = await _self_managed_tls(webhook, kubernetes)
        context = context_for(tls)
        status["certificate"] = f"Secret {webhook.namespace}/{webhook.tls_secret}"
        keeper = CaBundleKeeper(kubernetes, webhook.configuration, tls.ca,
                                webhook.check_period)
        supervisor.start("webhook-ca-bundle", keeper.run)
    runner = await _serve(webhook_app(config.scheduler_name), webhook.listen, context)
    logger.info("webhook on https://%s:%d%s", *webhook.listen, WEBHOOK_PATH)

    def report() -> dict[str, object]:
        if keeper is None:
            return status
        return {**status, "configuration": webhook.configuration, "ca_bundle": keeper.state}

    return _Webhook(runner, report)


def _starting_app(why: Callable[[], list[str]]) -> web.Application:
    """What the extender's and the metrics' ports answer until the daemon is up: alive,
    not ready."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(status=503, text="; ".join(why()) + "\n")

    async def statusz(_: web.Request) -> web.Response:
        return web.Response(body=msgspec.json.encode({"ready": False,
                                                       "not_ready_because": why()}),
                            content_type="application/json")

    async def starting(_: web.Request) -> web.Response:
        return web.Response(status=503, text="pyhami is starting: " + "; ".join(why()) + "\n")

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz),
                    web.get("/statusz", statusz), web.route("*", "/{path:.*}", starting)])
    return app


async def _unless_stopped(stop: asyncio.Event, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None (``work`` cancelled) when ``stop`` is set first."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


def nats_check(connection: Connection, grace: float) -> Callable[[], str | None]:
    def check() -> str | None:
        down = connection.down_for()
        if down <= grace:
            return None
        return f"NATS disconnected for {down:.0f}s (grace {grace:g}s)"

    return check


async def run_daemon(config: DaemonConfig, stop: asyncio.Event,
                     started: Callable[[SchedulerService], None] | None = None) -> None:
    """Run until ``stop`` is set; ``started`` is told once the daemon answers /filter.

    Raises ``StartupError`` for a setting found unusable at start."""
    kubernetes = await _kubernetes(config) if config.mode != "standalone" else None
    certificate_files = _certificate_files(config.webhook)
    extender_files = _extender_files(config.extender_tls)
    extender_tls = extender_files.context if extender_files is not None else None
    connection = Connection(config.nats, "pyhami-scheduler")
    supervisor = Supervisor()
    runners: list[web.AppRunner] = []
    service: SchedulerService | None = None
    standalone: StandaloneCluster | None = None
    lease: NatsLease | None = None
    loop: PendingLoop | None = None
    phase = ["connecting to NATS"]

    async def when_up(client: Client, new_client: bool) -> None:
        if service is None:
            return  # the first connection: starting up subscribes and asks for a resync
        # What the agents sent while the daemon was off the bus is lost: their next
        # messages may skip any number of sequences, and they are asked for them now.
        service.connection_resumed()
        if new_client and standalone is not None:
            # A replacement client: what was built on the old one is built again.
            await standalone.reattach(client)
            if lease is not None:
                await lease.reattach(client)
        await connection.publish(RESYNC_SUBJECT, encode(ResyncRequest(
            requested_by="pyhami-scheduler")))

    connection.when_up(when_up)
    callout: AuthCallout | None = None
    answered_early: Counter[AuthResult] = Counter()

    def count_answer(result: AuthResult) -> None:
        if service is None:
            answered_early[result] += 1
        else:
            service.metrics.nats_auth.labels(result).inc()

    webhook: _Webhook | None = None
    try:
        starting = [await _serve(_starting_app(lambda: phase), config.listen, extender_tls)]
        if config.metrics is not None:  # where the kubelet probes: it has no client certificate
            starting.append(await _serve(_starting_app(lambda: phase), config.metrics))
        runners.extend(starting)
        if extender_files is not None:
            supervisor.start("extender-certificate-files", extender_files.follow)
        if config.webhook is not None:
            webhook = await _unless_stopped(stop, _start_webhook(
                config, certificate_files, kubernetes, supervisor, phase))
            if webhook is None:
                return
            runners.append(webhook.runner)
            phase[0] = "connecting to NATS"
        if config.bus_auth is not None:
            signer = await _unless_stopped(stop, _callout_signer(
                config.bus_auth, kubernetes, connection, phase))
            if signer is None:
                return
            identities = _agent_identities(config.bus_auth, kubernetes, signer)
            callout = AuthCallout(connection, identities, signer, count=count_answer)
            await callout.start()  # before connecting: agents are admitted from the first moment
            phase[0] = "connecting to NATS"
        supervisor.start("nats-connection", connection.run)
        client = await _unless_stopped(stop, connection.wait_up())
        if client is None:
            return
        if kubernetes is None:
            phase[0] = "opening the JetStream pod bucket"
            standalone = await _unless_stopped(stop, _open_bucket(
                client, lambda: lease.refusal() if lease is not None else None))
            if standalone is None:
                return
        cluster = standalone or kubernetes
        assert cluster is not None
        service = SchedulerService(config.service, cluster, telemetry_publisher(connection))
        for result, times in answered_early.items():
            service.metrics.nats_auth.labels(result).inc(times)
        service.readiness_checks.append(nats_check(connection, config.nats_grace))
        service.readiness_checks.append(lambda: "; ".join(supervisor.problems()) or None)
        service.status_parts["nats"] = lambda: {"connected": connection.connected,
                                                "down_for_s": round(connection.down_for(), 1),
                                                "clients_replaced": connection.replaced}
        service.status_parts["background_crashes"] = lambda: dict(supervisor.crashes)
        if webhook is not None:
            service.status_parts["webhook"] = webhook.status
        service.metrics.registry.register(ConnectionCollector(connection))
        app = extender_app(service, url_prefix=config.url_prefix, noop=config.noop_endpoint)
        if standalone is not None:
            loop = PendingLoop(service, standalone, config.retry_period,
                               config.scheduler_name)
            app.add_routes(pod_api(standalone, loop))
        service.status_parts["extender"] = lambda: _extender_status(config, extender_files)
        if standalone is not None:
            lease = await _standalone_lease(config, client, standalone, service,
                                            lambda: loop)
        service.shared.leadership = _leadership(config, kubernetes, service, lease)
        for runner in starting:
            runners.remove(runner)
            await runner.cleanup()
        runners.append(await _serve(app, config.listen, extender_tls))
        if config.metrics is not None:
            runners.append(await _serve(metrics_app(service), config.metrics))

        async def on_inventory(message: Msg) -> None:
            with supervisor.contained("inventory message"):
                await service.receive_inventory(message.subject, message.data)

        # Only the leader answers the device plugins: a standby's view may lag.
        async def on_allocations_request(message: Msg) -> None:
            if not service.shared.leadership.leading():
                return
            with supervisor.contained("allocations request"):
                pending = await service.pending_allocations(message.subject)
                if pending is not None and message.reply:
                    await connection.publish(message.reply, encode(pending))

        async def on_allocation_outcome(message: Msg) -> None:
            if not service.shared.leadership.leading():
                return
            with supervisor.contained("allocation outcome"):
                await service.allocation_outcome(message.subject, message.data)

        await connection.subscribe(INVENTORY_SUBJECTS, on_inventory)
        await connection.subscribe(ALLOCATIONS_SUBJECTS, on_allocations_request)
        await connection.subscribe(ALLOCATED_SUBJECTS, on_allocation_outcome)
        await connection.publish(RESYNC_SUBJECT,
                                 encode(ResyncRequest(requested_by="pyhami-scheduler")))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), config.resync_wait)
        if stop.is_set() or await _unless_stopped(stop, _rebuilt(service)) is None:
            return
        leadership = service.shared.leadership
        phase[0] = "learning which daemon leads"
        await _unless_stopped(stop, leadership.start())
        if stop.is_set():
            return
        supervisor.start("leadership", leadership.run)
        supervisor.start("follow-cluster", service.follow_cluster)
        supervisor.start("expire-reservations", service.expire_reservations)
        supervisor.start("follow-cordons", service.follow_cordons)
        supervisor.start("watch-nodes", service.watch_nodes)
        if standalone is not None:
            supervisor.start("settle-pod-store", standalone.keep_settled)
        if loop is not None and config.drive_pending:
            supervisor.start("pending-loop", loop.run)
        logger.info("pyhami scheduler ready on %s:%d%s as %s, %s", *config.listen,
                    "" if extender_files is None
                    else " (HTTPS, mutual TLS)" if extender_files.mutual else " (HTTPS)",
                    config.identity, leadership.role)
        if started is not None:
            started(service)
        await stop.wait()
    finally:
        await supervisor.stop()
        if service is not None:
            await service.shared.leadership.resign()
        if callout is not None:
            await callout.close()
        for runner in runners:
            await runner.cleanup()
        if service is not None:
            await service.settle(SETTLE_S)
        await connection.close()
        if kubernetes is not None:
            await kubernetes.close()


async def _standalone_lease(config: DaemonConfig, client: Client,
                            standalone: StandaloneCluster, service: SchedulerService,
                            pending_loop: Callable[[], PendingLoop | None]) -> NatsLease:
    """The standalone daemons' lease: once elected, a daemon reads every pod afresh and
    rebuilds its ledger before it decides; standing by, it drops its reservations."""

    async def elected() -> None:
        await standalone.reload()
        await service.rebuild()
        loop = pending_loop()
        if loop is not None:
            loop.retry_now()

    settings = config.leadership
    lease = NatsLease(config.identity, ttl=settings.lease_ttl,
                      renew_period=settings.lease_renew_period,
                      renew_deadline=settings.lease_renew_deadline,
                      on_elected=elected, on_demoted=service.stand_by)
    try:
        await lease.open(client)
    except LeaseSettingsError as error:
        raise StartupError(str(error)) from None
    return lease


def _leadership(config: DaemonConfig, kubernetes: KubernetesCluster | None,
                service: SchedulerService, lease: NatsLease | None) -> Leadership:
    if lease is not None:
        return lease
    followed = config.leadership.leader_lease
    if kubernetes is None or not followed or followed == "none":
        return Sole(config.identity)
    namespace, _, name = followed.partition("/")
    # Elected: a fresh list of the pods, for any the pod watch has not brought yet.
    return FollowedLease(kubernetes, namespace, name, config.identity,
                         on_elected=service.reconcile)


def _extender_status(config: DaemonConfig,
                     files: CertificateFiles | None) -> dict[str, object]:
    listen = f"{config.listen[0]}:{config.listen[1]}"
    if files is None:
        return {"listen": listen, "tls": "off"}
    return {"listen": listen, "tls": "mutual" if files.mutual else "server",
            "certificate": files.describe()}


async def _rebuilt(service: SchedulerService) -> bool:
    """Rebuild the ledger, trying again while the cluster cannot list its pods."""
    while True:
        try:
            await service.rebuild()
        except ClusterError as error:
            logger.warning("rebuilding the ledger failed, trying again in %gs: %s",
                           REBUILD_RETRY_S, error)
            await asyncio.sleep(REBUILD_RETRY_S)
            continue
        return True
