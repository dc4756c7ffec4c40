"""A stub of the Kubernetes API server, for ``scheduler.cluster.kube`` without a cluster.

No kube-apiserver can run in the unit tests, so ``StubApiServer`` (aiohttp on 127.0.0.1)
stands in for one: it answers the paths the Kubernetes adapter calls (pods, ResourceQuotas,
Events, Secrets, a Lease, TokenReviews) with canned JSON shaped like the API's (lists in
pages, 404 and 409 Status bodies, a chunked newline-delimited watch stream) and records
every request. Pods it holds change as on the API server: a patch merges and honours its
resourceVersion precondition (409 when the pod changed), a Binding places a pod on no node
yet, and each change gives a new resourceVersion. A client reaches it through a kubeconfig
``write_kubeconfig`` writes, with token auth, exactly as it would reach a real server.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

TOKEN = "stub-token"


def pod_json(name: str, *, namespace: str = "default", uid: str | None = None,
             node: str | None = None, phase: str = "Pending",
             annotations: dict[str, str] | None = None, version: str = "1",
             scheduler: str = "default-scheduler") -> dict[str, Any]:
    """A v1.Pod as the API server returns it, with the fields pyhami ignores as well."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "initContainers": [{"name": "warmup", "image": "busybox",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        "containers": [{
            "name": "train", "image": "trainer:1",
            "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1000",
                                     "cpu": "500m"}},
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        }],
        "volumes": [{"name": "data", "emptyDir": {}}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                         "effect": "NoSchedule"}],
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace, "uid": uid or f"uid-{name}",
            "resourceVersion": version, "creationTimestamp": "2025-01-02T03:04:05Z",
            "labels": {"app": "trainer"},
            "annotations": annotations or {},
            "managedFields": [{"manager": "kubectl", "operation": "Update",
                               "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": spec,
        "status": {"phase": phase, "qosClass": "Burstable",
                   "conditions": [{"type": "PodScheduled", "status": "True"}]},
    }


def quota_json(name: str, hard: dict[str, Any], *, namespace: str = "default",
               uid: str | None = None, version: str = "1",
               scope_selector: dict[str, Any] | None = None) -> dict[str, Any]:
    """A v1.ResourceQuota as the API server returns it, with a status the quota controller
    wrote and fields pyhami ignores."""
    spec: dict[str, Any] = {"hard": hard}
    if scope_selector is not None:
        spec["scopeSelector"] = scope_selector
    return {
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}",
                     "resourceVersion": version,
                     "creationTimestamp": "2025-01-02T03:04:05Z",
                     "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
        "spec": spec,
        "status": {"hard": hard, "used": {key: "0" for key in hard}},
    }


def status_json(code: int, reason: str, message: str) -> dict[str, Any]:
    """A Status body, as the API server answers a request it refuses."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


@dataclass
class Recorded:
    """One request the stub received."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    content_type: str


@dataclass
class Scripted:
    """What the stub answers, in turn, to the lists and the watches of one collection."""

    lists: list[tuple[list[dict[str, Any]], str]] = field(default_factory=list)
    """The n-th list (objects, resourceVersion); the last one repeats."""
    watches: list[list[dict[str, Any]] | int] = field(default_factory=list)
    """The n-th watch: its events, then the stream ends; or an HTTP error status. Once they
    run out, a watch stays open without events."""
    forbidden: bool = False
    """Every list and watch refused (403), as RBAC refuses an account not allowed them."""
    lists_served: int = 0
    watches_served: int = 0


