"""What a Pod asks for: the manifest subset pyhami reads and its parsed request."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Annotated

import msgspec

from common.core.annotations import comma_list
from common.core.deviceconfig import INT32_MAX, DeviceConfig
from common.core.mig import POD_MODES
from common.core.names import shown
from common.core.policy import (
    WEIGHTS_ANNOTATION,
    Chain,
    NodePolicy,
    PodRejected,
    Weights,
    parse_chain,
    parse_node_policy,
    parse_weights,
)
from common.core.vendors import NVIDIA, ResourceNames

# Whole numbers as msgpack stores them (the standalone pod store): a larger one is refused
# when the manifest is read, with the field named, not when the pod is stored.
StorableInt = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
Quantity = str | StorableInt | float

DEFAULT_DEVICE = DeviceConfig()
"""The device configuration HAMi's chart renders, in force without ``--device-config``."""
DEFAULT_NAMES = DEFAULT_DEVICE.resources
RESOURCE_GPU = DEFAULT_NAMES.count
RESOURCE_MEMORY = DEFAULT_NAMES.memory
RESOURCE_MEMORY_PERCENT = DEFAULT_NAMES.memory_percentage
RESOURCE_CORES = DEFAULT_NAMES.cores


def gpu_resources(names: ResourceNames) -> tuple[str, str, str, str]:
    """The resources that make a container a GPU container: count, memory, memory
    share, cores (the priority alone does not, as in HAMi's webhook)."""
    return (names.count, names.memory, names.memory_percentage, names.cores)


GPU_RESOURCES = gpu_resources(DEFAULT_NAMES)

GPU_POLICY_ANNOTATION = "hami.io/gpu-scheduler-policy"
NODE_POLICY_ANNOTATION = "hami.io/node-scheduler-policy"


# The subset of a v1.Pod that pyhami reads; every other field is ignored on decode.
class ResourceRequirements(msgspec.Struct):
    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None


class EnvVar(msgspec.Struct):
    name: str = ""
    value: str = ""
    """Empty for a variable taken from elsewhere (``valueFrom``), which pyhami cannot read."""


class Container(msgspec.Struct):
    name: str = ""
    resources: ResourceRequirements | None = None
    env: list[EnvVar] | None = None


DISABLE_CONTROL_ENV = "CUDA_DISABLE_CONTROL"
# Go's strconv.ParseBool true spellings, which HAMi's device plugin uses for this variable.
_TRUE_SPELLINGS = frozenset({"1", "t", "T", "TRUE", "true", "True"})


def control_disabled(container: Container) -> bool:
    """Whether the container's own env turns HAMi-core off (``CUDA_DISABLE_CONTROL`` true,
    in any of Go's spellings): its device plugin then mounts no ld.so.preload. As HAMi,
    any true occurrence counts; a false or unreadable one is ignored."""
    return any(var.name == DISABLE_CONTROL_ENV and var.value in _TRUE_SPELLINGS
               for var in container.env or ())


DEFAULT_NAMESPACE = "default"
"""Where Kubernetes puts a pod whose manifest names no namespace."""


class SchedulingGroup(msgspec.Struct, rename="camel"):
    """A pod's ``spec.schedulingGroup`` (Kubernetes v1.36, feature gate GenericWorkload)."""

    pod_group_name: str | None = None
    """The ``scheduling.k8s.io/v1alpha2`` PodGroup of the pod's namespace it belongs to."""


class PodSpec(msgspec.Struct, rename="camel"):
    containers: list[Container] = []
    init_containers: list[Container] | None = None
    node_name: str | None = None
    scheduler_name: str | None = None
    priority: int | None = None
    """Set by the API server from the pod's PriorityClass (0 without one)."""
    preemption_policy: str | None = None
    """``Never``: the pod waits for room and evicts nobody (default PreemptLowerPriority)."""
    priority_class_name: str | None = None
    """Read by a ResourceQuota's ``PriorityClass`` scope."""
    active_deadline_seconds: StorableInt | None = None
    """Set: the pod is ``Terminating`` to a ResourceQuota's scopes."""
    scheduling_group: SchedulingGroup | None = None
    """Set: the pod is a member of a group placed all or nothing (``common.core.groups``)."""


class ObjectMeta(msgspec.Struct):
    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None


