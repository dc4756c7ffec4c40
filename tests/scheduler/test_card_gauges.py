"""The per-card gauges, written without prometheus_client's collectors, read as it would
write them; a node's labels follow its inventory."""

from __future__ import annotations

import msgspec
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from common.core import Allocation, CardGrant, Fleet
from common.core.model import Card, Node
from common.gzipstream import DeflatedRun
from common.wire import Measured, MeasuredCard
from scheduler.metrics import CARD_FAMILIES, MEASURED_CARD_FAMILIES, CardGauges, plain

MIB = 1024 * 1024
# A card model name may hold what the exposition formats escape.
ODD_TYPE = 'NVIDIA "T4" \\ rev\nB'


def _fleet() -> Fleet:
    fleet = Fleet()
    fleet.upsert_node(Node(name="a", cards=[
        Card(uuid="GPU-a0", index=0, type="NVIDIA-A100", memory=81920),
        Card(uuid="GPU-a1", index=1, type=ODD_TYPE, memory=15360, cores=50, health=False,
             physical_memory=7680, physical_cores=100)]))
    fleet.upsert_node(Node(name="b", cards=[
        Card(uuid="GPU-b0", index=0, type="NVIDIA-A100", memory=0)]))
    fleet.allocate("default/p", Allocation(node="a", containers=(
        (CardGrant("GPU-a1", 3000, 30),), (CardGrant("GPU-a1", 1000, 10),))))
    return fleet


