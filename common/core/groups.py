"""Pod groups: a job's pods that get their cards together, or none of them does.

A pod declares its group the way its users already do; pyhami reads three ways:

- **Kueue's plain-pod groups**: the label ``kueue.x-k8s.io/pod-group-name`` names the group
  and the annotation ``kueue.x-k8s.io/pod-group-total-count`` on each member gives how
  many pods it has. The count is the pod's own.
- **The coscheduling plugin of scheduler-plugins**: the label
  ``scheduling.x-k8s.io/pod-group`` names a ``PodGroup`` (``scheduling.x-k8s.io/v1alpha1``)
  of the pod's namespace, whose ``spec.minMember`` is the count.
- **Kubernetes' own** (v1.36, feature gate ``GenericWorkload``): the pod's
  ``spec.schedulingGroup.podGroupName`` names a ``PodGroup`` (``scheduling.k8s.io/v1alpha2``)
  whose ``spec.schedulingPolicy.gang.minCount`` is the count.

The last two counts live in another object, which the daemon reads (``GroupRef.count`` is
None for them). A pod that declares its group in two ways is refused, whatever the names:
two sources can disagree on the count, and pyhami will not choose between them.

``place_group`` finds cards for every member at once, on a copy of the fleet: all placed,
or none, with one sentence saying which member does not fit and why.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Generator, Sequence
from dataclasses import dataclass

from common.core.decide import Decision, decide
from common.core.fleet import Fleet
from common.core.names import InvalidName, check_label_value, shown
from common.core.pod import PodManifest, PodRequest
from common.core.policy import PodRejected

KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
GROUP_MAX = 1024
"""The most members a group may count: its placement is one decision per member, made at
once (a thousand decisions at 5,000 nodes take about a third of a second)."""


class GroupSource(enum.Enum):
    """Where a pod declared its group."""

    KUEUE = "kueue"
    COSCHEDULING = "coscheduling"
    WORKLOAD = "workload"

    @property
    def field(self) -> str:
        """Where the declaration is, as a message names it."""
        return _FIELDS[self]


_FIELDS = {
    GroupSource.KUEUE: f"metadata.labels[{KUEUE_GROUP_LABEL}]",
    GroupSource.COSCHEDULING: f"metadata.labels[{COSCHEDULING_GROUP_LABEL}]",
    GroupSource.WORKLOAD: "spec.schedulingGroup.podGroupName",
}


@dataclass(frozen=True, slots=True)
class GroupRef:
    """The group a pod declares it belongs to."""

    namespace: str
    name: str
    source: GroupSource
    count: int | None
    """How many members the group has, as the pod itself says (Kueue); None where the
    count is in the PodGroup object the declaration names."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def check_count(field: str, value: object) -> int:
    """A group's member count, from 1 to ``GROUP_MAX``; raises ``PodRejected`` naming
    ``field`` otherwise. Text must be plain decimal digits (as Kueue writes the count)."""
    count = value
    if isinstance(value, str):
        digits = value.isascii() and value.isdigit() and len(value) <= len(str(GROUP_MAX))
        count = int(value) if digits else None
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= GROUP_MAX:
        shown_value = shown(value) if isinstance(value, str) else repr(value)
        raise PodRejected(f"{field}: {shown_value} is not a member count: a whole number "
                          f"from 1 to {GROUP_MAX}")
    return count


def group_of(manifest: PodManifest) -> GroupRef | None:
    """The group ``manifest`` declares, None when it declares none; raises ``PodRejected``
    naming the field for a name that is not a label value (or, for Kubernetes' own, not a
    name), a count out of bounds, or two declarations."""
    labels = manifest.metadata.labels or {}
    annotations = manifest.metadata.annotations or {}
    scheduling_group = manifest.spec.scheduling_group
    declared: dict[GroupSource, str] = {}
    if KUEUE_GROUP_LABEL in labels:
        declared[GroupSource.KUEUE] = labels[KUEUE_GROUP_LABEL]
    if COSCHEDULING_GROUP_LABEL in labels:
        declared[GroupSource.COSCHEDULING] = labels[COSCHEDULING_GROUP_LABEL]
    if scheduling_group is not None and scheduling_group.pod_group_name is not None:
        declared[GroupSource.WORKLOAD] = scheduling_group.pod_group_name
    if not declared:
        if KUEUE_COUNT_ANNOTATION in annotations:
            raise PodRejected(f"metadata.annotations[{KUEUE_COUNT_ANNOTATION}] is set but "
                              f"metadata.labels[{KUEUE_GROUP_LABEL}] names no group")
        return None
    if len(declared) > 1:
        first, second = list(declared)[:2]
        raise PodRejected(
            f"the pod declares two groups, {shown(declared[first])} in {first.field} and "
            f"{shown(declared[second])} in {second.field}: a pod belongs to one group, "
            "declared one way")
    ((source, name),) = declared.items()
    try:
        check_label_value(source.field, name)
    except InvalidName as error:
        raise PodRejected(str(error)) from None
    count = None
    if source is GroupSource.KUEUE:
        field = f"metadata.annotations[{KUEUE_COUNT_ANNOTATION}]"
        if KUEUE_COUNT_ANNOTATION not in annotations:
            raise PodRejected(f"{field} is missing: Kueue's group {shown(name)} needs its "
                              "member count on every member")
        count = check_count(field, annotations[KUEUE_COUNT_ANNOTATION])
    return GroupRef(manifest.namespace, name, source, count)


