"""The sentence a refused pod's Event carries: what was asked for and what the nodes have.

Pure: fleets built here, ``decide(..., describe=True)``; each expected sentence is written
from the inputs the test chose (cards per node, memory held, the request).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from common.core import (
    Decision,
    Fleet,
    NodeRefusal,
    PodManifest,
    decide,
    decision_document,
    parse_pod,
)
from common.core.fiterror import SENTENCE_LIMIT, fit_error_message
from pyhami.sandbox import DEFAULTS
from tests.builders import (
    T4,
    T4_MEMORY,
    fleet_of,
    hold,
    lab_fleet,
    manifest,
    node,
    node_with,
    run,
    worked_example_fleet,
)

NODE = "gpu-node-1"


def described(fleet: Fleet, pod: PodManifest) -> Decision:
    decision = decide(fleet, parse_pod(pod, DEFAULTS), describe=True)
    assert not decision.scheduled, f"the pod was placed: {decision}"
    return decision


def message(fleet: Fleet, pod: PodManifest) -> str:
    text = described(fleet, pod).message
    assert text is not None
    return text


def gpu(index: int) -> str:
    return f"GPU-{NODE}-{index}"


# What was asked ---------------------------------------------------------------------------


def test_more_cards_than_the_node_has() -> None:
    cards, asked, memory = 4, 5, 1000
    fleet = fleet_of(node(NODE, cards))
    assert message(fleet, manifest(gpus=asked, gpumem=memory)) == (
        f"asked for {asked} cards with {memory} MiB each; "
        f"{NODE} has {cards} cards (NodeInsufficientDevice)")


def test_a_memory_shortfall_names_the_largest_free_memory() -> None:
    fleet = lab_fleet()
    held = [1000 * (i + 1) for i in range(4)]  # card i holds (i + 1) GB
    for i, memory in enumerate(held):
        hold(fleet, f"default/t{i}", NODE, gpu(i), memory=memory)
    asked = T4_MEMORY - min(held) + 1
    assert message(fleet, manifest(gpumem=asked)) == (
        f"asked for 1 card with {asked} MiB; "
        f"{NODE}: 4/4 CardInsufficientMemory (largest free {T4_MEMORY - min(held)} MiB)")


def test_the_failed_nodes_tokens_are_kept_with_what_is_there_after_each() -> None:
    # GPU 0 and GPU 1 have tenants; mutex leaves two idle cards for a pod asking three.
    decision = described(worked_example_fleet(), manifest(policy="mutex", gpus=3))
    reasons = (decision.failed_nodes or {})[NODE]
    assert reasons == "2/4 AllocatedCardsInsufficientRequest, 2/4 ExclusiveDeviceAllocateConflict"
    assert decision.message == (
        f"asked for 3 cards with 1000 MiB each; {NODE}: "
        "2/4 AllocatedCardsInsufficientRequest (2 cards fit, 3 needed), "
        "2/4 ExclusiveDeviceAllocateConflict (in use)")


def test_a_share_of_memory_and_cores_is_asked_as_written() -> None:
    fleet = lab_fleet()
    booked = 50
    for i in range(4):
        hold(fleet, f"default/t{i}", NODE, gpu(i), cores=booked)
    pod = manifest(containers=[{"nvidia.com/gpumem-percentage": 50, "nvidia.com/gpucores": 60}])
    assert message(fleet, pod) == (
        "asked for 1 card with 50% memory, 60% cores; "
        f"{NODE}: 4/4 CardInsufficientCore (largest free {100 - booked}% cores)")


def test_a_pod_asking_no_memory_asks_for_all_of_it() -> None:
    fleet = lab_fleet()
    hold(fleet, "default/t", NODE, gpu(0), memory=1)
    pod = manifest(gpus=4, gpumem=None)
    # And all of its cores: HAMi's exclusive default for a container asking only for cards.
    assert message(fleet, pod) == (
        "asked for 4 cards with 100% memory, 100% cores each; "
        f"{NODE}: 1/4 CardInsufficientMemory (largest free {T4_MEMORY - 1} MiB), "
        "3/4 AllocatedCardsInsufficientRequest (3 cards fit, 4 needed)")


# What is there, per reason -------------------------------------------------------------------


def test_the_card_types_are_named_for_a_type_mismatch() -> None:
    pod = manifest(annotations={"nvidia.com/use-gputype": "A100"})
    assert message(lab_fleet(), pod) == (
        f"asked for 1 card with 1000 MiB; {NODE}: 4/4 CardTypeMismatch (type {T4})")


def test_exhausted_slots_name_the_split_count() -> None:
    split = 2
    fleet = fleet_of(node(NODE, 1, count=split))
    for tenant in range(split):
        hold(fleet, f"default/t{tenant}", NODE, gpu(0))
    assert message(fleet, manifest()) == (
        f"asked for 1 card with 1000 MiB; "
        f"{NODE}: 1/1 CardTimeSlicingExhausted ({split} slots each, all taken)")


def test_booked_cores_exhaust_a_card_for_a_pod_asking_none() -> None:
    fleet = fleet_of(node(NODE, 1))
    hold(fleet, "default/t", NODE, gpu(0), cores=100)
    assert message(fleet, manifest(gpumem=10)) == (
        f"asked for 1 card with 10 MiB; {NODE}: 1/1 CardComputeUnitsExhausted (all cores booked)")


def test_numa_bind_counts_the_cards_one_numa_node_holds() -> None:
    fleet = fleet_of(node_with(NODE, {"numa": 0}, {"numa": 1}))
    pod = manifest(gpus=2, annotations={"nvidia.com/numa-bind": "true"})
    assert message(fleet, pod) == (
        f"asked for 2 cards with 1000 MiB each; {NODE}: "
        "1/2 AllocatedCardsInsufficientRequest (1 card fits on one NUMA node, 2 needed), "
        "1/2 NumaNotFit (on other NUMA nodes)")


def test_topology_reasons_say_what_the_links_lack() -> None:
    pod = manifest(gpus=2, policy="topology-aware")
    no_links = fleet_of(node(NODE, 4, links={}))
    assert message(no_links, pod) == (
        f"asked for 2 cards with 1000 MiB each; "
        f"{NODE}: 4/4 TopologyNotFit (no 2 linked by NVLink)")
    unknown = fleet_of(node(NODE, 4, links=None))
    assert message(unknown, pod) == (
        f"asked for 2 cards with 1000 MiB each; "
        f"{NODE}: 4/4 TopologyUnknown (no NVLink topology reported)")


def test_a_reason_that_says_it_all_stands_alone() -> None:
    fleet = fleet_of(node(NODE, 2, health=False))
    assert message(fleet, manifest()) == (
        f"asked for 1 card with 1000 MiB; {NODE}: 2/2 CardNotHealth")


# Many nodes, several containers, nodes refused before the core -----------------------------


def test_nodes_failing_alike_are_one_part_with_the_best_they_offer() -> None:
    busy = [f"node-{i}" for i in range(1, 5)]
    fleet = fleet_of(*(node(n, 4) for n in busy), node("small", 2), node("tiny", 2),
                     node("one", 1))
    for position, name in enumerate(busy, start=1):  # node-i holds i GB on each card
        for card in range(4):
            hold(fleet, f"default/{name}-{card}", name, f"GPU-{name}-{card}",
                 memory=1000 * position)
    # The largest part first: four nodes, named up to three; then two, then one.
    assert message(fleet, manifest(gpus=3, gpumem=T4_MEMORY)) == (
        f"asked for 3 cards with {T4_MEMORY} MiB each; "
        "node-1, node-2, node-3 and 1 more: 4/4 CardInsufficientMemory "
        f"(largest free {T4_MEMORY - 1000} MiB); "
        "small and tiny each have 2 cards (NodeInsufficientDevice); "
        "one has 1 card (NodeInsufficientDevice)")


def test_the_failing_container_is_named_when_several_ask_for_cards() -> None:
    fleet = lab_fleet()
    pod = manifest(containers=[{"nvidia.com/gpu": 2, "nvidia.com/gpumem": 10000},
                               {"nvidia.com/gpu": 3, "nvidia.com/gpumem": 8000}])
    # c0 takes two cards with 10000 MiB; two idle cards are left for c1's three.
    assert message(fleet, pod) == (
        "asked for 2 cards with 10000 MiB each in c0 and 3 cards with 8000 MiB each in c1; "
        f"{NODE} (for c1): 2/4 AllocatedCardsInsufficientRequest (2 cards fit, 3 needed), "
        f"2/4 CardInsufficientMemory (largest free {T4_MEMORY - 10000} MiB)")


def test_nodes_refused_before_the_core_are_written_as_given() -> None:
    fleet = fleet_of(node("fresh", 4), node("stale", 4))
    request = parse_pod(manifest(gpus=5), DEFAULTS)
    judged = decide(fleet, request, nodes=["fresh"]).failures or {}
    stale = "NodeInventoryStale: no inventory from the node's agent for 31s (limit 30s)"
    others = {"stale": NodeRefusal("NodeInventoryStale",
                                   "no inventory from the node's agent for 31s (limit 30s)"),
              "gone": NodeRefusal("NodeUnknown", "x")}
    assert fit_error_message(fleet, request, {**judged, **others}) == (
        "asked for 5 cards with 1000 MiB each; fresh has 4 cards (NodeInsufficientDevice); "
        "gone: NodeUnknown: x; " f"stale: {stale}")


def test_no_node_at_all() -> None:
    assert message(Fleet(), manifest(gpus=2)) == (
        "asked for 2 cards with 1000 MiB each; pyhami knows no node with GPU cards")


def test_the_sentence_fits_an_event_message_and_counts_what_it_leaves_out() -> None:
    """Within an Event message with HAMi's summary before it (test_event_messages.py)."""
    sizes = range(1, 61)  # one part per node: each has another number of cards
    fleet = fleet_of(*(node(f"node-{size:02d}", size) for size in sizes))
    text = message(fleet, manifest(gpus=100))
    assert len(text.encode()) <= SENTENCE_LIMIT
    shown = text.count(" cards (NodeInsufficientDevice)") + text.count(" card (")
    assert shown > 5
    assert text.endswith(f"; {len(sizes) - shown} more nodes refused")


