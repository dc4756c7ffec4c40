"""The daemon's HTTP face: the extender verbs, health, readiness and metrics (aiohttp).

kube-scheduler's extender/v1 shapes (``scheduler.web.protocol``) stop here: each POST verb
decodes its body once, calls the service's verb with a pod and node names (or a pod's
identity and a node), and writes the service's answer in kube-scheduler's shape."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import NamedTuple, Protocol, TypeVar

import msgspec
from aiohttp import hdrs, web

from common.core.names import InvalidName, check_subdomain
from common.files import InputFileError, parse_pod_manifest
from scheduler.service import Filtered, NodeVictims, SchedulerService
from scheduler.web.limits import (
    EXTENDER_BODY_LIMIT,
    POD_BODY_LIMIT,
    YAML_ENTRIES_LIMIT,
    read_body,
)
from scheduler.web.protocol import (
    ExtenderArgs,
    ExtenderArgsDecoder,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
    MetaPod,
    MetaVictims,
    check_binding_args,
    check_extender_args,
    check_preemption_args,
    node_name,
)

Args = TypeVar("Args")
Args_co = TypeVar("Args_co", covariant=True)
Handler = Callable[[web.Request], Awaitable[web.Response]]

_binding_args = msgspec.json.Decoder(ExtenderBindingArgs)
_preemption_args = msgspec.json.Decoder(ExtenderPreemptionArgs)
_encoder = msgspec.json.Encoder()
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"


class Answer(NamedTuple):
    """An HTTP answer as the verbs make it, for either HTTP layer to write."""

    status: int
    content_type: str
    body: bytes


BodyVerb = Callable[[bytes], Awaitable[Answer]]
"""A POST verb from its whole body to its answer."""


def _text(status: int, text: str) -> Answer:
    return Answer(status, TEXT, f"{text}\n".encode())


def _json(value: object) -> web.Response:
    return web.Response(body=_encoder.encode(value), content_type=JSON)


class Decoder(Protocol[Args_co]):
    def decode(self, body: bytes, /) -> Args_co: ...


def _verb(decoder: Decoder[Args], what: str, check: Callable[[Args], None],
          answer: Callable[[Args], Awaitable[object]],
          refusal: Callable[[], str | None]) -> BodyVerb:
    """A POST verb: decode the body as ``what`` and ``check`` its names, answer as JSON;
    400 naming the problem when the body does not decode or a name is refused, 503 while
    this daemon may not decide (``refusal``)."""

    async def handle(body: bytes) -> Answer:
        if (standby := refusal()) is not None:
            return _text(503, standby)
        try:
            args = decoder.decode(body)
            check(args)
        except (msgspec.DecodeError, InvalidName) as error:
            return _text(400, f"malformed {what}: {error}")
        except RecursionError:  # msgspec's depth bound: Python's recursion limit
            return _text(400, f"malformed {what}: JSON nested too deeply")
        return Answer(200, JSON, _encoder.encode(await answer(args)))

    return handle


def extender_verbs(service: SchedulerService, *, url_prefix: str = "") -> dict[str, BodyVerb]:
    """The POST verbs kube-scheduler calls, by path (``url_prefix`` as its ``urlPrefix``
    ends)."""

    decided, preemptions = service.verbs, service.preemptions

    async def answer_filter(args: ExtenderArgs) -> ExtenderFilterResult:
        return filter_result(args, await decided.filter(args.pod, args.offered_names()))

    async def answer_prioritize(args: ExtenderArgs) -> list[HostPriority]:
        scores = await decided.prioritize(args.pod, args.offered_names())
        return [HostPriority(node, score) for node, score in scores]

    async def answer_bind(args: ExtenderBindingArgs) -> ExtenderBindingResult:
        refused = await decided.bind(namespace=args.pod_namespace, name=args.pod_name,
                                     uid=args.pod_uid, node=args.node)
        return ExtenderBindingResult(error=refused or "")

    async def answer_preempt(args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
        answered = await preemptions.answer(args.pod, offered_victims(args))
        return ExtenderPreemptionResult({
            node: MetaVictims([MetaPod(uid) for uid in victims.uids], victims.pdb_violations)
            for node, victims in answered.items()})

    # The verbs say whether this daemon may decide now (a standalone standby may not):
    # asked before a body is read, a standby answers 503 without decoding it.
    refusal = decided.refusal
    prefix = url_prefix.rstrip("/")
    args = ExtenderArgsDecoder()
    return {
        f"{prefix}/filter": _verb(args, "ExtenderArgs", check_extender_args, answer_filter,
                                  refusal),
        f"{prefix}/prioritize": _verb(args, "ExtenderArgs", check_extender_args,
                                      answer_prioritize, refusal),
        f"{prefix}/bind": _verb(_binding_args, "ExtenderBindingArgs", check_binding_args,
                                answer_bind, refusal),
        f"{prefix}/preempt": _verb(_preemption_args, "ExtenderPreemptionArgs",
                                   check_preemption_args, answer_preempt, refusal),
    }


def filter_result(args: ExtenderArgs, filtered: Filtered) -> ExtenderFilterResult:
    """/filter's answer in the shape kube-scheduler sent its nodes in: NodeNames for
    NodeNames, else the node objects of Nodes that pass, as they were sent."""
    if filtered.passing is None:
        return ExtenderFilterResult(failed_and_unresolvable_nodes=filtered.unresolvable,
                                    error=filtered.error)
    if args.node_names is not None:
        return ExtenderFilterResult(node_names=list(filtered.passing),
                                    failed_nodes=filtered.failed)
    if filtered.every_node:
        return ExtenderFilterResult(nodes={"items": list(args.nodes.items or [])}
                                    if args.nodes else None)
    wanted = set(filtered.passing)
    chosen = [item for item in (args.nodes.items or []) if node_name(item) in wanted] \
        if args.nodes and wanted else []
    return ExtenderFilterResult(nodes={"items": chosen}, failed_nodes=filtered.failed)


def offered_victims(args: ExtenderPreemptionArgs) -> dict[str, NodeVictims]:
    """Each candidate node kube-scheduler sent, with the victims it found there."""
    return {node: NodeVictims(uids, violations)
            for node, (uids, violations) in args.offered().items()}


def _aiohttp_handler(verb: BodyVerb) -> Handler:
    """The verb behind aiohttp: the body read with the extender's bound (413 past it)."""

    async def handle(request: web.Request) -> web.Response:
        status, content_type, body = await verb(await read_body(request, EXTENDER_BODY_LIMIT))
        return web.Response(status=status, body=body, headers={hdrs.CONTENT_TYPE: content_type})

    return handle