def member_order(members: Sequence[PodRequest]) -> list[PodRequest]:
    """The order a group's members are placed in: the largest first (most cards, then most
    memory asked in MiB, then as a share of a card), then by key. Placing the largest first
    leaves the small ones the gaps, as first-fit decreasing packs bins, and fixes one order
    for every try."""
    def size(member: PodRequest) -> tuple[int, int, int, str]:
        containers = member.gpu_containers
        return (-sum(c.cards for c in containers),
                -sum(c.cards * (c.memory_mib or 0) for c in containers),
                -sum(c.cards * c.memory_percent for c in containers if c.memory_mib is None),
                member.key)

    return sorted(members, key=size)


@dataclass(frozen=True, slots=True)
class GroupPlacement:
    """All the members placed, or none."""

    group: str
    placed: bool
    decisions: tuple[Decision, ...]
    """With ``placed``: each member's decision, in ``member_order``, booked one after the
    other on a copy of the fleet; without: empty."""
    fitting: int
    """How many members found cards (all of them when ``placed``)."""
    message: str | None = None
    """Without ``placed``: the sentence for every member's Event."""
    nodes: frozenset[str] = frozenset()
    """The nodes the members that found cards were placed on (placed or not): where the
    group would start first, the nodes a group going ahead keeps for itself."""
    refused: str | None = None
    """Without ``placed``: the first member that does not fit and why (the end of
    ``message``)."""


PlacementSteps = Generator[None, None, GroupPlacement]
"""A group's placement one member at a time: each ``next`` decides one member (or frees
one pod's cards, for ``idle_placement``); the generator's return value is the placement.
The daemon runs it in slices between which its loop answers other requests."""


def place_group(fleet: Fleet, group: str, members: Sequence[PodRequest], *,
                nodes: Collection[str] | None = None) -> GroupPlacement:
    """Cards for every member of ``group`` among ``nodes`` (default: every node), each
    member decided with its own policy chain on a copy of ``fleet`` that holds the members
    placed before it (and their quota charges: the group's sum counts). ``fleet`` itself
    is left as it is. When a member does not fit, the rest are still tried, to say how
    many would."""
    return run_to_end(placement_steps(fleet, group, members, nodes=nodes))


def run_to_end(steps: PlacementSteps) -> GroupPlacement:
    """The placement ``steps`` returns, every step taken at once."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            placement: GroupPlacement = done.value
            return placement


def placement_steps(fleet: Fleet, group: str, members: Sequence[PodRequest], *,
                    nodes: Collection[str] | None = None) -> PlacementSteps:
    """``place_group`` a member a step. The copy of ``fleet`` is made before the first
    step, so ``fleet`` may change between steps without changing the outcome."""
    return _placement_steps(fleet.copy(), group, members, nodes)


def idle_placement_steps(fleet: Fleet, group: str, members: Sequence[PodRequest], *,
                         nodes: Collection[str] | None = None) -> PlacementSteps:
    """The group placed on ``fleet`` as if no pod held any card (the nodes and cards as
    they are, cordons and health included; no namespace charged under its quota but for
    the group's own members): whether it could ever start on what exists. A step frees
    one pod's cards, or decides one member."""
    idle = fleet.copy()
    return _idle_steps(idle, list(idle.allocations()), group, members, nodes)


def _idle_steps(idle: Fleet, held: list[str], group: str, members: Sequence[PodRequest],
                nodes: Collection[str] | None) -> PlacementSteps:
    for key in held:
        idle.release(key)
        yield
    return (yield from _placement_steps(idle, group, members, nodes))


def _placement_steps(trial: Fleet, group: str, members: Sequence[PodRequest],
                     nodes: Collection[str] | None) -> PlacementSteps:
    decisions: list[Decision] = []
    first_refused: tuple[PodRequest, Decision] | None = None
    for member in member_order(members):
        decision = decide(trial, member, nodes=nodes, describe=True)
        yield
        if not decision.scheduled:
            if first_refused is None:
                first_refused = (member, decision)
            continue
        if decision.allocation is not None:
            trial.allocate(member.key, decision.allocation)
        decisions.append(decision)
    used = frozenset(d.node for d in decisions if d.node is not None)
    if first_refused is None:
        return GroupPlacement(group, True, tuple(decisions), len(decisions), nodes=used)
    member, decision = first_refused
    name = member.key.partition("/")[2]
    why = decision.message or decision.reason or "it fits no node"
    refused = f"{name}: {why}"
    message = f"group {group}: {len(decisions)} of {len(members)} members fit; {refused}"
    return GroupPlacement(group, False, (), len(decisions), message, used, refused)
