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

from tests.core.hami.cards import answer, decide_row
from tests.core.hami.tables import Row, cases


@cases("fit")
def test_hami_case(row: Row) -> None:
    got = answer(decide_row(row.given))
    expected = row.expected
    assert {key: got.get(key) for key in expected} == expected
