"""Running the daemon: start-up as a list of named steps, stopping in reverse.

``Daemon.run`` reads as kube-scheduler's ``Run``: each step is one method, and each
registers on one ``AsyncExitStack`` what undoes it, so that stopping in any state undoes
exactly what was done, last first, after the background tasks. The order makes stopping
and probing work in every state: the CLI installs the signal handlers first; then HTTP
comes up on the extender's and the metrics' listeners (``/healthz`` answers, ``/readyz``
says which step the daemon is at; the extender's over HTTPS already when it is so
configured); then the webhook, when asked for, once it has its certificate; then NATS is
connected, the cluster opened, the service built, the ledger rebuilt and the leadership
learnt, each step abandoned at once when ``stop`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import nats.errors
import nats.js.errors
import nkeys
from aiohttp import web
from nats.aio.client import Client
from nats.aio.msg import Msg

from common import telemetry
from common.buckets import BucketReplicasError, default_replicas
from common.busaccess import DAEMON_USER, CredentialsError
from common.core.deviceconfig import DeviceConfig
from common.core.natsjwt import public_key
from common.core.pod import PodManifest
from common.messaging import Connection, describe_error
from common.supervision import Supervisor
from common.wire import (
    ALLOCATED_SUBJECTS,
    ALLOCATIONS_SUBJECTS,
    INVENTORY_SUBJECTS,
    RESYNC_SUBJECT,
    ResyncRequest,
    WireError,
    decode_resync,
    encode,
)
from scheduler.busauth import (
    AgentIdentities,
    AuthCallout,
    AuthResult,
    NodeTokens,
    ServiceAccountTokens,
    self_managed_credentials,
)
from scheduler.cluster import Cluster, ClusterError, WebhookCluster
from scheduler.cluster.standalone import StandaloneCluster
from scheduler.config import BusAuthConfig, DaemonConfig, ExtenderTls, WebhookConfig
from scheduler.errors import SchedulerError
from scheduler.leadership import (
    FollowedLease,
    Leadership,
    LeaseSettingsError,
    NatsLease,
    Sole,
    TakeOverFailed,
)
from scheduler.metrics import ConnectionCollector, UnreadableCollector
from scheduler.pending import PendingLoop
from scheduler.service import SchedulerService
from scheduler.tls.files import CertificateFiles, TlsError
from scheduler.tls.webhook import (
    WEBHOOK_FLAGS,
    CaBundleKeeper,
    ServingTls,
    context_for,
    self_managed,
    service_names,
)
from scheduler.web.extender import extender_app, extender_verbs, metrics_app
from scheduler.web.fastpath import VerbsServer
from scheduler.web.pods import PodApi
from scheduler.web.probes import serve, starting_app
from scheduler.web.quotas import QuotaApi
from scheduler.web.webhook import WEBHOOK_PATH, QuotaGate, webhook_app

if TYPE_CHECKING:
    from scheduler.cluster.kube import Kubernetes

logger = logging.getLogger(__name__)

# Stopping must end within 10 s: each step of the shutdown has its share.
SETTLE_S = 2.0
REBUILD_RETRY_S = 2.0
CATCH_UP_AFTER_S = 6.0
BUS_START_PATIENCE_S = 60.0
"""How long the start asks JetStream again while it does not answer in time (a stream
electing its leader, a server of the cluster lost as the daemon starts) before it stops."""
BUS_START_RETRY_S = 1.0
"""When a standalone daemon that has just taken the lease reads the pods again for writes
its predecessor sent while it still decided but that landed after this daemon read them
(a NATS client's publish timeout, 5 s, plus a margin): each is booked then."""
T = TypeVar("T")


class StartupError(SchedulerError):
    """A setting found unusable at start (a kubeconfig, the in-cluster configuration, a
    nats-server without JetStream); the CLI prints it on one line and exits 2."""


class _Stopped(SchedulerError):
    """``stop`` was set during a step: the start-up ends there, and what was done is
    undone. Never leaves ``Daemon.run``."""


class StartupPhase:
    """What the daemon is doing while it starts, as ``/readyz`` and ``/statusz`` say it."""

    def __init__(self, first: str) -> None:
        self._now = first

    def enter(self, what: str) -> None:
        self._now = what

    def not_ready_because(self) -> list[str]:
        return [self._now]


async def run_daemon(config: DaemonConfig, stop: asyncio.Event,
                     started: Callable[[SchedulerService], None] | None = None) -> None:
    """Run until ``stop`` is set; ``started`` is told once the daemon answers /filter.

    Raises ``StartupError`` for a setting found unusable at start."""
    await Daemon(config, stop, started).run()


class Daemon:
    """``pyhami scheduler``: NATS in, HTTP in and out, the cluster port chosen at start-up.

    The collaborators each step makes are kept here for the steps after it and for the
    hooks the NATS connection and the leadership call (a replaced NATS client, an
    election); those hooks fire only once the steps they read from have run.
    """

    def __init__(self, config: DaemonConfig, stop: asyncio.Event,
                 started: Callable[[SchedulerService], None] | None = None) -> None:
        self._config = config
        self._stop = stop
        self._started = started
        self._phase = StartupPhase("connecting to NATS")
        self._connection = Connection(config.nats, "pyhami-scheduler")
        self._connection.when_up(self._connection_up)
        self._supervisor = Supervisor()
        # The auth callout answers from before the service (and its metrics) exist.
        self._auth_answers: Counter[AuthResult] = Counter()
        self._kubernetes: Kubernetes | None = None
        self._extender_files: CertificateFiles | None = None
        self._webhook_files: CertificateFiles | None = None
        self._webhook_status: Callable[[], dict[str, object]] | None = None
        self._standalone: StandaloneCluster | None = None
        self._lease: NatsLease | None = None
        self._service: SchedulerService | None = None
        self._pending: PendingLoop | None = None
        self._catching_up: asyncio.Task[None] | None = None  # after an election (standalone)

    async def run(self) -> None:
        async with contextlib.AsyncExitStack() as undo:
            try:
                await self._start_up(undo)
                await self._stop.wait()
            except _Stopped:
                pass
            finally:
                self._stop_catching_up()
                await self._supervisor.stop()  # first: the background tasks use the rest

    async def _start_up(self, undo: contextlib.AsyncExitStack) -> None:
        """The steps, in order."""
        await self._open_kubernetes(undo)
        self._read_certificates()
        undo.push_async_callback(self._connection.close)
        probes = await self._serve_probes(undo)
        self._follow_extender_certificate()
        await self._start_webhook(undo)
        await self._answer_auth_callout(undo)
        client = await self._connect_nats()
        leadership = self._choose_leadership()
        cluster = await self._open_cluster(client)
        await self._open_lease(client)
        service = self._build_service(cluster, leadership, undo)
        await self._serve_extender(service, probes, undo)
        await self._subscribe(service, leadership)
        await self._collect_inventories()
        await self._rebuild_ledger(service)
        await self._learn_leadership(leadership, undo)
        self._start_background(service, leadership)
        self._announce_ready(service, leadership)

    # The steps --------------------------------------------------------------------------

    async def _open_kubernetes(self, undo: contextlib.AsyncExitStack) -> None:
        if self._config.mode == "standalone":
            return
        self._kubernetes = kubernetes = _kubernetes(self._config)
        undo.push_async_callback(kubernetes.close)

    def _read_certificates(self) -> None:
        """The extender's and the webhook's certificate files, read at once: a bad one
        stops the start before anything listens."""
        self._extender_files = _extender_files(self._config.extender_tls)
        if self._config.webhook is not None:
            self._webhook_files = _webhook_files(self._config.webhook)

    async def _serve_probes(self, undo: contextlib.AsyncExitStack) -> contextlib.AsyncExitStack:
        """Alive and not ready on the extender's and the metrics' listeners until the
        service answers there; returns what stops them."""
        config = self._config
        tls = _context_of(self._extender_files)
        probes = contextlib.AsyncExitStack()
        undo.push_async_callback(probes.aclose)
        app = starting_app(self._phase.not_ready_because)
        probes.push_async_callback((await serve(app, config.listen, tls)).cleanup)
        if config.metrics is not None:  # where the kubelet probes: it has no client certificate
            probes.push_async_callback((await serve(app, config.metrics)).cleanup)
        return probes

    def _follow_extender_certificate(self) -> None:
        if self._extender_files is not None:
            self._supervisor.start("extender-certificate-files", self._extender_files.follow)

    async def _start_webhook(self, undo: contextlib.AsyncExitStack) -> None:
        config = self._config.webhook
        if config is None:
            return
        webhook = await self._unless_stopped(_webhook_server(
            config, self._config.scheduler_name, self._admission_quota,
            self._config.service.defaults.device, files=self._webhook_files,
            kubernetes=self._kubernetes, supervisor=self._supervisor, phase=self._phase))
        undo.push_async_callback(webhook.runner.cleanup)
        self._webhook_status = webhook.status
        self._phase.enter("connecting to NATS")

    async def _answer_auth_callout(self, undo: contextlib.AsyncExitStack) -> None:
        """Before connecting: agents are admitted from the first moment."""
        config = self._config.bus_auth
        if config is None:
            return
        signer = await self._unless_stopped(_callout_signer(
            config, self._kubernetes, self._connection, self._phase))
        identities = _agent_identities(config, self._kubernetes, signer)
        callout = AuthCallout(self._connection, identities, signer,
                              count=self._count_auth_answer)
        await callout.start()
        undo.push_async_callback(callout.close)
        self._phase.enter("connecting to NATS")

    async def _connect_nats(self) -> Client:
        self._supervisor.start("nats-connection", self._connection.run)
        return await self._unless_stopped(self._connection.wait_up())

    def _choose_leadership(self) -> Leadership:
        """Who decides: the standalone daemons' lease in NATS, kube-scheduler's Lease
        followed, or this daemon alone."""
        config = self._config
        if self._kubernetes is None:
            settings = config.leadership
            self._lease = NatsLease(
                config.identity, ttl=settings.lease_ttl, replicas=self._bucket_replicas(),
                renew_period=settings.lease_renew_period,
                renew_deadline=settings.lease_renew_deadline,
                on_elected=self._elected, on_demoted=self._demoted)
            return self._lease
        followed = config.leadership.leader_lease
        if not followed or followed == "none":
            return Sole(config.identity)
        namespace, _, name = followed.partition("/")
        return FollowedLease(self._kubernetes.cluster, namespace, name, config.identity,
                             on_elected=self._elected)

    async def _open_cluster(self, client: Client) -> Cluster:
        if self._kubernetes is not None:
            return self._kubernetes.cluster
        self._phase.enter("opening the JetStream pod bucket")
        assert self._lease is not None, "standalone daemons hold a lease"
        lease, replicas = self._lease, self._bucket_replicas()
        self._standalone = await self._unless_stopped(_while_the_bus_times_out(
            "the pod bucket", lambda: _open_bucket(client, lease.refusal, replicas)))
        return self._standalone

    def _bucket_replicas(self) -> int:
        """The servers keeping each standalone bucket: as set, else by the server list."""
        return (self._config.leadership.bucket_replicas
                or default_replicas(self._config.nats.servers))

    async def _open_lease(self, client: Client) -> None:
        """Standalone: the lease's bucket, which must expire entries as --lease-ttl says."""
        if self._lease is None:
            return
        lease = self._lease

        async def open_lease() -> None:
            try:
                await lease.open(client)
            except (nats.js.errors.ServiceUnavailableError,
                    nats.errors.NoRespondersError) as error:
                _unless_jetstream_is_starting(client, error)
                raise

        try:
            await self._unless_stopped(_while_the_bus_times_out(
                "the lease bucket", open_lease))
        except (LeaseSettingsError, BucketReplicasError) as error:
            raise StartupError(str(error)) from None

    def _build_service(self, cluster: Cluster, leadership: Leadership,
                       undo: contextlib.AsyncExitStack) -> SchedulerService:
        connection, supervisor = self._connection, self._supervisor
        status_parts: dict[str, Callable[[], object]] = {
            "nats": lambda: {"connected": connection.connected, "server": connection.server,
                             "down_for_s": round(connection.down_for(), 1),
                             "clients_replaced": connection.replaced},
            "background_crashes": lambda: dict(supervisor.crashes),
        }
        if self._webhook_status is not None:
            status_parts["webhook"] = self._webhook_status
        config, files = self._config, self._extender_files
        status_parts["extender"] = lambda: _extender_status(config, files)
        self._service = service = SchedulerService(
            self._config.service, cluster, telemetry_publisher(connection),
            leadership=leadership,
            readiness_checks=[nats_check(connection, self._config.nats_grace),
                              lambda: "; ".join(supervisor.problems()) or None],
            status_parts=status_parts)
        for result, times in self._auth_answers.items():
            service.metrics.nats_auth.labels(result).inc(times)
        service.metrics.registry.register(ConnectionCollector(connection))
        if self._kubernetes is not None:
            service.metrics.registry.register(
                UnreadableCollector(self._kubernetes.cluster.unreadable.counts))
        undo.push_async_callback(service.shared.settle, SETTLE_S)
        return service

    async def _serve_extender(self, service: SchedulerService,
                              probes: contextlib.AsyncExitStack,
                              undo: contextlib.AsyncExitStack) -> None:
        """The extender (and in standalone mode the pod API) and the metrics, in place of
        the probes."""
        config = self._config
        verbs = extender_verbs(service, url_prefix=config.url_prefix, noop=config.noop_endpoint)
        app = extender_app(service, verbs, url_prefix=config.url_prefix)
        if self._standalone is not None:
            self._pending = PendingLoop(service, self._standalone, config.retry_period,
                                        config.scheduler_name)
            app.add_routes(PodApi(self._standalone, self._pending.retry_now).routes())
            app.add_routes(QuotaApi(self._standalone,
                                    self._config.service.defaults.device).routes())
        await probes.aclose()
        tls = _context_of(self._extender_files)
        undo.push_async_callback(
            (await VerbsServer.start(app, verbs, config.listen, tls)).cleanup)
        if config.metrics is not None:
            undo.push_async_callback((await serve(metrics_app(service), config.metrics)).cleanup)

    async def _subscribe(self, service: SchedulerService, leadership: Leadership) -> None:
        await _subscribe_to_agents(self._connection, self._supervisor, service, leadership)
        await self._ask_for_inventories()

    async def _collect_inventories(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), self._config.resync_wait)
        if self._stop.is_set():
            raise _Stopped

    async def _rebuild_ledger(self, service: SchedulerService) -> None:
        await self._unless_stopped(_rebuilt(service))

    async def _learn_leadership(self, leadership: Leadership,
                                undo: contextlib.AsyncExitStack) -> None:
        self._phase.enter("learning which daemon leads")
        undo.push_async_callback(leadership.resign)
        await self._unless_stopped(leadership.start())

    def _start_background(self, service: SchedulerService, leadership: Leadership) -> None:
        start = self._supervisor.start
        start("leadership", leadership.run)
        start("follow-cluster", service.handlers.pods.follow_cluster)
        start("follow-quotas", service.handlers.quotas.follow_quotas)
        start("expire-reservations", service.handlers.reservations.expire_reservations)
        start("follow-cordons", service.handlers.cordons.follow_cordons)
        start("watch-nodes", service.handlers.inventories.watch_nodes)
        if self._config.service.node_registration:
            start("register-nodes", service.registration.run)
        if self._standalone is not None:
            start("settle-pod-store", self._standalone.keep_settled)
        if self._pending is not None and self._config.drive_pending:
            start("pending-loop", self._pending.run)

    def _announce_ready(self, service: SchedulerService, leadership: Leadership) -> None:
        files = self._extender_files
        logger.info("pyhami scheduler ready on %s:%d%s as %s, %s", *self._config.listen,
                    "" if files is None
                    else " (HTTPS, mutual TLS)" if files.mutual else " (HTTPS)",
                    self._config.identity, leadership.role)
        if self._started is not None:
            self._started(service)

    # What the steps wait on, and the hooks ---------------------------------------------

    def _admission_quota(self, pod: PodManifest) -> str | None:
        """The webhook's quota check; the webhook listens before the service is built, and
        admits on quota grounds until then."""
        return None if self._service is None else self._service.verbs.admission_refusal(pod)

    async def _unless_stopped(self, work: Awaitable[T]) -> T:
        return await _unless_stopped(self._stop, work)

    def _count_auth_answer(self, result: AuthResult) -> None:
        if self._service is None:
            self._auth_answers[result] += 1
        else:
            self._service.metrics.nats_auth.labels(result).inc()

    async def _ask_for_inventories(self) -> None:
        await self._connection.publish(RESYNC_SUBJECT, encode(ResyncRequest(
            requested_by="pyhami-scheduler")))

    async def _connection_up(self, client: Client, new_client: bool) -> None:
        """NATS is up again. What the agents sent while the daemon was off the bus is lost:
        their next messages may skip any number of sequences, and they are asked for them
        now. The first connection is the start-up's, which subscribes and asks itself."""
        if self._service is None:
            return
        self._service.handlers.inventories.connection_resumed()
        if new_client and self._standalone is not None:
            # A replacement client: what was built on the old one is built again.
            await self._standalone.reattach(client)
            if self._lease is not None:
                await self._lease.reattach(client)
        await self._ask_for_inventories()

    async def _elected(self) -> None:
        """This daemon leads from now on. Standalone: it reads every pod afresh and
        rebuilds its ledger before it decides. Kubernetes: a fresh list of the pods, for
        any the pod watch has not brought yet."""
        service = self._service
        assert service is not None, "the leadership starts after the service is built"
        if self._standalone is None:
            await service.handlers.pods.reconcile()
            return
        try:
            await self._standalone.reload()
            # Before deciding: a bind the predecessor sent can no longer land on a pod
            # this daemon may place elsewhere (docs/reliability.md, the fault test).
            late = await self._standalone.fence()
        except (nats.errors.Error, TimeoutError, OSError, ClusterError) as error:
            raise TakeOverFailed(f"the pod store could not be read and fenced "
                                 f"({describe_error(error)})") from None
        if late:
            logger.warning("%d pod(s) bound by the previous lease holder after this daemon "
                           "read the pod store: read now", late)
        await service.handlers.ledger.rebuild()
        self._stop_catching_up()
        self._catching_up = asyncio.create_task(self._catch_up(self._standalone))
        if self._pending is not None:
            self._pending.retry_now()

    async def _catch_up(self, standalone: StandaloneCluster) -> None:
        """Once, ``CATCH_UP_AFTER_S`` after taking the lease: the pods the predecessor's
        last writes bound after this daemon's reload are read and booked (their Allocate
        is asked again meanwhile by the device plugin, agent UNLISTED_PATIENCE_S)."""
        await asyncio.sleep(CATCH_UP_AFTER_S)
        deadline = time.monotonic() + BUS_START_PATIENCE_S
        while self._lease is not None and self._lease.leading():
            with self._supervisor.contained("catching up with the pod store"):
                try:
                    taken = await standalone.catch_up()
                except (nats.errors.Error, TimeoutError, OSError) as error:
                    if time.monotonic() + BUS_START_RETRY_S >= deadline:
                        logger.error("the pod store was not read again within %gs of taking "
                                     "the lease (%s): a bind the previous holder made last "
                                     "may be missing from the ledger", BUS_START_PATIENCE_S,
                                     describe_error(error))
                        return
                    logger.warning("catching up with the pod store: %s; trying again in %gs",
                                   describe_error(error), BUS_START_RETRY_S)
                    await asyncio.sleep(BUS_START_RETRY_S)
                    continue
                if taken:
                    logger.warning("%d pod(s) written by the previous lease holder after this "
                                   "daemon read the pod store: read now", taken)
            return

    def _stop_catching_up(self) -> None:
        if self._catching_up is not None:
            self._catching_up.cancel()
            self._catching_up = None

    async def _demoted(self) -> None:
        """Standing by: the standalone daemon drops its reservations."""
        assert self._service is not None, "the leadership starts after the service is built"
        self._stop_catching_up()
        await self._service.handlers.reservations.stand_by()


