"""Pod groups in the decision core: reading a pod's declaration, and placing a group's
members all or nothing on a copy of the fleet."""

from __future__ import annotations

from typing import Any

import pytest

from common.core import Fleet, PodRejected, parse_pod
from common.core.groups import (
    COSCHEDULING_GROUP_LABEL,
    GROUP_MAX,
    KUEUE_COUNT_ANNOTATION,
    KUEUE_GROUP_LABEL,
    GroupRef,
    GroupSource,
    group_of,
    idle_placement_steps,
    member_order,
    place_group,
    placement_steps,
    run_to_end,
)
from common.core.pod import ObjectMeta, PodManifest, PodRequest, PodSpec, SchedulingGroup
from common.core.quota import Quota
from pyhami.sandbox import DEFAULTS
from tests.builders import fleet_of, gpu_limits, hold, manifest, node


def declared(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
             pod_group: str | None = None) -> PodManifest:
    return PodManifest(
        metadata=ObjectMeta(name="worker-0", namespace="lab", labels=labels,
                            annotations=annotations),
        spec=PodSpec(scheduling_group=None if pod_group is None
                     else SchedulingGroup(pod_group_name=pod_group)))


@pytest.mark.parametrize(("pod", "expected"), [
    pytest.param(declared(), None, id="none"),
    pytest.param(declared({KUEUE_GROUP_LABEL: "train-a"}, {KUEUE_COUNT_ANNOTATION: "4"}),
                 GroupRef("lab", "train-a", GroupSource.KUEUE, 4), id="kueue"),
    pytest.param(declared({COSCHEDULING_GROUP_LABEL: "Train_A.1"}),
                 GroupRef("lab", "Train_A.1", GroupSource.COSCHEDULING, None),
                 id="coscheduling"),
    pytest.param(declared(pod_group="train-a"),
                 GroupRef("lab", "train-a", GroupSource.WORKLOAD, None), id="workload-api"),
    pytest.param(declared({KUEUE_GROUP_LABEL: "g"}, {KUEUE_COUNT_ANNOTATION: str(GROUP_MAX)}),
                 GroupRef("lab", "g", GroupSource.KUEUE, GROUP_MAX), id="kueue-at-the-bound"),
])
def test_a_pods_group_is_read_from_where_its_users_declare_it(
        pod: PodManifest, expected: GroupRef | None) -> None:
    assert group_of(pod) == expected


