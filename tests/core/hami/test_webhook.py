"""HAMi's tests of its mutating webhook (``cases/webhook.yaml``).

A ``MutateAdmission`` case (one container) is put to ``admit`` as the one container of
a pod naming no scheduler: HAMi's "has a GPU resource" is pyhami's taking the pod
(``ours``), its error a denial. A ``Handle`` case goes to ``respond`` with the
AdmissionRequest the Go test builds, plus the Pod kind and ``CREATE`` the API server
always sends (HAMi's handler does not read them; pyhami lets anything else through).

pyhami's webhook writes no ``gpucores`` into a pod: it applies the webhook's exclusive
default when it reads the pod. So for ``TestMutateAdmissionDefaultsExclusiveCore`` the
observable equivalent of the cores HAMi's webhook leaves in the container (those it
wrote, else those the pod gives, else ``defaultCores``, 0 in these tests) is the cores
pyhami's ``parse_pod`` reads for it.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from common.core import PodRejected, parse_pod
from common.core.admission import AdmittedContainer, AdmittedPod, AdmittedPodSpec, admit
from common.core.deviceconfig import DeviceConfigError
from common.core.pod import PodManifest, PodSpec, ResourceRequirements
from scheduler.web.webhook import AdmissionRequest, GroupVersionKind, respond
from tests.builders import under
from tests.core.hami.readings import asserted, container_of, device_of
from tests.core.hami.tables import Row, cases

_patch = msgspec.json.Decoder(list[dict[str, Any]])


def exclusive_cores(given: dict[str, Any]) -> dict[str, Any]:
    """The cores pyhami reads for the container, or why its configuration is refused."""
    try:
        device = device_of(given)
    except DeviceConfigError as error:
        return {"refused": str(error)}
    pod = PodManifest(spec=PodSpec(containers=[container_of(**given["container"])]))
    try:
        return {"cores": parse_pod(pod, under(device)).containers[0].cores}
    except PodRejected as error:
        return {"refused": str(error)}


def cores_found(want: dict[str, Any]) -> dict[str, Any]:
    """Where HAMi's test finds the container's cores, as the cores its scheduler reads."""
    if "refused" in want:
        return want
    in_limits = want["cores_in_limits"]
    return {"cores": in_limits if in_limits is not None else want.get("cores_in_requests", 0)}


def mutate(given: dict[str, Any]) -> dict[str, Any]:
    """``admit`` on a pod of the one container: taken, refused, env, runtime class."""
    resources = given["container"]
    pod = AdmittedPod(spec=AdmittedPodSpec(containers=[AdmittedContainer(
        name="test", resources=ResourceRequirements(limits=resources.get("limits"),
                                                    requests=resources.get("requests")))]))
    admission = admit(pod, "hami-scheduler", device_of(given))
    return {
        "has_resource": admission.ours,
        "error": admission.denial is not None,
        "env": {name: value for added in admission.env for name, value in added.variables},
        "runtime_class_name": admission.runtime_class_name,
    }


def handle(given: dict[str, Any]) -> dict[str, Any]:
    """``respond`` to the review: allowed, and the scheduler name the patch writes."""
    request = AdmissionRequest(
        uid="test-uid", kind=GroupVersionKind(version="v1", kind="Pod"), operation="CREATE",
        name=given["pod"]["metadata"]["name"], namespace="default",
        object=msgspec.Raw(json.dumps(given["pod"]).encode()))
    response = respond(request, given["scheduler_name"], None, device_of(given))
    patch = _patch.decode(response.patch) if response.patch is not None else []
    written = [op["value"] for op in patch
               if op["path"] == "/spec/schedulerName" and op["op"] in ("add", "replace")]
    return {"allowed": response.allowed, "scheduler_name_patch": next(iter(written), None)}


@cases("webhook")
def test_hami_case(row: Row) -> None:
    if row.test == "TestMutateAdmissionDefaultsExclusiveCore":
        assert exclusive_cores(row.given) == cores_found(row.expected)
    elif "pod" in row.given:
        assert asserted(handle(row.given), row.expected) == row.expected
    else:
        assert asserted(mutate(row.given), row.expected) == row.expected
