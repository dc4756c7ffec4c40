"""Choosing N cards, numa-bind, topology-aware, and set-level reasons."""

from __future__ import annotations

from typing import Any

from tests.builders import fleet_of, hold, indexes, manifest, node, node_with, run

NUMA_BIND = {"nvidia.com/numa-bind": "true"}


def islands(name: str = "n", size: int = 8, **extra: Any) -> list[dict[str, Any]]:
    """Two NVLink islands: cards 0..size/2-1 linked together, the rest together."""
    half = size // 2
    cards = []
    for i in range(size):
        group = range(0, half) if i < half else range(half, size)
        cards.append({"links": {f"GPU-{name}-{j}": 4 for j in group if j != i},
                      "numa": 0 if i < half else 1, **extra})
    return cards


class TestNCards:
    def test_takes_the_first_n_in_chain_order(self) -> None:
        fleet = fleet_of(node("n", 4))
        hold(fleet, "default/a", "n", "GPU-n-2")
        assert indexes(run(fleet, manifest(gpus=2, policy="binpack"))) == [[2, 0]]
        assert indexes(run(fleet, manifest(gpus=3))) == [[0, 1, 3]]

    def test_the_article_reason_string_for_a_mutex_pod(self) -> None:
        fleet = fleet_of(node("n", 3))
        hold(fleet, "default/a", "n", "GPU-n-0")
        hold(fleet, "default/b", "n", "GPU-n-1")
        decision = run(fleet, manifest(gpus=2, policy="mutex"))
        assert decision.failed_nodes == {
            "n": "1/3 AllocatedCardsInsufficientRequest, 2/3 ExclusiveDeviceAllocateConflict"
        }

    def test_more_cards_than_the_node_has(self) -> None:
        decision = run(fleet_of(node("n", 2)), manifest(gpus=3))
        assert decision.failed_nodes == {"n": "2/2 NodeInsufficientDevice"}

    def test_no_eligible_card_leaves_out_the_insufficient_count(self) -> None:
        decision = run(fleet_of(node("n", 2, health=False)), manifest(gpus=2))
        assert decision.failed_nodes == {"n": "2/2 CardNotHealth"}


class TestNumaBind:
    def test_cards_of_one_container_share_a_numa_node(self) -> None:
        fleet = fleet_of(node_with("n", {"numa": 0}, {"numa": 1}, {"numa": 1}, {"numa": 0}))
        hold(fleet, "default/a", "n", "GPU-n-1")
        pod = manifest(gpus=2, policy="binpack", annotations=NUMA_BIND)
        # Best ranked is card 1 (busy, NUMA 1): its group supplies 1 and 2.
        assert indexes(run(fleet, pod)) == [[1, 2]]
        # Without the binding binpack takes card 1 and then the lowest index.
        assert indexes(run(fleet, manifest(gpus=2, policy="binpack"))) == [[1, 0]]

    def test_a_group_that_cannot_supply_n_is_skipped(self) -> None:
        fleet = fleet_of(node_with("n", {"numa": 0}, {"numa": 1}, {"numa": 1}, {"numa": 1}))
        pod = manifest(gpus=3, annotations=NUMA_BIND)
        assert indexes(run(fleet, pod)) == [[1, 2, 3]]

    def test_unknown_numa_cards_belong_to_no_group(self) -> None:
        fleet = fleet_of(node_with("n", {"numa": -1}, {"numa": -1}, {"numa": 0}))
        decision = run(fleet, manifest(gpus=2, annotations=NUMA_BIND))
        assert decision.failed_nodes == {
            "n": "1/3 AllocatedCardsInsufficientRequest, 2/3 NumaNotFit"
        }

    def test_numa_reasons_count_the_best_ranked_group(self) -> None:
        fleet = fleet_of(node_with("n", {"numa": 0}, {"numa": 1}, {"numa": 1}, {"numa": 2}))
        hold(fleet, "default/a", "n", "GPU-n-1")
        pod = manifest(gpus=3, policy="binpack", annotations=NUMA_BIND)
        assert run(fleet, pod).failed_nodes == {
            "n": "2/4 AllocatedCardsInsufficientRequest, 2/4 NumaNotFit"
        }

    def test_a_single_card_needs_no_group(self) -> None:
        fleet = fleet_of(node("n", 1, numa=-1))
        assert indexes(run(fleet, manifest(annotations=NUMA_BIND))) == [[0]]


