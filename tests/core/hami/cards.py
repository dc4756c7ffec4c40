"""A one-node fleet from the figures of HAMi's ``DeviceUsage`` literals.

A row gives each card as HAMi's test does: ``id``, ``index``, ``used`` (tenants),
``count``, ``usedmem``, ``totalmem``, ``usedcores``, ``totalcore``, ``numa``, ``type``,
``health``, and optionally ``score`` (a figure the Go test sets on the card directly);
what a literal leaves out is Go's zero value, as there. The card becomes a pyhami
``Card`` and its usage the ledger and the agent's view:

- ``usedmem`` and ``usedcores`` are one tenant's grant on the card;
- ``used`` is the tenants the agent sees, so that the card's tenants are ``used``
  (a card that books memory or cores holds at least the one tenant that booked them);
  or, where a row gives the processes on the card (``pod_processes``, per pod, and
  ``stray_processes``, owned by no pod), what the agent counts of them (``seen_tenants``);
- ``score`` becomes as many processes on a card of 100 slots: pyhami ranks cards by
  the score their usage gives, so a score the Go test writes in is given as usage that
  ranks the cards alike (only ``score``'s order matters where a row gives it);
- ``index``: HAMi lets cards share an index where pyhami forbids it (a repeated index
  could give one card twice), so a node whose literals repeat one is numbered by
  position;
- ``type`` is HAMi's device type (``NVIDIA`` unless given), which pyhami reads as the
  card's model: a request HAMi makes for another type is written as the pod's
  ``nvidia.com/use-gputype`` naming that type (``request_annotations``);
- ``pair_scores`` (HAMi's ``DevicePairScore``) become NVLink links of that weight, a
  score of 0 or less no link (pyhami's links are lanes, never negative).
"""

from __future__ import annotations

from typing import Any

from agent.monitor.processes import tenants_per_card
from common.core import Card, CardGrant, Decision, Fleet, Node
from common.core.ledger import Allocation
from tests.builders import manifest, run

NODE = "node"
HAMI_TYPE = "NVIDIA"
SCORED_SLOTS = 100


def _indexes(cards: list[dict[str, Any]]) -> list[int]:
    given = [int(card.get("index", 0)) for card in cards]
    return given if len(set(given)) == len(given) else list(range(len(cards)))


def _links(card: dict[str, Any]) -> dict[str, int] | None:
    scores = card.get("pair_scores")
    if scores is None:
        return None
    return {peer: int(score) for peer, score in scores.items() if score > 0}


def seen_tenants(card: dict[str, Any], uuid: str) -> int:
    """The tenants the agent reports for a card whose literal gives the processes it runs:
    ``pod_processes``, per pod on the card, how many compute processes it runs, and
    ``stray_processes``, processes no pod owns; counted by the agent's own rule
    (``tenants_per_card``), as its node monitor attributes them."""
    processes = [(uuid, 1000 * pod + number, f"pod-{pod}")
                 for pod, count in enumerate(card.get("pod_processes", ()))
                 for number in range(count)]
    processes += [(uuid, 100_000 + number, None)
                  for number in range(card.get("stray_processes", 0))]
    return tenants_per_card(processes).get(uuid, 0)


def hami_card(card: dict[str, Any], index: int) -> Card:
    scored = "score" in card
    uuid = card.get("id", f"card-{index}")
    if "pod_processes" in card or "stray_processes" in card:
        seen = seen_tenants(card, uuid)
    else:
        seen = int(card["score"]) if scored else card.get("used", 0)
    return Card(
        uuid=uuid, index=index, type=card.get("type", HAMI_TYPE),
        memory=card.get("totalmem", 0), cores=card.get("totalcore", 0),
        count=SCORED_SLOTS if scored else card.get("count", 0),
        numa=card.get("numa", 0), health=card.get("health", True),
        links=_links(card),
        processes=seen,
    )


def hami_fleet(cards: list[dict[str, Any]], node_annotations: dict[str, str] | None = None,
               name: str = NODE) -> Fleet:
    """One node, ``name``, holding ``cards`` with their usage."""
    return add_node(Fleet(), name, cards, node_annotations)


def add_node(fleet: Fleet, name: str, cards: list[dict[str, Any]],
             node_annotations: dict[str, str] | None = None) -> Fleet:
    """``fleet`` with node ``name`` holding ``cards`` with their usage."""
    devices = [hami_card(card, index) for card, index in zip(cards, _indexes(cards), strict=True)]
    fleet.upsert_node(Node(name=name, cards=devices, annotations=node_annotations or {}))
    for device, card in zip(devices, cards, strict=True):
        memory, cores = card.get("usedmem", 0), card.get("usedcores", 0)
        if memory or cores:
            grant = CardGrant(device.uuid, memory, cores)
            fleet.allocate(f"default/tenant-{name}-{device.uuid}", Allocation(name, ((grant,),)))
    return fleet


def request_limits(request: dict[str, Any]) -> dict[str, int | str]:
    """HAMi's ``ContainerDeviceRequest`` (``nums``, ``memreq``, ``mempercentagereq``,
    ``coresreq``) as the container limits that read so: ``memreq`` wins, a share of 0
    or 101 (HAMi's unset) is left out, and the cores are always written (pyhami applies
    the webhook's exclusive default to a count-only request)."""
    limits: dict[str, int | str] = {"nvidia.com/gpu": request["nums"],
                                    "nvidia.com/gpucores": request.get("coresreq", 0)}
    percent = request.get("mempercentagereq", 0)
    if request.get("memreq", 0) > 0:
        limits["nvidia.com/gpumem"] = request["memreq"]
    elif percent not in (0, 101):
        limits["nvidia.com/gpumem-percentage"] = percent
    return limits


def request_annotations(request: dict[str, Any]) -> dict[str, str]:
    """A request for a device type other than HAMi's ``NVIDIA``, as pyhami says it."""
    wanted = request.get("type", HAMI_TYPE)
    return {} if wanted == HAMI_TYPE else {"nvidia.com/use-gputype": wanted}


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
