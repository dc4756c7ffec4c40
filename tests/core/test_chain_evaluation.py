"""The policy chain, parsed and evaluated (filters first, keys in order)."""

from __future__ import annotations

import io

import pytest

from common.core import (
    Chain,
    Node,
    decide,
    decision_document,
    parse_chain,
    parse_default_chain,
    parse_pod,
)
from common.core.policy import Filter, SortKey
from pyhami.output import print_decision, stdout_console
from pyhami.sandbox import DEFAULTS
from tests.builders import (
    fleet_of,
    hold,
    indexes,
    lab_fleet,
    manifest,
    node,
    node_with,
    place,
    run,
    worked_example_fleet,
)

SPREAD = parse_default_chain("spread")


class TestParse:
    def test_splits_trims_and_matches_names_case_insensitively(self) -> None:
        parsed = parse_chain("  Mutex , BINPACK ,numa ", SPREAD)
        assert parsed.chain == Chain(frozenset({Filter.MUTEX}), (SortKey.BINPACK, SortKey.NUMA))
        assert parsed.ignored == ()

    def test_drops_empty_entries_and_repeats_keeping_first_place(self) -> None:
        parsed = parse_chain("numa,,binpack, numa ,BinPack,", SPREAD)
        assert parsed.chain.sort_keys == (SortKey.NUMA, SortKey.BINPACK)

    def test_unknown_names_are_ignored_and_reported(self) -> None:
        parsed = parse_chain("binpack,fastest,numa", SPREAD)
        assert parsed.chain.sort_keys == (SortKey.BINPACK, SortKey.NUMA)
        assert parsed.ignored == ("fastest",)

    def test_no_known_name_left_means_the_cluster_default(self) -> None:
        default = parse_default_chain("mutex,binpack")
        parsed = parse_chain(" , bogus", default)
        assert parsed.chain == default
        assert parsed.ignored == ("bogus",)

    def test_filters_are_not_sort_keys(self) -> None:
        parsed = parse_chain("topology-aware,mutex", SPREAD)
        assert parsed.chain.filters == {Filter.MUTEX, Filter.TOPOLOGY_AWARE}
        assert parsed.chain.sort_keys == ()
        assert parsed.chain.ranking == (SortKey.SPREAD,)

    def test_a_default_chain_with_an_unknown_name_is_refused(self) -> None:
        with pytest.raises(ValueError, match="fastest"):
            parse_default_chain("binpack,fastest")

    def test_ignored_policies_are_reported_in_the_decision(self) -> None:
        decision = run(lab_fleet(), manifest(policy="binpack,turbo"))
        assert decision.ignored_policies == ("turbo",)
        assert indexes(decision) == [[0]]


class TestWorkedExample:
    """The article's figure: one node, four T4, GPU 0 at 3.30, GPU 1 at 1.65."""

    def test_mutex_binpack_lands_on_gpu_2(self) -> None:
        decision = run(worked_example_fleet(), manifest(policy="mutex,binpack"))
        assert decision.node == "gpu-node-1"
        assert indexes(decision) == [[2]]

    def test_plain_binpack_lands_on_gpu_0(self) -> None:
        assert indexes(run(worked_example_fleet(), manifest(policy="binpack"))) == [[0]]

    def test_explain_shows_the_scores_and_the_mutex_filter(self) -> None:
        decision = run(worked_example_fleet(), manifest(policy="mutex,binpack"), explain=True)
        assert decision.explain is not None
        rows = {r.index: r for r in decision.explain}
        assert (rows[0].score, rows[0].used) == (3.302083, 2)
        assert (rows[1].score, rows[1].used) == (1.651042, 1)
        assert rows[2].score == rows[3].score == 0.0
        for gpu in (0, 1):
            assert rows[gpu].filtered_by == "ExclusiveDeviceAllocateConflict"
            assert rows[gpu].rank is None
        assert (rows[2].rank, rows[3].rank) == (1, 2)
        assert [r.index for r in decision.explain if r.chosen] == [2]

    def test_a_node_refused_before_its_cards_shows_every_card_refused_for_it(self) -> None:
        # "small" has 2 cards, too few for 3; "big" has 4 cards of 15360 MiB, too small
        # for 20000 MiB each. Both nodes' cards are also too small: the small node's must
        # still read as its node-level refusal, as failed_nodes and the sentence say.
        fleet = fleet_of(node("small", 2), node("big", 4))
        decision = decide(fleet, parse_pod(manifest(gpus=3, gpumem=20000), DEFAULTS),
                          explain=True, describe=True)
        assert decision.node is None and decision.explain is not None
        by_node: dict[str, set[str | None]] = {}
        for row in decision.explain:
            by_node.setdefault(row.node, set()).add(row.filtered_by)
            assert row.rank is None and not row.chosen
        assert by_node == {"small": {"NodeInsufficientDevice"},
                           "big": {"CardInsufficientMemory"}}
        assert decision_document(decision)["failed_nodes"]["small"] == \
            "2/2 NodeInsufficientDevice"
        out = io.StringIO()
        print_decision(decision_document(decision), stdout_console(out))
        rows = [line.split() for line in out.getvalue().splitlines()]
        # node, card (two words), tenants, score, filtered by, rank
        assert [(row[0], row[5], row[6]) for row in rows if row[0] in ("small", "big")] == [
            ("big", "CardInsufficientMemory", "-")] * 4 + [
            ("small", "NodeInsufficientDevice", "-")] * 2


