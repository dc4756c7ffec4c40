"""Preemption: the cheapest set of lower-priority pods whose eviction lets a pod fit."""

from __future__ import annotations

import random
from itertools import combinations

import pytest

from common.core import (
    Fleet,
    PodManifest,
    PodRequest,
    Preemption,
    Tenant,
    best_preemption,
    decide,
    parse_pod,
    preemption_on_node,
)
from common.core.preemption import victim_cost
from common.core.quota import Quota
from pyhami.sandbox import DEFAULTS
from tests.builders import fleet_of, hold, manifest, node, node_with

HIGH = 100
NUMA_BIND = {"nvidia.com/numa-bind": "true"}


def request(pod: PodManifest) -> PodRequest:
    return parse_pod(pod, DEFAULTS)


def booked(fleet: Fleet, tenants: dict[str, Tenant], key: str, node_name: str, *cards: int,
           priority: int, started: float = 0.0, memory: int = 1000,
           disruption_allowed: bool = True) -> None:
    """A tenant of ``priority`` holding ``cards`` of ``node_name``."""
    hold(fleet, f"default/{key}", node_name, *(f"GPU-{node_name}-{c}" for c in cards),
         memory=memory)
    tenants[f"default/{key}"] = Tenant(priority, started, disruption_allowed)


def victims(found: Preemption | None) -> tuple[str, ...] | None:
    return None if found is None else tuple(key.removeprefix("default/")
                                            for key in found.victims)


def cards_of(found: Preemption | None) -> list[str]:
    assert found is not None
    return [grant.uuid for grants in found.allocation.containers for grant in grants]


def full_node(priorities: list[tuple[int, int]], starts: list[tuple[float, float]]
              ) -> tuple[Fleet, dict[str, Tenant]]:
    """Four cards, card ``c`` held by tenants ``c-0`` and ``c-1`` of the given priorities."""
    fleet = fleet_of(node("n", 4))
    tenants: dict[str, Tenant] = {}
    for card, (pair, times) in enumerate(zip(priorities, starts, strict=True)):
        for seat in range(2):
            booked(fleet, tenants, f"{card}-{seat}", "n", card, priority=pair[seat],
                   started=times[seat])
    return fleet, tenants


