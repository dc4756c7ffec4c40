"""The simulation engine on small traces whose outcome is worked out by hand."""

from __future__ import annotations

import heapq
import random
from collections import Counter
from typing import ClassVar

import pytest

from common.core import (
    Card,
    ClusterFile,
    Defaults,
    Node,
    NodePolicy,
    PodManifest,
    decide,
    fleet_from_cluster,
    parse_default_chain,
    parse_pod,
)
from common.core.pod import (
    GPU_POLICY_ANNOTATION,
    Container,
    ObjectMeta,
    PodSpec,
    ResourceRequirements,
)
from common.core.quota import Quota
from common.core.vendors import NVIDIA
from common.files import InputFileError
from pyhami.simulate._engine import PolicyRun, simulate
from pyhami.simulate._report import mig_lines
from pyhami.simulate._results import NamespaceTally
from pyhami.simulate._trace import SimPod, Trace
from tests.builders import mig_node

MIB = 1000


def node(name: str, cards: int) -> Node:
    return Node(name=name, cards=[Card(uuid=f"{name}-GPU-{i}", index=i, type="NVIDIA-T4",
                                         memory=MIB) for i in range(cards)])


def manifest(name: str, *, gpus: int = 1, percent: int | None = None,
             annotations: dict[str, str] | None = None,
             namespace: str | None = None) -> PodManifest:
    """A pod of ``gpus`` cards taking ``percent`` of each card's cores and memory
    (None: whole cards, 100 cores and all the memory)."""
    limits: dict[str, str | int | float] = {"nvidia.com/gpu": gpus,
                                            "nvidia.com/gpucores": percent or 100}
    if percent is not None:
        limits["nvidia.com/gpumem-percentage"] = percent
    return PodManifest(
        metadata=ObjectMeta(name=name, namespace=namespace, annotations=annotations),
        spec=PodSpec(containers=[Container(name="main",
                                           resources=ResourceRequirements(limits=limits))]))


def run(nodes: list[Node], pods: list[SimPod], policy: str = "binpack",
        inflate: float | None = None, quotas: tuple[Quota, ...] = ()) -> PolicyRun:
    return simulate(Trace(nodes=nodes, pods=pods, quotas=quotas), policy=policy,
                    node_policy=NodePolicy.BINPACK, inflate=inflate)


class TestBinpackLeavesAWholeCard:
    """Two cards; two half-card pods, then a whole-card pod. Binpack puts both halves on
    card 0 and the whole-card pod on card 1; spread puts the halves on cards 0 and 1, and
    the whole-card pod finds half a card's memory free on each: refused."""

    pods: ClassVar[list[SimPod]] = [SimPod(manifest("half-a", percent=50), 0.0),
                                    SimPod(manifest("half-b", percent=50), 1.0),
                                    SimPod(manifest("whole"), 2.0)]

    def test_binpack_places_all_three(self) -> None:
        result = run([node("n1", 2)], self.pods, "binpack")
        assert (result.placed, result.refused, result.refused_by_reason) == (3, 0, {})
        assert [s.allocation for s in result.samples] == [0.25, 0.5, 1.0]
        assert result.peak_allocation == 1.0
        assert result.waits == [0.0, 0.0, 0.0]

    def test_spread_refuses_the_whole_card_pod(self) -> None:
        result = run([node("n1", 2)], self.pods, "spread")
        assert (result.placed, result.refused) == (2, 1)
        assert result.refused_by_reason == {"CardInsufficientMemory": 1}
        assert [s.allocation for s in result.samples] == [0.25, 0.5, 0.5]
        assert result.peak_allocation == 0.5

    def test_arrived_counts_demand_in_cards(self) -> None:
        result = run([node("n1", 2)], self.pods, "spread")
        # 0.5, 0.5 and 1 card arrive on a cluster of 2 cards.
        assert [s.arrived for s in result.samples] == [0.25, 0.5, 1.0]
        assert [s.time for s in result.samples] == [0.0, 1.0, 2.0]

    def test_fragmentation(self) -> None:
        # Typical pods: a half card (weight 2/3), a whole card (weight 1/3).
        # After half-a (either policy): card 0 has 0.5 free, card 1 is free. The half
        # fits and strands nothing; the whole card fits card 1 and strands card 0's 0.5:
        # 1/3 x 0.5 = 1/6 of a card, over 2 cards = 1/12.
        # Binpack after half-b: card 0 full, card 1 free: nothing stranded.
        # Spread after half-b: 0.5 free on each card; the whole card fits nowhere on the
        # node, so all its free capacity (1 card) is stranded: 1/3 x 1 / 2 = 1/6.
        binpack = [s.fragmentation for s in run([node("n1", 2)], self.pods).samples]
        spread = [s.fragmentation for s in run([node("n1", 2)], self.pods, "spread").samples]
        assert binpack == pytest.approx([1 / 12, 0.0, 0.0])
        assert spread == pytest.approx([1 / 12, 1 / 6, 1 / 6])


