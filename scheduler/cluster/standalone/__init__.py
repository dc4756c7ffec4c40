"""Standalone mode: no Kubernetes. Pods live in a NATS JetStream key-value bucket.

``StandaloneCluster`` is the ``Cluster`` port over that bucket; ``PodApi`` lets a
user (the demo, the tests) submit, delete and list pods over HTTP; and
``PendingLoop`` plays kube-scheduler's part: filter, then bind, for every
pending pod, again whenever cards are freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TypeVar

import msgspec
from aiohttp import web
from nats.aio.client import Client
from nats.errors import (
    BadSubjectError,
    ConnectionClosedError,
    ConnectionDrainingError,
    MaxPayloadError,
    NoRespondersError,
    OutboundBufferLimitError,
)
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    InvalidKeyError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoKeysError,
)
from nats.js.kv import KeyValue

from common.core import PodManifest
from common.core.admission import names_no_other_scheduler
from common.core.annotations import BIND_PHASE_ANNOTATION
from common.core.names import InvalidName, check_label, check_subdomain
from common.files import InputFileError, parse_pod_manifest
from common.locks import KeyedLocks
from common.messaging import describe_error
from scheduler.cluster.port import (
    SCHEDULER_NAME,
    AllocationPhase,
    ClusterError,
    ClusterPod,
    DisruptionBudget,
    EventType,
    PodChange,
    StoreUnavailable,
)
from scheduler.service import SchedulerService
from scheduler.web.limits import POD_BODY_LIMIT, read_body
from scheduler.web.protocol import ExtenderArgs, ExtenderBindingArgs, check_pod_names

logger = logging.getLogger(__name__)

BUCKET = "pyhami-pods"
EVENTS_KEPT = 20
SETTLE_ATTEMPTS = 3
SETTLE_PERIOD_S = 1.0
# Failures after which the write surely did not reach the bucket: the server answered
# (APIError, no responders), or nats-py refused it before sending.
_NOT_SENT = (APIError, NoRespondersError, OutboundBufferLimitError, ConnectionClosedError,
             ConnectionDrainingError, MaxPayloadError, BadSubjectError, InvalidKeyError)

T = TypeVar("T")


class StoredPod(msgspec.Struct, kw_only=True):
    manifest: PodManifest
    uid: str
    submitted: float
    node: str | None = None
    phase: str = "Pending"
    annotations: dict[str, str] = {}

    def cluster_pod(self) -> ClusterPod:
        return ClusterPod(manifest=self.manifest, uid=self.uid, node=self.node,
                          phase=self.phase, annotations=self.annotations,
                          started=self.submitted)


class PodEvent(msgspec.Struct):
    """One Event, counted as kubectl shows it: a repeat raises ``count`` and ``last_time``."""

    type: str
    reason: str
    message: str
    count: int
    first_time: float
    last_time: float


def _key(namespace: str, name: str) -> str:
    # The pod API lets in only names Kubernetes accepts: a namespace (a DNS-1123 label)
    # holds no dot, so the first dot separates the two and no two pods share a key; both
    # hold only characters NATS accepts in a key, 317 of them at most.
    return f"{namespace}.{name}"


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StoredPod)


class StandaloneCluster:
    """Pods in a JetStream key-value bucket, and in memory as this daemon last answered.

    Every write goes to the bucket first and to memory once the bucket confirmed it, so an
    answered error means nothing changed. Writes are compare-and-set on the revision last
    read, so a second writer (another daemon) cannot have two binds of one pod succeed.
    While the NATS connection is down a write is refused at once: nats-py would otherwise
    buffer it and send it on reconnecting, after its caller was told it failed. A write that
    got no answer may still land; it is undone (``keep_settled``) once the bucket answers again.
    """

    def __init__(self, bucket: KeyValue, connection: Client) -> None:
        self._bucket = bucket
        self._connection = connection
        self._pods: dict[str, StoredPod] = {}
        self._revisions: dict[str, int] = {}  # the bucket revision of each pod in _pods
        # Writes that got no answer: the value sent (None for a delete), to be undone.
        self._unsettled: dict[str, bytes | None] = {}
        self._writing = KeyedLocks()  # one write of a pod at a time, settling included
        self._events: dict[str, deque[PodEvent]] = {}
        self._changes: asyncio.Queue[PodChange] = asyncio.Queue()
        self.refusal: Callable[[], str | None] = lambda: None
        """Why this daemon may not write the bucket now (a standby); None when it may."""

    @classmethod
    async def open(cls, connection: Client, bucket: str = BUCKET) -> StandaloneCluster:
        js = connection.jetstream()
        try:
            kv = await js.key_value(bucket)
        except BucketNotFoundError:
            kv = await js.create_key_value(bucket=bucket, history=1)
        cluster = cls(kv, connection)
        await cluster._load()
        return cluster

    async def reattach(self, connection: Client, bucket: str = BUCKET) -> None:
        """Use the bucket through a new NATS client (the old one was closed for good)."""
        self._bucket = await connection.jetstream().key_value(bucket)
        self._connection = connection

    async def reload(self) -> None:
        """Read every pod afresh (this daemon was elected: another may have written).

        This daemon's own writes that got no answer are settled first, against what it
        answered; one that cannot be settled yet keeps its answered version in memory,
        for ``keep_settled`` to finish.
        """
        for key in list(self._unsettled):
            with contextlib.suppress(StoreUnavailable):
                async with self._writing.hold(key):
                    await self._settle(key)
        answered = {key: (self._pods.get(key), self._revisions.get(key, 0))
                    for key in self._unsettled}
        self._pods.clear()
        self._revisions.clear()
        await self._load()
        for key, (pod, revision) in answered.items():
            if pod is None:
                self._pods.pop(key, None)
                self._revisions.pop(key, None)
            else:
                self._pods[key], self._revisions[key] = pod, revision

    async def _load(self) -> None:
        try:
            keys = await self._bucket.keys()
        except NoKeysError:
            keys = []
        for key in keys:
            try:
                entry = await self._bucket.get(key)
            except KeyNotFoundError:
                continue
            if entry.value:
                try:
                    self._pods[key] = _decoder.decode(entry.value)
                except msgspec.DecodeError as error:
                    logger.error("bucket %s: entry %s is unreadable (%s); skipped", BUCKET, key,
                                 error)
                    continue
                self._revisions[key] = entry.revision or 0

    # Writing the bucket ----------------------------------------------------------

    async def _write(self, key: str, sent: bytes | None, what: str,
                     write: Callable[[], Awaitable[T]]) -> T:
        """One bucket write (``sent``: the value, None for a delete).

        Raises ``StoreUnavailable`` when it was not applied, or may have been (then it is
        undone by ``keep_settled``), and ``KeyWrongLastSequenceError`` when the pod changed.
        """
        if (standby := self.refusal()) is not None:
            raise StoreUnavailable(f"{what}: {standby}; nothing was written")
        if not self._connection.is_connected:
            raise StoreUnavailable(f"{what}: the NATS connection is down; nothing was written")
        try:
            return await write()
        except KeyWrongLastSequenceError:
            raise
        except _NOT_SENT as error:
            raise StoreUnavailable(f"{what}: the pod store refused the write: "
                                   f"{describe_error(error)}") from None
        except (Exception, asyncio.CancelledError) as error:
            self._unsettled[key] = sent
            if isinstance(error, asyncio.CancelledError):
                raise
            raise StoreUnavailable(f"{what}: no answer from the pod store "
                                   f"({describe_error(error)}); the write is undone should it "
                                   "arrive") from None

    async def keep_settled(self, period: float = SETTLE_PERIOD_S) -> None:
        """Undo the writes that got no answer, once the bucket answers; runs forever."""
        while True:
            await asyncio.sleep(period)
            if self.refusal() is not None:
                continue  # a standby writes nothing; it reads every pod again if elected
            for key in list(self._unsettled):
                try:
                    async with self._writing.hold(key):
                        await self._settle(key)
                except StoreUnavailable as error:
                    logger.debug("pod %s not settled yet: %s", key, error)

    async def _settle(self, key: str) -> None:
        """Bring the bucket back to what was answered for ``key`` (memory), should a write
        of unknown outcome have landed; raises ``StoreUnavailable`` while it cannot."""
        if key not in self._unsettled:
            return
        sent = self._unsettled[key]
        answered = self._pods.get(key)
        wanted = _encoder.encode(answered) if answered is not None else None
        what = f"settling pod {key}"
        if not self._connection.is_connected:
            raise StoreUnavailable(f"{what}: the NATS connection is down")
        for _ in range(SETTLE_ATTEMPTS):
            try:
                stored, revision = await self._read(key)
                if stored not in (wanted, sent):
                    self._adopt(key, stored, revision)  # another writer's: it stands
                    break
                # The unanswered write landed (stored == sent), or not yet: writing what
                # was answered, on the revision just read, undoes it or fences it off.
                if wanted is None:
                    await self._bucket.delete(key, last=revision)
                    self._revisions.pop(key, None)
                else:
                    self._revisions[key] = await self._bucket.update(key, wanted, last=revision)
                break
            except KeyWrongLastSequenceError:
                continue  # it landed between the read and the write: read again
            except Exception as error:
                raise StoreUnavailable(f"{what}: {describe_error(error)}") from None
        else:
            raise StoreUnavailable(f"{what}: the pod kept changing")
        del self._unsettled[key]
        if stored == sent:
            logger.warning("pod %s: a write reported failed had reached the store; undone", key)

    async def _read(self, key: str) -> tuple[bytes | None, int]:
        """The pod's bytes in the bucket (None when absent) and the key's last revision."""
        try:
            entry = await self._bucket.get(key)
        except KeyNotFoundError as gone:
            deleted = gone.entry
            return None, (deleted.revision or 0) if deleted is not None else 0
        return entry.value or None, entry.revision or 0

    def _adopt(self, key: str, stored: bytes | None, revision: int) -> None:
        """Take the bucket's version of a pod that someone else changed."""
        if stored is None:
            gone = self._pods.pop(key, None)
            self._revisions.pop(key, None)
            if gone is not None:
                self._changes.put_nowait(PodChange(gone.cluster_pod(), deleted=True))
            return
        try:
            pod = _decoder.decode(stored)
        except msgspec.DecodeError as error:
            logger.error("bucket %s: entry %s is unreadable (%s); skipped", BUCKET, key, error)
            return
        self._pods[key] = pod
        self._revisions[key] = revision
        self._changes.put_nowait(PodChange(pod.cluster_pod(), deleted=False))

    async def _changed_meanwhile(self, key: str, what: str) -> ClusterError:
        """A compare-and-set write lost: re-read the pod, for the caller to raise."""
        with contextlib.suppress(Exception):
            self._adopt(key, *await self._read(key))
        return ClusterError(f"{what}: the pod changed meanwhile; try again")

    # The Cluster port ---------------------------------------------------------

    async def list_pods(self) -> list[ClusterPod]:
        return [pod.cluster_pod() for pod in self._pods.values()]

    async def get_pod(self, namespace: str, name: str) -> ClusterPod | None:
        pod = self._pods.get(_key(namespace, name))
        return pod.cluster_pod() if pod is not None else None

    async def device_cordons(self) -> dict[str, frozenset[str]]:
        """Standalone has no Node objects: cards are cordoned by their agent (--cordon)."""
        return {}

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: Mapping[str, str | None]) -> None:
        key = _key(namespace, name)
        what = f"bind {namespace}/{name}"
        async with self._writing.hold(key):
            await self._bind(key, what, uid, node, annotations)

    async def _bind(self, key: str, what: str, uid: str, node: str,
                    annotations: Mapping[str, str | None]) -> None:
        await self._settle(key)
        pod = self._pods.get(key)
        if pod is None:
            raise ClusterError(f"{what}: the pod no longer exists")
        if uid and pod.uid != uid:
            raise ClusterError(f"{what}: uid {uid} is not the pod's ({pod.uid})")
        if pod.node is not None:
            raise ClusterError(f"{what}: already bound to {pod.node}")
        merged = {**pod.annotations, **annotations}
        bound = msgspec.structs.replace(pod, node=node, phase="Running", annotations={
            name: value for name, value in merged.items() if value is not None})
        await self._replace(key, bound, what)

    async def _replace(self, key: str, pod: StoredPod, what: str) -> None:
        """Write ``pod`` over the revision last read (compare-and-set), then keep it."""
        value = _encoder.encode(pod)
        last = self._revisions.get(key, 0)
        try:
            revision = await self._write(key, value, what,
                                         lambda: self._bucket.update(key, value, last=last))
        except KeyWrongLastSequenceError:
            raise await self._changed_meanwhile(key, what) from None
        self._pods[key] = pod
        self._revisions[key] = revision
        self._changes.put_nowait(PodChange(pod.cluster_pod(), deleted=False))

    async def set_bind_phase(self, namespace: str, name: str, uid: str,
                             phase: AllocationPhase) -> None:
        key = _key(namespace, name)
        what = f"setting the bind-phase of pod {namespace}/{name} to {phase}"
        async with self._writing.hold(key):
            await self._settle(key)
            pod = self._pods.get(key)
            if pod is None:
                raise ClusterError(f"{what}: the pod no longer exists")
            if pod.uid != uid:
                raise ClusterError(f"{what}: uid {uid} is not the pod's ({pod.uid})")
            await self._replace(key, msgspec.structs.replace(
                pod, annotations={**pod.annotations, BIND_PHASE_ANNOTATION: phase}), what)

    async def record_event(self, namespace: str, name: str, kind: EventType, reason: str,
                           message: str) -> None:
        events = self._events.setdefault(_key(namespace, name), deque(maxlen=EVENTS_KEPT))
        now = time.time()
        for event in events:
            if (event.type, event.reason, event.message) == (kind, reason, message):
                events.remove(event)  # a repeat: moved to the end, as the latest
                event.count += 1
                event.last_time = now
                events.append(event)
                return
        events.append(PodEvent(kind, reason, message, 1, now, now))

    async def evict(self, namespace: str, name: str, uid: str) -> None:
        pod = self._pods.get(_key(namespace, name))
        if pod is None or pod.uid != uid:
            return  # gone, or another pod under the name now
        await self.delete(namespace, name)

    async def disruption_budgets(self) -> list[DisruptionBudget]:
        return []

    async def retry_pod(self, namespace: str, name: str, stamp: str) -> None:
        """Nothing to do: the pending loop tries waiting pods whenever cards are freed."""

    async def changes(self) -> AsyncIterator[PodChange]:
        while True:
            yield await self._changes.get()

    # What the pod API needs ----------------------------------------------------

    async def submit(self, manifest: PodManifest) -> StoredPod:
        namespace = manifest.namespace
        key = _key(namespace, manifest.metadata.name)
        async with self._writing.hold(key):
            return await self._submit(key, namespace, manifest)

    async def _submit(self, key: str, namespace: str, manifest: PodManifest) -> StoredPod:
        what = f"submit {namespace}/{manifest.metadata.name}"
        await self._settle(key)
        if key in self._pods:
            raise ClusterError(f"pod {namespace}/{manifest.metadata.name} already exists")
        metadata = msgspec.structs.replace(manifest.metadata, namespace=namespace,
                                           uid=str(uuid.uuid4()))
        manifest = msgspec.structs.replace(manifest, metadata=metadata)
        pod = StoredPod(manifest=manifest, uid=metadata.uid or "", submitted=time.time(),
                        annotations=dict(manifest.metadata.annotations or {}))
        value = _encoder.encode(pod)
        try:
            revision = await self._write(key, value, what,
                                         lambda: self._bucket.create(key, value))
        except KeyWrongLastSequenceError:
            await self._changed_meanwhile(key, what)
            raise ClusterError(
                f"pod {namespace}/{manifest.metadata.name} already exists") from None
        self._pods[key] = pod
        self._revisions[key] = revision
        return pod

    async def delete(self, namespace: str, name: str) -> bool:
        key = _key(namespace, name)
        async with self._writing.hold(key):
            return await self._delete(key, f"delete {namespace}/{name}")

    async def _delete(self, key: str, what: str) -> bool:
        await self._settle(key)
        pod = self._pods.get(key)
        if pod is None:
            return False
        last = self._revisions.get(key, 0)
        try:
            await self._write(key, None, what, lambda: self._bucket.delete(key, last=last))
        except KeyWrongLastSequenceError:
            raise await self._changed_meanwhile(key, what) from None
        del self._pods[key]
        self._revisions.pop(key, None)
        self._events.pop(key, None)
        self._changes.put_nowait(PodChange(pod.cluster_pod(), deleted=True))
        return True

    def pending(self) -> list[StoredPod]:
        waiting = [p for p in self._pods.values() if p.node is None and p.phase == "Pending"]
        return sorted(waiting, key=lambda p: p.submitted)

    def pods(self) -> list[StoredPod]:
        return sorted(self._pods.values(), key=lambda p: p.submitted)

    def events(self, namespace: str, name: str) -> list[PodEvent]:
        return list(self._events.get(_key(namespace, name), ()))


