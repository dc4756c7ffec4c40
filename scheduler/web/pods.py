"""The pod API, standalone mode's HTTP face for pods (aiohttp): ``/api/pods``, where a
user (the demo, the tests) submits, lists, reads and deletes the pods of
``scheduler.cluster.standalone``."""

from __future__ import annotations

import msgspec
from aiohttp import web

from common.core.names import InvalidName, check_label, check_subdomain
from common.files import InputFileError, parse_pod_manifest
from scheduler.cluster import ClusterError, StoreUnavailable
from scheduler.cluster.standalone import PodEvent, StandaloneCluster, StoredPod
from scheduler.pending import PendingLoop
from scheduler.web.limits import POD_BODY_LIMIT, read_body
from scheduler.web.protocol import check_pod_names


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