def test_a_pod_too_large_for_a_node_strands_all_its_free_cards() -> None:
    # n1 has 2 cards, n2 one; typical pods: 2 whole cards and 1 whole card, 1/2 each.
    # The 2-card pod can only go to n1. Then n2's free card is of no use to a 2-card pod
    # (all of it is stranded) and of use to a 1-card pod: 1/2 x 1 card, over 3 cards.
    # The 1-card pod then fills n2: nothing free, nothing stranded.
    pods = [SimPod(manifest("two", gpus=2), 0.0), SimPod(manifest("one"), 1.0)]
    result = run([node("n1", 2), node("n2", 1)], pods)
    assert [s.fragmentation for s in result.samples] == pytest.approx([1 / 6, 0.0])
    assert [s.allocation for s in result.samples] == pytest.approx([2 / 3, 1.0])
    assert result.placed == 2


class TestDepartures:
    def test_a_waiting_pod_is_placed_when_the_card_frees(self) -> None:
        # "first" holds the only card from 0 to 10; "second" arrives at 3 and waits 7 s;
        # "third" arrives at 10, after the departure and the retry, and finds the card
        # taken by "second", which never leaves.
        pods = [SimPod(manifest("first"), 0.0, 10.0), SimPod(manifest("second"), 3.0),
                SimPod(manifest("third"), 10.0)]
        result = run([node("n1", 1)], pods)
        assert result.waits == [0.0, 7.0]
        assert (result.placed, result.refused) == (2, 1)
        assert result.refused_by_reason == {"CardInsufficientMemory": 1}
        # At "second"'s arrival the card is still held; at "third"'s, held again.
        assert [s.allocation for s in result.samples] == [1.0, 1.0, 1.0]

    def test_waiting_pods_are_retried_in_arrival_order(self) -> None:
        # A half-card pod waits before a whole-card pod; when the card frees the half is
        # placed first, and the whole-card pod no longer fits.
        pods = [SimPod(manifest("first"), 0.0, 5.0),
                SimPod(manifest("half", percent=50), 1.0),
                SimPod(manifest("whole"), 2.0)]
        result = run([node("n1", 1)], pods)
        assert result.waits == [0.0, 4.0]
        assert result.refused_by_reason == {"CardInsufficientMemory": 1}

    def test_a_departure_at_an_arrival_time_comes_first(self) -> None:
        pods = [SimPod(manifest("first"), 0.0, 4.0), SimPod(manifest("second"), 4.0)]
        result = run([node("n1", 1)], pods)
        assert result.waits == [0.0, 0.0]
        assert result.refused == 0

    def test_pods_still_waiting_at_the_end_are_refused_after_the_last_departure(self) -> None:
        # The last arrival comes at 1; the card frees at 20 and the waiting pod takes it.
        pods = [SimPod(manifest("first"), 0.0, 20.0), SimPod(manifest("late"), 1.0, 5.0)]
        result = run([node("n1", 1)], pods)
        assert result.waits == [0.0, 19.0]
        assert result.refused == 0


