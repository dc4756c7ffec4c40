"""Why a pod fits no node, in one sentence: what it asked for and what the nodes have.

The sentence ends the message of the pod's last ``FilteringFailed`` Event, after HAMi's
summary (``no available node, N nodes do not meet: <sentence>``, ``common.core.events``),
and is what ``pyhami explain`` prints, so both read the same for the same pod and
cluster::

    asked for 5 cards with 1000 MiB each; gpu-node-1 has 4 cards (NodeInsufficientDevice)
    asked for 1 card with 20000 MiB; gpu-node-1: 4/4 CardInsufficientMemory (largest free
    15360 MiB)

Each node's part is its ``FailedNodes`` reasons with what the cards a reason removed
have to offer after that reason: HAMi's ``count/cards Reason`` tokens stay as they are, for
users who grep for them. Nodes that fail the same way (the same reasons, for the same
container) are one part, the largest group first, with the facts of all its nodes (the
largest free memory among them, say). The sentence fits an Event message (1024 bytes)
with the summary before it: parts that do not fit are counted at the end instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from common.core.fleet import BoolArray, Fleet, IntArray, Snapshot
from common.core.placement import CodeArray, NodeFailure, PodView, place_pod
from common.core.pod import ContainerRequest, PodRequest
from common.core.reasons import (
    CARD_REASON,
    INSUFFICIENT_CARDS,
    NODE_INSUFFICIENT_DEVICE,
    NUMA_NOT_FIT,
    QUOTA_REASON,
    TOPOLOGY_NOT_FIT,
    TOPOLOGY_UNKNOWN,
    CardCheck,
    FailedNode,
    NodeReasons,
    NodeRefusal,
    reason_token,
)

MESSAGE_LIMIT = 1024
"""Bytes: the longest message the API server takes for an Event."""
SUMMARY_ROOM = 48
"""Bytes of an Event message kept for HAMi's summary before the sentence: ``no available
node, N nodes do not meet: `` is 47 bytes with N of 8 digits."""
SENTENCE_LIMIT = MESSAGE_LIMIT - SUMMARY_ROOM
NAMES_SHOWN = 3
"""Node names written out per part; the rest of the part's nodes are counted."""
TYPES_SHOWN = 3

_TRUNCATED = "..."


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _container_ask(request: ContainerRequest) -> str:
    memory = (f"{request.memory_mib} MiB" if request.memory_mib is not None
              else f"{request.memory_percent}% memory")
    cores = f", {request.cores}% cores" if request.cores else ""
    each = " each" if request.cards > 1 else ""
    return f"{plural(request.cards, 'card')} with {memory}{cores}{each}"


def _container_name(request: ContainerRequest) -> str:
    name = request.name or "an unnamed container"
    return f"init container {name}" if request.is_init else name


def asked_for(pod: PodRequest) -> str:
    """``asked for 2 cards with 1000 MiB each``; per container when several ask for cards."""
    containers = pod.gpu_containers
    if len(containers) == 1:
        return f"asked for {_container_ask(containers[0])}"
    return "asked for " + " and ".join(
        f"{_container_ask(c)} in {_container_name(c)}" for c in containers)


@dataclass(frozen=True, slots=True)
class _Cards:
    """Per card of the fleet, as the container that failed on its node checked it."""

    codes: CodeArray
    free_memory: IntArray
    free_cores: IntArray
    container: dict[int, int]
    """Node position -> the failing container's position among the GPU containers."""


def _failing_checks(snapshot: Snapshot, pod: PodRequest, nodes: list[int],
                    fleet: Fleet) -> _Cards:
    view = PodView(snapshot, pod, fleet.quotas.left(pod.subject))
    codes = view.card_codes(pod.gpu_containers[0], slice(None))
    free_memory = snapshot.memory - snapshot.usedmem
    free_cores = snapshot.cores - snapshot.usedcores
    container = dict.fromkeys(nodes, 0)
    if len(pod.gpu_containers) > 1:
        # A later container may be the one that failed: place the pod again on each node.
        first = codes
        codes = first.copy()
        for node in nodes:
            where = snapshot.node_slice(node)
            failure = place_pod(view, node, first[where])
            assert isinstance(failure, NodeFailure), "a refused node refuses the pod again"
            container[node] = failure.container
            if failure.codes is not None:
                codes[where] = failure.codes
            if failure.taken is not None:
                free_memory[where] -= failure.taken.memory
                free_cores[where] -= failure.taken.cores
    return _Cards(codes, free_memory, free_cores, container)