# Helpers of the steps ---------------------------------------------------------------------


async def _unless_stopped(stop: asyncio.Event, work: Awaitable[T]) -> T:
    """``work``'s result; ``_Stopped`` (``work`` cancelled) when ``stop`` is set first."""
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
    raise _Stopped


async def _subscribe_to_agents(connection: Connection, supervisor: Supervisor,
                               service: SchedulerService, leadership: Leadership) -> None:
    """Inventories from the agents; the device plugins' requests and outcomes, which only
    the leader answers (a standby's view may lag). A message that crashes its handler is
    logged and counted, and the next one is handled as usual."""

    async def on_inventory(message: Msg) -> None:
        with supervisor.contained("inventory message"):
            await service.handlers.inventories.receive_inventory(message.subject, message.data)

    async def on_allocations_request(message: Msg) -> None:
        if not leadership.leading():
            return
        with supervisor.contained("allocations request"):
            pending = await service.handlers.allocations.pending_allocations(message.subject)
            if pending is not None and message.reply:
                await connection.publish(message.reply, encode(pending))

    async def on_resync(message: Msg) -> None:
        # A watcher connecting asks the agents to report; the leader answers it with the
        # decisions it made before (the agents' answers bring the usage: handlers/inventories.py).
        if not leadership.leading():
            return
        try:
            asker = decode_resync(message.data).requested_by
        except WireError:
            return  # the agents answer it as a request to all; nothing here to replay
        if asker == telemetry.WATCH_CLIENT:
            service.reporting.replay_decisions()

    async def on_allocation_outcome(message: Msg) -> None:
        if not leadership.leading():
            # Kept a while: the lease may move before the holder wrote it.
            service.handlers.allocations.keep_outcome(message.subject, message.data)
            return
        with supervisor.contained("allocation outcome"):
            await service.handlers.allocations.allocation_outcome(message.subject, message.data)

    await connection.subscribe(INVENTORY_SUBJECTS, on_inventory)
    await connection.subscribe(ALLOCATIONS_SUBJECTS, on_allocations_request)
    await connection.subscribe(ALLOCATED_SUBJECTS, on_allocation_outcome)
    await connection.subscribe(RESYNC_SUBJECT, on_resync)


