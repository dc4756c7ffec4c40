"""The mutating webhook's rule: which new pods pyhami's scheduler takes over.

A pod that asks for a GPU resource pyhami manages and names no scheduler of its own is
given pyhami's scheduler name, as HAMi's webhook does, so manifests written for HAMi
(which rarely set ``schedulerName``) are placed by pyhami unchanged. The API server fills
in ``default-scheduler`` before admission webhooks see a pod, so that name counts as
none. Pure: the webhook's HTTP side (``scheduler.web.webhook``) decodes the pod and applies
the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from common.core.deviceconfig import ResourceNames
from common.core.pod import DEFAULT_NAMES, Container, ObjectMeta, names_gpu_resource

DEFAULT_SCHEDULER = "default-scheduler"


# The subset of a v1.Pod the rule reads; every other field is ignored on decode.
class SecurityContext(msgspec.Struct):
    privileged: bool | None = None


class AdmittedContainer(Container, rename="camel"):
    security_context: SecurityContext | None = None


class AdmittedPodSpec(msgspec.Struct, rename="camel"):
    containers: list[AdmittedContainer] = []
    init_containers: list[AdmittedContainer] | None = None
    node_name: str | None = None
    scheduler_name: str | None = None


class AdmittedPod(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: AdmittedPodSpec = msgspec.field(default_factory=AdmittedPodSpec)


@dataclass(frozen=True, slots=True)
class Admission:
    """What the webhook does with one new pod."""

    redirect: bool
    """Write pyhami's scheduler name into ``spec.schedulerName``."""
    reason: str
    """Why, in a few words, for the daemon's log."""
    warning: str | None = None
    """Said to whoever creates the pod (``kubectl`` prints it as ``Warning:``)."""
    ours: bool = False
    """pyhami's scheduler will place the pod (redirected, or naming it already): its
    namespace's quotas are checked at admission."""


def names_no_other_scheduler(named: str | None, scheduler_name: str) -> bool:
    """Whether a pod whose ``spec.schedulerName`` is ``named`` is for pyhami's scheduler
    (``scheduler_name``): it names that scheduler, or none (the API server's default
    counts as none)."""
    return (named or DEFAULT_SCHEDULER) in (DEFAULT_SCHEDULER, scheduler_name)


def admit(pod: AdmittedPod, scheduler_name: str,
          names: ResourceNames = DEFAULT_NAMES) -> Admission:
    """Whether pyhami's scheduler (``scheduler_name``) takes this new pod over; a pod is
    a GPU pod when it names one of the resources ``names`` (the device configuration's).

    Never refuses a pod: a pod left alone goes to the scheduler it names.
    """
    spec = pod.spec
    named = spec.scheduler_name or DEFAULT_SCHEDULER
    containers = [*(spec.init_containers or ()), *spec.containers]
    if not names_gpu_resource(containers, names):
        return Admission(False, "asks for no GPU resource pyhami manages")
    if named == scheduler_name:
        return Admission(False, f"already names {scheduler_name}", ours=not spec.node_name)
    if named != DEFAULT_SCHEDULER:
        return Admission(False, f"names scheduler {named}")
    if spec.node_name:
        return Admission(False, f"already assigned to node {spec.node_name}")
    privileged = next((c.name for c in containers
                       if c.security_context is not None and c.security_context.privileged),
                      None)
    if privileged is not None:
        # A privileged container sees every GPU of its node: no share of a card can be
        # kept to it. HAMi refuses such pods; pyhami lets the pod's scheduler have it.
        return Admission(False, f"container {privileged} is privileged", warning=(
            f"pyhami: container {privileged!r} is privileged and would see every GPU of its "
            f"node, so the pod is left to {named}, not given to {scheduler_name}"))
    return Admission(True, f"asks for a GPU: schedulerName set to {scheduler_name}", ours=True)
