"""Kueue's Workloads, as pyhami's admission check reads them.

Kueue admits a job in two steps: its quota is reserved in a ClusterQueue, then every
AdmissionCheck the ClusterQueue names must say ``Ready``. pyhami is the controller of one
such check (``CONTROLLER_NAME``): it places every pod a Workload will run, all or nothing,
on the live fleet, and says ``Ready`` only once their cards are reserved.

This module is the pure part of that: the Workload as the API server sends it (wire
types, msgspec), what the check must do with it now (``check_duty``), and its pods read
as pod requests (``workload_members``), each under a key of its own that no pod can have
(``placeholder_key``), so that their reservations sit in the one ledger beside the pods'.
The pods, once Kueue starts the job, carry ``WORKLOAD_ANNOTATION`` and
``POD_SET_ANNOTATION`` (the check asks Kueue to add them, ``pod_set_updates``) and take the
cards reserved in their name.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from common.core.errors import InvalidInput
from common.core.names import InvalidName, check_label_value, check_subdomain
from common.core.pod import Defaults, ObjectMeta, PodManifest, PodRequest, PodSpec, parse_pod
from common.core.policy import PodRejected

CONTROLLER_NAME = "pyhami.io/placement"
"""The ``spec.controllerName`` of the AdmissionChecks pyhami answers."""
WORKLOAD_ANNOTATION = "pyhami.io/workload"
"""On each pod of a workload placed by the check: the Workload's name (same namespace)."""
POD_SET_ANNOTATION = "pyhami.io/pod-set"
"""On each pod of a workload placed by the check: its pod set's name."""
WORKLOAD_POD_MAX = 1024
"""The most pods a workload placed by the check may run: one decision per pod, made at
once (as a pod group's, ``GROUP_MAX``)."""
MESSAGE_MAX = 32768
"""Kueue's bound on a check's message (``AdmissionCheckState.message``)."""


class CheckState(enum.StrEnum):
    """An AdmissionCheck's state on a Workload (Kueue's ``CheckState``)."""

    PENDING = "Pending"
    READY = "Ready"
    RETRY = "Retry"
    REJECTED = "Rejected"


# The wire: a Workload (kueue.x-k8s.io/v1beta2) as far as the check reads it ---------------


class Condition(msgspec.Struct, rename="camel"):
    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""


class PodSetUpdate(msgspec.Struct, rename="camel", omit_defaults=True):
    name: str
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class AdmissionCheckState(msgspec.Struct, rename="camel"):
    name: str = ""
    state: str = ""
    message: str = ""
    last_transition_time: str | None = None
    pod_set_updates: list[PodSetUpdate] | None = None


class PodSetAssignment(msgspec.Struct, rename="camel"):
    name: str = ""
    count: int | None = None


class Admission(msgspec.Struct, rename="camel"):
    cluster_queue: str = ""
    pod_set_assignments: list[PodSetAssignment] = []


class WorkloadStatus(msgspec.Struct, rename="camel"):
    conditions: list[Condition] = []
    admission: Admission | None = None
    admission_checks: list[AdmissionCheckState] = []


class PodSet(msgspec.Struct, rename="camel"):
    name: str = "main"
    count: int = 1
    template: msgspec.Raw = msgspec.Raw(b"{}")
    """Read apart (``workload_members``): a template pyhami cannot read is said on the
    check, not a Workload the watch drops."""


class WorkloadSpec(msgspec.Struct, rename="camel"):
    pod_sets: list[PodSet] = []
    priority: int | None = None
    queue_name: str = ""


class WorkloadMeta(msgspec.Struct, rename="camel"):
    name: str = ""
    namespace: str = "default"
    uid: str = ""
    resource_version: str = ""
    creation_timestamp: str = ""


class Workload(msgspec.Struct):
    """A Kueue Workload, the parts the check reads."""

    metadata: WorkloadMeta = msgspec.field(default_factory=WorkloadMeta)
    spec: WorkloadSpec = msgspec.field(default_factory=WorkloadSpec)
    status: WorkloadStatus = msgspec.field(default_factory=WorkloadStatus)

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"

    def condition(self, kind: str) -> bool:
        """Whether the condition ``kind`` (``QuotaReserved``, ``Finished``) is True."""
        return any(c.type == kind and c.status == "True" for c in self.status.conditions)

    def check(self, names: Collection[str]) -> AdmissionCheckState | None:
        """The state of the first check of ``names`` on this workload; None if it has none
        of them."""
        for state in self.status.admission_checks:
            if state.name in names:
                return state
        return None

    @property
    def order(self) -> tuple[int, str, str]:
        """Kueue's order among workloads waiting: higher priority first, then older."""
        return (-(self.spec.priority or 0), self.metadata.creation_timestamp, self.key)


class AdmissionCheckSpec(msgspec.Struct, rename="camel"):
    controller_name: str = ""


class AdmissionCheck(msgspec.Struct):
    """A Kueue AdmissionCheck (cluster-scoped): which controller answers it."""

    metadata: WorkloadMeta = msgspec.field(default_factory=WorkloadMeta)
    spec: AdmissionCheckSpec = msgspec.field(default_factory=AdmissionCheckSpec)

    @property
    def key(self) -> str:
        """Its name: AdmissionChecks are cluster-scoped."""
        return self.metadata.name


# What the check does with a workload now ---------------------------------------------------


class Duty(enum.Enum):
    """What the check owes a workload, from its status alone."""

    NONE = "none"
    """Not ours, or it holds no quota: nothing to place, nothing to hold."""
    PLACE = "place"
    """It holds quota and the check is Pending: place its pods, or say why not."""
    HOLD = "hold"
    """The check said Ready and the workload runs or is about to: its cards stay held
    until its pods take them."""


