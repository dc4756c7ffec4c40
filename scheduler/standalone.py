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
from collections.abc import AsyncIterator, Mapping

import msgspec
from aiohttp import web
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue

from common.core import PodManifest
from common.files import InputFileError, parse_pod_manifest
from scheduler.cluster import ClusterError, ClusterPod, EventType, PodChange
from scheduler.protocol import ExtenderArgs, ExtenderBindingArgs
from scheduler.service import SchedulerService

logger = logging.getLogger(__name__)

BUCKET = "pyhami-pods"
EVENTS_KEPT = 20


class StoredPod(msgspec.Struct, kw_only=True):
    manifest: PodManifest
    uid: str
    submitted: float
    node: str | None = None
    phase: str = "Pending"
    annotations: dict[str, str] = {}

    def cluster_pod(self) -> ClusterPod:
        return ClusterPod(manifest=self.manifest, uid=self.uid, node=self.node,
                          phase=self.phase, annotations=self.annotations)


class PodEvent(msgspec.Struct):
    type: str
    reason: str
    message: str
    time: float


def _key(namespace: str, name: str) -> str:
    # Namespaces hold no dots, so the first dot separates the two.
    return f"{namespace}.{name}"


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StoredPod)


class StandaloneCluster:
    """Pods in a JetStream key-value bucket; this daemon is their only writer."""

    def __init__(self, bucket: KeyValue) -> None:
        self._bucket = bucket
        self._pods: dict[str, StoredPod] = {}
        self._events: dict[str, deque[PodEvent]] = {}
        self._changes: asyncio.Queue[PodChange] = asyncio.Queue()

    @classmethod
    async def open(cls, js: JetStreamContext, bucket: str = BUCKET) -> StandaloneCluster:
        try:
            kv = await js.key_value(bucket)
        except BucketNotFoundError:
            kv = await js.create_key_value(bucket=bucket, history=1)
        cluster = cls(kv)
        await cluster._load()
        return cluster

    async def reattach(self, js: JetStreamContext, bucket: str = BUCKET) -> None:
        """Use the bucket through a new NATS client (the old one was closed for good)."""
        self._bucket = await js.key_value(bucket)

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

    async def _store(self, key: str, pod: StoredPod) -> None:
        await self._bucket.put(key, _encoder.encode(pod))
        self._pods[key] = pod

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
                   annotations: Mapping[str, str]) -> None:
        key = _key(namespace, name)
        pod = self._pods.get(key)
        if pod is None:
            raise ClusterError(f"bind {namespace}/{name}: the pod no longer exists")
        if uid and pod.uid != uid:
            raise ClusterError(f"bind {namespace}/{name}: uid {uid} is not the pod's ({pod.uid})")
        if pod.node is not None:
            raise ClusterError(f"bind {namespace}/{name}: already bound to {pod.node}")
        bound = msgspec.structs.replace(pod, node=node, phase="Running",
                                        annotations={**pod.annotations, **annotations})
        try:
            await self._store(key, bound)
        except Exception as error:
            raise ClusterError(
                f"bind {namespace}/{name}: storing the pod failed: {error}") from None
        self._changes.put_nowait(PodChange(bound.cluster_pod(), deleted=False))

    async def record_event(self, namespace: str, name: str, kind: EventType, reason: str,
                           message: str) -> None:
        events = self._events.setdefault(_key(namespace, name), deque(maxlen=EVENTS_KEPT))
        events.append(PodEvent(kind, reason, message, time.time()))

    async def nudge(self, namespace: str, name: str, stamp: str) -> None:
        """Nothing to do: the pending loop tries waiting pods whenever cards are freed."""

    async def changes(self) -> AsyncIterator[PodChange]:
        while True:
            yield await self._changes.get()

    # What the pod API needs ----------------------------------------------------

    async def submit(self, manifest: PodManifest) -> StoredPod:
        namespace = manifest.metadata.namespace or "default"
        key = _key(namespace, manifest.metadata.name)
        if key in self._pods:
            raise ClusterError(f"pod {namespace}/{manifest.metadata.name} already exists")
        metadata = msgspec.structs.replace(manifest.metadata, namespace=namespace,
                                           uid=str(uuid.uuid4()))
        manifest = msgspec.structs.replace(manifest, metadata=metadata)
        pod = StoredPod(manifest=manifest, uid=metadata.uid or "", submitted=time.time(),
                        annotations=dict(manifest.metadata.annotations or {}))
        await self._store(key, pod)
        return pod

    async def delete(self, namespace: str, name: str) -> bool:
        key = _key(namespace, name)
        pod = self._pods.pop(key, None)
        if pod is None:
            return False
        await self._bucket.delete(key)
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
                 retry_period: float = 5.0) -> None:
        self._service = service
        self._cluster = cluster
        self._retry_period = retry_period
        self._wake = service.capacity_changed()

    def poke(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            await self.schedule_pending()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._retry_period)

    async def schedule_pending(self) -> None:
        if not self._service.ready:
            return
        for pod in self._cluster.pending():
            nodes = sorted(n.name for n in self._service.state.fleet.nodes())
            result = await self._service.filter(ExtenderArgs(pod=pod.manifest, node_names=nodes))
            if result.error or not result.node_names:
                continue
            namespace = pod.manifest.metadata.namespace or "default"
            await self._service.bind(ExtenderBindingArgs(
                pod_name=pod.manifest.metadata.name, pod_namespace=namespace, pod_uid=pod.uid,
                node=result.node_names[0]))