@pytest.mark.parametrize(("pod", "message"), [
    pytest.param(declared({KUEUE_GROUP_LABEL: "g"}, {KUEUE_COUNT_ANNOTATION: "0"}),
                 f"metadata.annotations[{KUEUE_COUNT_ANNOTATION}]: '0' is not a member count: "
                 f"a whole number from 1 to {GROUP_MAX}", id="count-0"),
    pytest.param(declared({KUEUE_GROUP_LABEL: "g"}, {KUEUE_COUNT_ANNOTATION: "-4"}),
                 f"metadata.annotations[{KUEUE_COUNT_ANNOTATION}]: '-4' is not a member "
                 f"count: a whole number from 1 to {GROUP_MAX}", id="count-negative"),
    pytest.param(declared({KUEUE_GROUP_LABEL: "g"}, {KUEUE_COUNT_ANNOTATION: "1025"}),
                 f"metadata.annotations[{KUEUE_COUNT_ANNOTATION}]: '1025' is not a member "
                 f"count: a whole number from 1 to {GROUP_MAX}", id="count-above-the-bound"),
    pytest.param(declared({KUEUE_GROUP_LABEL: "g"}, {KUEUE_COUNT_ANNOTATION: "4.0"}),
                 f"metadata.annotations[{KUEUE_COUNT_ANNOTATION}]: '4.0' is not a member "
                 f"count: a whole number from 1 to {GROUP_MAX}", id="count-not-whole"),
    pytest.param(declared({KUEUE_GROUP_LABEL: "g"}),
                 f"metadata.annotations[{KUEUE_COUNT_ANNOTATION}] is missing: Kueue's group "
                 "'g' needs its member count on every member", id="kueue-without-count"),
    pytest.param(declared(annotations={KUEUE_COUNT_ANNOTATION: "4"}),
                 f"metadata.annotations[{KUEUE_COUNT_ANNOTATION}] is set but "
                 f"metadata.labels[{KUEUE_GROUP_LABEL}] names no group", id="count-without-group"),
    pytest.param(declared({KUEUE_GROUP_LABEL: "train a"}, {KUEUE_COUNT_ANNOTATION: "4"}),
                 f"metadata.labels[{KUEUE_GROUP_LABEL}]: 'train a' is not a valid label value: "
                 "letters, digits, '-', '_' and '.', starting and ending with a letter or digit",
                 id="name-not-a-label-value"),
    pytest.param(declared({COSCHEDULING_GROUP_LABEL: ""}),
                 f"metadata.labels[{COSCHEDULING_GROUP_LABEL}]: must not be empty",
                 id="name-empty"),
    pytest.param(declared({COSCHEDULING_GROUP_LABEL: "g" * 64}),
                 f"metadata.labels[{COSCHEDULING_GROUP_LABEL}]: {'g' * 40!r}... (64 characters) "
                 "is longer than 63 characters (a label value)", id="name-too-long"),
    pytest.param(declared({KUEUE_GROUP_LABEL: "a", COSCHEDULING_GROUP_LABEL: "a"},
                          {KUEUE_COUNT_ANNOTATION: "4"}),
                 f"the pod declares two groups, 'a' in metadata.labels[{KUEUE_GROUP_LABEL}] and "
                 f"'a' in metadata.labels[{COSCHEDULING_GROUP_LABEL}]: a pod belongs to one "
                 "group, declared one way", id="two-declarations"),
    pytest.param(declared({COSCHEDULING_GROUP_LABEL: "a"}, pod_group="b"),
                 f"the pod declares two groups, 'a' in metadata.labels[{COSCHEDULING_GROUP_LABEL}]"
                 " and 'b' in spec.schedulingGroup.podGroupName: a pod belongs to one group, "
                 "declared one way", id="label-and-workload-api"),
    pytest.param(declared({KUEUE_GROUP_LABEL: "a", COSCHEDULING_GROUP_LABEL: "b"},
                          {KUEUE_COUNT_ANNOTATION: "4"}, pod_group="c"),
                 f"the pod declares two groups, 'a' in metadata.labels[{KUEUE_GROUP_LABEL}] and "
                 f"'b' in metadata.labels[{COSCHEDULING_GROUP_LABEL}]: a pod belongs to one "
                 "group, declared one way", id="three-declarations-found-by-the-fuzzer"),
])
def test_a_bad_declaration_is_refused_naming_the_field(pod: PodManifest, message: str) -> None:
    with pytest.raises(PodRejected) as refused:
        group_of(pod)
    assert str(refused.value) == message


def member(name: str, mib: int = 14000, cards: int = 2, **extra: Any) -> PodRequest:
    return parse_pod(manifest(name, containers=[gpu_limits(mib, cards=cards, **extra)]),
                     DEFAULTS)


def two_t4_nodes() -> Fleet:
    return fleet_of(node("a", 4), node("b", 4))


def test_a_group_that_fits_is_placed_whole_on_a_copy_of_the_fleet() -> None:
    fleet = two_t4_nodes()
    placement = place_group(fleet, "train-a", [member(f"w{i}") for i in range(4)])
    assert placement.placed and placement.fitting == 4
    assert [d.node for d in placement.decisions] == ["a", "a", "b", "b"]
    used = {uuid for d in placement.decisions if d.allocation is not None
            for grants in d.allocation.containers for uuid in (g.uuid for g in grants)}
    assert len(used) == 8  # each member its own two cards: none given twice
    assert fleet.allocations() == {}  # the fleet itself books nothing


def test_a_group_that_does_not_fit_places_none_and_says_how_many_would() -> None:
    placement = place_group(two_t4_nodes(), "train-a", [member(f"w{i}") for i in range(5)])
    assert not placement.placed
    assert placement.decisions == ()
    assert placement.fitting == 4
    assert placement.message == (
        "group train-a: 4 of 5 members fit; w4: asked for 2 cards with 14000 MiB each; a and "
        "b: 4/4 CardInsufficientMemory (largest free 1360 MiB)")


def test_members_held_elsewhere_count_against_the_group() -> None:
    fleet = two_t4_nodes()
    hold(fleet, "default/other", "b", "GPU-b-0", memory=10000)
    placement = place_group(fleet, "train-a", [member(f"w{i}") for i in range(4)])
    assert not placement.placed
    assert placement.fitting == 3