class NamespacedObject(msgspec.Struct):
    """A namespaced Kubernetes object as pyhami reads one: its metadata, and from it its
    namespace and its ``namespace/name`` key."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)

    @property
    def namespace(self) -> str:
        """The object's namespace: Kubernetes' default one when the manifest names none."""
        return self.metadata.namespace or DEFAULT_NAMESPACE

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.metadata.name}"


class PodManifest(NamespacedObject):
    spec: PodSpec = msgspec.field(default_factory=PodSpec)

    def asks_for_gpu(self, names: ResourceNames = DEFAULT_NAMES) -> bool:
        """Whether any container names one of the GPU resources ``names`` (the device
        configuration's; HAMi's defaults unless given)."""
        return names_gpu_resource([*(self.spec.init_containers or ()), *self.spec.containers],
                                  names)


def names_gpu_resource(containers: Iterable[Container],
                       names: ResourceNames = DEFAULT_NAMES) -> bool:
    """Whether one of ``containers`` names a GPU resource pyhami manages (count, memory,
    share or cores under ``names``), in its limits or its requests, whatever the
    quantity."""
    wanted = gpu_resources(names)
    return any(
        resource in table
        for container in containers
        if container.resources is not None
        for table in (container.resources.limits or {}, container.resources.requests or {})
        for resource in wanted
    )


# Compute resources of Kubernetes' QoS classes: a pod naming none of them is BestEffort.
_QOS_RESOURCES = ("cpu", "memory")


def _is_zero(value: Quantity) -> bool:
    """Whether a quantity is zero; one that cannot be read counts as set (nonzero): the
    API server would have refused it, and a quota scope errs towards charging the pod."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return value == 0
    try:
        return _quantity_text(value, "") == 0
    except PodRejected:
        return False


def is_best_effort(manifest: PodManifest) -> bool:
    """Kubernetes' BestEffort QoS class: no container, init containers included, has a
    nonzero cpu or memory request or limit."""
    for container in [*(manifest.spec.init_containers or ()), *manifest.spec.containers]:
        resources = container.resources
        if resources is None:
            continue
        for table in (resources.requests or {}, resources.limits or {}):
            if any(name in table and not _is_zero(table[name]) for name in _QOS_RESOURCES):
                return False
    return True


@dataclass(frozen=True, slots=True)
class QuotaSubject:
    """A pod as a ResourceQuota sees it: its namespace and what quota scopes match on."""

    namespace: str
    priority_class: str = ""
    """``spec.priorityClassName``, empty when unset."""
    terminating: bool = False
    """``spec.activeDeadlineSeconds`` is set (Kubernetes' Terminating scope)."""
    best_effort: bool = False
    """The pod's QoS class is BestEffort."""

    @classmethod
    def of(cls, manifest: PodManifest) -> QuotaSubject:
        deadline = manifest.spec.active_deadline_seconds
        return cls(namespace=manifest.namespace,
                   priority_class=manifest.spec.priority_class_name or "",
                   terminating=deadline is not None and deadline >= 0,
                   best_effort=is_best_effort(manifest))


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """One container's GPU request; ``cards == 0`` means it wants no GPU."""

    name: str
    is_init: bool
    cards: int
    memory_mib: int | None
    memory_percent: int
    cores: int

    def memory_slice(self, card_memory: int) -> int:
        if self.memory_mib is not None:
            return self.memory_mib
        return card_memory * self.memory_percent // 100


@dataclass(frozen=True, slots=True)
class PodRequest:
    key: str
    containers: tuple[ContainerRequest, ...]
    chain: Chain
    ignored_policies: tuple[str, ...]
    node_policy: NodePolicy
    weights: Weights
    use_uuids: frozenset[str] | None
    nouse_uuids: frozenset[str]
    use_types: tuple[str, ...] | None
    nouse_types: tuple[str, ...]
    numa_bind: bool
    subject: QuotaSubject
    """The pod as its namespace's ResourceQuotas see it."""
    modes: frozenset[str] | None = None
    """The card modes ``nvidia.com/vgpu-mode`` allows (``hami-core``, ``mig``); None
    without the annotation: a card of either mode."""
    adjusted: tuple[str, ...] = ()
    """Figures read otherwise than written, as HAMi's scheduler reads them (a share above
    100 read as 100, ...): one sentence each, shown as warnings by ``decide``, ``explain``
    and the daemon's ``RequestAdjusted`` Event."""

    def takes_mode(self, mode: str) -> bool:
        return self.modes is None or mode in self.modes

    @property
    def gpu_containers(self) -> tuple[ContainerRequest, ...]:
        return tuple(c for c in self.containers if c.cards > 0)

    @property
    def wants_gpu(self) -> bool:
        return any(c.cards > 0 for c in self.containers)