class TestQuotas:
    """Two nodes of one 1000 MiB card; team-a may use 500 MiB of GPU memory."""

    nodes: ClassVar[list[Node]] = [node("n1", 1), node("n2", 1)]
    quotas: ClassVar[tuple[Quota, ...]] = (Quota("team-a", "gpu-quota", memory=500),)
    pods: ClassVar[list[SimPod]] = [
        # a1 (400 MiB) then b1 (600 MiB) fill n1: binpack takes the fuller node.
        SimPod(manifest("a1", percent=40, namespace="team-a"), 0.0, 10.0),
        SimPod(manifest("b1", percent=60, namespace="team-b"), 0.0),
        # a2 (500 MiB) fits n2, but team-a's quota (400 + 500 > 500) keeps it waiting until
        # a1 leaves n1 at 10; n1 then has only 400 MiB free: a2 takes n2, a node nobody
        # left. a3, the same request, waits behind it and is refused for the quota at the
        # end (500 + 500 > 500).
        SimPod(manifest("a2", percent=50, namespace="team-a"), 1.0),
        SimPod(manifest("a3", percent=50, namespace="team-a"), 2.0),
        # b2 asks for two cards: no node has them.
        SimPod(manifest("b2", gpus=2, namespace="team-b"), 3.0),
    ]

    def test_a_refunded_namespace_is_retried_on_every_node(self) -> None:
        result = run(self.nodes, self.pods, quotas=self.quotas)
        assert result.waits == [0.0, 0.0, 9.0]
        assert result.refused_by_reason == {"ResourceQuotaNotFit": 1,
                                            "NodeInsufficientDevice": 1}

    def test_pods_by_namespace(self) -> None:
        result = run(self.nodes, self.pods, quotas=self.quotas)
        assert result.by_namespace == {"team-a": NamespaceTally(3, 2, 1, 0),
                                       "team-b": NamespaceTally(2, 1, 0, 1)}

    def test_without_the_quota_nobody_waits(self) -> None:
        result = run(self.nodes, self.pods)
        # a2 and a3 go straight to n2, 500 MiB each.
        assert result.waits == [0.0, 0.0, 0.0, 0.0]
        assert result.by_namespace == {"team-a": NamespaceTally(3, 3, 0, 0),
                                       "team-b": NamespaceTally(2, 1, 0, 1)}

    def test_a_malformed_pod_counts_as_another_refusal_of_its_namespace(self) -> None:
        bad = PodManifest(
            metadata=ObjectMeta(name="bad", namespace="team-a"),
            spec=PodSpec(containers=[Container(name="main", resources=ResourceRequirements(
                limits={"nvidia.com/gpumem": "lots"}))]))
        result = run(self.nodes, [SimPod(bad, 0.0)], quotas=self.quotas)
        assert result.by_namespace == {"team-a": NamespaceTally(1, 0, 0, 1)}
        assert result.refused_by_reason == {"PodRejected": 1}


def test_pods_listed_out_of_order_arrive_in_time_order() -> None:
    # "late" is listed first but arrives after "early" has taken the only card.
    pods = [SimPod(manifest("late"), 5.0), SimPod(manifest("early"), 1.0, 10.0)]
    result = run([node("n1", 1)], pods)
    assert [s.time for s in result.samples] == [1.0, 5.0]
    assert result.waits == [0.0, 6.0]


def test_malformed_pods_and_pods_without_gpu() -> None:
    bad = manifest("bad", annotations={NVIDIA.pod_annotations.numa_bind: "maybe"})
    no_gpu = PodManifest(metadata=ObjectMeta(name="cpu-only"),
                         spec=PodSpec(containers=[Container(name="main")]))
    pods = [SimPod(bad, 0.0), SimPod(no_gpu, 1.0), SimPod(manifest("good"), 2.0)]
    result = run([node("n1", 1)], pods)
    assert result.refused_by_reason == {"PodRejected": 1}
    assert (result.pods, result.placed, result.refused) == (3, 2, 1)
    # Neither the malformed pod nor the CPU-only one adds GPU demand or usage.
    assert [(s.arrived, s.allocation) for s in result.samples] == [(0.0, 0.0), (0.0, 0.0),
                                                                    (1.0, 1.0)]


def test_mutex_keeps_one_pod_per_card() -> None:
    quarters = [SimPod(manifest(f"q{i}", percent=25), float(i)) for i in range(4)]
    shared = run([node("n1", 2)], quarters, "binpack")
    assert (shared.placed, shared.refused) == (4, 0)
    assert shared.samples[-1].allocation == 0.5  # all four on card 0: 100 of 200 cores
    alone = run([node("n1", 2)], quarters, "mutex,binpack")
    assert (alone.placed, alone.refused) == (2, 2)
    assert alone.refused_by_reason == {"ExclusiveDeviceAllocateConflict": 2}
    assert alone.samples[-1].allocation == 0.25


def test_a_pod_annotation_overrides_the_policy() -> None:
    # As in TestBinpackLeavesAWholeCard under spread, but the halves ask for binpack.
    binpack = {GPU_POLICY_ANNOTATION: "binpack"}
    pods = [SimPod(manifest("half-a", percent=50, annotations=binpack), 0.0),
            SimPod(manifest("half-b", percent=50, annotations=binpack), 1.0),
            SimPod(manifest("whole"), 2.0)]
    assert run([node("n1", 2)], pods, "spread").placed == 3