_CHECKS: dict[str, list[int]] = {
    name: [int(check) for check, named in CARD_REASON.items() if named == name]
    for name in set(CARD_REASON.values())
}
"""Reason name -> the card checks reported under it (two for the exclusive conflict)."""


@dataclass(frozen=True, slots=True)
class _Facts:
    """What one part's nodes hold, for the reasons' parentheses."""

    snapshot: Snapshot
    cards: _Cards
    on_nodes: BoolArray
    request: ContainerRequest
    numa_bind: bool

    def removed_by(self, reason: str) -> BoolArray:
        return self.on_nodes & np.isin(self.cards.codes, _CHECKS.get(reason, []))


def _largest(values: IntArray, where: BoolArray, unit: str) -> str:
    return f"largest free {int(values[where].max())}{unit}" if where.any() else ""


def _types(facts: _Facts, where: BoolArray) -> str:
    names = sorted({facts.snapshot.devices[i].type for i in np.flatnonzero(where).tolist()})
    if not names:
        return ""
    more = f" and {len(names) - TYPES_SHOWN} more" if len(names) > TYPES_SHOWN else ""
    return f"{'type' if len(names) == 1 else 'types'} {', '.join(names[:TYPES_SHOWN])}{more}"


def _slots(facts: _Facts, where: BoolArray) -> str:
    counts = np.unique(facts.snapshot.count[where]).tolist()
    return f"{plural(counts[0], 'slot')} each, all taken" if len(counts) == 1 \
        else "all slots taken"


def _fitting(facts: _Facts, count: int) -> str:
    fit = "fits" if count == 1 else "fit"
    numa = " on one NUMA node" if facts.numa_bind else ""
    return f"{plural(count, 'card')} {fit}{numa}, {facts.request.cards} needed"


def _what_is_there(reason: str, facts: _Facts, count: int) -> str:
    """Words on what the node has, for one reason: from the cards a card check removed, or
    from the reason's count (the eligible cards, for the rules on sets of cards). Empty
    where the reason's name says it all (unhealthy, cordoned, a uuid not asked for)."""
    if reason == CARD_REASON[CardCheck.TYPE_MISMATCH]:
        return _types(facts, facts.removed_by(reason))
    if reason == CARD_REASON[CardCheck.SLOTS_EXHAUSTED]:
        return _slots(facts, facts.removed_by(reason))
    if reason == CARD_REASON[CardCheck.MUTEX_BUSY]:
        return "in use"
    if reason == CARD_REASON[CardCheck.INSUFFICIENT_MEMORY]:
        return _largest(facts.cards.free_memory, facts.removed_by(reason), " MiB")
    if reason == CARD_REASON[CardCheck.INSUFFICIENT_CORE]:
        return _largest(facts.cards.free_cores, facts.removed_by(reason), "% cores")
    if reason == CARD_REASON[CardCheck.COMPUTE_EXHAUSTED]:
        return "all cores booked"
    if reason == CARD_REASON[CardCheck.MIG_INFEASIBLE]:
        return "no allowed MIG profile that large with a free placement"
    if reason == INSUFFICIENT_CARDS:
        return _fitting(facts, count)
    if reason == NUMA_NOT_FIT:
        return "on other NUMA nodes"
    if reason == TOPOLOGY_NOT_FIT:
        return f"no {facts.request.cards} linked by NVLink"
    if reason == TOPOLOGY_UNKNOWN:
        return "no NVLink topology reported"
    return ""


def _subject(names: list[str]) -> str:
    shown = names[:NAMES_SHOWN]
    rest = len(names) - len(shown)
    if rest:
        return f"{', '.join(shown)} and {rest} more"
    if len(shown) == 1:
        return shown[0]
    return f"{', '.join(shown[:-1])} and {shown[-1]}"