def _pod_view(pod: StoredPod, events: list[PodEvent]) -> dict[str, object]:
    return {
        "namespace": pod.manifest.metadata.namespace, "name": pod.manifest.metadata.name,
        "uid": pod.uid, "node": pod.node, "phase": pod.phase, "annotations": pod.annotations,
        "events": [msgspec.structs.asdict(e) for e in events],
    }


def pod_api(cluster: StandaloneCluster, loop: PendingLoop) -> web.RouteTableDef:
    """``/api/pods``: submit (POST a Pod manifest, YAML or JSON), list, get, delete."""
    routes = web.RouteTableDef()
    encode = msgspec.json.encode

    def json_response(value: object, status: int = 200) -> web.Response:
        return web.Response(body=encode(value), status=status, content_type="application/json")

    @routes.post("/api/pods")
    async def submit(request: web.Request) -> web.Response:
        try:
            manifest = parse_pod_manifest(await request.read(), "request body")
        except InputFileError as error:
            return web.Response(status=400, text=f"{error}\n")
        if not manifest.metadata.name:
            return web.Response(status=400, text="request body: metadata.name is required\n")
        try:
            pod = await cluster.submit(manifest)
        except ClusterError as error:
            return web.Response(status=409, text=f"{error}\n")
        loop.poke()
        return json_response(_pod_view(pod, []), status=201)

    @routes.get("/api/pods")
    async def list_pods(_: web.Request) -> web.Response:
        return json_response([
            _pod_view(p, cluster.events(p.manifest.metadata.namespace or "default",
                                        p.manifest.metadata.name))
            for p in cluster.pods()
        ])

    @routes.get("/api/pods/{namespace}/{name}")
    async def get_pod(request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        found = next((p for p in cluster.pods() if p.manifest.metadata.namespace == namespace
                      and p.manifest.metadata.name == name), None)
        if found is None:
            return web.Response(status=404, text=f"pod {namespace}/{name} not found\n")
        return json_response(_pod_view(found, cluster.events(namespace, name)))

    @routes.delete("/api/pods/{namespace}/{name}")
    async def delete_pod(request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if not await cluster.delete(namespace, name):
            return web.Response(status=404, text=f"pod {namespace}/{name} not found\n")
        return web.Response(status=204)

    return routes