class TestMutex:
    def test_the_tenants_of_the_card_with_the_lowest_priorities(self) -> None:
        # Highest victim priority per card: 5, 4, 3, 3; cards 2 and 3 tie, card 3's sum
        # (2 + 3) is below card 2's (3 + 3).
        fleet, tenants = full_node([(5, 5), (1, 4), (3, 3), (2, 3)], [(0, 0)] * 4)
        found = preemption_on_node(fleet, "n", request(manifest(policy="mutex")), HIGH, tenants)
        assert victims(found) == ("3-0", "3-1")
        assert cards_of(found) == ["GPU-n-3"]
        assert found is not None and found.pdb_violations == 0

    def test_equal_priorities_go_to_the_least_recently_started(self) -> None:
        fleet, tenants = full_node([(1, 1)] * 4,
                                   [(500, 510), (100, 110), (300, 90), (200, 210)])
        found = preemption_on_node(fleet, "n", request(manifest(policy="mutex")), HIGH, tenants)
        # Latest start per card: 510, 110, 300, 210: card 1's tenants started longest ago.
        assert victims(found) == ("1-0", "1-1")

    def test_a_pod_of_equal_priority_preempts_nobody(self) -> None:
        fleet, tenants = full_node([(HIGH, HIGH)] * 4, [(0, 0)] * 4)
        pod = request(manifest(policy="mutex"))
        assert preemption_on_node(fleet, "n", pod, HIGH, tenants) is None
        assert victims(preemption_on_node(fleet, "n", pod, HIGH + 1, tenants)) == ("0-0", "0-1")

    def test_a_higher_priority_tenant_blocks_its_card(self) -> None:
        fleet = fleet_of(node("n", 2))
        tenants: dict[str, Tenant] = {}
        booked(fleet, tenants, "low", "n", 0, priority=1)
        booked(fleet, tenants, "high", "n", 0, priority=HIGH + 1)
        booked(fleet, tenants, "mid-a", "n", 1, priority=50)
        booked(fleet, tenants, "mid-b", "n", 1, priority=50)
        found = preemption_on_node(fleet, "n", request(manifest(policy="mutex")), HIGH, tenants)
        assert victims(found) == ("mid-a", "mid-b")
        assert cards_of(found) == ["GPU-n-1"]

    def test_a_pod_unknown_to_the_tenants_is_never_a_victim(self) -> None:
        fleet = fleet_of(node("n", 2))
        tenants: dict[str, Tenant] = {}
        hold(fleet, "default/unknown", "n", "GPU-n-0")
        booked(fleet, tenants, "known-a", "n", 1, priority=5)
        booked(fleet, tenants, "known-b", "n", 1, priority=5)
        found = preemption_on_node(fleet, "n", request(manifest(policy="mutex")), HIGH, tenants)
        assert victims(found) == ("known-a", "known-b")

    def test_a_tenant_of_two_cards_counts_once(self) -> None:
        fleet = fleet_of(node("n", 4))
        tenants: dict[str, Tenant] = {}
        booked(fleet, tenants, "wide", "n", 0, 1, priority=5)
        booked(fleet, tenants, "two", "n", 2, priority=1)
        booked(fleet, tenants, "three", "n", 3, priority=1)
        pod = request(manifest(policy="mutex", gpus=2))
        found = preemption_on_node(fleet, "n", pod, HIGH, tenants)
        assert victims(found) == ("wide",)
        assert sorted(cards_of(found)) == ["GPU-n-0", "GPU-n-1"]

    def test_each_mutex_container_needs_its_own_card(self) -> None:
        fleet = fleet_of(node("n", 3))
        tenants: dict[str, Tenant] = {}
        for card, priority in enumerate((3, 1, 2)):
            booked(fleet, tenants, f"t{card}", "n", card, priority=priority)
        one: dict[str, int | str] = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}
        pod = request(manifest(policy="mutex", containers=[one, one]))
        # The two cheapest cards, 1 and 2; victims listed lowest priority first.
        assert victims(preemption_on_node(fleet, "n", pod, HIGH, tenants)) == ("t1", "t2")


    def test_an_init_container_may_share_the_card_of_an_app_container(self) -> None:
        fleet = fleet_of(node("n", 2))
        tenants: dict[str, Tenant] = {}
        booked(fleet, tenants, "t0", "n", 0, priority=1)
        booked(fleet, tenants, "t1", "n", 1, priority=2)
        one: dict[str, int | str] = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}
        # The init container runs before the app container: one free card holds both.
        pod = request(manifest(policy="mutex", init_containers=[one], containers=[one]))
        found = preemption_on_node(fleet, "n", pod, HIGH, tenants)
        assert victims(found) == ("t0",)
        assert found is not None and found.allocation.init_containers == 1
        assert cards_of(found) == ["GPU-n-0", "GPU-n-0"]


class TestNoAnswer:
    def test_more_memory_than_any_card_has(self) -> None:
        fleet, tenants = full_node([(1, 1)] * 4, [(0, 0)] * 4)
        pod = request(manifest(gpumem=20000))
        assert preemption_on_node(fleet, "n", pod, HIGH, tenants) is None

    def test_more_cards_than_the_node_has(self) -> None:
        fleet, tenants = full_node([(1, 1)] * 4, [(0, 0)] * 4)
        pod = request(manifest(policy="mutex", gpus=5))
        assert preemption_on_node(fleet, "n", pod, HIGH, tenants) is None

    def test_an_unknown_node(self) -> None:
        fleet, tenants = full_node([(1, 1)] * 4, [(0, 0)] * 4)
        assert preemption_on_node(fleet, "m", request(manifest()), HIGH, tenants) is None

    def test_a_pod_that_fits_already_needs_no_victims(self) -> None:
        fleet, tenants = full_node([(1, 1)] * 4, [(0, 0)] * 4)
        found = preemption_on_node(fleet, "n", request(manifest()), HIGH, tenants)
        assert found is not None and found.victims == () and found.pdb_violations == 0
        assert found.allocation.node == "n"