def _judged_part(names: list[str], reasons: NodeReasons, facts: _Facts, several: bool) -> str:
    """One group of nodes the decision core refused, with what they have."""
    subject = _subject(names)
    if several:
        subject += f" (for {_container_name(facts.request)})"
    if reasons.counts and reasons.counts[0][0] == NODE_INSUFFICIENT_DEVICE:
        # a node-level reason stands alone
        verb = "has" if len(names) == 1 else "each have"
        return f"{subject} {verb} {plural(reasons.cards, 'card')} ({NODE_INSUFFICIENT_DEVICE})"
    described = []
    for reason, count in reasons.counts:
        token = reason_token(reason, count, reasons.cards)
        words = _what_is_there(reason, facts, count)
        described.append(f"{token} ({words})" if words else token)
    return f"{subject}: {', '.join(described)}"


def _bounded(asked: str, parts: list[tuple[str, int]]) -> str:
    """``asked; part; part``, within ``SENTENCE_LIMIT`` bytes; parts that do not fit are
    counted by their nodes at the end."""
    sentence = asked
    for shown, (text, _) in enumerate(parts):
        rest = sum(nodes for _, nodes in parts[shown + 1:])
        tail = f"; {plural(rest, 'more node')} refused" if rest else ""
        longer = f"{sentence}; {text}"
        if len((longer + tail).encode()) > SENTENCE_LIMIT:
            left = sum(nodes for _, nodes in parts[shown:])
            sentence = f"{sentence}; {plural(left, 'more node')} refused"
            break
        sentence = longer
    return cut(sentence)


def cut(text: str, limit: int = SENTENCE_LIMIT) -> str:
    """``text``, or as much of it as fits in ``limit`` bytes with ``...`` after."""
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    return encoded[:limit - len(_TRUNCATED)].decode(errors="ignore") + _TRUNCATED


def fit_error_message(fleet: Fleet, pod: PodRequest, failures: Mapping[str, FailedNode]) -> str:
    """The sentence for a pod that fits none of the nodes it was judged on.

    ``failures`` holds, per node, the decision core's reasons, judged on the fleet as it
    is now, or the refusal of a node refused before the core saw it (no inventory, a
    stale one), which is written as given.
    """
    snapshot = fleet.snapshot
    judged = {name: why for name, why in failures.items() if isinstance(why, NodeReasons)}
    positions = {name: snapshot.node_position[name] for name in judged
                 if name in snapshot.node_position}
    cards = _failing_checks(snapshot, pod, sorted(positions.values()), fleet)
    groups: dict[tuple[NodeReasons, int], list[str]] = {}
    for name, reasons in judged.items():
        position = positions.get(name)
        container = cards.container[position] if position is not None else 0
        groups.setdefault((reasons, container), []).append(name)
    written: dict[NodeRefusal, list[str]] = {}
    for name, why in failures.items():
        if isinstance(why, NodeRefusal):
            written.setdefault(why, []).append(name)

    several = len(pod.gpu_containers) > 1
    parts: list[tuple[str, list[str]]] = []
    for (reasons, container), names in groups.items():
        names.sort()
        on_nodes = np.isin(snapshot.node_of, [positions[n] for n in names if n in positions])
        facts = _Facts(snapshot, cards, on_nodes, pod.gpu_containers[container], pod.numa_bind)
        parts.append((_judged_part(names, reasons, facts, several), names))
    for why, names in written.items():
        names.sort()
        parts.append((f"{_subject(names)}: {why.text()}", names))
    if not parts:
        return cut(f"{asked_for(pod)}; pyhami knows no node with GPU cards")
    parts.sort(key=lambda part: (-len(part[1]), part[1][0]))
    opening = asked_for(pod)
    quota_hit = any(reason == QUOTA_REASON for reasons in judged.values()
                    for reason, _ in reasons.counts)
    refusal = fleet.quotas.card_refusal(pod, snapshot.memory, cards.codes) if quota_hit else None
    if refusal is not None:
        # The quota first: it is what the namespace's owner can change.
        opening = f"{refusal.text()}; {opening}"
    return _bounded(opening, [(text, len(names)) for text, names in parts])