def extender_app(service: SchedulerService, verbs: Mapping[str, BodyVerb], *,
                 url_prefix: str = "") -> web.Application:
    """The extender's listener as aiohttp serves it: the ``verbs`` (``extender_verbs``),
    /explain under ``url_prefix``, health, status and the ledger."""

    async def explain(request: web.Request) -> web.Response:
        # ?node=NAME (repeated) offers only those nodes, as a /filter with NodeNames would.
        nodes = request.query.getall("node", None)
        try:
            for node in nodes or ():
                check_subdomain("node", node)
            pod = parse_pod_manifest(await read_body(request, POD_BODY_LIMIT), "request body",
                                     yaml_entries_max=YAML_ENTRIES_LIMIT)
        except (InputFileError, InvalidName) as error:
            return web.Response(status=400, text=f"{error}\n")
        return _json(service.verbs.explain(pod, nodes))

    async def statusz(_: web.Request) -> web.Response:
        return _json(service.reporting.status())

    prefix = url_prefix.rstrip("/")
    # Handlers read through read_body with their own limit; this bounds any other reader.
    app = web.Application(client_max_size=EXTENDER_BODY_LIMIT)
    app.add_routes([
        *(web.post(path, _aiohttp_handler(verb)) for path, verb in verbs.items()),
        web.post(f"{prefix}/explain", explain),
        *health_routes(service),
        web.get("/statusz", statusz),
        web.get("/ledgerz", ledgerz_handler(service)),
    ])
    return app


def health_routes(service: SchedulerService) -> list[web.RouteDef]:
    """``/healthz`` (alive) and ``/readyz`` (200, or 503 saying why not)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if not_ready := service.reporting.not_ready_because():
            return web.Response(status=503, text="; ".join(not_ready) + "\n")
        leadership = service.shared.leadership
        if leadership.role == "standby":  # on Kubernetes: it serves, its kube-scheduler waits
            holder = leadership.describe().get("holder") or "no one yet"
            return web.Response(text=f"standby: ready to serve; the leader is {holder}\n")
        return web.Response(text="ready\n")

    return [web.get("/healthz", healthz), web.get("/readyz", readyz)]


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header takes gzip: named, or ``*``, with a quality above
    0 (RFC 9110 12.5.3; a coding named outranks ``*``)."""
    taken: dict[str, bool] = {}
    for coding in accept_encoding.lower().split(","):
        name, _, parameters = coding.partition(";")
        quality = 1.0
        for parameter in parameters.split(";"):
            key, _, value = parameter.partition("=")
            if key.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        taken[name.strip()] = quality > 0
    return taken.get("gzip", taken.get("x-gzip", taken.get("*", False)))


def metrics_app(service: SchedulerService) -> web.Application:
    """Prometheus metrics on their own listener, as ``--metrics`` sets it: OpenMetrics for a
    scraper that asks for it (``Accept: application/openmetrics-text``), the classic text
    format otherwise, gzip when accepted. ``/healthz`` and ``/readyz`` too: the kubelet's
    probes come here, as they cannot present the client certificate a mutual-TLS extender
    asks for."""

    async def metrics(request: web.Request) -> web.StreamResponse:
        # gzip written by Metrics, not by aiohttp: the card gauges are kept compressed and
        # sent as they are (compressing 74 MB of text at 5,000 nodes took 0.46 s a scrape).
        gzip = accepts_gzip(",".join(request.headers.getall(hdrs.ACCEPT_ENCODING, [])))
        content_type, pieces = service.metrics.pieces(
            ",".join(request.headers.getall(hdrs.ACCEPT, [])), gzip=gzip)
        headers = {hdrs.CONTENT_TYPE: content_type, hdrs.VARY: hdrs.ACCEPT_ENCODING}
        if gzip:
            headers[hdrs.CONTENT_ENCODING] = "gzip"
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        for piece in pieces:
            if piece:  # an empty piece only lets the loop run (the cards being gathered)
                await response.write(piece)
            await asyncio.sleep(0)  # /filter and the agents' messages get their turn
        await response.write_eof()
        return response

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), *health_routes(service)])
    return app


def ledgerz_handler(service: SchedulerService) -> Handler:
    """``GET /ledgerz``: the ledger, reservations and per-card usage, read-only."""

    async def ledgerz(_: web.Request) -> web.Response:
        return _json(service.reporting.ledger())

    return ledgerz
