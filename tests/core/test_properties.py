"""Properties of the decision that must hold for any cluster and any pod (hypothesis)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.core import (
    Allocation,
    Card,
    CardGrant,
    Decision,
    Fleet,
    Node,
    PodManifest,
    decide,
    parse_pod,
)
from common.core.pod import Container, ResourceRequirements
from common.core.quota import Quota, Scope, ScopeRule
from pyhami.sandbox import DEFAULTS
from tests.builders import manifest, run

pytestmark = pytest.mark.slow  # hypothesis properties over whole fleets

POLICIES = ["binpack", "spread", "numa", "mutex", "topology-aware"]
MEMORY = [1000, 4000, 15360]


@st.composite
def nodes(draw: st.DrawFn) -> list[Node]:
    result = []
    for n in range(draw(st.integers(1, 4))):
        name = f"node-{n}"
        size = draw(st.integers(1, 6))
        uuids = [f"GPU-{name}-{i}" for i in range(size)]
        links_known = draw(st.booleans())
        devices = []
        for i in range(size):
            links = None
            if links_known:
                links = {u: draw(st.integers(0, 4)) for u in uuids
                         if u != uuids[i] and draw(st.booleans())}
            devices.append(Card(
                uuid=uuids[i], index=i,
                type=draw(st.sampled_from(["NVIDIA-Tesla T4", "NVIDIA-A100"])),
                memory=draw(st.sampled_from(MEMORY)), cores=100,
                count=draw(st.integers(1, 4)), numa=draw(st.integers(-1, 1)),
                health=draw(st.booleans()) or draw(st.booleans()),
                links=links, processes=draw(st.integers(0, 1))))
        cordon = [u for u in uuids if draw(st.integers(0, 9)) == 0]
        result.append(Node(name=name, cards=devices,
                           annotations={"hami.io/device-cordon": ",".join(cordon)}))
    return result


@st.composite
def allocations(draw: st.DrawFn, cluster: list[Node]) -> dict[str, Allocation]:
    booked: dict[str, Allocation] = {}
    for number in range(draw(st.integers(0, 8))):
        node = draw(st.sampled_from(cluster))
        device = draw(st.sampled_from(node.cards))
        grant = CardGrant(device.uuid, draw(st.sampled_from([0, 500, 3000])),
                          draw(st.sampled_from([0, 30, 100])))
        booked[f"default/held-{number}"] = Allocation(node.name, ((grant,),))
    return booked


@st.composite
def pods(draw: st.DrawFn) -> PodManifest:
    chain = ",".join(draw(st.lists(st.sampled_from(POLICIES), max_size=4)))
    annotations = {"hami.io/gpu-scheduler-policy": chain} if chain else {}
    if draw(st.booleans()):
        annotations["nvidia.com/numa-bind"] = "true"
    if draw(st.integers(0, 3)) == 0:
        annotations["hami.io/node-scheduler-policy"] = draw(st.sampled_from(["binpack",
                                                                             "spread"]))
    if draw(st.integers(0, 3)) == 0:
        annotations["nvidia.com/use-gputype"] = "t4"
    containers: list[dict[str, int | str]] = [
        {"nvidia.com/gpu": draw(st.integers(1, 3)),
         "nvidia.com/gpumem": draw(st.sampled_from([500, 1000, 4000])),
         "nvidia.com/gpucores": draw(st.sampled_from([0, 30, 100]))}
        for _ in range(draw(st.integers(1, 2)))
    ]
    return manifest(annotations=annotations, containers=containers)


def build(cluster: list[Node], booked: dict[str, Allocation]) -> Fleet:
    fleet = Fleet()
    for node in cluster:
        fleet.upsert_node(node)
    for key, allocation in booked.items():
        fleet.allocate(key, allocation)
    return fleet


def outcome(decision: Decision) -> tuple[Any, ...]:
    return (decision.scheduled, decision.node, decision.cards, decision.failed_nodes,
            decision.allocation, decision.reason)


scenario = st.shared(nodes(), key="cluster")
COMMON = settings(max_examples=150, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])


@COMMON
@given(cluster=scenario, booked=scenario.flatmap(allocations), pod=pods(),
       shuffle=st.randoms(use_true_random=False))
def test_listing_order_of_nodes_cards_and_pods_does_not_matter(
    cluster: list[Node], booked: dict[str, Allocation], pod: PodManifest, shuffle: Any,
) -> None:
    reordered = [Node(name=n.name, cards=shuffle.sample(n.cards, len(n.cards)),
                      annotations=n.annotations) for n in shuffle.sample(cluster, len(cluster))]
    rebooked = dict(shuffle.sample(list(booked.items()), len(booked)))
    assert outcome(run(build(cluster, booked), pod)) == outcome(run(build(reordered, rebooked),
                                                                    pod))


@COMMON
@given(cluster=scenario, booked=scenario.flatmap(allocations), pod=pods())
def test_the_decision_is_identical_when_run_twice(
    cluster: list[Node], booked: dict[str, Allocation], pod: PodManifest,
) -> None:
    fleet = build(cluster, booked)
    assert outcome(run(fleet, pod, explain=True)) == outcome(run(fleet, pod))
    assert run(fleet, pod, explain=True) == run(fleet, pod, explain=True)


@COMMON
@given(cluster=scenario, booked=scenario.flatmap(allocations), pod=pods(),
       token=st.sampled_from(["fastest", "BOGUS", "gang"]))
def test_an_unknown_token_changes_nothing_but_ignored_policies(
    cluster: list[Node], booked: dict[str, Allocation], pod: PodManifest, token: str,
) -> None:
    annotations = dict(pod.metadata.annotations or {})
    chain = annotations.get("hami.io/gpu-scheduler-policy", "")
    annotations["hami.io/gpu-scheduler-policy"] = f"{chain},{token}" if chain else token
    noisy = PodManifest(metadata=pod.metadata.__class__(
        name=pod.metadata.name, namespace=pod.metadata.namespace, annotations=annotations),
        spec=pod.spec)
    fleet = build(cluster, booked)
    plain, with_token = run(fleet, pod), run(fleet, noisy)
    assert outcome(plain) == outcome(with_token)
    assert with_token.ignored_policies == (*plain.ignored_policies, token)


@COMMON
@given(cluster=scenario, booked=scenario.flatmap(allocations), pod=pods())
def test_no_chosen_card_fails_any_check(
    cluster: list[Node], booked: dict[str, Allocation], pod: PodManifest,
) -> None:
    fleet = build(cluster, booked)
    decision = run(fleet, pod)
    if decision.node is None:
        return
    request = parse_pod(pod, DEFAULTS)
    node = next(n for n in cluster if n.name == decision.node)
    devices = {d.uuid: d for d in node.cards}
    cordoned = set(node.annotations["hami.io/device-cordon"].split(","))
    taken: dict[str, list[int]] = {}
    gpu = [c for c in request.containers if c.cards]
    assert len(decision.cards) == len(gpu)
    for container, cards in zip(gpu, decision.cards, strict=True):
        assert len(cards) == container.cards
        assert len({c.uuid for c in cards}) == len(cards)
        for placed in cards:
            device = devices[placed.uuid]
            held = fleet.usage(node.name, device.uuid)
            extra = taken.get(device.uuid, [0, 0, 0])
            used = max(held.tenants + extra[0], device.processes)
            free_memory = device.memory - held.memory - extra[1]
            free_cores = device.cores - held.cores - extra[2]
            assert device.health and device.uuid not in cordoned
            assert "t4" in device.type.lower() or request.use_types is None
            assert used < device.count
            assert not (request.chain.mutex and used > 0)
            assert free_memory >= container.memory_slice(device.memory) == placed.memory
            assert free_cores >= container.cores == placed.cores
            assert not (container.cores == 100 and used > 0)
            assert not (container.cores == 0 and free_cores <= 0)
            if not container.is_init:
                slot = taken.setdefault(device.uuid, [0, 0, 0])
                slot[0] += 1
                slot[1] += placed.memory
                slot[2] += placed.cores
        if container.cards > 1 and request.numa_bind:
            assert len({devices[c.uuid].numa for c in cards}) == 1
            assert devices[cards[0].uuid].numa >= 0
        if container.cards > 1 and request.chain.topology_aware:
            for a in cards:
                for b in cards:
                    if a.uuid != b.uuid:
                        assert ((devices[a.uuid].links or {}).get(b.uuid, 0) > 0
                                or (devices[b.uuid].links or {}).get(a.uuid, 0) > 0)


@COMMON
@given(cluster=scenario, booked=scenario.flatmap(allocations), pod=pods())
def test_counting_per_node_agrees_with_judging_every_node_one_by_one(
    cluster: list[Node], booked: dict[str, Allocation], pod: PodManifest,
) -> None:
    fleet = build(cluster, booked)
    request = parse_pod(pod, DEFAULTS)
    assert outcome(decide(fleet, request)) == outcome(decide(fleet, request, exhaustive=True))


@COMMON
@given(cluster=scenario, booked=scenario.flatmap(allocations), pod=pods(),
       asked=st.sets(st.sampled_from([f"node-{n}" for n in range(5)])))
def test_the_fitting_nodes_are_those_that_hold_the_pod_alone_the_chosen_first(
    cluster: list[Node], booked: dict[str, Allocation], pod: PodManifest, asked: set[str],
) -> None:
    # What /filter answers with --filter-nodes all: a subset of the nodes asked about, each
    # node one the pod would be placed on if it were the only one, the chosen node first.
    fleet = build(cluster, booked)
    request = parse_pod(pod, DEFAULTS)
    decision = decide(fleet, request, nodes=asked)
    if not request.wants_gpu:
        return
    assert decision.fitting is not None
    alone = {n.name for n in cluster
             if n.name in asked and decide(fleet, request, nodes=[n.name]).scheduled}
    assert set(decision.fitting) == alone
    assert (list(decision.fitting)[:1] == [decision.node]) if decision.node else not alone


@st.composite
def histories(draw: st.DrawFn, cluster: list[Node]) -> list[tuple[str, Any]]:
    """SchedulingCache, releases and agent reports, in the order the daemon might see them."""
    steps: list[tuple[str, Any]] = []
    for number in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["book", "release", "report"]))
        if kind == "report":
            node = draw(st.sampled_from(cluster))
            devices = [Card(uuid=d.uuid, index=d.index, type=d.type, memory=d.memory,
                            cores=d.cores, count=d.count, numa=d.numa, links=d.links,
                            health=draw(st.booleans()) or draw(st.booleans()),
                            processes=draw(st.integers(0, 2)))
                       for d in node.cards]
            cordon = [d.uuid for d in node.cards if draw(st.integers(0, 5)) == 0]
            steps.append((kind, Node(name=node.name, cards=devices,
                                     annotations={"hami.io/device-cordon": ",".join(cordon)})))
        else:
            steps.append((kind, (f"default/later-{number % 4}", draw(allocations(cluster)))))
    return steps


def replay(fleet: Fleet, steps: list[tuple[str, Any]]) -> list[Node]:
    """Apply ``steps`` to ``fleet``; returns the nodes as last reported."""
    nodes = {node.name: node for node in fleet.nodes()}
    for kind, step in steps:
        if kind == "report":
            fleet.upsert_node(step)
            nodes[step.name] = step
            continue
        key, booked = step
        if kind == "release" or not booked:
            fleet.release(key)
        else:
            fleet.allocate(key, next(iter(booked.values())))
    return list(nodes.values())


@COMMON
@given(cluster=scenario, booked=scenario.flatmap(allocations),
       history=scenario.flatmap(histories), first=pods(), then=pods())
def test_a_fleet_that_decided_before_changes_decides_as_one_built_afresh(
    cluster: list[Node], booked: dict[str, Allocation], history: list[tuple[str, Any]],
    first: PodManifest, then: PodManifest,
) -> None:
    # The checks and node scores a fleet keeps between decisions follow every booking,
    # release and report; a fleet built from the final state keeps nothing.
    fleet = build(cluster, booked)
    run(fleet, first)
    run(fleet, then)
    reported = replay(fleet, history)
    afresh = build(reported, fleet.allocations())
    for pod in (first, then):
        assert outcome(run(fleet, pod)) == outcome(run(afresh, pod))
        request = parse_pod(pod, DEFAULTS)
        assert outcome(decide(fleet, request)) == outcome(
            decide(afresh, request, exhaustive=True))


# ResourceQuota: random quotas, random pods decided and booked one after another.

NAMESPACES = ["team-a", "team-b"]


@st.composite
def quota_lists(draw: st.DrawFn) -> list[Quota]:
    quotas = []
    for number in range(draw(st.integers(1, 4))):
        memory = draw(st.none() | st.integers(0, 12000))
        cores = draw(st.none() | st.integers(0, 250))
        if memory is None and cores is None:
            memory = draw(st.integers(0, 12000))
        rules = draw(st.sampled_from([
            (), (), (), (ScopeRule(Scope.PRIORITY_CLASS, "In", frozenset({"high"})),),
            (ScopeRule(Scope.PRIORITY_CLASS, "NotIn", frozenset({"high"})),),
            (ScopeRule(Scope.TERMINATING),), (ScopeRule(Scope.NOT_TERMINATING),),
            (ScopeRule(Scope.BEST_EFFORT),), (ScopeRule(Scope.NOT_BEST_EFFORT),)]))
        quotas.append(Quota(draw(st.sampled_from(NAMESPACES)), f"q{number}", memory, cores,
                            rules))
    return quotas


@st.composite
def tenant_pods(draw: st.DrawFn, number: int) -> PodManifest:
    """A pod of a namespace under quota: what quota scopes match on, and containers asking
    MiB or a percentage, with cores, over one or two cards, init containers among them."""

    def limits() -> dict[str, int | str]:
        spec: dict[str, int | str] = {"nvidia.com/gpu": draw(st.integers(1, 2)),
                                      "nvidia.com/gpucores": draw(st.sampled_from([0, 20, 40]))}
        if draw(st.booleans()):
            spec["nvidia.com/gpumem"] = draw(st.sampled_from([1000, 2000, 4000]))
        else:
            spec["nvidia.com/gpumem-percentage"] = draw(st.sampled_from([10, 25, 50]))
        return spec

    pod = manifest(f"p{number}",
                   containers=[limits() for _ in range(draw(st.sampled_from([1, 1, 2])))],
                   init_containers=[limits() for _ in range(draw(st.sampled_from([0, 0, 1])))],
                   policy=draw(st.sampled_from(["binpack", "spread"])))
    # With a cpu request the pod is not BestEffort.
    requests: dict[str, str | int | float] | None = (
        {"cpu": "100m"} if draw(st.booleans()) else None)
    containers = [Container(name=c.name, resources=ResourceRequirements(
        limits=(c.resources.limits if c.resources else None), requests=requests))
        for c in pod.spec.containers]
    spec = msgspec.structs.replace(
        pod.spec, containers=containers,
        priority_class_name=draw(st.sampled_from([None, "high", "low"])),
        active_deadline_seconds=draw(st.sampled_from([None, 600])))
    metadata = msgspec.structs.replace(pod.metadata, namespace=draw(st.sampled_from(NAMESPACES)))
    return PodManifest(metadata=metadata, spec=spec)


def quota_used(fleet: Fleet) -> dict[tuple[str, str, str], tuple[int, int]]:
    """(namespace, quota, resource) -> (used, limit)."""
    return {(s.namespace, s.quota, s.resource): (s.used, s.limit)
            for s in fleet.quotas.standings()}


@st.composite
def quota_cards(draw: st.DrawFn) -> list[Node]:
    """Up to three nodes of two to four cards of two sizes, so that a percentage costs
    different MiB on different cards."""
    return [Node(name=f"node-{n}", cards=[
        Card(uuid=f"GPU-{n}-{i}", index=i, type="NVIDIA-A100",
             memory=draw(st.sampled_from([8192, 16384])), cores=100, count=10)
        for i in range(draw(st.integers(2, 4)))]) for n in range(draw(st.integers(1, 3)))]


@COMMON
@given(cluster=quota_cards(), quotas=quota_lists(),
       pods=st.integers(1, 10).flatmap(
           lambda count: st.tuples(*(tenant_pods(n) for n in range(count)))),
       quotas_first=st.booleans(), shuffle=st.randoms(use_true_random=False))
def test_no_quota_is_exceeded_by_a_pod_placed_and_refunds_bring_it_back_to_zero(
    cluster: list[Node], quotas: list[Quota], pods: tuple[PodManifest, ...],
    quotas_first: bool, shuffle: Any,
) -> None:
    fleet = build(cluster, {})
    if quotas_first:
        for quota in quotas:
            fleet.quotas.set_quota(quota)
    placed: list[str] = []
    for position, pod in enumerate(pods):
        if position == len(pods) // 2 and not quotas_first:
            # Quotas set with pods already holding cards: counted from them.
            for quota in quotas:
                fleet.quotas.set_quota(quota)
        request = parse_pod(pod, DEFAULTS)
        before = quota_used(fleet)
        decision = decide(fleet, request)
        if decision.allocation is None:
            continue
        fleet.allocate(decision.pod, decision.allocation)
        placed.append(decision.pod)
        after = quota_used(fleet)
        charge = decision.allocation.charge()
        for quota in fleet.quotas.quotas():
            applies = quota.applies_to(request.subject)
            for resource, asked in (("nvidia.com/gpumem", charge.memory),
                                    ("nvidia.com/gpucores", charge.cores)):
                key = (quota.namespace, quota.name, resource)
                if key not in after:
                    continue
                was, limit = before[key]
                now, _ = after[key]
                assert now == (was + asked if applies else was)
                if applies and asked > 0:
                    # A quota already exceeded admits nothing of its resource (a pod
                    # asking none of it is not judged by it); one within its limit
                    # stays within it.
                    assert was <= limit
                    assert now <= limit
    # The book kept by charges agrees with one counted afresh from the ledger.
    afresh = build(cluster, fleet.allocations())
    for quota in quotas:
        afresh.quotas.set_quota(quota)
    assert quota_used(afresh) == quota_used(fleet)
    for key in shuffle.sample(placed, len(placed)):
        fleet.release(key)
    assert all(used == 0 for used, _ in quota_used(fleet).values())
    assert fleet.quotas.namespace_used() == {}
