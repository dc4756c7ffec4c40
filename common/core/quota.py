"""ResourceQuota for GPU memory and cores: the one room of the decision core that knows
quotas. It reads them, keeps the book of what pods are charged under them, tells one
decision what its pod may still be charged, judges the cards against that, and words the
quota that refused a pod.

HAMi reads two keys of an ordinary ResourceQuota's ``spec.hard``:
``limits.nvidia.com/gpumem`` (MiB) and ``limits.nvidia.com/gpucores`` (percent of a card,
100 = one card). pyhami reads the same keys, with Kubernetes' semantics where HAMi's are
accidental: every quota of a namespace applies (the tightest one decides), and a quota's
``scopes`` and ``scopeSelector`` choose the pods it charges, as they do for Kubernetes'
own quota.

A pod is charged what its allocation puts on its cards (``Allocation.charge``): per card,
its init containers at their peak and its app containers summed, then summed over the
cards. ``QuotaBook`` keeps those charges for the pods that hold cards (bound or reserved)
and the quotas the cluster holds. A decision asks it once: ``QuotaBook.left`` is what its
pod may still be charged (``QuotaLeft``), which the card checks of ``common.core.placement``
consume as one limit (``QuotaLeft.card_fails``); when the quota refused cards,
``QuotaBook.card_refusal`` names the quota and its figures (``QuotaRefusal.text``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum

import msgspec
import numpy as np
import numpy.typing as npt

from common.core.deviceconfig import DeviceConfig
from common.core.errors import InvalidInput
from common.core.ledger import Allocation, Usage
from common.core.names import InvalidName, check_label, check_subdomain, shown
from common.core.pod import (
    DEFAULT_DEVICE,
    DEFAULT_NAMES,
    RESOURCE_CORES,
    RESOURCE_MEMORY,
    ContainerRequest,
    NamespacedObject,
    PodRequest,
    Quantity,
    QuotaSubject,
    whole_quantity,
)
from common.core.policy import PodRejected
from common.core.reasons import CardCheck
from common.core.vendors import ResourceNames

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
"""Per card of a snapshot (``common.core.fleet`` names the same types; it imports this
module, so they are named here again)."""

QUOTA_PREFIX = "limits."
"""HAMi reads only ``limits.<resource>`` keys of a quota's ``spec.hard``."""


def quota_keys(names: ResourceNames) -> tuple[str, str]:
    """The ``spec.hard`` keys of GPU memory and cores under the configured names
    (``limits.<resourceMemoryName>``, ``limits.<resourceCoreName>``)."""
    return QUOTA_PREFIX + names.memory, QUOTA_PREFIX + names.cores


MEMORY_KEY, CORES_KEY = quota_keys(DEFAULT_NAMES)
"""The keys under HAMi's default names."""

SCOPES_MAX = 16
"""Scopes and scope expressions a quota may name, together."""
SCOPE_VALUES_MAX = 64
"""Values one scope expression may list."""


class QuotaRejected(InvalidInput):
    """A ResourceQuota pyhami cannot apply; the message names the quota and the field."""


# The subset of a v1.ResourceQuota that pyhami reads; every other field is ignored.
class ScopedRequirement(msgspec.Struct, rename="camel"):
    scope_name: str = ""
    operator: str = ""
    values: list[str] | None = None


class ScopeSelector(msgspec.Struct, rename="camel"):
    match_expressions: list[ScopedRequirement] | None = None


class QuotaSpec(msgspec.Struct, rename="camel"):
    hard: dict[str, Quantity] | None = None
    scopes: list[str] | None = None
    scope_selector: ScopeSelector | None = None


class ResourceQuotaManifest(NamespacedObject):
    spec: QuotaSpec = msgspec.field(default_factory=QuotaSpec)


class Scope(Enum):
    """The quota scopes that select pods by what pyhami knows of them."""

    TERMINATING = "Terminating"
    NOT_TERMINATING = "NotTerminating"
    BEST_EFFORT = "BestEffort"
    NOT_BEST_EFFORT = "NotBestEffort"
    PRIORITY_CLASS = "PriorityClass"