def check_duty(workload: Workload, checks: frozenset[str]) -> tuple[Duty, str | None]:
    """What the check owes ``workload`` and the name of the check (one of ``checks``, the
    AdmissionChecks whose controller is pyhami) on it."""
    state = workload.check(checks)
    if state is None:
        return Duty.NONE, None
    if workload.condition("Finished") or not workload.condition("QuotaReserved"):
        return Duty.NONE, state.name
    if state.state == CheckState.PENDING:
        return Duty.PLACE, state.name
    if state.state == CheckState.READY:
        return Duty.HOLD, state.name
    return Duty.NONE, state.name


# The workload's pods as pod requests -------------------------------------------------------


class WorkloadRefused(InvalidInput):
    """A workload the check cannot place whatever the cards: the message says why, for the
    check's message (the check is then ``Rejected``)."""


class _Template(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)


_templates = msgspec.json.Decoder(_Template)


@dataclass(frozen=True, slots=True)
class Member:
    """One pod of a workload, before it exists: its pod set and its request, keyed by its
    placeholder key."""

    pod_set: str
    index: int
    """Its place in its pod set, from 0."""
    request: PodRequest


def placeholder_key(namespace: str, workload: str, pod_set: str, index: int) -> str:
    """The key a workload's pod ``index`` of ``pod_set`` is reserved under until the pod
    exists: ``<namespace>/<workload>[<pod set>#<index>]``, which no pod's name can be
    (brackets and ``#`` are not in DNS names)."""
    return f"{namespace}/{workload}[{pod_set}#{index}]"


def workload_members(workload: Workload, defaults: Defaults) -> list[Member]:
    """The pods of ``workload`` that ask for GPUs, each read as a pod request under its
    placeholder key; as many per pod set as Kueue admitted (``status.admission``'s counts,
    where partial admission lowered them), else as the pod set counts. Raises
    ``WorkloadRefused`` naming the field: a pod set name that is not a label value, more
    than ``WORKLOAD_POD_MAX`` pods, a template that does not read as a pod, or a pod
    request pyhami refuses."""
    namespace, name = workload.metadata.namespace, workload.metadata.name
    admitted = {a.name: a.count for a in (workload.status.admission.pod_set_assignments
                                         if workload.status.admission else ())
                if a.count is not None}
    counts = [admitted.get(p.name, p.count) for p in workload.spec.pod_sets]
    total = sum(max(count, 0) for count in counts)
    if total > WORKLOAD_POD_MAX:
        raise WorkloadRefused(f"spec.podSets: {total} pods; pyhami places at most "
                              f"{WORKLOAD_POD_MAX} pods of a workload at once")
    members: list[Member] = []
    for position, (pod_set, count) in enumerate(zip(workload.spec.pod_sets, counts, strict=True)):
        where = f"spec.podSets[{position}]"
        try:
            check_label_value(f"{where}.name", pod_set.name)
        except InvalidName as error:
            raise WorkloadRefused(str(error)) from None
        if count < 0:
            raise WorkloadRefused(f"{where}.count: {count} is not a pod count")
        try:
            template = _templates.decode(pod_set.template)
        except msgspec.DecodeError as error:
            raise WorkloadRefused(f"{where}.template does not read as a pod: {error}") from None
        for index in range(count):
            key = placeholder_key(namespace, name, pod_set.name, index)
            manifest = PodManifest(
                metadata=msgspec.structs.replace(template.metadata, name=key.partition("/")[2],
                                                 namespace=namespace),
                spec=template.spec)
            try:
                request = parse_pod(manifest, defaults)
            except PodRejected as error:
                raise WorkloadRefused(f"{where}.template: {error}") from None
            if not request.wants_gpu:
                break  # the pod set's pods are alike: none asks for a GPU
            members.append(Member(pod_set.name, index, request))
    return members


def pod_set_updates(workload: Workload, pod_sets: Sequence[str]) -> list[PodSetUpdate]:
    """What the check asks Kueue to add to the pods of ``pod_sets`` when it says Ready:
    the annotations that tie each pod to the cards held for it."""
    name = workload.metadata.name
    return [PodSetUpdate(pod_set, annotations={WORKLOAD_ANNOTATION: name,
                                               POD_SET_ANNOTATION: pod_set})
            for pod_set in pod_sets][:8]  # Kueue's bound on podSetUpdates


def claimed_workload(annotations: Mapping[str, str]) -> tuple[str, str] | None:
    """The workload and pod set a pod says it belongs to (``WORKLOAD_ANNOTATION``,
    ``POD_SET_ANNOTATION``); None when it names none. Raises ``PodRejected`` for one
    without the other or a value that is not a name."""
    workload = annotations.get(WORKLOAD_ANNOTATION)
    pod_set = annotations.get(POD_SET_ANNOTATION)
    if workload is None and pod_set is None:
        return None
    if workload is None or pod_set is None:
        missing = WORKLOAD_ANNOTATION if workload is None else POD_SET_ANNOTATION
        raise PodRejected(f"metadata.annotations[{missing}] is missing: a pod of a workload "
                          f"placed by pyhami's check carries both {WORKLOAD_ANNOTATION} and "
                          f"{POD_SET_ANNOTATION}")
    try:
        check_subdomain(f"metadata.annotations[{WORKLOAD_ANNOTATION}]", workload)
        check_label_value(f"metadata.annotations[{POD_SET_ANNOTATION}]", pod_set)
    except InvalidName as error:
        raise PodRejected(str(error)) from None
    return workload, pod_set


def check_message(text: str) -> str:
    """``text`` within Kueue's bound on a check's message."""
    if len(text) <= MESSAGE_MAX:
        return text
    return text[:MESSAGE_MAX - 3] + "..."