@dataclass(frozen=True, slots=True)
class Defaults:
    """Cluster-wide defaults, settings of the daemon and of ``pyhami decide``."""

    gpu_policy: Chain
    node_policy: NodePolicy
    device: DeviceConfig = field(default_factory=DeviceConfig)
    """HAMi's device configuration (``--device-config``): the pod parser reads its
    resource names, request defaults and ``memoryFactor``."""


_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:\d+\.?\d*|\.\d+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE](?P<exponent>[+-]?\d+))?"
)
_SCALE = {
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30),
    "Ti": Fraction(2**40), "Pi": Fraction(2**50), "Ei": Fraction(2**60),
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9),
    "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18),
}


QUANTITY_MAX = 2**53
"""The largest quantity accepted: beyond it a JSON number is no longer exact."""
QUANTITY_TEXT_MAX = 64
"""Characters in a quantity string; canonical Kubernetes quantities are far shorter."""
_DIGITS_MAX = len(str(QUANTITY_MAX)) - 1
"""Digits of a string read at once as an integer: fewer than ``QUANTITY_MAX`` has, so
it is never above it."""
# A nonzero number of at most 64 characters, scaled by 10**e with e beyond this span, is
# either above QUANTITY_MAX or not a whole number: decided without computing 10**e.
_EXPONENT_SPAN = 2 * QUANTITY_TEXT_MAX


def whole_quantity(value: Quantity, where: str, *, signed: bool = False) -> int:
    """A Kubernetes quantity whose value is a whole number from 0 to ``QUANTITY_MAX``
    (from ``-QUANTITY_MAX`` with ``signed``: a memory share, which HAMi reads whatever its
    sign).

    The API server stores quantities in canonical form (``1000`` comes back as
    ``1k``), so suffixes and exponents are read; the value must be an integer.
    The work is bounded whatever the text: its length is limited and a huge
    exponent is judged by its sign alone.
    """
    # The forms pods are written in most, read without Fraction (a quantity took 3 to 9 us
    # that way, a tenth of /filter's reading of a pod): a plain integer, or a string of
    # ASCII digits (the API server's canonical form of a whole number below 1000).
    if type(value) is int and (-QUANTITY_MAX if signed else 0) <= value <= QUANTITY_MAX:
        return value
    if type(value) is str and len(value) <= _DIGITS_MAX and value.isascii() \
            and value.isdigit():
        return int(value)
    if isinstance(value, bool):
        raise PodRejected(f"{where}: {value!r} is not an integer")
    if isinstance(value, float) and not math.isfinite(value):
        raise PodRejected(f"{where}: {value!r} is not a finite number")
    exact = Fraction(value) if isinstance(value, int | float) else _quantity_text(value, where)
    if exact.denominator != 1:
        raise PodRejected(f"{where}: {_shown(value)} is not an integer")
    if exact < 0 and not signed:
        raise PodRejected(f"{where}: {_shown(value)} is a negative number")
    if exact > QUANTITY_MAX:
        raise PodRejected(f"{where}: {_shown(value)} is above 2^53 ({QUANTITY_MAX})")
    if exact < -QUANTITY_MAX:
        raise PodRejected(f"{where}: {_shown(value)} is, in size, above 2^53 ({QUANTITY_MAX})")
    return int(exact)


def _quantity_text(text: str, where: str) -> Fraction:
    if len(text) > QUANTITY_TEXT_MAX:
        raise PodRejected(f"{where}: a quantity of {len(text)} characters is not accepted "
                          f"(at most {QUANTITY_TEXT_MAX})")
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise PodRejected(f"{where}: {text!r} is not a quantity")
    number = Fraction(match["number"])
    if match["suffix"]:
        return number * _SCALE[match["suffix"]]
    exponent = int(match["exponent"] or 0)
    if number == 0:
        return number
    if abs(exponent) <= _EXPONENT_SPAN:
        return number * Fraction(10) ** exponent
    if exponent < 0:
        return Fraction(1, 2)  # a nonzero value below 10**-64: not a whole number
    return Fraction(QUANTITY_MAX + 1) * (1 if number > 0 else -1)


def _shown(value: Quantity) -> str:
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return shown(value) if isinstance(value, str) else repr(value)