class TestInflate:
    def test_repeats_until_the_target_and_nobody_departs(self) -> None:
        # One half-card pod repeated until 2 x 4 cards arrived: 16 pods. Only 8 fit; had
        # durations been kept, each would have left before the next arrived.
        pods = [SimPod(manifest("half", percent=50), 0.0, 1.0)]
        result = run([node("n1", 4)], pods, inflate=2.0)
        assert result.pods == 16
        assert (result.placed, result.refused) == (8, 8)
        assert result.samples[-2].arrived == 1.875
        assert result.samples[-1].arrived == 2.0

    def test_stops_at_the_pod_that_reaches_the_target(self) -> None:
        # 0.5 and 1 card, again and again, on 2 cards until 2.4 cards: 0.5, 1.5, 2, 3.
        pods = [SimPod(manifest("half", percent=50), 0.0), SimPod(manifest("whole"), 5.0)]
        result = run([node("n1", 2)], pods, inflate=1.2)
        assert [s.arrived for s in result.samples] == [0.25, 0.75, 1.0, 1.5]
        # Repeats follow one another in time: the span (5 s) plus one second apart.
        assert [s.time for s in result.samples] == [0.0, 5.0, 6.0, 11.0]

    def test_needs_gpu_demand(self) -> None:
        no_gpu = PodManifest(metadata=ObjectMeta(name="cpu-only"))
        with pytest.raises(InputFileError, match="no pod of the workload asks for a GPU"):
            run([node("n1", 1)], [SimPod(no_gpu, 0.0)], inflate=1.0)


# Quotas tight enough against random_trace's pods to keep some of them waiting.
RANDOM_QUOTAS = (Quota("team-a", "memory", memory=1500),
                 Quota("team-b", "cores", cores=150), Quota("team-b", "memory", memory=2500))