class TestMemory:
    def test_one_big_tenant_rather_than_two_small_ones(self) -> None:
        # 15360 MiB, 13000 used: 6000 more needs the 7000 MiB tenant or both 3000 MiB ones.
        fleet = fleet_of(node("n", 1))
        tenants: dict[str, Tenant] = {}
        booked(fleet, tenants, "big", "n", 0, priority=5, memory=7000)
        booked(fleet, tenants, "small-a", "n", 0, priority=1, memory=3000)
        booked(fleet, tenants, "small-b", "n", 0, priority=1, memory=3000)
        found = preemption_on_node(fleet, "n", request(manifest(gpumem=6000)), HIGH, tenants)
        assert victims(found) == ("big",)

    def test_the_original_fleet_is_left_as_it_was(self) -> None:
        fleet = fleet_of(node("n", 1))
        tenants: dict[str, Tenant] = {}
        booked(fleet, tenants, "big", "n", 0, priority=5, memory=15000)
        before = fleet.allocations()
        found = preemption_on_node(fleet, "n", request(manifest(gpumem=6000)), HIGH, tenants)
        assert victims(found) == ("big",)
        assert fleet.allocations() == before
        assert fleet.usage("n", "GPU-n-0").memory == 15000


class TestLargeNodes:
    def test_ten_tenants_a_card_on_eight_cards(self) -> None:
        fleet = fleet_of(node("n", 8))
        tenants: dict[str, Tenant] = {}
        for card in range(8):
            for seat in range(10):
                booked(fleet, tenants, f"{card}-{seat}", "n", card,
                       priority=1 if card == 5 else 2, started=float(seat))
        found = preemption_on_node(fleet, "n", request(manifest(policy="mutex")), HIGH, tenants)
        assert victims(found) == tuple(f"5-{seat}" for seat in range(10))
        assert cards_of(found) == ["GPU-n-5"]

    def test_a_card_of_many_tenants_gives_up_its_lowest_priorities(self) -> None:
        # 12 x 1200 MiB leave 960 MiB: 4000 MiB more needs three tenants gone (3600 MiB).
        fleet = fleet_of(node("n", 1, count=20))
        tenants: dict[str, Tenant] = {}
        for seat in range(12):
            booked(fleet, tenants, f"t{seat:02}", "n", 0, priority=12 - seat, memory=1200)
        found = preemption_on_node(fleet, "n", request(manifest(gpumem=4000)), HIGH, tenants)
        assert victims(found) == ("t11", "t10", "t09")


class TestDisruptionBudgets:
    def test_a_larger_set_without_violations_wins(self) -> None:
        fleet = fleet_of(node("n", 2))
        tenants: dict[str, Tenant] = {}
        booked(fleet, tenants, "guarded", "n", 0, priority=1, disruption_allowed=False)
        booked(fleet, tenants, "free-a", "n", 1, priority=50)
        booked(fleet, tenants, "free-b", "n", 1, priority=50)
        found = preemption_on_node(fleet, "n", request(manifest(policy="mutex")), HIGH, tenants)
        assert victims(found) == ("free-a", "free-b")
        assert found is not None and found.pdb_violations == 0

    def test_violations_are_counted_when_unavoidable(self) -> None:
        fleet = fleet_of(node("n", 1))
        tenants: dict[str, Tenant] = {}
        booked(fleet, tenants, "guarded", "n", 0, priority=1, disruption_allowed=False)
        booked(fleet, tenants, "free", "n", 0, priority=1)
        found = preemption_on_node(fleet, "n", request(manifest(policy="mutex")), HIGH, tenants)
        assert victims(found) == ("free", "guarded") or victims(found) == ("guarded", "free")
        assert found is not None and found.pdb_violations == 1