class Reference(Collector):
    """The same gauges through prometheus_client, by hand: what the text must read as."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self) -> list[Metric]:
        families = {name: GaugeMetricFamily(name, documentation,
                                            labels=["node", "device_uuid", "device_index",
                                                    "device_type", "zone", "device_cores",
                                                    "device_memory_limit"])
                    for name, documentation in CARD_FAMILIES}
        for node in self.fleet.nodes():
            for card in node.cards:
                usage = self.fleet.usage(node.name, card.uuid)
                labels = [node.name, card.uuid, str(card.index), card.type, "vGPU", "", ""]
                with_cores = [*labels[:5], str(card.cores), ""]
                families["hami_gpu_memory_limit_bytes"].add_metric(labels, card.memory * MIB)
                families["hami_gpu_core_limit_ratio"].add_metric(labels, card.cores)
                families["hami_gpu_memory_allocated_bytes"].add_metric(with_cores,
                                                                       usage.memory * MIB)
                families["hami_gpu_shared_count"].add_metric(labels, usage.tenants)
                families["hami_gpu_core_allocated_ratio"].add_metric(labels, usage.cores)
                families["hami_node_gpu_overview"].add_metric(
                    [*with_cores[:6], str(card.memory)], usage.memory * MIB)
                if card.memory:
                    families["hami_node_gpu_memory_allocated_ratio"].add_metric(
                        labels, usage.memory / card.memory)
                families["pyhami_gpu_healthy"].add_metric([*labels[:4], "", "", ""],
                                                          1 if card.health else 0)
                families["pyhami_gpu_physical_memory_bytes"].add_metric(
                    [*labels[:4], "", "", ""], card.own_memory * MIB)
                families["pyhami_gpu_physical_core_ratio"].add_metric(
                    [*labels[:4], "", "", ""], card.own_cores)
        return list(families.values())


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    # Labels the reference leaves empty are absent from the series.
    return [(sample.name, {k: v for k, v in sample.labels.items() if v}, sample.value)
            for family in text_string_to_metric_families(text) for sample in family.samples]


def test_the_cards_text_reads_as_prometheus_client_would_write_it() -> None:
    fleet = _fleet()
    registry = CollectorRegistry()
    registry.register(Reference(fleet))
    expected = _samples(generate_latest(registry).decode())
    assert _samples(CardGauges(lambda: fleet).text()) == expected
    # Worked by hand: 4000 MiB of GPU-a1's 15360 taken by two containers.
    assert ("hami_gpu_memory_allocated_bytes",
            {"node": "a", "device_uuid": "GPU-a1", "device_index": "1", "device_cores": "50",
             "device_type": ODD_TYPE, "zone": "vGPU"}, 4000.0 * MIB) in expected
    assert ("hami_gpu_shared_count", {"node": "a", "device_uuid": "GPU-a1", "device_index": "1",
                                      "device_type": ODD_TYPE, "zone": "vGPU"}, 2.0) in expected
    # A card of no memory has no allocated ratio.
    assert not any(name == "hami_node_gpu_memory_allocated_ratio" and labels["node"] == "b"
                   for name, labels, _ in expected)


@pytest.mark.parametrize(("card", "registered", "physical"), [
    pytest.param(Card(uuid="GPU-c0", index=0, type="NVIDIA-T4", memory=15360),
                 (15360, 100), (15360, 100), id="unscaled"),
    pytest.param(Card(uuid="GPU-c0", index=0, type="NVIDIA-T4", memory=30720,
                      physical_memory=15360), (30720, 100), (15360, 100), id="memory-x2"),
    pytest.param(Card(uuid="GPU-c0", index=0, type="NVIDIA-T4", memory=15360, cores=150,
                      physical_cores=100), (15360, 150), (15360, 100), id="cores-x1.5"),
])
def test_hamis_gauges_show_the_registered_figures_and_pyhamis_the_physical(
        card: Card, registered: tuple[int, int], physical: tuple[int, int]) -> None:
    """HAMi's limit gauges report the registered (scaled) figures, as HAMi's scheduler
    reports its registered devmem and devcore; pyhami's the card's own beside them."""
    fleet = Fleet()
    fleet.upsert_node(Node(name="c", cards=[card]))
    found = {name: value for name, _, value in _samples(CardGauges(lambda: fleet).text())}
    assert (found["hami_gpu_memory_limit_bytes"], found["hami_gpu_core_limit_ratio"]) == (
        registered[0] * MIB, registered[1])
    assert (found["pyhami_gpu_physical_memory_bytes"],
            found["pyhami_gpu_physical_core_ratio"]) == (physical[0] * MIB, physical[1])


def test_a_replaced_inventory_is_labelled_afresh_and_a_forgotten_node_leaves() -> None:
    fleet = _fleet()
    gauges = CardGauges(lambda: fleet)
    gauges.text()
    a = fleet.node("a")
    assert a is not None
    fleet.upsert_node(msgspec.structs.replace(
        a, cards=[msgspec.structs.replace(a.cards[0], type="NVIDIA-H100")]))
    fleet.remove_node("b")
    samples = _samples(gauges.text())
    assert {labels["device_uuid"] for _, labels, _ in samples} == {"GPU-a0"}
    assert {labels["device_type"] for _, labels, _ in samples} == {"NVIDIA-H100"}


def test_the_text_comes_in_pieces_of_a_block_of_nodes() -> None:
    fleet = _fleet()
    every = list(CardGauges(lambda: fleet, cards_per_piece=8).pieces())
    # Writing the nodes lets the loop run (a turn a block of nodes written, a node a block
    # at 8 cards a piece): empty pieces first, one a node.
    nodes = sum(1 for _ in fleet.nodes())
    assert every[:nodes] == [b""] * nodes and every[nodes] != b""
    pieces = every[nodes:]
    # Per family: its header (plain), then its lines, kept compressed a block (here a node)
    # at a time (a's 2 cards, b's one); the measured families' nodes empty (no card
    # measured).
    families = len(CARD_FAMILIES) + len(MEASURED_CARD_FAMILIES)
    assert len(pieces) == 2 * families
    header, run = pieces[:2]
    assert isinstance(header, bytes) and header.startswith(b"# HELP hami_gpu_memory_limit_bytes ")
    assert isinstance(run, DeflatedRun)
    assert [piece.text().count(b"\n") for piece in run.pieces] == [2, 1]
    assert b"".join(plain(pieces)).decode() == CardGauges(lambda: fleet).text()


def test_the_measured_figures_show_for_the_cards_measured_only() -> None:
    """``pyhami_card_memory_used_bytes`` and ``pyhami_card_utilization_ratio``: a card's
    labels as the other card gauges write them; a card without a figure, a card its node
    does not report and a node that sends none have no series."""
    fleet = _fleet()
    measured = {"a": Measured(at=1.0, cards=[
        MeasuredCard(uuid="GPU-a1", memory_used=4500, utilization=37),
        MeasuredCard(uuid="GPU-a0"),
        MeasuredCard(uuid="GPU-gone", memory_used=1, utilization=1)])}
    text = CardGauges(lambda: fleet, measured=lambda: measured).text()
    found = [(name, labels, value) for name, labels, value in _samples(text)
             if name.startswith("pyhami_card_")]
    labels = {"node": "a", "device_uuid": "GPU-a1", "device_index": "1",
              "device_type": ODD_TYPE}
    assert found == [("pyhami_card_memory_used_bytes", labels, 4500.0 * MIB),
                     ("pyhami_card_utilization_ratio", labels, 0.37)]
