"""HAMi's tests of card and node scores and of the orders built on them
(``cases/scores.yaml``).

A row's ``given.cards`` (or ``given.nodes``, name to cards) are HAMi's ``DeviceUsage``
figures, read by ``tests.core.hami.cards``; ``want`` names what the Go test asserts:

- ``score`` / ``scores``: a card's score (``ComputeScore``), the first card's or each
  card's by id, under ``given.weights`` (HAMi's ``DeviceScoringWeights``, default 1,1,1);
- ``binpack`` / ``spread``: the card a one-card container takes under that policy;
- ``less``: HAMi's ``DeviceUsageList.Less(0, 1)`` under ``given.policy`` (and
  ``given.numa_bind``). HAMi's ``Fit`` takes cards from the end of the sorted list, so
  ``Less(0, 1)`` says card 1 is preferred: here, that pyhami ranks card 1 before card 0
  (``PodView.rank``, the order before the filters, as ``Less`` is);
- ``node_less``: HAMi's ``NodeScoreList.Less(0, 1)``: HAMi takes the last node of the
  sorted list, so that pyhami chooses node 1;
- ``node_score``: ``ComputeDefaultScore`` of the node (``Snapshot.node_scores``);
- ``fit`` / ``card_set``: a container placed as in ``test_fit``.

pyhami rounds scores to 6 places; HAMi's are float32, compared as the Go test writes them.
"""

from __future__ import annotations

from typing import Any

from common.core import Fleet, parse_pod
from common.core.placement import PodView
from pyhami.sandbox import DEFAULTS
from tests.builders import manifest, run
from tests.core.hami.cards import NODE, add_node, decide_row, hami_fleet
from tests.core.hami.cards import answer as fit_answer
from tests.core.hami.tables import Row, cases

PROBE: dict[str, int | str] = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1,
                               "nvidia.com/gpucores": 0}
"""The container a row's choices are asked for: one card, as little as a card gives."""


ROOMY = {"count": 100, "totalmem": 1000, "totalcore": 100}
"""What a ``less`` or ``node_less`` row's cards are besides the fields it gives: HAMi's
``Less`` reads only ``Score``, ``Numa``, ``Used`` and ``Index`` of the literals, which
leave the rest zero; a card of zero capacity would score 0 in pyhami whatever its use."""


def roomy(cards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**ROOMY, **card} for card in cards]


def pod_annotations(given: dict[str, Any], policy: str | None = None) -> dict[str, str]:
    notes: dict[str, str] = {}
    if "weights" in given:
        weights = given["weights"]
        notes["hami.io/device-scoring-weights"] = ",".join(
            f"{key}={weights[key]}" for key in ("slot", "core", "memory"))
    if policy or given.get("policy"):
        notes["hami.io/gpu-scheduler-policy"] = policy or given["policy"]
    if given.get("numa_bind"):
        notes["nvidia.com/numa-bind"] = "true"
    return notes


def card_scores(given: dict[str, Any]) -> dict[str, float]:
    decision = run(hami_fleet(given["cards"]),
                   manifest(annotations=pod_annotations(given), containers=[PROBE]),
                   explain=True)
    assert decision.explain is not None
    return {row.uuid: row.score for row in decision.explain}


def pick(given: dict[str, Any], policy: str) -> str:
    decision = run(hami_fleet(given["cards"]),
                   manifest(annotations=pod_annotations(given, policy), containers=[PROBE]))
    ((card,),) = decision.cards
    return card.uuid


def ranks_second_first(given: dict[str, Any]) -> bool:
    first, second = roomy(given["cards"])
    fleet = hami_fleet([{**first, "id": "first"}, {**second, "id": "second"}])
    pod = parse_pod(manifest(annotations=pod_annotations(given), containers=[PROBE]), DEFAULTS)
    snapshot = fleet.snapshot
    ranked = [snapshot.devices[card].uuid for card in PodView(snapshot, pod).rank(0, [0, 1])]
    return ranked == ["second", "first"]


def nodes_fleet(given: dict[str, Any]) -> Fleet:
    fleet = Fleet()
    for name, cards in given["nodes"].items():
        add_node(fleet, name, roomy(cards))
    return fleet


def chooses_second_node(given: dict[str, Any]) -> bool:
    notes = {"hami.io/node-scheduler-policy": given["policy"]}
    decision = run(nodes_fleet(given), manifest(annotations=notes, containers=[PROBE]))
    return bool(decision.node == list(given["nodes"])[1])


def node_score(given: dict[str, Any]) -> float:
    fleet = add_node(Fleet(), NODE, given["cards"])
    return float(fleet.snapshot.node_scores()[0])


def answer(row: Row) -> dict[str, Any]:
    given, wanted = row.given, set(row.expected)
    got: dict[str, Any] = {}
    if wanted & {"score", "scores"}:
        scores = card_scores(given)
        got["scores"] = scores
        got["score"] = next(iter(scores.values()))
    for policy in wanted & {"binpack", "spread"}:
        got[policy] = pick(given, policy)
    if "less" in wanted:
        got["less"] = ranks_second_first(given)
    if "node_less" in wanted:
        got["node_less"] = chooses_second_node(given)
    if "node_score" in wanted:
        got["node_score"] = node_score(given)
    if wanted & {"fit", "card_set", "cards"}:
        got.update(fit_answer(decide_row(given)))
    return got


@cases("scores")
def test_hami_case(row: Row) -> None:
    got = answer(row)
    expected = row.expected
    assert {key: got.get(key) for key in expected} == expected