class TestCardSets:
    def test_numa_bind_frees_cards_of_one_numa_node(self) -> None:
        fleet = fleet_of(node_with("n", {"numa": 0}, {"numa": 0}, {"numa": 1}, {"numa": 1}))
        tenants: dict[str, Tenant] = {}
        for card, (name, priority) in enumerate((("a", 1), ("b", 9), ("c", 2), ("d", 3))):
            booked(fleet, tenants, name, "n", card, priority=priority)
        loose = request(manifest(policy="mutex", gpus=2))
        assert victims(preemption_on_node(fleet, "n", loose, HIGH, tenants)) == ("a", "c")
        bound = request(manifest(policy="mutex", gpus=2, annotations=NUMA_BIND))
        # {a, b} would evict priority 9; {c, d} at most priority 3.
        assert victims(preemption_on_node(fleet, "n", bound, HIGH, tenants)) == ("c", "d")

    def test_topology_aware_frees_linked_cards(self) -> None:
        linked = [{"links": {"GPU-n-1": 4}}, {"links": {"GPU-n-0": 4}},
                  {"links": {"GPU-n-3": 4}}, {"links": {"GPU-n-2": 4}}]
        fleet = fleet_of(node_with("n", *linked))
        tenants: dict[str, Tenant] = {}
        for card, (name, priority) in enumerate((("a", 1), ("b", 5), ("c", 1), ("d", 6))):
            booked(fleet, tenants, name, "n", card, priority=priority)
        loose = request(manifest(policy="mutex", gpus=2))
        assert victims(preemption_on_node(fleet, "n", loose, HIGH, tenants)) == ("a", "c")
        aware = request(manifest(policy="mutex,topology-aware", gpus=2))
        assert victims(preemption_on_node(fleet, "n", aware, HIGH, tenants)) == ("a", "b")


class TestAcrossNodes:
    def test_the_node_with_the_cheapest_victims(self) -> None:
        fleet = fleet_of(node("a", 1), node("b", 1))
        tenants: dict[str, Tenant] = {}
        booked(fleet, tenants, "on-a", "a", 0, priority=5)
        booked(fleet, tenants, "on-b", "b", 0, priority=3)
        pod = request(manifest(policy="mutex"))
        choices = [preemption_on_node(fleet, name, pod, HIGH, tenants) for name in ("a", "b")]
        found = best_preemption([c for c in choices if c is not None], tenants)
        assert found is not None and found.node == "b" and victims(found) == ("on-b",)

    def test_a_node_needing_no_victims_wins_and_none_is_none(self) -> None:
        fleet = fleet_of(node("a", 1), node("b", 1))
        tenants: dict[str, Tenant] = {}
        booked(fleet, tenants, "on-a", "a", 0, priority=1)
        pod = request(manifest(policy="mutex"))
        choices = [preemption_on_node(fleet, name, pod, HIGH, tenants) for name in ("a", "b")]
        found = best_preemption([c for c in choices if c is not None], tenants)
        assert found is not None and found.node == "b" and found.victims == ()
        assert best_preemption([], tenants) is None


class TestFleetWithoutSeveralPods:
    def test_a_copy_less_the_pods_and_the_same_fleet_when_none_holds_cards(self) -> None:
        fleet = fleet_of(node("n", 2))
        hold(fleet, "default/a", "n", "GPU-n-0", memory=3000)
        hold(fleet, "default/b", "n", "GPU-n-0", memory=2000)
        hold(fleet, "default/c", "n", "GPU-n-1", memory=1000)
        less = fleet.without_all(["default/a", "default/c", "default/absent"])
        assert sorted(less.allocations()) == ["default/b"]
        assert less.usage("n", "GPU-n-0").memory == 2000
        assert less.usage("n", "GPU-n-1").memory == 0
        assert fleet.usage("n", "GPU-n-0").memory == 5000
        assert fleet.without_all(["default/absent"]) is fleet


