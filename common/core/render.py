"""A decision as the JSON document ``pyhami decide`` prints (docs/decision-core.md)."""

from __future__ import annotations

from typing import Any

from common.core.decide import Decision, PlacedCard
from common.core.vendors import NVIDIA

NO_GPU_NOTE = ("the pod asks for no GPU: pyhami passes every node and leaves the choice to "
               "kube-scheduler")


def decision_document(decision: Decision) -> dict[str, Any]:
    document: dict[str, Any] = {
        "scheduled": decision.scheduled,
        "gpu": decision.asks_for_gpu,
        "node": decision.node,
        "devices": [[_device(c) for c in cards] for cards in decision.cards],
        "annotations": decision.annotations(),
        "failed_nodes": dict(decision.failed_nodes or {}),
        "ignored_policies": list(decision.ignored_policies),
        "warnings": list(decision.adjusted),
    }
    if not decision.asks_for_gpu:
        document["note"] = NO_GPU_NOTE
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


def _device(card: PlacedCard) -> dict[str, Any]:
    """One card given to a container; on a MIG card, the instance's profile and where it
    sits (``{"start": slice, "size": slices}``)."""
    device: dict[str, Any] = {"uuid": card.uuid, "index": card.index, "type": NVIDIA.name,
                              "usedmem": card.memory, "usedcores": card.cores}
    if card.instance is not None:
        placement = card.instance.placement
        device["mig"] = {"profile": card.instance.profile,
                         "placement": {"start": placement.start, "size": placement.size}}
    return device