def telemetry_publisher(connection: Connection) -> Callable[
        [telemetry.DecisionEvent | telemetry.UsageEvent], Awaitable[None]]:
    """Telemetry never fails a request: what cannot go is counted by the connection."""

    async def publish(event: telemetry.DecisionEvent | telemetry.UsageEvent) -> None:
        subject = (telemetry.DECISIONS_SUBJECT if isinstance(event, telemetry.DecisionEvent)
                   else telemetry.usage_subject(event.node))
        await connection.publish(subject, telemetry.encode(event))

    return publish


def nats_check(connection: Connection, grace: float) -> Callable[[], str | None]:
    def check() -> str | None:
        down = connection.down_for()
        if down <= grace:
            return None
        return f"NATS disconnected for {down:.0f}s (grace {grace:g}s)"

    return check


def _kubernetes(config: DaemonConfig) -> Kubernetes:
    from scheduler.cluster.kube import (  # noqa: PLC0415 (heavy; loaded only when used)
        Kubernetes,
    )

    if config.mode == "in-cluster":
        try:
            return Kubernetes.in_cluster(scheduler_name=config.scheduler_name)
        except ClusterError as error:
            raise StartupError(f"--in-cluster: {error} (it works only in a pod of the cluster; "
                               "elsewhere use --kubeconfig)") from None
    assert config.kubeconfig is not None
    try:
        return Kubernetes.from_kubeconfig(config.kubeconfig,
                                          scheduler_name=config.scheduler_name)
    except ClusterError as error:
        raise StartupError(f"--kubeconfig: {error}") from None


