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

This module is the wiring only: what each step builds lives with its subject (the TLS
files in ``tls/``, the webhook's server in ``web/``, the subscriptions in ``bus.py``,
the start's patience in ``retry.py``, the takeover with the ``leadership``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client

from common.buckets import BucketReplicasError, default_replicas
from common.core.pod import PodManifest
from common.messaging import Connection
from common.natsjwt import public_key
from common.supervision import Supervisor
from common.wire import RESYNC_SUBJECT, ResyncRequest, encode
from scheduler.bus import nats_check, subscribe_to_agents, telemetry_publisher
from scheduler.busauth import (
    AgentIdentities,
    AuthCallout,
    AuthResult,
    NodeTokens,
    ServiceAccountTokens,
    callout_signer,
)
from scheduler.cluster import Cluster, ClusterError
from scheduler.cluster.standalone import StandaloneCluster
from scheduler.config import DaemonConfig
from scheduler.errors import SchedulerError, StartupError
from scheduler.leadership import (
    AlwaysLeader,
    FollowedLease,
    Leadership,
    LeaseSettingsError,
    NatsLease,
    Takeover,
)
from scheduler.metrics import ConnectionCollector, UnreadableCollector
from scheduler.pending import PendingLoop
from scheduler.retry import unless_jetstream_is_starting, while_the_bus_times_out
from scheduler.service import SchedulerService
from scheduler.tls.files import CertificateFiles, context_of, read_at_start, tls_status
from scheduler.tls.webhook import webhook_files
from scheduler.web.extender import extender_app, extender_verbs, metrics_app
from scheduler.web.fastpath import VerbsServer
from scheduler.web.pods import PodApi
from scheduler.web.probes import StartupPhase, serve, starting_app
from scheduler.web.quotas import QuotaApi
from scheduler.web.webhook_server import serve_webhook

if TYPE_CHECKING:
    from scheduler.cluster.kube import Kubernetes

__all__ = ["Daemon", "run_daemon"]

logger = logging.getLogger(__name__)

# Stopping must end within 10 s: each step of the shutdown has its share.
SETTLE_S = 2.0
T = TypeVar("T")


class _Stopped(SchedulerError):
    """``stop`` was set during a step: the start-up ends there, and what was done is
    undone. Never leaves ``Daemon.run``."""


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
        self._takeover: Takeover | None = None  # once the leadership is learnt

    async def run(self) -> None:
        async with contextlib.AsyncExitStack() as undo:
            try:
                await self._start_up(undo)
                await self._stop.wait()
            except _Stopped:
                pass
            finally:
                if self._takeover is not None:
                    self._takeover.stop()
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
        await self._learn_leadership(service, leadership, undo)
        self._start_background(service, leadership)
        self._announce_ready(service, leadership)

    # The steps --------------------------------------------------------------------------

    async def _open_kubernetes(self, undo: contextlib.AsyncExitStack) -> None:
        if self._config.mode == "standalone":
            return
        from scheduler.cluster.kube import (  # noqa: PLC0415 (heavy; loaded only when used)
            Kubernetes,
        )

        config = self._config
        if config.mode == "in-cluster":
            try:
                kubernetes = Kubernetes.in_cluster(scheduler_name=config.scheduler_name)
            except ClusterError as error:
                raise StartupError(f"--in-cluster: {error} (it works only in a pod of the "
                                   "cluster; elsewhere use --kubeconfig)") from None
        else:
            assert config.kubeconfig is not None
            try:
                kubernetes = Kubernetes.from_kubeconfig(config.kubeconfig,
                                                        scheduler_name=config.scheduler_name)
            except ClusterError as error:
                raise StartupError(f"--kubeconfig: {error}") from None
        self._kubernetes = kubernetes
        undo.push_async_callback(kubernetes.close)

    def _read_certificates(self) -> None:
        """The extender's and the webhook's certificate files, read at once: a bad one
        stops the start before anything listens."""
        extender = self._config.extender_tls
        if extender is not None:
            self._extender_files = read_at_start(extender.files)
        webhook = self._config.webhook
        if webhook is not None:
            self._webhook_files = webhook_files(webhook.cert_file, webhook.key_file,
                                                webhook.check_period)

    async def _serve_probes(self, undo: contextlib.AsyncExitStack) -> contextlib.AsyncExitStack:
        """Alive and not ready on the extender's and the metrics' listeners until the
        service answers there; returns what stops them."""
        config = self._config
        tls = context_of(self._extender_files)
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
        kubernetes = self._kubernetes
        webhook = await self._unless_stopped(serve_webhook(
            config, self._config.scheduler_name, self._admission_quota,
            self._config.service.defaults.device, files=self._webhook_files,
            secrets=None if kubernetes is None else kubernetes.secrets,
            supervisor=self._supervisor, phase=self._phase.enter))
        undo.push_async_callback(webhook.runner.cleanup)
        self._webhook_status = webhook.status
        self._phase.enter("connecting to NATS")

    async def _answer_auth_callout(self, undo: contextlib.AsyncExitStack) -> None:
        """Before connecting: agents are admitted from the first moment."""
        config = self._config.bus_auth
        if config is None:
            return
        kubernetes = self._kubernetes
        signer = await self._unless_stopped(callout_signer(
            config.credentials, self._connection,
            secrets=None if kubernetes is None else kubernetes.secrets,
            namespace=config.namespace, secret=config.secret, phase=self._phase.enter))
        identities: AgentIdentities = (
            NodeTokens(public_key(signer)) if kubernetes is None
            else ServiceAccountTokens(kubernetes.token_reviewer, audience=config.audience,
                                      namespace=config.agent_namespace,
                                      service_account=config.agent_service_account))
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
            return AlwaysLeader(config.identity)
        namespace, _, name = followed.partition("/")
        return FollowedLease(self._kubernetes.cluster, namespace, name, config.identity,
                             on_elected=self._elected)

    async def _open_cluster(self, client: Client) -> Cluster:
        if self._kubernetes is not None:
            return self._kubernetes.cluster
        self._phase.enter("opening the JetStream pod bucket")
        assert self._lease is not None, "standalone daemons hold a lease"
        lease, replicas = self._lease, self._bucket_replicas()

        async def open_bucket() -> StandaloneCluster:
            try:
                return await StandaloneCluster.open(client, lease.refusal, replicas=replicas)
            except BucketReplicasError as error:
                if error.transient:
                    raise  # servers of the cluster restarting: asked again while patience lasts
                raise StartupError(str(error)) from None
            except (nats.js.errors.ServiceUnavailableError,
                    nats.errors.NoRespondersError) as error:
                unless_jetstream_is_starting(client, error)
                url = client.connected_url
                raise StartupError(
                    f"--standalone keeps pods in JetStream, which the nats-server at "
                    f"{url.netloc if url else '?'} does not offer: start nats-server with -js "
                    "(and -sd DIR to keep the pods on disk)") from None

        self._standalone = await self._unless_stopped(while_the_bus_times_out(
            "the pod bucket", open_bucket))
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
                unless_jetstream_is_starting(client, error)
                raise

        try:
            await self._unless_stopped(while_the_bus_times_out(
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
        listen, files = f"{self._config.listen[0]}:{self._config.listen[1]}", self._extender_files
        status_parts["extender"] = lambda: {"listen": listen, **tls_status(files)}
        self._service = service = SchedulerService(
            self._config.service, cluster, telemetry_publisher(connection),
            leadership=leadership,
            readiness_checks=[nats_check(connection, self._config.nats_grace),
                              lambda: "; ".join(supervisor.problems()) or None],
            status_parts=status_parts,
            kueue=(self._kubernetes.kueue if self._kubernetes is not None
                   and self._config.service.kueue_admission_check else None))
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
        verbs = extender_verbs(service, url_prefix=config.url_prefix)
        app = extender_app(service, verbs, url_prefix=config.url_prefix)
        if self._standalone is not None:
            self._pending = PendingLoop(service, self._standalone, config.retry_period,
                                        config.scheduler_name)
            app.add_routes(PodApi(self._standalone, self._pending.retry_now).routes())
            app.add_routes(QuotaApi(self._standalone,
                                    self._config.service.defaults.device).routes())
        await probes.aclose()
        tls = context_of(self._extender_files)
        undo.push_async_callback(
            (await VerbsServer.start(app, verbs, config.listen, tls)).cleanup)
        if config.metrics is not None:
            undo.push_async_callback((await serve(metrics_app(service), config.metrics)).cleanup)

    async def _subscribe(self, service: SchedulerService, leadership: Leadership) -> None:
        await subscribe_to_agents(self._connection, self._supervisor, service, leadership)
        await self._ask_for_inventories()

    async def _collect_inventories(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), self._config.resync_wait)
        if self._stop.is_set():
            raise _Stopped

    async def _rebuild_ledger(self, service: SchedulerService) -> None:
        await self._unless_stopped(service.handlers.ledger.rebuild_until_listed())

    async def _learn_leadership(self, service: SchedulerService, leadership: Leadership,
                                undo: contextlib.AsyncExitStack) -> None:
        """Who leads now; what this daemon does as it begins to lead, or stops, is ready
        before the leadership can say so."""
        self._phase.enter("learning which daemon leads")
        handlers, pending = service.handlers, self._pending
        self._takeover = Takeover(
            leadership, self._supervisor, ledger=handlers.ledger, pods=handlers.pods,
            reservations=handlers.reservations, store=self._standalone,
            retry_pending=None if pending is None else pending.retry_now)
        undo.push_async_callback(leadership.resign)
        await self._unless_stopped(leadership.start())

    def _start_background(self, service: SchedulerService, leadership: Leadership) -> None:
        start = self._supervisor.start
        start("leadership", leadership.run)
        handlers = service.handlers
        start("follow-cluster", handlers.pods.follow_cluster)
        start("follow-quotas", handlers.quotas.follow_quotas)
        start("expire-reservations", handlers.reservations.expire_reservations)
        start("follow-cordons", handlers.cordons.follow_cordons)
        start("watch-nodes", handlers.inventories.watch_nodes)
        if self._config.service.node_registration:
            start("register-nodes", service.registration.run)
        if service.admission is not None:
            start("follow-workloads", service.admission.follow_workloads)
            start("follow-admission-checks", service.admission.follow_checks)
            start("admission-checks", service.admission.run)
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
        return None if self._service is None else self._service.verbs.admission_denial(pod)

    async def _unless_stopped(self, work: Awaitable[T]) -> T:
        """``work``'s result; ``_Stopped`` (``work`` cancelled) when ``stop`` is set first."""
        task = asyncio.ensure_future(work)
        stopping = asyncio.create_task(self._stop.wait())
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
        assert self._takeover is not None, "the leadership starts after the takeover is ready"
        await self._takeover.elected()

    async def _demoted(self) -> None:
        assert self._takeover is not None, "the leadership starts after the takeover is ready"
        await self._takeover.demoted()
