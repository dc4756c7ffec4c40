"""``/api/resourcequotas``, the pod API's ResourceQuotas (standalone mode): a user (the demo,
the tests, ``curl``) stores, lists, reads and deletes the quotas that cap each namespace's
GPU memory and cores, as ``kubectl`` does with a cluster's."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from common.core.deviceconfig import DeviceConfig
from common.core.errors import InvalidInput
from common.core.names import InvalidName, check_label, check_subdomain, shown
from common.core.pod import DEFAULT_DEVICE, DEFAULT_NAMESPACE, whole_quantity
from common.core.policy import PodRejected
from common.core.quota import (
    QuotaRejected,
    ResourceQuotaManifest,
    parse_quota,
    quota_keys,
)
from common.files import InputFileError, json_keys_distinct, parse_document
from scheduler.cluster import ClusterError, StoreUnavailable
from scheduler.cluster.standalone import EntryTooLarge, StandaloneCluster, StoredQuota
from scheduler.web.limits import POD_BODY_LIMIT, YAML_ENTRIES_LIMIT, read_body
from scheduler.web.pods import Handler, path_names, refusing_on_standby

KIND = "ResourceQuota"
SOURCE = "request body"
APPLY_WAIT_S = 5.0
"""How long a write waits for this daemon to apply the quota before it answers anyway (the
quota is stored, and applies as soon as the daemon gets to it)."""
SHOWN = 40
"""Characters of a refused value that is not text shown in a message."""


class QuotaBodyError(InvalidInput):
    """A body that is no ResourceQuota pyhami can store; the message says why."""


def read_quota(body: bytes, namespace: str | None = None, name: str | None = None,
               device: DeviceConfig = DEFAULT_DEVICE) -> StoredQuota:
    """The ResourceQuota in a request body (JSON or YAML, as ``kubectl get resourcequota
    -o json`` prints one), ready to store; ``namespace`` and ``name`` (from the URL) fill in
    the manifest's when it names none, and must match them when it does. Its GPU limits
    are the keys of ``device``'s resource names (the daemon's ``--device-config``), checked
    as the daemon will apply them.

    Raises ``QuotaBodyError`` naming the field: a body that is not a mapping, of another
    kind, of the wrong shape, a name Kubernetes would refuse, a limit that is not a whole
    quantity from 0 to 2^53, a scope or scope expression pyhami cannot apply."""
    document = _document(body)
    metadata = document.setdefault("metadata", {})
    if not isinstance(metadata, dict):
        raise QuotaBodyError(f"{SOURCE}: metadata is not a mapping")
    for field, wanted in (("namespace", namespace), ("name", name)):
        given = metadata.get(field)
        if wanted is not None and given not in (None, "", wanted):
            raise QuotaBodyError(f"{SOURCE}: metadata.{field} {_shown(given)} is not the "
                                 f"URL's {wanted!r}")
        if wanted is not None and not given:
            metadata[field] = wanted
    if not metadata.get("namespace"):
        metadata["namespace"] = DEFAULT_NAMESPACE
    try:
        manifest = msgspec.convert(document, ResourceQuotaManifest)
    except msgspec.ValidationError as error:
        raise QuotaBodyError(_early_refusal(document, device) or f"{SOURCE}: {error}") from None
    except RecursionError:
        raise QuotaBodyError(f"{SOURCE}: nested too deeply") from None
    try:
        parse_quota(manifest, device)
    except QuotaRejected as error:
        raise QuotaBodyError(str(error)) from None
    try:
        given = msgspec.json.encode(document)
    except (TypeError, ValueError, OverflowError, RecursionError) as error:
        raise QuotaBodyError(f"{SOURCE}: cannot be kept as JSON: {error}") from None
    return StoredQuota(manifest=manifest, given=given)


def _document(body: bytes) -> dict[str, Any]:
    """The body as plain values: JSON read by msgspec, else YAML by the safe loader."""
    document: object = None
    read = False
    if body[:64].lstrip()[:1] == b"{":
        try:
            # msgspec keeps a key's last value: with one given twice, the YAML reader names it.
            document, read = msgspec.json.decode(body), json_keys_distinct(body)
        except msgspec.DecodeError:
            pass  # out-of-range numbers, or YAML's flow style: YAML reads it, or says why
        except RecursionError:
            raise QuotaBodyError(f"{SOURCE}: nested too deeply") from None
    if not read:
        try:
            document = parse_document(body, SOURCE, entries_max=YAML_ENTRIES_LIMIT)
        except InputFileError as error:
            raise QuotaBodyError(str(error)) from None
    if not isinstance(document, dict):
        raise QuotaBodyError(f"{SOURCE}: expected a ResourceQuota manifest (a mapping)")
    kind = document.get("kind", KIND)
    if kind != KIND:
        raise QuotaBodyError(f"{SOURCE}: kind is {_shown(kind)}, expected {KIND!r}")
    return document


def _shown(value: object) -> str:
    """A value of the body, quoted and cut short for a one-line message."""
    if isinstance(value, str):
        return shown(value)
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} characters)"


def _early_refusal(document: dict[str, Any], device: DeviceConfig) -> str | None:
    """The limit of ``spec.hard`` that makes a manifest unreadable (no quantity at all, or
    an integer beyond any), named as ``parse_quota`` names a limit; None when the problem
    is in another field."""
    metadata, spec = document.get("metadata"), document.get("spec")
    hard = spec.get("hard") if isinstance(spec, dict) else None
    if not isinstance(hard, dict) or not isinstance(metadata, dict):
        return None
    namespace, name = metadata.get("namespace"), metadata.get("name")
    try:
        check_label("", namespace if isinstance(namespace, str) else "")
        check_subdomain("", name if isinstance(name, str) else "")
    except InvalidName:
        return None  # msgspec's message names the field, and parse_quota would the name
    where = f"ResourceQuota {namespace}/{name}"
    gpu_keys = quota_keys(device.resources)
    for key, value in hard.items():
        # The GPU keys are named as parse_quota names them; any other is quoted.
        field = f"{where}: spec.hard[{key if key in gpu_keys else _shown(key)}]"
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            return f"{field}: {_shown(value)} is not a quantity"
        if isinstance(value, int) and not -(2**63) <= value < 2**63:
            try:
                whole_quantity(value, field)
            except PodRejected as error:
                return str(error)
    return None


class QuotaApi:
    """``/api/resourcequotas``: create (POST), create or replace (PUT), list, get, delete,
    and the Events of one.

    A body is a ResourceQuota manifest, JSON or YAML, at most ``POD_BODY_LIMIT`` (413); one
    pyhami cannot apply is a 400 naming the field, and nothing is stored. A standby answers
    503 naming the lease's holder, as the pod API does; any 503 means nothing was stored.
    A quota is kept as given (with its namespace filled in) and applies once stored: on
    this daemon before the write is answered (``APPLY_WAIT_S`` at most), on the others
    through the bucket's watch. A quota that sets no GPU limit is stored and listed, and
    limits nothing.
    """

    def __init__(self, cluster: StandaloneCluster, device: DeviceConfig = DEFAULT_DEVICE) -> None:
        """``device``: the daemon's device configuration, whose resource names and
        ``memoryFactor`` a quota's limits are checked under."""
        self._cluster = cluster
        self._device = device

    def routes(self) -> list[web.RouteDef]:
        """The routes, each refused with 503 on a standby, as the pod API's."""
        def guard(handler: Handler) -> Handler:
            return refusing_on_standby(self._cluster, handler)

        one = "/api/resourcequotas/{namespace}/{name}"
        return [web.post("/api/resourcequotas", guard(self.create)),
                web.get("/api/resourcequotas", guard(self.list_quotas)),
                web.put(one, guard(self.put)),
                web.get(one, guard(self.get_quota)),
                web.delete(one, guard(self.delete_quota)),
                web.get(one + "/events", guard(self.quota_events))]

    async def create(self, request: web.Request) -> web.Response:
        try:
            quota = read_quota(await read_body(request, POD_BODY_LIMIT), device=self._device)
        except QuotaBodyError as error:
            return _text(400, str(error))
        return await self._store(quota, replace=False)

    async def put(self, request: web.Request) -> web.Response:
        namespace, name = path_names(request)
        try:
            quota = read_quota(await read_body(request, POD_BODY_LIMIT), namespace, name,
                               self._device)
        except QuotaBodyError as error:
            return _text(400, str(error))
        return await self._store(quota, replace=True)

    async def _store(self, quota: StoredQuota, *, replace: bool) -> web.Response:
        try:
            created = await self._cluster.put_quota(quota, replace=replace)
        except StoreUnavailable as error:
            return _text(503, str(error))
        except EntryTooLarge as error:
            return _text(413, str(error))
        except ClusterError as error:
            return _text(409, str(error))
        await self._cluster.quotas_applied(APPLY_WAIT_S)
        return _json(quota.given, status=201 if created else 200)

    async def list_quotas(self, _: web.Request) -> web.Response:
        """Every quota, as ``kubectl get resourcequota -A -o json`` lists them."""
        items = [msgspec.Raw(quota.given) for quota in self._cluster.quotas()]
        return _json(msgspec.json.encode({"apiVersion": "v1", "kind": "ResourceQuotaList",
                                          "items": items}))

    async def get_quota(self, request: web.Request) -> web.Response:
        namespace, name = path_names(request)
        quota = self._cluster.quota(namespace, name)
        if quota is None:
            return _text(404, f"ResourceQuota {namespace}/{name} not found")
        return _json(quota.given)

    async def delete_quota(self, request: web.Request) -> web.Response:
        namespace, name = path_names(request)
        try:
            deleted = await self._cluster.delete_quota(namespace, name)
        except StoreUnavailable as error:
            return _text(503, str(error))
        except ClusterError as error:
            return _text(409, str(error))
        if not deleted:
            return _text(404, f"ResourceQuota {namespace}/{name} not found")
        await self._cluster.quotas_applied(APPLY_WAIT_S)
        return web.Response(status=204)

    async def quota_events(self, request: web.Request) -> web.Response:
        namespace, name = path_names(request)
        if self._cluster.quota(namespace, name) is None:
            return _text(404, f"ResourceQuota {namespace}/{name} not found")
        events = self._cluster.quota_events(namespace, name)
        return _json(msgspec.json.encode([msgspec.structs.asdict(e) for e in events]))


def _text(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=f"{message}\n")


def _json(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json")
