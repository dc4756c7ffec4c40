"""HAMi's tests of how a card is judged for one container (``cases/fit.yaml``).

HAMi's ``Fit`` is handed one node's cards (``DeviceUsage``) and one container's request
(``ContainerDeviceRequest``) and answers whether it fits, the cards it takes, and the
reasons the node fails (``count/total Reason``, joined). Here the cards become a
one-node fleet (``tests.core.hami.cards``), the request a pod of one container, and
pyhami decides it. A row's ``want`` names what the Go test asserts:

- ``fit``: whether the container is placed;
- ``cards``: the card ids taken, in order; ``card_set``: the same, in any order;
- ``grants``: per card taken, ``uuid,memory,cores`` as booked;
- ``reason``: the node's reason string; ``reasons``: the count of each reason (the Go
  test compares counts, not the totals).
"""

from __future__ import annotations

from typing import Any

from common.core import Decision
from tests.builders import manifest, run
from tests.core.hami.cards import NODE, hami_fleet, request_annotations, request_limits
from tests.core.hami.tables import Row, cases


def reason_counts(reason: str) -> dict[str, int]:
    """``3/10 CardUuidMismatch, 1/10 CardInsufficientCore`` as ``{reason: count}``."""
    counts: dict[str, int] = {}
    for part in reason.split(", "):
        share, name = part.split(" ", 1)
        counts[name] = int(share.split("/", 1)[0])
    return counts


def decide_row(given: dict[str, Any]) -> Decision:
    fleet = hami_fleet(given["cards"], given.get("node_annotations"))
    request = given["request"]
    notes = {**given.get("annotations", {}), **request_annotations(request)}
    return run(fleet, manifest(annotations=notes, containers=[request_limits(request)]))


def answer(decision: Decision) -> dict[str, Any]:
    """Everything a row may assert, of pyhami's decision."""
    if decision.scheduled:
        (cards,) = decision.cards
        return {"fit": True, "cards": [card.uuid for card in cards],
                "card_set": sorted(card.uuid for card in cards),
                "grants": [f"{card.uuid},{card.memory},{card.cores}" for card in cards]}
    assert decision.failed_nodes is not None, decision.reason
    reason = decision.failed_nodes[NODE]
    return {"fit": False, "reason": reason, "reasons": reason_counts(reason)}


@cases("fit")
def test_hami_case(row: Row) -> None:
    got = answer(decide_row(row.given))
    expected = row.expected
    assert {key: got.get(key) for key in expected} == expected