class PendingLoop:
    """Plays kube-scheduler for standalone pods: filter, then bind, retrying on change."""

    def __init__(self, service: SchedulerService, cluster: StandaloneCluster,
                 retry_period: float = 5.0, scheduler_name: str = SCHEDULER_NAME) -> None:
        self._service = service
        self._cluster = cluster
        self._retry_period = retry_period
        self._scheduler_name = scheduler_name
        self._retry = service.retry_signal()

    def retry_now(self) -> None:
        self._retry.set()

    async def run(self) -> None:
        while True:
            self._retry.clear()
            await self.schedule_pending()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._retry.wait(), self._retry_period)

    async def schedule_pending(self) -> None:
        if not self._service.ready or self._service.refusal() is not None:
            return
        for pod in self._cluster.pending():
            # A pod naming another scheduler waits for that one's /filter and /bind, as
            # kube-scheduler leaves the pods of other schedulers alone.
            if not names_no_other_scheduler(pod.manifest.spec.scheduler_name,
                                            self._scheduler_name):
                continue
            try:
                await self._schedule(pod)
            except Exception:  # one pod that breaks a rule must not stall every other
                logger.exception("pending pod %s: scheduling it crashed; it is tried again "
                                 "in the next round", pod.manifest.key)

    async def _schedule(self, pod: StoredPod) -> None:
        nodes = sorted(n.name for n in self._service.state.fleet.nodes())
        result = await self._service.filter(ExtenderArgs(pod=pod.manifest, node_names=nodes))
        if result.error or not result.node_names:
            return
        namespace = pod.manifest.namespace
        await self._service.bind(ExtenderBindingArgs(
            pod_name=pod.manifest.metadata.name, pod_namespace=namespace, pod_uid=pod.uid,
            node=result.node_names[0]))


