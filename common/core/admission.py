"""The mutating webhook's rule: which new pods pyhami's scheduler takes over, and what the
webhook writes into them, in HAMi v2.10's order.

A pod that asks for a GPU resource pyhami manages and names no scheduler of its own is
given pyhami's scheduler name, as HAMi's webhook does, so manifests written for HAMi
(which rarely set ``schedulerName``) are placed by pyhami unchanged. The API server fills
in ``default-scheduler`` before admission webhooks see a pod, so that name counts as
none. Every pod passing that scheduler-name gate, GPU or not, then gets the device
configuration's container environment and runtime class (HAMi's ``MutateAdmission``),
and a GPU pod with a privileged container or a node already named is refused. Pure: the
webhook's HTTP side (``scheduler.web.webhook``) decodes the pod, turns the answer into a
JSONPatch and checks the quota last.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import msgspec

from common.core.deviceconfig import DeviceConfig
from common.core.pod import (
    DEFAULT_DEVICE,
    Container,
    ObjectMeta,
    names_gpu_resource,
    whole_quantity,
)
from common.core.policy import PodRejected
from common.core.vendors import NVIDIA

DEFAULT_SCHEDULER = "default-scheduler"
TASK_PRIORITY_ENV = "CUDA_TASK_PRIORITY"
CORE_POLICY_ENV = "GPU_CORE_UTILIZATION_POLICY"
DEFAULT_CORE_POLICY = "default"
"""``gpuCorePolicy`` value (as the empty one) that writes no variable."""


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
    runtime_class_name: str | None = None


class AdmittedPod(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: AdmittedPodSpec = msgspec.field(default_factory=AdmittedPodSpec)


@dataclass(frozen=True, slots=True)
class EnvAddition:
    """Variables the webhook appends to one container's ``env``, in order."""

    field: str
    """``initContainers`` or ``containers``: the list the container is in."""
    index: int
    """The container's place in that list."""
    has_env: bool
    """The container has an ``env`` list already: the variables are appended to it;
    otherwise the list is added with them."""
    variables: tuple[tuple[str, str], ...]
    """(name, value) pairs, in the order HAMi appends them."""


@dataclass(frozen=True, slots=True)
class Admission:
    """What the webhook does with one new pod."""

    redirect: bool
    """Write pyhami's scheduler name into ``spec.schedulerName``."""
    reason: str
    """Why, in a few words, for the daemon's log."""
    ours: bool = False
    """pyhami's scheduler will place the pod (redirected, or naming it already): its
    namespace's quotas are checked at admission."""
    denial: str | None = None
    """Refused, with this message for whoever creates the pod; nothing is patched."""
    env: tuple[EnvAddition, ...] = ()
    """Variables added to containers (the device configuration's)."""
    runtime_class_name: str | None = None
    """Written into ``spec.runtimeClassName``, which the pod leaves unset."""

    @property
    def mutates(self) -> bool:
        """Whether the pod is changed, so the answer carries a patch."""
        return self.redirect or bool(self.env) or self.runtime_class_name is not None


def names_no_other_scheduler(named: str | None, scheduler_name: str) -> bool:
    """Whether a pod whose ``spec.schedulerName`` is ``named`` is for pyhami's scheduler
    (``scheduler_name``): it names that scheduler, or none (the API server's default
    counts as none)."""
    return (named or DEFAULT_SCHEDULER) in (DEFAULT_SCHEDULER, scheduler_name)


def admit(pod: AdmittedPod, scheduler_name: str,
          device: DeviceConfig = DEFAULT_DEVICE) -> Admission:
    """What the webhook does with a new pod for pyhami's scheduler (``scheduler_name``)
    under the device configuration ``device``, in HAMi v2.10's order: the scheduler-name
    gate; each init container then container has its memory share checked and gets its
    env; the runtime class; a
    privileged container in a GPU pod refused; the scheduler name, and a GPU pod already
    on a node refused. The quota check, HAMi's last step, is the caller's (``ours``)."""
    spec = pod.spec
    named = spec.scheduler_name or DEFAULT_SCHEDULER
    if not names_no_other_scheduler(named, scheduler_name):
        return Admission(False, f"names scheduler {named}")
    names = device.resources
    lists = (("initContainers", spec.init_containers or []), ("containers", spec.containers))
    env: list[EnvAddition] = []
    gpu_pod = False
    for field, containers in lists:
        for index, container in enumerate(containers):
            invalid = invalid_share(container, device)
            if invalid is not None:
                return Admission(False, invalid, denial=invalid)
            has_gpu = names_gpu_resource([container], names)
            gpu_pod = gpu_pod or has_gpu
            variables = container_env(container, has_gpu, device)
            if variables:
                env.append(EnvAddition(field, index, container.env is not None, variables))
    runtime_class = (device.runtime_class_name
                     if device.runtime_class_name and not spec.runtime_class_name else None)
    added = tuple(env)
    if not gpu_pod:
        return Admission(False, "asks for no GPU resource pyhami manages", env=added)
    privileged = next((c.name for _, containers in lists for c in containers
                       if c.security_context is not None and c.security_context.privileged),
                      None)
    if privileged is not None:
        # A privileged container sees every GPU of its node: no share of a card can be
        # kept to it.
        denial = f"container {privileged} is privileged"
        return Admission(False, denial, denial=denial)
    if spec.node_name:
        return Admission(False, f"already assigned to node {spec.node_name}",
                         denial="pod has node assigned")
    if named == scheduler_name:
        return Admission(False, f"already names {scheduler_name}", ours=True, env=added,
                         runtime_class_name=runtime_class)
    return Admission(True, f"asks for a GPU: schedulerName set to {scheduler_name}",
                     ours=True, env=added, runtime_class_name=runtime_class)


def invalid_share(container: Container, device: DeviceConfig) -> str | None:
    """HAMi's first step for each container (``validateMemoryPercentage``): a memory share
    outside 0..100, from the limits, else the requests, refuses the pod with HAMi's
    sentence. (HAMi's scheduler would clamp it; pods the webhook never saw are read so.)"""
    resources = container.resources
    if resources is None:
        return None
    name = device.resources.memory_percentage
    table = resources.limits if resources.limits and name in resources.limits \
        else resources.requests
    if not table or name not in table:
        return None
    try:
        value = whole_quantity(table[name], name, signed=True)
    except PodRejected:
        return None  # not a quantity: the API server refuses the pod itself
    if 0 <= value <= 100:
        return None
    return (f"invalid {name} value {value} in container {container.name}: must be an "
            "integer between 0 and 100")


def container_env(container: Container, has_gpu: bool,
                  device: DeviceConfig) -> tuple[tuple[str, str], ...]:
    """The variables HAMi's webhook appends to one container, in its order: the task
    priority from the container's limits, the core policy unless ``default``, and no
    visible devices for a container asking for no card when ``overwriteEnv``."""
    variables: list[tuple[str, str]] = []
    limits = container.resources.limits if container.resources is not None else None
    priority = (limits or {}).get(device.resources.priority)
    if priority is not None:
        # An extended resource must be a whole number: the API server refuses a pod
        # naming another after the webhook, so no variable is written for it.
        with contextlib.suppress(PodRejected):
            variables.append((TASK_PRIORITY_ENV, str(whole_quantity(
                priority, f"container {container.name}: {device.resources.priority}"))))
    if device.gpu_core_policy not in ("", DEFAULT_CORE_POLICY):
        variables.append((CORE_POLICY_ENV, device.gpu_core_policy))
    if not has_gpu and device.overwrite_env:
        variables.append((NVIDIA.visible_devices_env, "none"))
    return tuple(variables)
