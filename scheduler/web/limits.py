"""Request bodies read with a bound: refused with 413 before they are read whole.

``EXTENDER_BODY_LIMIT`` serves the largest ExtenderArgs kube-scheduler sends in the
shipped configuration (``nodeCacheCapable: true``, so node names, not Node objects)
at 15,000 nodes: 15,000 names of at most 253 characters, quoted and comma-separated,
are 3.84 MB; the Pod beside them is at most 1.5 MiB in etcd and, as JSON, under
3 MiB (the API server's own limit on a request body). 6.99 MB in all, below 8 MiB.

``POD_BODY_LIMIT`` bounds a lone Pod manifest (the pod API, /explain): the API
server's 3 MiB limit on a request body.

``ADMISSION_BODY_LIMIT`` bounds an AdmissionReview: the object and, on an update, the old
object, each a Pod under 3 MiB as JSON, plus the request's few other fields (the user's
name and groups among them), well under 1 MiB.

``YAML_ENTRIES_LIMIT`` bounds a body read as YAML (the pod API, /explain, the quota API):
PyYAML reads a document in one call of 6 to 8 us an entry on the development machine (2
vCPU EPYC), 10 s for 3 MiB of a flow list, and nothing else runs on the daemon's loop
meanwhile. 10,000 lines and commas, 60 to 80 ms at most, hold any Pod written by hand
many times over; larger bodies are sent as JSON (msgspec reads 3 MiB in milliseconds),
as kubectl and every client library do.
"""

from __future__ import annotations

from aiohttp import web

EXTENDER_BODY_LIMIT = 8 * 1024 * 1024
POD_BODY_LIMIT = 3 * 1024 * 1024
ADMISSION_BODY_LIMIT = 2 * POD_BODY_LIMIT + 1024 * 1024
YAML_ENTRIES_LIMIT = 10_000


async def read_body(request: web.Request, limit: int) -> bytes:
    """The body, or 413 as soon as it is known to exceed ``limit``: from its
    Content-Length before reading anything, else (chunked) once ``limit`` is passed."""
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if len(body) > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body))
    return bytes(body)