def _pod_view(pod: StoredPod, events: list[PodEvent]) -> dict[str, object]:
    return {
        "namespace": pod.manifest.metadata.namespace, "name": pod.manifest.metadata.name,
        "uid": pod.uid, "node": pod.node, "phase": pod.phase, "annotations": pod.annotations,
        "events": [msgspec.structs.asdict(e) for e in events],
    }


def _path_names(request: web.Request) -> tuple[str, str]:
    """The namespace and name in the URL; 400 naming the one Kubernetes would refuse."""
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    try:
        check_label("namespace", namespace)
        check_subdomain("name", name)
    except InvalidName as error:
        raise web.HTTPBadRequest(text=f"{error}\n") from None
    return namespace, name


def pod_api(cluster: StandaloneCluster, loop: PendingLoop) -> web.RouteTableDef:
    """``/api/pods``: submit (POST a Pod manifest, YAML or JSON), list, get, delete.

    Names are checked as Kubernetes checks them; a body over ``POD_BODY_LIMIT`` is a 413.
    """
    routes = web.RouteTableDef()
    encode = msgspec.json.encode

    def json_response(value: object, status: int = 200) -> web.Response:
        return web.Response(body=encode(value), status=status, content_type="application/json")

    def standing_by() -> web.Response | None:
        """A standby's pods may be stale and it writes none: 503 naming the holder."""
        standby = cluster.refusal()
        return None if standby is None else web.Response(status=503, text=f"{standby}\n")

    @routes.post("/api/pods")
    async def submit(request: web.Request) -> web.Response:
        if (refused := standing_by()) is not None:
            return refused
        try:
            manifest = parse_pod_manifest(await read_body(request, POD_BODY_LIMIT),
                                          "request body")
        except InputFileError as error:
            return web.Response(status=400, text=f"{error}\n")
        try:
            check_pod_names(manifest, "")
        except InvalidName as error:
            return web.Response(status=400, text=f"request body: {error}\n")
        try:
            pod = await cluster.submit(manifest)
        except StoreUnavailable as error:
            return web.Response(status=503, text=f"{error}\n")
        except ClusterError as error:
            return web.Response(status=409, text=f"{error}\n")
        loop.retry_now()
        return json_response(_pod_view(pod, []), status=201)

    @routes.get("/api/pods")
    async def list_pods(_: web.Request) -> web.Response:
        if (refused := standing_by()) is not None:
            return refused
        return json_response([
            _pod_view(p, cluster.events(p.manifest.namespace, p.manifest.metadata.name))
            for p in cluster.pods()
        ])

    @routes.get("/api/pods/{namespace}/{name}")
    async def get_pod(request: web.Request) -> web.Response:
        if (refused := standing_by()) is not None:
            return refused
        namespace, name = _path_names(request)
        found = next((p for p in cluster.pods() if p.manifest.metadata.namespace == namespace
                      and p.manifest.metadata.name == name), None)
        if found is None:
            return web.Response(status=404, text=f"pod {namespace}/{name} not found\n")
        return json_response(_pod_view(found, cluster.events(namespace, name)))

    @routes.delete("/api/pods/{namespace}/{name}")
    async def delete_pod(request: web.Request) -> web.Response:
        if (refused := standing_by()) is not None:
            return refused
        namespace, name = _path_names(request)
        try:
            deleted = await cluster.delete(namespace, name)
        except StoreUnavailable as error:
            return web.Response(status=503, text=f"{error}\n")
        except ClusterError as error:
            return web.Response(status=409, text=f"{error}\n")
        if not deleted:
            return web.Response(status=404, text=f"pod {namespace}/{name} not found\n")
        return web.Response(status=204)

    return routes