class TestTopologyAware:
    def test_chooses_a_linked_set_inside_one_island(self) -> None:
        fleet = fleet_of(node_with("n", *islands()))
        for gpu in (0, 1, 2):
            hold(fleet, f"default/t{gpu}", "n", f"GPU-n-{gpu}")
        # Spread ranks idle 3..7 first, then busy 0..2. The best-ranked card, 3, belongs
        # to a linked set only with 0..2: that set's ranks (1, 6, 7, 8) come first.
        assert indexes(run(fleet, manifest(gpus=4, policy="topology-aware"))) == [[3, 0, 1, 2]]
        # With mutex 0..2 are gone, so 3 has no partners and the other island wins.
        decision = run(fleet, manifest(gpus=4, policy="mutex,topology-aware"))
        assert indexes(decision) == [[4, 5, 6, 7]]
        # Without the filter the first four idle cards cross islands.
        assert indexes(run(fleet, manifest(gpus=4))) == [[3, 4, 5, 6]]

    def test_takes_the_lexicographically_smallest_ranked_set(self) -> None:
        fleet = fleet_of(node_with("n", *islands()))
        hold(fleet, "default/a", "n", "GPU-n-5")
        decision = run(fleet, manifest(gpus=2, policy="topology-aware,binpack"))
        # Card 5 ranks first; its best-ranked linked partner is card 4.
        assert indexes(decision) == [[5, 4]]

    def test_links_listed_on_one_side_count(self) -> None:
        fleet = fleet_of(node_with("n", {"links": {"GPU-n-1": 2}}, {"links": {}}, {"links": {}}))
        decision = run(fleet, manifest(gpus=2, policy="topology-aware"))
        assert indexes(decision) == [[0, 1]]

    def test_an_nvswitch_node_links_every_pair(self) -> None:
        every = [{"links": {f"GPU-n-{j}": 12 for j in range(8) if j != i}} for i in range(8)]
        fleet = fleet_of(node_with("n", *every))
        hold(fleet, "default/a", "n", "GPU-n-0")
        assert indexes(run(fleet, manifest(gpus=4, policy="topology-aware"))) == [[1, 2, 3, 4]]

    def test_no_linked_set_fails_with_topology_not_fit(self) -> None:
        cordon = {"hami.io/device-cordon": "GPU-n-0"}
        fleet = fleet_of(node_with("n", *islands(size=4), annotations=cordon))
        hold(fleet, "default/b", "n", "GPU-n-2", memory=15000)
        decision = run(fleet, manifest(gpus=2, gpumem=1000, policy="topology-aware"))
        # Cards 1 and 3 are eligible but sit on different islands.
        assert decision.failed_nodes == {
            "n": "1/4 CardCordoned, 1/4 CardInsufficientMemory, 2/4 TopologyNotFit"
        }

    def test_a_pcie_only_node_fails_with_topology_not_fit(self) -> None:
        decision = run(fleet_of(node("n", 4)), manifest(gpus=2, policy="topology-aware"))
        assert decision.failed_nodes == {"n": "4/4 TopologyNotFit"}

    def test_a_node_without_link_data_is_topology_unknown(self) -> None:
        decision = run(fleet_of(node("n", 4, links=None)),
                       manifest(gpus=2, policy="topology-aware"))
        assert decision.failed_nodes == {"n": "4/4 TopologyUnknown"}

    def test_one_card_is_not_filtered(self) -> None:
        decision = run(fleet_of(node("n", 4, links=None)),
                       manifest(gpus=1, policy="topology-aware"))
        assert indexes(decision) == [[0]]

    def test_with_numa_bind_the_set_is_linked_and_on_one_numa_node(self) -> None:
        # NVSwitch links everything, but NUMA splits the cards 0-3 / 4-7.
        every = [{"links": {f"GPU-n-{j}": 12 for j in range(8) if j != i},
                  "numa": 0 if i < 4 else 1} for i in range(8)]
        fleet = fleet_of(node_with("n", *every))
        hold(fleet, "default/a", "n", "GPU-n-0")
        pod = manifest(gpus=4, policy="topology-aware", annotations=NUMA_BIND)
        # Card 1 ranks first and NUMA 0 holds a linked set with busy card 0.
        assert indexes(run(fleet, pod)) == [[1, 2, 3, 0]]
        pod = manifest(gpus=4, policy="mutex,topology-aware", annotations=NUMA_BIND)
        assert indexes(run(fleet, pod)) == [[4, 5, 6, 7]]
        # Five cards never fit one NUMA node of four.
        pod = manifest(gpus=5, policy="topology-aware", annotations=NUMA_BIND)
        assert run(fleet, pod).failed_nodes == {
            "n": "4/8 AllocatedCardsInsufficientRequest, 4/8 NumaNotFit"
        }