@dataclass
class StubApiServer:
    """The Kubernetes API paths the adapter calls, answered with canned JSON."""

    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # "ns/name" -> pod, for GET
    all_pods: Scripted = field(default_factory=Scripted)
    """The lists and watches of all pods."""
    all_quotas: Scripted = field(default_factory=Scripted)
    """The lists and watches of all ResourceQuotas."""
    page_size: int = 1
    patch_statuses: list[int] = field(default_factory=list)  # the n-th patch's; else 200
    binding_status: int = 201
    event_status: int = 201
    get_status: int = 200
    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    """"ns/name" -> Event, as created and patched."""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    """The Nodes listed; a merge patch of a Node's annotations changes its entry here."""
    node_patch_statuses: list[int] = field(default_factory=list)  # the n-th's; else 200
    after_read: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)
    """Changes made to a pod by someone else right after the n-th GET of it is answered."""
    after_patch: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)
    """The same, after the n-th successful PATCH of a pod in ``pods``."""
    secrets: dict[str, dict[str, Any]] = field(default_factory=dict)
    """"ns/name" -> Secret, as created."""
    leases: dict[str, dict[str, Any]] = field(default_factory=dict)
    """"ns/name" -> coordination.k8s.io/v1 Lease."""
    reviews: dict[str, dict[str, Any]] = field(default_factory=dict)
    """token -> the TokenReview status the API server answers for it (unknown tokens:
    not authenticated)."""
    requests: list[Recorded] = field(default_factory=list)
    closing: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/api/v1/pods", self._listing(self.all_pods, "PodList"))
        app.router.add_get("/api/v1/resourcequotas",
                           self._listing(self.all_quotas, "ResourceQuotaList"))
        app.router.add_get("/api/v1/nodes", self._nodes)
        app.router.add_patch("/api/v1/nodes/{name}", self._patch_node)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._get)
        app.router.add_patch("/api/v1/namespaces/{ns}/pods/{name}", self._patch)
        app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", self._binding)
        app.router.add_post("/api/v1/namespaces/{ns}/events", self._event)
        app.router.add_get("/api/v1/namespaces/{ns}/events/{name}",
                           self._reading("events", self.events))
        app.router.add_patch("/api/v1/namespaces/{ns}/events/{name}", self._patch_event)
        app.router.add_get("/api/v1/namespaces/{ns}/secrets/{name}",
                           self._reading("secrets", self.secrets))
        app.router.add_post("/api/v1/namespaces/{ns}/secrets", self._create_secret)
        app.router.add_get("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}",
                           self._reading("leases", self.leases))
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self._review)
        return app

    def sent(self, method: str, path_end: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and r.path.endswith(path_end)]

    @web.middleware
    async def _record(self, request: web.Request,
                      handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else None
        self.requests.append(Recorded(request.method, request.path, dict(request.query), body,
                                      request.headers.get("Content-Type", "")))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response(status_json(401, "Unauthorized", "no token"), status=401)
        response: web.StreamResponse = await handler(request)
        return response

    def _listing(self, script: Scripted, kind: str,
                 ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """The list (in pages) and the watch of one collection, as ``script`` says."""

        async def answer(request: web.Request) -> web.StreamResponse:
            if script.forbidden:
                resource = request.path.rsplit("/", 1)[-1]
                return web.json_response(status_json(
                    403, "Forbidden", f'{resource} is forbidden: User "{TOKEN}" cannot list '
                    f'resource "{resource}" in API group "" at the cluster scope'), status=403)
            if request.query.get("watch") == "true":
                return await self._watch(request, script)
            token = request.query.get("continue")
            if token is None:
                index, offset = min(script.lists_served, len(script.lists) - 1), 0
                script.lists_served += 1
            else:
                index, offset = (int(part) for part in token.split(":"))
            items, version = script.lists[index]
            end = offset + self.page_size
            metadata = {"resourceVersion": version}
            if end < len(items):
                metadata["continue"] = f"{index}:{end}"
            return web.json_response({"kind": kind, "apiVersion": "v1", "metadata": metadata,
                                      "items": items[offset:end]})

        return answer

    async def _watch(self, request: web.Request, script: Scripted) -> web.StreamResponse:
        events = (script.watches[script.watches_served]
                  if script.watches_served < len(script.watches) else None)
        script.watches_served += 1
        if isinstance(events, int):
            return web.json_response(status_json(events, "InternalError", "etcd is down"),
                                     status=events)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)  # chunked, as the API server streams a watch
        for event in events or ():
            await response.write(json.dumps(event).encode() + b"\n")
        if events is None:
            await self.closing.wait()
        await response.write_eof()
        return response

    async def _nodes(self, _: web.Request) -> web.Response:
        return web.json_response({"kind": "NodeList", "apiVersion": "v1", "metadata": {},
                                  "items": self.nodes})

    async def _patch_node(self, request: web.Request) -> web.Response:
        """A merge patch of a Node's annotations (null removes one); 404 for a Node not
        listed."""
        status = self.node_patch_statuses.pop(0) if self.node_patch_statuses else 200
        if status != 200:
            return web.json_response(status_json(status, "InternalError", "etcd is down"),
                                     status=status)
        name = request.match_info["name"]
        node = next((node for node in self.nodes if node["metadata"]["name"] == name), None)
        if node is None:
            return web.json_response(
                status_json(404, "NotFound", f'nodes "{name}" not found'), status=404)
        notes = node["metadata"].setdefault("annotations", {})
        for note, value in (await request.json())["metadata"]["annotations"].items():
            if value is None:
                notes.pop(note, None)
            else:
                notes[note] = value
        return web.json_response(node)

    async def _get(self, request: web.Request) -> web.Response:
        key = f"{request.match_info['ns']}/{request.match_info['name']}"
        if self.get_status != 200:
            return web.json_response(status_json(self.get_status, "InternalError", "broken"),
                                     status=self.get_status)
        if key not in self.pods:
            return web.json_response(
                status_json(404, "NotFound", f'pods "{request.match_info["name"]}" not found'),
                status=404)
        answer = web.json_response(self.pods[key])
        if self.after_read:
            change(self.pods[key], self.after_read.pop(0))
        return answer

    async def _patch(self, request: web.Request) -> web.Response:
        status = self.patch_statuses.pop(0) if self.patch_statuses else 200
        if status == 422:
            return web.json_response(
                status_json(422, "Invalid", "metadata.uid: field is immutable"), status=422)
        if status != 200:
            return web.json_response(status_json(status, "InternalError", "etcd is down"),
                                     status=status)
        name = request.match_info["name"]
        pod = self.pods.get(f"{request.match_info['ns']}/{name}")
        if pod is None:
            return web.json_response(pod_json(name))
        patch = (await request.json())["metadata"]
        if (stale := modified_since(pod, patch, name)) is not None:
            return stale

        def merge(target: dict[str, Any]) -> None:
            notes = target["metadata"]["annotations"]
            for note, value in patch.get("annotations", {}).items():
                if value is None:
                    notes.pop(note, None)
                else:
                    notes[note] = value

        change(pod, merge)
        answer = web.json_response(pod)
        if self.after_patch:
            change(pod, self.after_patch.pop(0))
        return answer

    async def _binding(self, request: web.Request) -> web.Response:
        """As kube-apiserver 1.36 binds: the resourceVersion given is a precondition, the
        Binding's annotations and labels are copied onto the pod with its node, in one
        update."""
        name = request.match_info["name"]
        pod = self.pods.get(f"{request.match_info['ns']}/{name}")
        assigned = pod["spec"].get("nodeName") if pod is not None else None
        if self.binding_status != 201 or assigned:
            return web.json_response(
                status_json(409, "Conflict", f'pod {name} is already assigned to node '
                            f'"{assigned or "n9"}"'), status=409)
        if pod is not None:
            binding = await request.json()
            meta = binding["metadata"]
            if meta.get("uid", pod["metadata"]["uid"]) != pod["metadata"]["uid"]:
                return web.json_response(status_json(
                    409, "Conflict", f"Precondition failed: UID in precondition: "
                    f"{meta['uid']}, UID in object meta: {pod['metadata']['uid']}"), status=409)
            if (stale := modified_since(pod, meta, name)) is not None:
                return stale

            def bind(placed: dict[str, Any]) -> None:
                placed["spec"]["nodeName"] = binding["target"]["name"]
                placed["metadata"]["annotations"].update(meta.get("annotations", {}))
                placed["metadata"].setdefault("labels", {}).update(meta.get("labels", {}))

            change(pod, bind)
        return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                  "status": "Success", "code": 201}, status=201)

    async def _event(self, request: web.Request) -> web.Response:
        if self.event_status != 201:
            return web.json_response(status_json(403, "Forbidden", "events are forbidden"),
                                     status=self.event_status)
        return self._created(request, "events", self.events, await request.json())

    @staticmethod
    def _created(request: web.Request, kind: str, table: dict[str, dict[str, Any]],
                 body: dict[str, Any]) -> web.Response:
        """Store ``body`` in ``table`` under the path's namespace and its name, or answer the
        API server's 409 when that name is taken."""
        name = body["metadata"]["name"]
        key = f"{request.match_info['ns']}/{name}"
        if key in table:
            return web.json_response(
                status_json(409, "AlreadyExists", f'{kind} "{name}" already exists'), status=409)
        table[key] = body
        return web.json_response(body, status=201)

    def _stored(self, request: web.Request, kind: str,
                table: dict[str, dict[str, Any]]) -> dict[str, Any] | web.Response:
        """The object the path names in ``table``, or the API server's 404 for it."""
        name = request.match_info["name"]
        stored = table.get(f"{request.match_info['ns']}/{name}")
        if stored is None:
            return web.json_response(
                status_json(404, "NotFound", f'{kind} "{name}" not found'), status=404)
        return stored

    def _reading(self, kind: str, table: dict[str, dict[str, Any]],
                 ) -> Callable[[web.Request], Awaitable[web.Response]]:
        """A GET of one object of ``table``."""

        async def read(request: web.Request) -> web.Response:
            stored = self._stored(request, kind, table)
            return stored if isinstance(stored, web.Response) else web.json_response(stored)

        return read

    async def _patch_event(self, request: web.Request) -> web.Response:
        event = self._stored(request, "events", self.events)
        if isinstance(event, web.Response):
            return event
        event.update(await request.json())
        return web.json_response(event)

    async def _create_secret(self, request: web.Request) -> web.Response:
        return self._created(request, "secrets", self.secrets, await request.json())

    async def _review(self, request: web.Request) -> web.Response:
        body = await request.json()
        status = self.reviews.get(body["spec"]["token"], {"authenticated": False,
                                                          "error": "invalid bearer token"})
        return web.json_response({**body, "status": status}, status=201)


