"""The mutating admission webhook: an AdmissionReview in, the pod's ``schedulerName``, the
device configuration's container environment and runtime class out.

``POST /webhook`` on its own HTTPS listener (``--webhook-listen``). The rule is the core's
(``common.core.admission``); here is the wire. A pod is allowed, with a JSONPatch only when
the rule changes the pod, unless the rule refuses it (a privileged container, a node
already named) or, last as in HAMi, pyhami will place it and its fixed GPU requests alone
exceed what its namespace's ResourceQuotas leave (``QuotaGate``): then it is denied (403)
with the sentence. A body that is no AdmissionReview, or a Pod that
does not decode, is answered 400 naming what is wrong: the API server then admits the pod
unchanged under ``failurePolicy: Ignore``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec
from aiohttp import web

from common.core.admission import Admission, AdmittedPod, admit
from common.core.deviceconfig import DeviceConfig
from common.core.errors import InvalidInput
from common.core.pod import DEFAULT_DEVICE, DEFAULT_NAMESPACE, EnvVar, PodManifest
from scheduler.errors import SchedulerError
from scheduler.web.limits import ADMISSION_BODY_LIMIT, read_body

logger = logging.getLogger(__name__)

WEBHOOK_PATH = "/webhook"
REVIEW_KIND = "AdmissionReview"
# The API server sends the first version of the configuration's admissionReviewVersions
# it speaks and expects the answer in that version; both carry the same fields.
REVIEW_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
JSON_PATCH = "JSONPatch"


# AdmissionReview, as much of it as the webhook reads and writes --------------------------


class GroupVersionKind(msgspec.Struct):
    group: str = ""
    version: str = ""
    kind: str = ""


class AdmissionRequest(msgspec.Struct, rename="camel"):
    uid: str
    kind: GroupVersionKind = msgspec.field(default_factory=GroupVersionKind)
    sub_resource: str = ""
    name: str = ""
    namespace: str = ""
    operation: str = ""
    # Empty when absent; decoded only for a Pod being created.
    object: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class ResponseStatus(msgspec.Struct, omit_defaults=True):
    """The ``metav1.Status`` of a denial: the API server shows ``message`` to the client."""

    code: int
    reason: str = ""
    message: str = ""


class AdmissionResponse(msgspec.Struct, rename="camel", omit_defaults=True):
    uid: str
    allowed: bool
    status: ResponseStatus | None = None
    patch_type: str | None = None
    patch: bytes | None = None  # base64 on the wire, as msgspec writes bytes
    warnings: list[str] | None = None


class AdmissionReview(msgspec.Struct, rename="camel", omit_defaults=True):
    api_version: str = ""
    kind: str = ""
    request: AdmissionRequest | None = None
    response: AdmissionResponse | None = None


class PatchOperation(msgspec.Struct):
    """One RFC 6902 operation."""

    op: str
    path: str
    value: str | EnvVar | list[EnvVar]


_review = msgspec.json.Decoder(AdmissionReview)
_pod = msgspec.json.Decoder(AdmittedPod)
_manifest = msgspec.json.Decoder(PodManifest)

QuotaGate = Callable[[PodManifest], "str | None"]
"""Why a new pod's fixed GPU requests exceed what its namespace's quotas leave (the
sentence), or None: they fit, or the daemon cannot judge yet (its ledger not rebuilt)."""
_encoder = msgspec.json.Encoder()


class BadReview(SchedulerError, InvalidInput):
    """A body the API server would not send; the message says what is wrong."""


def read_review(body: bytes) -> tuple[str, AdmissionRequest]:
    """The review's apiVersion (the answer's) and its request. Raises ``BadReview``."""
    try:
        review = _review.decode(body)
    except msgspec.DecodeError as error:
        raise BadReview(f"not an AdmissionReview: {error}") from None
    except RecursionError:  # msgspec's depth bound: Python's recursion limit
        raise BadReview("not an AdmissionReview: JSON nested too deeply") from None
    if review.kind != REVIEW_KIND or review.api_version not in REVIEW_VERSIONS:
        raise BadReview(f"kind {review.kind!r} apiVersion {review.api_version!r} is not "
                        f"{REVIEW_KIND} {' or '.join(REVIEW_VERSIONS)}")
    if review.request is None or not review.request.uid:
        raise BadReview("the AdmissionReview has no request.uid")
    return review.api_version, review.request


def respond(request: AdmissionRequest, scheduler_name: str,
            quota: QuotaGate | None = None,
            device: DeviceConfig = DEFAULT_DEVICE) -> AdmissionResponse:
    """The answer to a review under the device configuration ``device``: allowed, with a
    patch when the rule changes a new Pod; denied when the rule refuses it, or when it is
    pyhami's and ``quota`` refuses it.

    Anything but the creation of a Pod is let through untouched. Raises ``BadReview`` when
    the Pod does not decode."""
    allowed = AdmissionResponse(uid=request.uid, allowed=True)
    if ((request.kind.group, request.kind.kind) != ("", "Pod") or request.sub_resource
            or request.operation != "CREATE"):
        return allowed
    if not request.object or bytes(request.object) == b"null":
        raise BadReview("request.object: a Pod CREATE carries the Pod")
    try:
        pod = _pod.decode(request.object)
    except msgspec.DecodeError as error:
        raise BadReview(f"request.object is not a Pod: {error}") from None
    except RecursionError:
        raise BadReview("request.object is not a Pod: JSON nested too deeply") from None
    admission = admit(pod, scheduler_name, device)
    name = pod.metadata.name or request.name or "(name to be generated)"
    where = f"pod {request.namespace or pod.metadata.namespace or DEFAULT_NAMESPACE}/{name}"
    refusal = admission.denial
    if refusal is None and admission.ours and quota is not None:
        try:
            manifest = _manifest.decode(request.object)
        except msgspec.DecodeError as error:
            raise BadReview(f"request.object is not a Pod: {error}") from None
        if request.namespace:
            manifest.metadata.namespace = request.namespace  # the API server's word
        refusal = quota(manifest)
    if refusal is not None:
        logger.info("%s: denied: %s", where, refusal)
        return AdmissionResponse(uid=request.uid, allowed=False, status=ResponseStatus(
            code=403, reason="Forbidden", message=refusal))
    log = logger.info if admission.mutates else logger.debug
    log("%s: %s", where, admission.reason)
    if not admission.mutates:
        return allowed
    return AdmissionResponse(uid=request.uid, allowed=True, patch_type=JSON_PATCH,
                             patch=_encoder.encode(patch_of(admission, scheduler_name)))


def patch_of(admission: Admission, scheduler_name: str) -> list[PatchOperation]:
    """The JSONPatch carrying out ``admission``'s changes, in the rule's order."""
    operations: list[PatchOperation] = []
    for added in admission.env:
        where = f"/spec/{added.field}/{added.index}/env"
        variables = [EnvVar(name, value) for name, value in added.variables]
        if added.has_env:
            operations.extend(PatchOperation("add", f"{where}/-", var) for var in variables)
        else:
            operations.append(PatchOperation("add", where, variables))
    # "add" sets a member whether the API server filled it in or not.
    if admission.runtime_class_name is not None:
        operations.append(PatchOperation("add", "/spec/runtimeClassName",
                                         admission.runtime_class_name))
    if admission.redirect:
        operations.append(PatchOperation("add", "/spec/schedulerName", scheduler_name))
    return operations


def webhook_app(scheduler_name: str, quota: QuotaGate | None = None,
                device: DeviceConfig = DEFAULT_DEVICE) -> web.Application:
    """``POST /webhook``, for the webhook's HTTPS listener; ``quota`` judges the pods
    pyhami will place against their namespace's quotas; ``device`` is the daemon's device
    configuration (resource names, env and runtime class written)."""

    async def review(http: web.Request) -> web.Response:
        body = await read_body(http, ADMISSION_BODY_LIMIT)
        try:
            version, request = read_review(body)
            response = respond(request, scheduler_name, quota, device)
        except BadReview as error:
            return web.Response(status=400, text=f"malformed AdmissionReview: {error}\n")
        answer = AdmissionReview(api_version=version, kind=REVIEW_KIND, response=response)
        return web.Response(body=_encoder.encode(answer), content_type="application/json")

    # The handler reads through read_body with its own limit; this bounds any other reader.
    app = web.Application(client_max_size=ADMISSION_BODY_LIMIT)
    app.add_routes([web.post(WEBHOOK_PATH, review)])
    return app