class TestOrder:
    def test_filters_run_before_sort_keys_whatever_the_written_order(self) -> None:
        for chain in ("binpack,mutex", "mutex,binpack"):
            assert indexes(run(worked_example_fleet(), manifest(policy=chain))) == [[2]]

    def test_first_key_decides_and_later_keys_only_break_ties(self) -> None:
        fleet = fleet_of(node_with("n", {"numa": 1}, {"numa": 1}, {"numa": 0}, {"numa": 0}))
        hold(fleet, "default/busy", "n", "GPU-n-0")
        assert indexes(run(fleet, manifest(policy="binpack,numa"))) == [[0]]
        assert indexes(run(fleet, manifest(policy="numa,binpack"))) == [[2]]
        assert indexes(run(fleet, manifest(policy="spread"))) == [[1]]
        assert indexes(run(fleet, manifest(policy="spread,numa"))) == [[2]]

    def test_unknown_numa_ranks_after_every_known_id(self) -> None:
        fleet = fleet_of(node_with("n", {"numa": -1}, {"numa": 3}, {"numa": 1}))
        assert indexes(run(fleet, manifest(policy="numa"))) == [[2]]

    def test_ties_go_to_the_lower_device_index_not_list_order(self) -> None:
        base = node("n", 4)
        fleet = fleet_of(Node(name="n", cards=list(reversed(base.cards))))
        assert indexes(run(fleet, manifest(policy="binpack"))) == [[0]]
        assert indexes(run(fleet, manifest(policy="spread"))) == [[0]]

    def test_tiebreak_uses_the_index_field(self) -> None:
        fleet = fleet_of(node_with("n", {"index": 7, "uuid": "GPU-a"},
                                   {"index": 6, "uuid": "GPU-b"}))
        decision = run(fleet, manifest())
        assert decision.cards[0][0].uuid == "GPU-b"
        assert decision.cards[0][0].index == 6

    def test_a_chain_without_sort_keys_ranks_by_spread(self) -> None:
        fleet = lab_fleet()
        for gpu, memory in enumerate((1000, 3000, 2000, 500)):
            hold(fleet, f"default/t{gpu}", "gpu-node-1", f"GPU-gpu-node-1-{gpu}", memory=memory)
        assert indexes(run(fleet, manifest(policy="topology-aware"))) == [[3]]
        assert indexes(run(fleet, manifest(policy="spread"))) == [[3]]
        assert indexes(run(fleet, manifest(policy="binpack"))) == [[1]]

    @pytest.mark.parametrize("chain", ["mutex", "mutex,topology-aware"])
    def test_mutex_chains_without_sort_keys_take_the_lowest_idle_card(self, chain: str) -> None:
        fleet = lab_fleet()
        hold(fleet, "default/a", "gpu-node-1", "GPU-gpu-node-1-0", "GPU-gpu-node-1-2")
        assert indexes(run(fleet, manifest(policy=chain))) == [[1]]


class TestSingleValues:
    def test_default_spread_walks_the_cards_in_index_order(self) -> None:
        fleet = lab_fleet()
        placed = [indexes(place(fleet, manifest(name=f"s{i}"))) for i in range(4)]
        assert placed == [[[0]], [[1]], [[2]], [[3]]]

    def test_binpack_stacks_on_one_card(self) -> None:
        fleet = lab_fleet()
        placed = [indexes(place(fleet, manifest(name=f"b{i}", policy="binpack")))
                  for i in range(3)]
        assert placed == [[[0]], [[0]], [[0]]]

    def test_mutex_waits_while_every_card_has_a_tenant_then_takes_the_freed_one(self) -> None:
        fleet = lab_fleet()
        for i in range(4):
            place(fleet, manifest(name=f"s{i}"))
        blocked = run(fleet, manifest(name="m", policy="mutex"))
        assert not blocked.scheduled
        assert blocked.failed_nodes == {"gpu-node-1": "4/4 ExclusiveDeviceAllocateConflict"}
        fleet.release("default/s1")
        assert indexes(run(fleet, manifest(name="m", policy="mutex"))) == [[1]]

    def test_numa_alone_prefers_the_lower_numa_node(self) -> None:
        fleet = fleet_of(node_with("n", {"numa": 1}, {"numa": 1}, {"numa": 0}, {"numa": 0}))
        assert indexes(run(fleet, manifest(policy="numa"))) == [[2]]