def change(pod: dict[str, Any], how: Callable[[dict[str, Any]], None]) -> None:
    """Change a stored pod as the API server would: a new resourceVersion."""
    how(pod)
    pod["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + 1)


def write_kubeconfig(path: Path, port: int, token: str = TOKEN) -> Path:
    """A kubeconfig at ``path`` that reaches the stub on ``port`` with ``token``."""
    path.write_text(json.dumps({  # JSON is YAML
        "apiVersion": "v1", "kind": "Config", "current-context": "stub",
        "clusters": [{"name": "stub", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "tester", "user": {"token": token}}],
        "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "tester"}}],
    }))
    return path


@asynccontextmanager
async def serve(api: StubApiServer) -> AsyncIterator[int]:
    """The stub on a free loopback port; yields the port."""
    runner = web.AppRunner(api.app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    await web.SockSite(runner, listener).start()
    try:
        yield listener.getsockname()[1]
    finally:
        api.closing.set()  # ends the watches held open
        await runner.cleanup()


def modified_since(pod: dict[str, Any], metadata: dict[str, Any],
                   name: str) -> web.Response | None:
    """The API server's 409 for a write whose resourceVersion precondition the pod no
    longer meets (a patch's or a Binding's); None when it meets it or names none."""
    current = pod["metadata"]["resourceVersion"]
    if metadata.get("resourceVersion", current) == current:
        return None
    return web.json_response(status_json(
        409, "Conflict", f'Operation cannot be fulfilled on pods "{name}": the object has '
        "been modified; please apply your changes to the latest version and try again"),
        status=409)