_OPPOSED = ((Scope.TERMINATING, Scope.NOT_TERMINATING), (Scope.BEST_EFFORT, Scope.NOT_BEST_EFFORT))
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True, slots=True)
class ScopeRule:
    """One scope a pod must match for a quota to charge it (Kubernetes' rules)."""

    scope: Scope
    operator: str = "Exists"
    values: frozenset[str] = frozenset()

    def matches(self, pod: QuotaSubject) -> bool:
        scope = self.scope
        if scope is Scope.TERMINATING:
            return pod.terminating
        if scope is Scope.NOT_TERMINATING:
            return not pod.terminating
        if scope is Scope.BEST_EFFORT:
            return pod.best_effort
        if scope is Scope.NOT_BEST_EFFORT:
            return not pod.best_effort
        if self.operator == "Exists":
            return pod.priority_class != ""
        if self.operator == "In":
            return pod.priority_class in self.values
        if self.operator == "NotIn":
            return pod.priority_class not in self.values
        # DoesNotExist: Kubernetes matches a label selector against a set that always
        # holds the priorityClass key (empty when the pod has none): it never matches.
        return False


@dataclass(frozen=True, slots=True)
class Quota:
    """One ResourceQuota as pyhami applies it: its GPU limits and the pods it charges."""

    namespace: str
    name: str
    memory: int | None = None
    """``limits.nvidia.com/gpumem``, MiB; None when the quota does not set it."""
    cores: int | None = None
    """``limits.nvidia.com/gpucores``, percent of a card; None when not set."""
    rules: tuple[ScopeRule, ...] = ()
    memory_resource: str = RESOURCE_MEMORY
    """The configured memory resource's name, for reports and refusals."""
    cores_resource: str = RESOURCE_CORES
    """The configured cores resource's name, for reports and refusals."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def limits_gpu(self) -> bool:
        """Whether the quota sets a GPU limit at all (others are Kubernetes' own)."""
        return self.memory is not None or self.cores is not None

    def applies_to(self, pod: QuotaSubject) -> bool:
        return pod.namespace == self.namespace and all(r.matches(pod) for r in self.rules)


def _limit(hard: dict[str, Quantity], key: str, where: str) -> int | None:
    if key not in hard:
        return None
    try:
        return whole_quantity(hard[key], f"{where}: spec.hard[{key}]")
    except PodRejected as error:
        raise QuotaRejected(str(error)) from None


def _scope(name: str, where: str) -> Scope:
    try:
        return Scope(name)
    except ValueError:
        known = ", ".join(s.value for s in Scope)
        raise QuotaRejected(f"{where}: {shown(name)} is not a scope pyhami applies to GPU "
                            f"requests (one of {known})") from None


def _selector_rule(requirement: ScopedRequirement, where: str) -> ScopeRule:
    scope = _scope(requirement.scope_name, f"{where}.scopeName")
    operator = requirement.operator
    if operator not in _OPERATORS:
        raise QuotaRejected(f"{where}.operator: {shown(operator)} is not one of "
                            f"{', '.join(_OPERATORS)}")
    values = requirement.values or []
    if len(values) > SCOPE_VALUES_MAX:
        raise QuotaRejected(f"{where}.values: {len(values)} values (at most "
                            f"{SCOPE_VALUES_MAX})")
    if scope is not Scope.PRIORITY_CLASS:
        if operator != "Exists" or values:
            raise QuotaRejected(f"{where}: scope {scope.value} takes operator Exists and "
                                "no values")
    elif operator in ("In", "NotIn") and not values:
        raise QuotaRejected(f"{where}.values: operator {operator} needs at least one value")
    elif operator in ("Exists", "DoesNotExist") and values:
        raise QuotaRejected(f"{where}.values: operator {operator} takes no values")
    return ScopeRule(scope, operator, frozenset(values))


def parse_quota(manifest: ResourceQuotaManifest,
                device: DeviceConfig = DEFAULT_DEVICE) -> Quota:
    """The quota's GPU limits and scopes, under ``device``'s resource names; the memory
    limit is multiplied by ``memoryFactor``, as HAMi does, since requests are charged
    scaled. Raises ``QuotaRejected`` naming the quota and the field: a limit that is not
    a whole quantity from 0 to 2^53 (the bounds of a pod's requests), a scope pyhami does
    not know, a scope expression Kubernetes would refuse."""
    where = f"ResourceQuota {shown(manifest.key)}"
    try:
        check_subdomain(f"{where}: metadata.name", manifest.metadata.name)
        check_label(f"{where}: metadata.namespace", manifest.namespace)
    except InvalidName as error:
        raise QuotaRejected(str(error)) from None
    where = f"ResourceQuota {manifest.key}"
    spec = manifest.spec
    hard = spec.hard or {}
    expressions = (spec.scope_selector.match_expressions or []) if spec.scope_selector else []
    if len(spec.scopes or ()) + len(expressions) > SCOPES_MAX:
        raise QuotaRejected(f"{where}: more than {SCOPES_MAX} scopes and scope expressions")
    rules = [ScopeRule(_scope(name, f"{where}: spec.scopes[{i}]"))
             for i, name in enumerate(spec.scopes or ())]
    rules += [_selector_rule(e, f"{where}: spec.scopeSelector.matchExpressions[{i}]")
              for i, e in enumerate(expressions)]
    named = {rule.scope for rule in rules}
    for one, other in _OPPOSED:
        if one in named and other in named:
            raise QuotaRejected(f"{where}: scopes {one.value} and {other.value} exclude each "
                                "other")
    names = device.resources
    memory_key, cores_key = quota_keys(names)
    memory = _limit(hard, memory_key, where)
    return Quota(namespace=manifest.namespace, name=manifest.metadata.name,
                 memory=None if memory is None else memory * device.memory_factor,
                 cores=_limit(hard, cores_key, where), rules=tuple(rules),
                 memory_resource=names.memory, cores_resource=names.cores)


@dataclass(frozen=True, slots=True)
class QuotaLeft:
    """What a pod may still be charged under every quota that applies to it: the least
    room among them, per resource (negative when a quota is already exceeded).

    One decision asks the book for it once (``QuotaBook.left``); the card checks consume
    it as one limit: ``card_fails`` per card, ``refuses_every_card`` for the usual pod."""

    memory: int | None
    cores: int | None

    def card_fails(self, request: ContainerRequest, capacity: IntArray,
                   own: OwnCharge | None = None) -> BoolArray:
        """Per card (``capacity``: the cards' memory, MiB), whether giving ``request`` that
        card (and as many more as it asks for, each charged as much) takes the pod beyond
        this room; ``own``: what the pod's earlier containers are charged on the cards.

        Judged per card, as HAMi does: a multi-card container is charged for each card what
        this one would cost, so a set that passes never exceeds the quota."""
        if request.memory_mib is not None:
            memory = np.full(len(capacity), request.memory_mib, dtype=np.int64)
        else:
            memory = capacity * request.memory_percent // 100
        cores = np.full(len(capacity), request.cores, dtype=np.int64)
        spent_memory = spent_cores = 0
        if own is not None:
            spent_memory, spent_cores, memory, cores = own.increase(request, memory, cores)
        fails = np.zeros(len(capacity), dtype=np.bool_)
        # A resource the card would add nothing of is not checked, as Kubernetes checks
        # only what a pod asks for: an exceeded cores quota refuses no pod of 0 cores.
        if self.memory is not None:
            fails |= (memory > 0) & (spent_memory + request.cards * memory > self.memory)
        if self.cores is not None:
            fails |= (cores > 0) & (spent_cores + request.cards * cores > self.cores)
        return fails

    def refuses_every_card(self, request: ContainerRequest) -> bool:
        """Whether this room refuses every card to a pod's first container, of fixed MiB
        (each card is charged alike): ``card_fails`` for one card, on integers (a resource
        the container adds nothing of is not checked)."""
        assert request.memory_mib is not None
        memory, cores = request.memory_mib, request.cores
        return ((self.memory is not None and memory > 0
                 and request.cards * memory > self.memory)
                or (self.cores is not None and cores > 0
                    and request.cards * cores > self.cores))


@dataclass(frozen=True, slots=True)
class OwnCharge:
    """What the pod's earlier containers are charged on a node's cards under its quotas:
    per card, init containers at their peak and app containers summed."""

    init_memory: IntArray
    init_cores: IntArray
    app_memory: IntArray
    app_cores: IntArray

    @classmethod
    def none(cls, cards: int) -> OwnCharge:
        return cls(*(np.zeros(cards, dtype=np.int64) for _ in range(4)))

    def add(self, request: ContainerRequest, card: int, memory: int) -> None:
        if request.is_init:
            self.init_memory[card] = max(int(self.init_memory[card]), memory)
            self.init_cores[card] = max(int(self.init_cores[card]), request.cores)
        else:
            self.app_memory[card] += memory
            self.app_cores[card] += request.cores

    def increase(self, request: ContainerRequest, memory: IntArray,
                 cores: IntArray) -> tuple[int, int, IntArray, IntArray]:
        """The charge so far (memory, cores) and, per card, what giving it to ``request``
        adds to it."""
        base_memory = np.maximum(self.init_memory, self.app_memory)
        base_cores = np.maximum(self.init_cores, self.app_cores)
        if request.is_init:
            memory = np.maximum(np.maximum(self.init_memory, memory), self.app_memory)
            cores = np.maximum(np.maximum(self.init_cores, cores), self.app_cores)
        else:
            memory = np.maximum(self.init_memory, self.app_memory + memory)
            cores = np.maximum(self.init_cores, self.app_cores + cores)
        return (int(base_memory.sum()), int(base_cores.sum()),
                memory - base_memory, cores - base_cores)


@dataclass(frozen=True, slots=True)
class QuotaRefusal:
    """The quota a pod's charge would exceed, with the figures of the sentence."""

    namespace: str
    quota: str
    resource: str
    used: int
    asked: int
    limit: int
    unit: str = ""
    """`` MiB`` for memory; empty for cores."""

    def text(self) -> str:
        """``team-a would use 18000 of 16384 MiB nvidia.com/gpumem under ResourceQuota
        gpu-quota (asked 4000)``."""
        unit = self.unit
        return (f"{self.namespace} would use {self.used + self.asked} of {self.limit}{unit} "
                f"{self.resource} under ResourceQuota {self.quota} (asked {self.asked})")


@dataclass(frozen=True, slots=True)
class QuotaStanding:
    """One quota's limit and what the pods it charges use, per resource it limits."""

    namespace: str
    quota: str
    resource: str
    used: int
    limit: int


class QuotaBook:
    """The quotas of every namespace and the charges of the pods holding cards.

    Each quota's use is kept up to date as pods are charged and refunded, so checking a
    pod costs a look at its namespace's quotas, whatever the number of pods.
    """

    def __init__(self) -> None:
        self._quotas: dict[str, dict[str, Quota]] = {}
        self._pods: dict[str, tuple[QuotaSubject, Usage]] = {}
        self._used: dict[tuple[str, str], Usage] = {}
        self._namespace_used: dict[str, Usage] = {}

    def copy(self) -> QuotaBook:
        other = QuotaBook()
        other._quotas = {namespace: dict(quotas) for namespace, quotas in self._quotas.items()}
        other._pods = dict(self._pods)
        other._used = dict(self._used)
        other._namespace_used = dict(self._namespace_used)
        return other

    def of_namespace(self, namespace: str) -> QuotaBook:
        """A copy holding one namespace's quotas and the charges of its pods alone: what a
        decision for a pod of that namespace reads, at the cost of its pods, not the
        cluster's."""
        other = QuotaBook()
        if namespace in self._quotas:
            other._quotas = {namespace: dict(self._quotas[namespace])}
        other._pods = {key: held for key, held in self._pods.items()
                       if held[0].namespace == namespace}
        other._used = {where: used for where, used in self._used.items()
                       if where[0] == namespace}
        if namespace in self._namespace_used:
            other._namespace_used = {namespace: self._namespace_used[namespace]}
        return other

    # Quotas --------------------------------------------------------------------------

    def quotas(self) -> Iterator[Quota]:
        for quotas in self._quotas.values():
            yield from quotas.values()

    def quota(self, namespace: str, name: str) -> Quota | None:
        return self._quotas.get(namespace, {}).get(name)

    def set_quota(self, quota: Quota) -> None:
        """Add or replace a quota; its use is counted afresh from the pods it charges."""
        self.remove_quota(quota.namespace, quota.name)
        if not quota.limits_gpu:
            return  # a quota of Kubernetes' own resources only: nothing to apply
        self._quotas.setdefault(quota.namespace, {})[quota.name] = quota
        used = Usage()
        for subject, charge in self._pods.values():
            if quota.applies_to(subject):
                used += charge
        self._used[(quota.namespace, quota.name)] = used

    def remove_quota(self, namespace: str, name: str) -> Quota | None:
        quotas = self._quotas.get(namespace)
        if quotas is None or name not in quotas:
            return None
        removed = quotas.pop(name)
        if not quotas:
            del self._quotas[namespace]
        del self._used[(namespace, name)]
        return removed

    def replace_quotas(self, quotas: Iterable[Quota]) -> None:
        """Forget every quota, then set these (the quotas listed afresh)."""
        for quota in list(self.quotas()):
            self.remove_quota(quota.namespace, quota.name)
        for quota in quotas:
            self.set_quota(quota)

    # Charges -------------------------------------------------------------------------

    def charge(self, key: str, allocation: Allocation,
               footprint: Mapping[str, Usage] | None = None) -> None:
        """Charge a pod what ``allocation`` puts on its cards (replacing an older charge);
        ``footprint``: the allocation's, when the caller has it already."""
        self.refund(key)
        subject = allocation.subject or QuotaSubject(key.partition("/")[0])
        charge = allocation.charge(footprint)
        self._pods[key] = (subject, charge)
        self._add(subject, charge)

    def refund(self, key: str) -> None:
        held = self._pods.pop(key, None)
        if held is not None:
            subject, charge = held
            self._add(subject, Usage() - charge)

    def _add(self, subject: QuotaSubject, delta: Usage) -> None:
        namespace = subject.namespace
        total = self._namespace_used.get(namespace, Usage()) + delta
        if total == Usage():
            self._namespace_used.pop(namespace, None)
        else:
            self._namespace_used[namespace] = total
        for quota in self._quotas.get(namespace, {}).values():
            if quota.applies_to(subject):
                where = (namespace, quota.name)
                self._used[where] = self._used[where] + delta

    # Checks ----------------------------------------------------------------------------

    def left(self, pod: QuotaSubject) -> QuotaLeft | None:
        """The least room under the quotas that apply to the pod; None when none does."""
        quotas = self._quotas.get(pod.namespace)
        if not quotas:
            return None
        memory: int | None = None
        cores: int | None = None
        for quota in quotas.values():
            if not quota.applies_to(pod):
                continue
            used = self._used[(quota.namespace, quota.name)]
            if quota.memory is not None:
                room = quota.memory - used.memory
                memory = room if memory is None else min(memory, room)
            if quota.cores is not None:
                room = quota.cores - used.cores
                cores = room if cores is None else min(cores, room)
        if memory is None and cores is None:
            return None
        return QuotaLeft(memory, cores)

    def refusal(self, pod: QuotaSubject, asked: Usage) -> QuotaRefusal | None:
        """The quota ``asked`` would exceed the most (by name on a tie), or None."""
        found: list[tuple[int, str, QuotaRefusal]] = []
        for quota in self._quotas.get(pod.namespace, {}).values():
            if not quota.applies_to(pod):
                continue
            used = self._used[(quota.namespace, quota.name)]
            for resource, limit, spent, wanted, unit in (
                    (quota.memory_resource, quota.memory, used.memory, asked.memory, " MiB"),
                    (quota.cores_resource, quota.cores, used.cores, asked.cores, "")):
                if limit is not None and wanted > 0 and spent + wanted > limit:
                    refusal = QuotaRefusal(pod.namespace, quota.name, resource, spent, wanted,
                                           limit, unit)
                    found.append((limit - spent - wanted, quota.name, refusal))
        return min(found, key=lambda item: item[:2])[2] if found else None

    def card_refusal(self, pod: PodRequest, card_memory: IntArray,
                     codes: npt.NDArray[np.int8]) -> QuotaRefusal | None:
        """The quota that refused the pod cards (``card_memory``: every card's memory, MiB;
        ``codes``: its first GPU container's checks of them), with what the pod asked: a
        percentage of memory counted on the smallest card the quota refused (or the largest
        card, when the charge fits on that one)."""
        refused = card_memory[codes == CardCheck.QUOTA_NOT_FIT]
        candidates: list[int | None] = [int(refused.min())] if len(refused) else []
        if len(card_memory):
            candidates.append(int(card_memory.max()))
        for memory in candidates or [None]:
            refusal = self.refusal(pod.subject, requested_charge(pod, memory))
            if refusal is not None:
                return refusal
        return None

    # Reports ---------------------------------------------------------------------------

    def standings(self) -> list[QuotaStanding]:
        """Each quota's use against its limit, per resource it limits, sorted."""
        rows = []
        for quota in self.quotas():
            used = self._used[(quota.namespace, quota.name)]
            if quota.memory is not None:
                rows.append(QuotaStanding(quota.namespace, quota.name, quota.memory_resource,
                                          used.memory, quota.memory))
            if quota.cores is not None:
                rows.append(QuotaStanding(quota.namespace, quota.name, quota.cores_resource,
                                          used.cores, quota.cores))
        return sorted(rows, key=lambda r: (r.namespace, r.quota, r.resource))

    def namespace_used(self) -> dict[str, Usage]:
        """Per namespace, what its pods holding cards are charged, under a quota or not."""
        return dict(self._namespace_used)


def requested_charge(pod: PodRequest, card_memory: int | None) -> Usage:
    """What the pod asks to be charged, its containers on cards of their own: app
    containers summed, init containers at their largest (they run before them). A
    percentage of memory counts on a card of ``card_memory`` MiB, or 0 when None (at
    admission, where no card is chosen yet: HAMi's rule)."""
    app_memory = app_cores = init_memory = init_cores = 0
    for container in pod.gpu_containers:
        if container.memory_mib is not None:
            memory = container.memory_mib
        elif card_memory is None:
            memory = 0
        else:
            memory = container.memory_slice(card_memory)
        memory *= container.cards
        cores = container.cores * container.cards
        if container.is_init:
            init_memory, init_cores = max(init_memory, memory), max(init_cores, cores)
        else:
            app_memory, app_cores = app_memory + memory, app_cores + cores
    return Usage(0, max(app_memory, init_memory), max(app_cores, init_cores))


def admission_denial(book: QuotaBook, pod: PodRequest) -> QuotaRefusal | None:
    """The quota a new pod's fixed requests alone would exceed (the webhook's check).

    A percentage of memory counts 0 here, as in HAMi's webhook: no card is chosen yet, so
    it is judged when the pod is filtered."""
    charge = requested_charge(pod, None)
    if charge.memory == 0 and charge.cores == 0:
        return None
    return book.refusal(pod.subject, charge)