def test_the_largest_members_are_placed_first_then_by_name() -> None:
    members = [member("small", 1000, 1), member("big-b", 14000, 2), member("big-a", 14000, 2),
               member("mid", 8000, 2)]
    assert [m.key for m in member_order(members)] == [
        "default/big-a", "default/big-b", "default/mid", "default/small"]


def test_the_largest_first_fits_a_group_smallest_first_would_not() -> None:
    # One node of two cards: a 2-card member fits only if placed before two 1-card ones
    # take a card each... both orders fit here; with binpack the small ones share a card.
    fleet = fleet_of(node("a", 2))
    members = [member("one-a", 7000, 1), member("one-b", 7000, 1), member("two", 7000, 2)]
    placement = place_group(fleet, "g", members)
    assert placement.placed
    assert [d.pod for d in placement.decisions] == ["default/two", "default/one-a",
                                                    "default/one-b"]


def test_a_namespace_quota_is_charged_the_groups_sum() -> None:
    """Each member alone is within the quota; the four together are not: none is placed."""
    fleet = two_t4_nodes()
    fleet.quotas.set_quota(Quota("default", "gpu-quota", memory=3 * 2 * 14000))
    four = [member(f"w{i}") for i in range(4)]
    placement = place_group(fleet, "train-a", four)
    assert not placement.placed
    assert placement.fitting == 3
    assert placement.message is not None and "quota" in placement.message.lower()
    assert place_group(fleet, "train-a", four[:3]).placed


def test_a_placement_in_steps_is_the_placement_at_once_whatever_the_fleet_does_between() -> None:
    """The daemon runs a group's placement a member a step, its loop serving others in
    between: the outcome is fixed by the copy taken before the first step."""
    fleet = two_t4_nodes()
    members = [member(f"w{i}") for i in range(4)]
    steps = placement_steps(fleet, "train-a", members)
    next(steps)
    hold(fleet, "default/late", "a", "GPU-a-0", "GPU-a-1", memory=10000)  # booked meanwhile
    stepwise = run_to_end(steps)
    assert stepwise == place_group(two_t4_nodes(), "train-a", members)
    assert stepwise.placed and stepwise.nodes == frozenset({"a", "b"})


@pytest.mark.parametrize(("held", "quota_cards", "placed", "fitting"), [
    pytest.param(["a", "b"], None, True, 4, id="busy-now-fits-idle"),
    pytest.param([], None, False, 4, id="larger-than-the-fleet"),
    pytest.param(["a"], 3 * 2, False, 3, id="over-its-namespace-quota-even-alone"),
    pytest.param(["a"], 4 * 2, True, 4, id="within-its-quota-alone"),
])
def test_an_idle_placement_says_whether_a_group_could_ever_start(
        held: list[str], quota_cards: int | None, placed: bool, fitting: int) -> None:
    """Every card freed (the namespace's other pods' quota charges too): a group that does
    not fit then never will on these nodes, and never goes ahead of other pods."""
    fleet = two_t4_nodes()
    for name in held:
        hold(fleet, f"default/tenant-{name}", name, f"GPU-{name}-0", f"GPU-{name}-1",
             memory=10000)
    if quota_cards is not None:
        fleet.quotas.set_quota(Quota("default", "gpu-quota", memory=quota_cards * 14000))
    count = 4 if held or quota_cards else 5
    members = [member(f"w{i}") for i in range(count)]
    before = fleet.allocations()
    idle = run_to_end(idle_placement_steps(fleet, "train-a", members))
    assert (idle.placed, idle.fitting) == (placed, fitting)
    assert fleet.allocations() == before  # the fleet itself keeps its pods


def test_the_fleet_counts_the_changes_a_trial_placement_must_not_miss() -> None:
    """``generation`` moves with what could make a trial over-commit (a booking, a node's
    cards changed or gone), ``changes`` with anything; a release frees cards only."""
    fleet = two_t4_nodes()
    generation, changes = fleet.generation, fleet.changes
    hold(fleet, "default/p", "a", "GPU-a-0")
    assert (fleet.generation, fleet.changes) == (generation + 1, changes + 1)
    fleet.release("default/p")
    assert (fleet.generation, fleet.changes) == (generation + 1, changes + 2)
    fleet.upsert_node(node("a", 4))  # the same cards reported again
    assert (fleet.generation, fleet.changes) == (generation + 1, changes + 3)
    fleet.upsert_node(node("a", 3))
    assert fleet.generation == generation + 2
    fleet.remove_node("b")
    assert fleet.generation == generation + 3
