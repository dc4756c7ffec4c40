"""A decision as the JSON document ``pyhami decide`` prints (SPEC section 7)."""

from __future__ import annotations

from typing import Any

from common.core.annotations import VENDOR
from common.core.decide import Decision


def decision_document(decision: Decision) -> dict[str, Any]:
    document: dict[str, Any] = {
        "scheduled": decision.scheduled,
        "node": decision.node,
        "devices": [
            [
                {"uuid": c.uuid, "index": c.index, "type": VENDOR,
                 "usedmem": c.memory, "usedcores": c.cores}
                for c in cards
            ]
            for cards in decision.cards
        ],
        "annotations": decision.annotations(),
        "failed_nodes": dict(decision.failed_nodes or {}),
        "ignored_policies": list(decision.ignored_policies),
    }
    if decision.reason is not None:
        document["reason"] = decision.reason
    if decision.message is not None:
        document["message"] = decision.message
    if decision.explain is not None:
        document["explain"] = [
            {"node": r.node, "index": r.index, "uuid": r.uuid, "used": r.used,
             "score": r.score, "filtered_by": r.filtered_by, "rank": r.rank,
             "chosen": r.chosen}
            for r in decision.explain
        ]
    return document