def random_trace(seed: int, quotas: bool = False) -> Trace:
    """80 pods on 4 nodes; with ``quotas``, in three namespaces, two of them under quota."""
    rng = random.Random(seed)
    nodes = [node(f"n{i}", rng.choice([1, 2, 4])) for i in range(4)]
    pods = []
    for i in range(80):
        namespace = rng.choice(["team-a", "team-b", "default"]) if quotas else None
        if rng.random() < 0.6:
            pod = manifest(f"p{i}", percent=rng.choice([10, 25, 50, 75]), namespace=namespace)
        else:
            pod = manifest(f"p{i}", gpus=rng.choice([1, 2]), namespace=namespace)
        duration = rng.choice([None, 3.0, 10.0, 30.0])
        pods.append(SimPod(pod, float(i // 2), duration))
    return Trace(nodes=nodes, pods=pods, quotas=RANDOM_QUOTAS if quotas else ())


def full_retry_replay(trace: Trace, policy: str) -> tuple[list[float], Counter[str]]:
    """A slow reference: every waiting pod tried on every node after each departure."""
    fleet = fleet_from_cluster(ClusterFile(nodes=trace.nodes))
    for quota in trace.quotas:
        fleet.quotas.set_quota(quota)
    defaults = Defaults(parse_default_chain(policy), NodePolicy.BINPACK)
    requests = [parse_pod(p.manifest, defaults) for p in trace.pods]
    departures: list[tuple[float, int]] = []
    waiting: list[int] = []
    waits: list[float] = []

    def attempt(position: int, now: float) -> bool:
        decision = decide(fleet, requests[position])
        if decision.allocation is None:
            return False
        fleet.allocate(str(position), decision.allocation)
        waits.append(now - trace.pods[position].arrival)
        duration = trace.pods[position].duration
        if duration is not None:
            heapq.heappush(departures, (now + duration, position))
        return True

    def depart() -> None:
        now = departures[0][0]
        while departures and departures[0][0] == now:
            fleet.release(str(heapq.heappop(departures)[1]))
        waiting[:] = [p for p in waiting if not attempt(p, now)]

    for position, pod in enumerate(trace.pods):
        while departures and departures[0][0] <= pod.arrival:
            depart()
        if not attempt(position, pod.arrival):
            waiting.append(position)
    while departures and waiting:
        depart()
    reasons: Counter[str] = Counter()
    for position in waiting:
        failures = decide(fleet, requests[position]).failures or {}
        removed: Counter[str] = Counter()
        for failure in failures.values():
            for reason, count in failure.removed():
                removed[reason] += count
        reasons[removed.most_common(1)[0][0]] += 1
    return waits, reasons


@pytest.mark.parametrize("policy", ["binpack", "spread", "mutex,spread"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_retrying_freed_nodes_only_matches_a_full_retry(policy: str, seed: int) -> None:
    trace = random_trace(seed)
    waits, reasons = full_retry_replay(trace, policy)
    result = simulate(trace, policy=policy, node_policy=NodePolicy.BINPACK)
    assert result.waits == waits
    assert result.refused_by_reason == dict(reasons)
    assert any(wait > 0 for wait in waits)  # the trace does exercise the retries


@pytest.mark.parametrize("policy", ["binpack", "spread"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_under_quotas_retrying_matches_a_full_retry(policy: str, seed: int) -> None:
    # A departure refunds its namespace's quotas: that namespace's waiting pods are tried
    # on every node, the others on the freed nodes only, as a full retry would find.
    trace = random_trace(seed, quotas=True)
    waits, reasons = full_retry_replay(trace, policy)
    result = simulate(trace, policy=policy, node_policy=NodePolicy.BINPACK)
    assert result.waits == waits
    assert result.refused_by_reason == dict(reasons)
    tallies = result.by_namespace.values()
    assert sum(t.refused_for_quota for t in tallies) == reasons["ResourceQuotaNotFit"]
    assert sum(t.refused_for_quota + t.refused_otherwise for t in tallies) == result.refused
    assert sum(t.placed for t in tallies) == result.placed
    assert sum(t.pods for t in tallies) == 80


def test_the_same_run_twice_gives_the_same_result() -> None:
    trace = random_trace(7)
    first = simulate(trace, policy="spread", node_policy=NodePolicy.SPREAD)
    second = simulate(trace, policy="spread", node_policy=NodePolicy.SPREAD)
    assert first == second
    assert first.placed + first.refused == 80


class TestDocument:
    def test_summary_fields_and_waits(self) -> None:
        pods = [SimPod(manifest("first"), 0.0, 10.0), SimPod(manifest("second"), 3.0),
                SimPod(manifest("third"), 10.0)]
        document = run([node("n1", 1)], pods).document()
        assert document["policy"] == "binpack"
        assert document["node_policy"] == "binpack"
        assert (document["pods"], document["placed"], document["refused"]) == (3, 2, 1)
        assert document["refused_by_reason"] == {"CardInsufficientMemory": 1}
        assert document["peak_allocation"] == 1.0
        assert document["allocation_at_arrived"] == [[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]]
        assert document["fragmentation_at_arrived"] == [[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]]
        # Arrivals at 0, 3 and 10; the one card is busy throughout.
        assert document["allocation_over_time"] == [[0.0, 1.0], [3.0, 1.0], [10.0, 1.0]]
        # Waits 0 and 7, linear between ranks: p50 0 + 7 x 0.5, p95 0 + 7 x 0.95.
        assert document["wait_seconds"] == {"p50": 3.5, "p95": 6.65, "max": 7.0}

    def test_long_series_are_thinned_to_200_points_first_and_last_kept(self) -> None:
        pods = [SimPod(manifest(f"p{i}", percent=10), float(i)) for i in range(500)]
        document = run([node("n1", 50)], pods).document()
        series = document["allocation_at_arrived"]
        assert isinstance(series, list)
        assert len(series) == 200
        assert series[0] == [0.002, 0.002]  # 0.1 card of 50
        assert series[-1] == [1.0, 1.0]


def test_progress_reports_the_end() -> None:
    seen: list[tuple[int, int]] = []
    simulate(random_trace(1), policy="binpack", node_policy=NodePolicy.BINPACK,
             progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (80, 80)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


def test_mig_cards_count_the_instances_each_policy_gives() -> None:
    """One A100 in MIG mode: three pods of 20 % (16,384 MiB: a 2g.20gb each, slices 0 to
    5), then one of 10 % (8,192 MiB: the 1g.10gb left at slice 6)."""
    pods = [SimPod(manifest(f"p{i}", percent=20), float(i)) for i in range(3)]
    pods.append(SimPod(manifest("small", percent=10), 3.0))
    result = run([mig_node("m", 1)], pods)
    assert result.mig_instances == {"2g.20gb": 3, "1g.10gb": 1}
    assert result.refused == 0
    assert result.document()["mig_instances"] == {"1g.10gb": 1, "2g.20gb": 3}
    assert mig_lines([result]) == ["MIG instances given:",
                                   "  binpack: 1g.10gb x 1, 2g.20gb x 3"]
    assert mig_lines([run([node("t", 1)], pods[:1])]) == []