async def _callout_signer(config: BusAuthConfig, kubernetes: Kubernetes | None,
                          connection: Connection, phase: StartupPhase) -> nkeys.KeyPair:
    """The issuer key, the daemon's password set on ``connection``: from the files, or read
    (made first if need be) from the Secret, tried again while the API fails."""
    if config.credentials is not None:
        connection.authenticate(DAEMON_USER, config.credentials.daemon_password)
        return config.credentials.signer
    assert config.secret is not None, "checked by the CLI"
    assert kubernetes is not None, "checked by the CLI: the Secret is a Kubernetes one"
    phase.enter(f"reading the NATS credentials from Secret {config.namespace}/{config.secret}")
    secret = config.secret
    try:
        credentials = await _while_the_api_fails("NATS credentials", lambda: (
            self_managed_credentials(kubernetes.secrets, config.namespace, secret)))
    except CredentialsError as error:
        raise StartupError(f"--nats-auth-secret: {error}; delete the Secret to have the "
                           "daemon make a new one (and restart NATS)") from None
    connection.authenticate(DAEMON_USER, credentials.daemon_password)
    return credentials.signer


@dataclass(frozen=True)
class _Webhook:
    runner: web.AppRunner
    status: Callable[[], dict[str, object]]


async def _webhook_server(config: WebhookConfig, scheduler_name: str, quota: QuotaGate,
                          device: DeviceConfig, *,
                          files: CertificateFiles | None,
                          kubernetes: Kubernetes | None, supervisor: Supervisor,
                          phase: StartupPhase) -> _Webhook:
    """The webhook on its listener, with its certificate from the files (followed) or from
    the Secret (made first if need be, its CA kept in the configuration's caBundle)."""
    status: dict[str, object] = {"listen": f"{config.listen[0]}:{config.listen[1]}",
                                 "scheduler_name": scheduler_name}
    keeper: CaBundleKeeper | None = None
    if files is not None:
        context = files.context
        status["certificate"] = files.describe()
        supervisor.start("webhook-certificate-files", files.follow)
    else:
        assert kubernetes is not None, "checked by the CLI: standalone needs the files"
        phase.enter(f"reading the webhook certificate from Secret "
                    f"{config.namespace}/{config.tls_secret}")
        tls = await _self_managed_tls(config, kubernetes.secrets)
        context = context_for(tls)
        status["certificate"] = f"Secret {config.namespace}/{config.tls_secret}"
        keeper = CaBundleKeeper(kubernetes.secrets, config.configuration, tls.ca,
                                config.check_period)
        supervisor.start("webhook-ca-bundle", keeper.run)
    runner = await serve(webhook_app(scheduler_name, quota, device), config.listen,
                         context)
    logger.info("webhook on https://%s:%d%s", *config.listen, WEBHOOK_PATH)

    def report() -> dict[str, object]:
        if keeper is None:
            return status
        return {**status, "configuration": config.configuration, "ca_bundle": keeper.state}

    return _Webhook(runner, report)