# The sentence in the decision's document and in ``pyhami explain`` --------------------------


def test_a_rejected_pod_carries_its_reason_as_the_message() -> None:
    decision = run(lab_fleet(), manifest(gpus="lots"))
    assert decision.reason is not None and decision.message == decision.reason
    document = decision_document(decision)
    assert document["message"] == document["reason"]


def test_a_placed_pod_carries_no_message() -> None:
    assert "message" not in decision_document(decide(lab_fleet(), parse_pod(
        manifest(), DEFAULTS), describe=True))


def pyhami(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyhami.cli", *map(str, args)],
                          check=False, capture_output=True, text=True, timeout=60,
                          env={"COLUMNS": "500", "PATH": "/usr/bin:/bin"})


def test_explain_prints_the_sentence_of_the_decision(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"nodes": [{"name": NODE, "devices": [
        {"uuid": gpu(i), "index": i, "type": T4, "memory": T4_MEMORY} for i in range(4)]}]}))
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big"},
        "spec": {"containers": [{"name": "app", "resources": {"limits": {
            "nvidia.com/gpu": 5, "nvidia.com/gpumem": "[1000]"}}}]}}
    manifest_file = tmp_path / "pod.json"
    manifest_file.write_text(json.dumps(pod))
    refused = pyhami("explain", manifest_file, "--cluster", cluster)
    assert refused.returncode == 0, refused.stderr
    # Square brackets in the sentence are printed as they are, not read as markup.
    assert "spec.containers[0].resources.limits[nvidia.com/gpumem]: '[1000]'" in refused.stdout

    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = 1000
    manifest_file.write_text(json.dumps(pod))
    decided = json.loads(pyhami("decide", "--cluster", cluster, "--pod", manifest_file).stdout)
    sentence = decided["message"]
    assert sentence == f"asked for 5 cards with 1000 MiB each; {NODE} has 4 cards " \
                       "(NodeInsufficientDevice)"
    explained = pyhami("explain", manifest_file, "--cluster", cluster)
    assert explained.returncode == 0, explained.stderr
    assert f"-> Pending: {sentence}\n" in explained.stdout
