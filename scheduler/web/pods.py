"""The pod API, standalone mode's HTTP face for pods (aiohttp): ``/api/pods``, where a
user (the demo, the tests) submits, lists, reads and deletes the pods of
``scheduler.cluster.standalone``."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web

from common.core import PodManifest, PodRejected
from common.core.groups import KUEUE_COUNT_ANNOTATION, KUEUE_GROUP_LABEL, group_of
from common.core.names import InvalidName, check_label, check_subdomain, shown
from common.files import InputFileError, parse_pod_manifest
from scheduler.cluster import ClusterError, StoreUnavailable
from scheduler.cluster.standalone import EntryTooLarge, PodEvent, StandaloneCluster, StoredPod
from scheduler.web.limits import POD_BODY_LIMIT, YAML_ENTRIES_LIMIT, read_body
from scheduler.web.protocol import check_pod_names

Handler = Callable[[web.Request], Awaitable[web.Response]]


def _pod_view(pod: StoredPod, events: list[PodEvent]) -> dict[str, object]:
    return {
        "namespace": pod.manifest.metadata.namespace, "name": pod.manifest.metadata.name,
        "uid": pod.uid, "node": pod.node, "phase": pod.phase, "annotations": pod.annotations,
        "events": [msgspec.structs.asdict(e) for e in events],
    }


def path_names(request: web.Request) -> tuple[str, str]:
    """The namespace and name in the URL; 400 naming the one Kubernetes would refuse."""
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    try:
        check_label("namespace", namespace)
        check_subdomain("name", name)
    except InvalidName as error:
        raise web.HTTPBadRequest(text=f"{error}\n") from None
    return namespace, name


def refusing_on_standby(cluster: StandaloneCluster, handler: Handler) -> Handler:
    """``handler``, answering 503 naming the lease's holder while this daemon stands by:
    its store may be stale, and it writes nothing."""
    async def handle(request: web.Request) -> web.Response:
        standby = cluster.refusal()
        if standby is not None:
            return web.Response(status=503, text=f"{standby}\n")
        return await handler(request)

    return handle


class PodApi:
    """``/api/pods``: submit (POST a Pod manifest, YAML or JSON), list, get, delete.

    Names are checked as Kubernetes checks them; a body over ``POD_BODY_LIMIT``, or a pod
    larger than the store takes in one NATS message, is a 413.
    A standby's pods may be stale and it writes none: every route answers it 503 naming
    the holder. ``retry_now`` is told of every pod submitted (the pending loop's).
    """

    def __init__(self, cluster: StandaloneCluster, retry_now: Callable[[], None]) -> None:
        self._cluster = cluster
        self._retry_now = retry_now

    def routes(self) -> list[web.RouteDef]:
        def guard(handler: Handler) -> Handler:
            return refusing_on_standby(self._cluster, handler)

        return [web.post("/api/pods", guard(self.submit)),
                web.get("/api/pods", guard(self.list_pods)),
                web.get("/api/pods/{namespace}/{name}", guard(self.get_pod)),
                web.delete("/api/pods/{namespace}/{name}", guard(self.delete_pod))]

    async def submit(self, request: web.Request) -> web.Response:
        try:
            manifest = parse_pod_manifest(await read_body(request, POD_BODY_LIMIT),
                                          "request body", yaml_entries_max=YAML_ENTRIES_LIMIT)
        except InputFileError as error:
            return web.Response(status=400, text=f"{error}\n")
        try:
            check_pod_names(manifest, "")
        except InvalidName as error:
            return web.Response(status=400, text=f"request body: {error}\n")
        refused = self._group_refusal(manifest)
        if refused is not None:
            return web.Response(status=400, text=f"request body: {refused}\n")
        try:
            pod = await self._cluster.submit(manifest)
        except StoreUnavailable as error:
            return web.Response(status=503, text=f"{error}\n")
        except EntryTooLarge as error:
            return web.Response(status=413, text=f"{error}\n")
        except ClusterError as error:
            return web.Response(status=409, text=f"{error}\n")
        self._retry_now()
        return _json_response(_pod_view(pod, []), status=201)

    def _group_refusal(self, manifest: PodManifest) -> str | None:
        """Why a pod's group declaration cannot be taken here, None when it can: a bad one,
        one naming a PodGroup object (standalone keeps none), or a count its group's pods
        already stored disagree with."""
        try:
            group = group_of(manifest)
        except PodRejected as error:
            return str(error)
        if group is None:
            return None
        if group.count is None:
            return (f"{group.source.field} names a PodGroup object, which standalone pyhami "
                    f"does not keep: declare the group with the label {KUEUE_GROUP_LABEL} and "
                    f"the annotation {KUEUE_COUNT_ANNOTATION}")
        for stored in self._cluster.pods():
            other = stored.manifest
            if other.namespace != group.namespace or other.key == manifest.key:
                continue
            with contextlib.suppress(PodRejected):
                theirs = group_of(other)
                if theirs is not None and theirs.key == group.key and \
                        theirs.count != group.count:
                    return (f"metadata.annotations[{KUEUE_COUNT_ANNOTATION}]: group "
                            f"{shown(group.name)} counts {theirs.count} members on pod "
                            f"{other.metadata.name}, not {group.count}: its members must agree")
        return None

    async def list_pods(self, _: web.Request) -> web.Response:
        cluster = self._cluster
        return _json_response([
            _pod_view(p, cluster.events(p.manifest.namespace, p.manifest.metadata.name))
            for p in cluster.pods()
        ])

    async def get_pod(self, request: web.Request) -> web.Response:
        namespace, name = path_names(request)
        found = next((p for p in self._cluster.pods()
                      if p.manifest.metadata.namespace == namespace
                      and p.manifest.metadata.name == name), None)
        if found is None:
            return web.Response(status=404, text=f"pod {namespace}/{name} not found\n")
        return _json_response(_pod_view(found, self._cluster.events(namespace, name)))

    async def delete_pod(self, request: web.Request) -> web.Response:
        namespace, name = path_names(request)
        try:
            deleted = await self._cluster.delete(namespace, name)
        except StoreUnavailable as error:
            return web.Response(status=503, text=f"{error}\n")
        except ClusterError as error:
            return web.Response(status=409, text=f"{error}\n")
        if not deleted:
            return web.Response(status=404, text=f"pod {namespace}/{name} not found\n")
        return web.Response(status=204)


def _json_response(value: object, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(value), status=status,
                        content_type="application/json")