def _agent_identities(config: BusAuthConfig, kubernetes: Kubernetes | None,
                      signer: nkeys.KeyPair) -> AgentIdentities:
    if kubernetes is None:
        return NodeTokens(public_key(signer))
    return ServiceAccountTokens(kubernetes.token_reviewer, audience=config.audience,
                                namespace=config.agent_namespace,
                                service_account=config.agent_service_account)


async def _open_bucket(client: Client, refusal: Callable[[], str | None],
                       replicas: int) -> StandaloneCluster:
    try:
        return await StandaloneCluster.open(client, refusal, replicas=replicas)
    except BucketReplicasError as error:
        if error.transient:
            raise  # servers of the cluster restarting: asked again while patience lasts
        raise StartupError(str(error)) from None
    except (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError) as error:
        _unless_jetstream_is_starting(client, error)
        url = client.connected_url
        raise StartupError(
            f"--standalone keeps pods in JetStream, which the nats-server at "
            f"{url.netloc if url else '?'} does not offer: start nats-server with -js "
            "(and -sd DIR to keep the pods on disk)") from None


def _unless_jetstream_is_starting(client: Client, error: Exception) -> None:
    """A JetStream question nobody answered: where the server says it runs JetStream (its
    INFO), JetStream is only not ready (a cluster without a majority yet, a server just
    restarted): raise ``TimeoutError``, which the start asks again on. Else return."""
    info = getattr(client, "_server_info", None) or {}
    if info.get("jetstream"):
        raise TimeoutError(f"JetStream is not ready on its server yet "
                           f"({describe_error(error)})")