def brute_force(fleet: Fleet, pod: PodRequest, tenants: dict[str, Tenant]
                ) -> tuple[str, ...] | None:
    """The cheapest fitting set among every subset of the eligible pods."""
    eligible = sorted(key for key in fleet.allocations() if tenants[key].priority < HIGH)
    fitting = [set(subset) for size in range(len(eligible) + 1)
               for subset in combinations(eligible, size)
               if decide(fleet.without_all(subset), pod).scheduled]
    if not fitting:
        return None
    return tuple(sorted(min(fitting, key=lambda s: victim_cost(s, tenants))))


class TestAgainstEverySubset:
    def test_small_random_nodes(self) -> None:
        rng = random.Random(15)
        for _ in range(60):
            cards = rng.randint(1, 3)
            fleet = fleet_of(node_with("n", *({"numa": rng.randint(0, 1)}
                                              for _ in range(cards))))
            tenants: dict[str, Tenant] = {}
            for number in range(rng.randint(1, 6)):
                held = rng.sample(range(cards), rng.choice((1, 1, 1, 2)) if cards > 1 else 1)
                booked(fleet, tenants, f"t{number}", "n", *held,
                       priority=rng.choice((1, 2, 3, HIGH)), started=rng.choice((1.0, 2.0)),
                       memory=rng.choice((2000, 5000, 9000)),
                       disruption_allowed=rng.random() > 0.2)
            pod = request(manifest(policy=rng.choice(("mutex", "binpack", "spread")),
                                   gpus=rng.randint(1, 2), gpumem=rng.choice((4000, 8000)),
                                   annotations=NUMA_BIND if rng.random() < 0.3 else None))
            found = preemption_on_node(fleet, "n", pod, HIGH, tenants)
            expected = brute_force(fleet, pod, tenants)
            assert (None if found is None else tuple(sorted(found.victims))) == expected


class TestQuota:
    """A pod refused for its namespace's quota makes room under it by evicting pods of its
    own namespace; pods of other namespaces free none of it."""

    @staticmethod
    def quota_fleet(tenants: dict[str, Tenant], *holders: tuple[str, str, int]) -> Fleet:
        """Two roomy nodes, a 2000 MiB quota on namespace default, and ``holders``: pod key,
        node, card, each of 1000 MiB and priority 1."""
        fleet = fleet_of(node("n", 4), node("m", 4))
        fleet.quotas.set_quota(Quota("default", "gpu-quota", memory=2000))
        for key, node_name, card in holders:
            hold(fleet, key, node_name, f"GPU-{node_name}-{card}")
            tenants[key] = Tenant(1, 0.0)
        return fleet

    def test_a_pod_of_its_own_namespace_is_evicted_for_quota_room(self) -> None:
        tenants: dict[str, Tenant] = {}
        fleet = self.quota_fleet(tenants, ("team-b/other", "n", 0), ("default/low", "n", 1))
        pod = request(manifest("p", gpumem=2000))
        assert decide(fleet, pod).node is None  # the cards have room; the quota has not
        found = preemption_on_node(fleet, "n", pod, HIGH, tenants)
        assert found is not None
        assert found.victims == ("default/low",)

    @pytest.mark.parametrize("holders", [
        [("team-b/other", "n", 0), ("team-b/more", "n", 1), ("default/low", "m", 0)],
        [("team-b/other", "n", 0), ("default/low", "m", 0), ("default/lower", "m", 1)],
    ], ids=["only-other-namespaces-on-the-node", "its-namespace-holds-another-node"])
    def test_pods_of_other_namespaces_are_never_evicted_for_quota(
            self, holders: list[tuple[str, str, int]]) -> None:
        tenants: dict[str, Tenant] = {}
        fleet = self.quota_fleet(tenants, *holders)
        pod = request(manifest("p", gpumem=2000))
        assert preemption_on_node(fleet, "n", pod, HIGH, tenants) is None