def _memory_mib(raw: Quantity, where: str, container: str, factor: int) -> int:
    """A ``gpumem`` quantity in MiB, times ``memoryFactor``. HAMi v2.10 drops the whole
    container request, with only a log line, when the value is not a whole number from 0
    to ``2^31-1 / memoryFactor``; pyhami refuses the pod and says so."""
    dropped = (f"; HAMi would drop container {container or '(unnamed)'}'s GPU request "
               "without a word")
    try:
        value = whole_quantity(raw, where)
    except PodRejected as error:
        raise PodRejected(f"{error}{dropped}") from None
    ceiling = INT32_MAX // factor
    if value > ceiling:
        scale = f"2^31-1 / memoryFactor {factor}" if factor > 1 else "2^31-1"
        raise PodRejected(
            f"{where}: {_shown(raw)} is {value} MiB, above {ceiling} ({scale}): gpumem is "
            f"MiB as a plain integer, such as 4096{dropped}")
    return value * factor


PERCENT_MAX = 100
"""The largest memory share, in percent: HAMi's scheduler reads a larger one as this."""


def _container_request(container: Container, is_init: bool, position: str,
                       device: DeviceConfig, adjusted: list[str]) -> ContainerRequest:
    """One container's request as HAMi v2.10 reads it under ``device``, its webhook's
    defaults included (``MutateAdmission``, then ``GenerateResourceRequests`` and
    ``Fit``'s clamps): each resource from the limits first, then the requests.

    Where HAMi's scheduler reads a figure as something else than written (a share above
    100 or not above 0, ``gpumem: 0``, cores above 100), the pod is read the same way and
    a sentence saying so is appended to ``adjusted``: a warning, not a refusal."""
    names = device.resources
    values, places = _written_figures(container, position, device)
    # The webhook's defaultGPUNum: a container naming memory, a share or cores but no
    # count gets that many cards; 0 leaves it no GPU container.
    cards = values.get(names.count, device.default_gpu_num if values else 0)
    if cards == 0:
        # No GPU container: nothing to default or to warn about (the figures are unused).
        return ContainerRequest(name=container.name, is_init=is_init, cards=0,
                                memory_mib=None, memory_percent=PERCENT_MAX,
                                cores=min(values.get(names.cores) or 0, 100))
    percent = _read_share(values, places, names, adjusted)
    memory = _read_memory(values, places, names, adjusted, share=percent is not None)
    cores = _read_cores(values, places, device, adjusted)
    if memory is None and percent is None and device.default_memory > 0:
        memory = device.default_memory
    return ContainerRequest(
        name=container.name,
        is_init=is_init,
        cards=cards,
        memory_mib=memory,
        memory_percent=PERCENT_MAX if percent is None else percent,
        cores=cores,
    )


def _written_figures(container: Container, position: str,
                     device: DeviceConfig) -> tuple[dict[str, int], dict[str, str]]:
    """The GPU resources the container names, as whole figures (memory in MiB, scaled by
    ``memoryFactor``), and where each was read: the limits first, then the requests."""
    names = device.resources
    resources = container.resources or ResourceRequirements()
    limits = resources.limits or {}
    requests = resources.requests or {}
    values: dict[str, int] = {}
    places: dict[str, str] = {}
    for resource in gpu_resources(names):
        source, raw = (
            ("limits", limits[resource]) if resource in limits
            else ("requests", requests.get(resource))
        )
        if raw is None:
            continue
        where = places[resource] = f"{position}.resources.{source}[{resource}]"
        if resource == names.memory:
            values[resource] = _memory_mib(raw, where, container.name, device.memory_factor)
        elif resource == names.memory_percentage:
            values[resource] = whole_quantity(raw, where, signed=True)
        else:
            values[resource] = whole_quantity(raw, where)
    return values, places


def _read_share(values: dict[str, int], places: dict[str, str], names: ResourceNames,
                adjusted: list[str]) -> int | None:
    """The memory share as HAMi's scheduler reads it: clamped to 100; not above 0, unset."""
    percent = values.get(names.memory_percentage)
    if percent is not None and percent > PERCENT_MAX:
        adjusted.append(f"{places[names.memory_percentage]}: {percent} is above "
                        f"{PERCENT_MAX}: read as {PERCENT_MAX} (HAMi's scheduler clamps it)")
        return PERCENT_MAX
    if percent is not None and percent <= 0:
        adjusted.append(f"{places[names.memory_percentage]}: {percent} is not above 0: "
                        "ignored, the default memory applies (as HAMi's scheduler reads it)")
        return None
    return percent


def _read_memory(values: dict[str, int], places: dict[str, str], names: ResourceNames,
                 adjusted: list[str], *, share: bool) -> int | None:
    """The memory figure, MiB, as HAMi's scheduler reads it: ``gpumem: 0`` is no figure,
    and the share (``share``: one is read), else the default, applies."""
    memory = values.get(names.memory)
    if memory == 0:
        adjusted.append(f"{places[names.memory]}: 0 is read as unset: "
                        f"{'the share' if share else 'the default memory'} "
                        "applies (as HAMi's scheduler reads it)")
        return None
    return memory