def _webhook_files(config: WebhookConfig) -> CertificateFiles | None:
    """The webhook's certificate files, read at once: a bad one stops the start."""
    if config.cert_file is None or config.key_file is None:
        return None
    try:
        return CertificateFiles("webhook", WEBHOOK_FLAGS, config.cert_file, config.key_file,
                                period=config.check_period)
    except TlsError as error:
        raise StartupError(str(error)) from None


def _context_of(files: CertificateFiles | None) -> ssl.SSLContext | None:
    """The TLS context a listener serving ``files`` keeps (it hands each connection the
    files last loaded); None: plain HTTP."""
    return files.context if files is not None else None


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


async def _while_the_bus_times_out(what: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """``attempt()``'s result, tried again every ``BUS_START_RETRY_S`` while JetStream
    does not answer in time, for at most ``BUS_START_PATIENCE_S``; then ``StartupError``
    in one line. Any other error goes to the caller."""
    deadline = time.monotonic() + BUS_START_PATIENCE_S
    while True:
        try:
            return await attempt()
        except TimeoutError as error:  # nats-py's own TimeoutError is one too
            if time.monotonic() + BUS_START_RETRY_S >= deadline:
                raise StartupError(f"{what} could not be opened: JetStream did not answer "
                                   f"within {BUS_START_PATIENCE_S:g}s "
                                   f"({describe_error(error)})") from None
            logger.warning("%s not opened yet, trying again in %gs: JetStream did not answer "
                           "(%s)", what, BUS_START_RETRY_S, describe_error(error))
        except BucketReplicasError as error:
            if not error.transient:
                raise  # too few servers: the caller says so in one line
            # Servers of the cluster coming back: their peers are known but offline.
            if time.monotonic() + BUS_START_RETRY_S >= deadline:
                raise StartupError(str(error)) from None
            logger.warning("%s not opened yet, trying again in %gs: %s", what,
                           BUS_START_RETRY_S, error)
        await asyncio.sleep(BUS_START_RETRY_S)


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
            await service.handlers.ledger.rebuild()
        except ClusterError as error:
            logger.warning("rebuilding the ledger failed, trying again in %gs: %s",
                           REBUILD_RETRY_S, error)
            await asyncio.sleep(REBUILD_RETRY_S)
            continue
        return True