def _read_cores(values: dict[str, int], places: dict[str, str], device: DeviceConfig,
                adjusted: list[str]) -> int:
    """The cores figure: clamped to 100, or when unset the webhook's default."""
    names = device.resources
    cores = values.get(names.cores)
    if cores is None:
        # The webhook's exclusive default (defaultExclusiveCoreIfNeeded), judged on the
        # figures as written: a share of exactly 100, or, without a share, no memory
        # figure at all (gpumem: 0 is a figure), gives whole cards' cores.
        written_percent = values.get(names.memory_percentage)
        exclusive = (written_percent == PERCENT_MAX if written_percent is not None
                     else names.memory not in places)
        return 100 if exclusive else device.default_cores
    if cores > 100:
        adjusted.append(f"{places[names.cores]}: {cores} is above 100: read as 100 "
                        "(HAMi's scheduler clamps it)")
        return 100
    return cores


_TRUE = {"1", "t", "true"}
_FALSE = {"0", "f", "false"}


def parse_pod(manifest: PodManifest, defaults: Defaults) -> PodRequest:
    """Read a pod's GPU request and scheduling annotations.

    Raises ``PodRejected`` naming the annotation or resource that is malformed.
    """
    annotations: Mapping[str, str] = manifest.metadata.annotations or {}
    adjusted: list[str] = []
    containers = [
        _container_request(c, True, f"spec.initContainers[{i}]", defaults.device, adjusted)
        for i, c in enumerate(manifest.spec.init_containers or ())
    ] + [
        _container_request(c, False, f"spec.containers[{i}]", defaults.device, adjusted)
        for i, c in enumerate(manifest.spec.containers)
    ]

    if GPU_POLICY_ANNOTATION in annotations:
        parsed = parse_chain(annotations[GPU_POLICY_ANNOTATION], defaults.gpu_policy)
        chain, ignored = parsed.chain, parsed.ignored
    else:
        chain, ignored = defaults.gpu_policy, ()

    node_policy = defaults.node_policy
    if NODE_POLICY_ANNOTATION in annotations:
        node_policy = parse_node_policy(
            annotations[NODE_POLICY_ANNOTATION], NODE_POLICY_ANNOTATION
        )

    weights = Weights()
    if WEIGHTS_ANNOTATION in annotations:
        weights = parse_weights(annotations[WEIGHTS_ANNOTATION])

    choice = NVIDIA.pod_annotations
    numa_bind = False
    if choice.numa_bind in annotations:
        flag = annotations[choice.numa_bind].strip().lower()
        if flag not in _TRUE | _FALSE:
            raise PodRejected(
                f"{choice.numa_bind}: {annotations[choice.numa_bind]!r} "
                "is not true or false"
            )
        numa_bind = flag in _TRUE

    modes = None
    if choice.mode in annotations:
        modes = parse_pod_modes(annotations[choice.mode])

    use_uuids = comma_list(annotations.get(choice.use_uuid, ""))
    use_types = comma_list(annotations.get(choice.use_type, ""))
    return PodRequest(
        key=manifest.key,
        containers=tuple(containers),
        chain=chain,
        ignored_policies=ignored,
        node_policy=node_policy,
        weights=weights,
        use_uuids=frozenset(use_uuids) if use_uuids else None,
        nouse_uuids=frozenset(comma_list(annotations.get(choice.nouse_uuid, ""))),
        use_types=tuple(t.lower() for t in use_types) if use_types else None,
        nouse_types=tuple(
            t.lower() for t in comma_list(annotations.get(choice.nouse_type, ""))
        ),
        numa_bind=numa_bind,
        subject=QuotaSubject.of(manifest),
        modes=modes,
        adjusted=tuple(adjusted),
    )


def parse_pod_modes(text: str) -> frozenset[str]:
    """The card modes ``nvidia.com/vgpu-mode`` lets a pod use (``mig``, ``hami-core``,
    or both, comma-separated).

    HAMi tests whether the annotation's text contains a card's mode, so any text is
    taken there and a misspelt one matches no card (the pod waits, every card
    ``CardTypeMismatch``); here a value that names no mode HAMi knows is refused
    (``PodRejected``), naming it."""
    modes = [part.strip() for part in text.split(",")]
    if not text.strip() or any(mode not in POD_MODES for mode in modes):
        raise PodRejected(
            f"{NVIDIA.pod_annotations.mode}: {shown(text)} must name hami-core, mig or mps, "
            "comma-separated")
    return frozenset(modes)
