"""The messages of the scheduler's Events on a pod, in the shapes HAMi's scheduler writes
them (its ``FilteringSucceed``, ``FilteringFailed`` and ``BindingSucceed``), for users and
tools that read HAMi's::

    find fit node(gpu-2), 1 nodes not fit, 3 nodes fit(gpu-3:0.40,gpu-1:0.52,gpu-2:0.90)
    2 nodes CardInsufficientMemory(gpu-1,gpu-4)
    no available node, 4 nodes do not meet: asked for 1 card with 20000 MiB; ...
    Successfully binding node [gpu-2] to default/train-1

HAMi names every node; a message here names at most ``NODES_LISTED`` and counts the rest
as ``+N more``, standing where HAMi's order would have them: HAMi lists the nodes that fit
worst first and the chosen node last, so the ones left out (the worst) are counted before
those named; it lists the nodes of a reason sorted, so the ones left out are counted
after. Every message fits an Event message (``MESSAGE_LIMIT`` bytes).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from itertools import islice

from common.core.decide import FittingNodes
from common.core.fiterror import MESSAGE_LIMIT, cut
from common.core.reasons import FailedNode, NodeReasons

FILTERING_SUCCEED = "FilteringSucceed"
FILTERING_FAILED = "FilteringFailed"
BINDING_SUCCEED = "BindingSucceed"
BINDING_FAILED = "BindingFailed"

NODES_LISTED = 10
"""Nodes named in one message at most; the others are counted. Ten names of 20 characters
keep a message near 300 bytes, which ``kubectl describe pod`` shows on one wide line."""


def _more(count: int) -> str:
    return f"+{count} more"


def _listed(kept: Sequence[str], total: int, room: int) -> list[str]:
    """The first of ``kept`` (at least one, all of them at most) whose names, joined by
    commas with ``+N more`` counting the rest of ``total``, fit in ``room`` bytes."""
    shown: list[str] = []
    used = len(_more(total).encode()) + 1  # the longest count there could be, and a comma
    for text in kept:
        size = len(text.encode()) + 1
        if shown and used + size > room:
            break
        shown.append(text)
        used += size
    return shown


def filtering_succeed(node: str, total: int, fitting: Mapping[str, float] | None) -> str:
    """``find fit node(<node>), <total - fit> nodes not fit, <fit> nodes fit(<n>:<s>,...)``:
    HAMi's message (its ``genSuccessMsg``) for a pod placed on ``node`` among ``total``
    nodes kube-scheduler sent. ``fitting``: the decision's nodes that hold the pod with
    their scores before it, best first (``Decision.fitting``); named as HAMi orders them,
    worst first, the chosen node last, each score with two decimals as Go's ``%.2f``.

    None (a group member whose cards were held for it by its group's placement, a pod
    asked about again once bound): the node alone, without a score: the decision that
    scored the nodes was made for another pod's /filter."""
    if fitting is None:
        return f"find fit node({node}), {max(total - 1, 0)} nodes not fit, 1 nodes fit({node})"
    fit = len(fitting)
    head = f"find fit node({node}), {max(total - fit, 0)} nodes not fit, {fit} nodes fit("
    best = (fitting.best(NODES_LISTED) if isinstance(fitting, FittingNodes)
            else list(islice(fitting.items(), NODES_LISTED)))
    named = [f"{name}:{score:.2f}" for name, score in best]
    shown = _listed(named, fit, MESSAGE_LIMIT - len(head.encode()) - 1)
    parts = shown[::-1]
    if fit > len(shown):
        parts.insert(0, _more(fit - len(shown)))
    return f"{head}{','.join(parts)})"


def reason_type(reason: str) -> str:
    """The reason's name up to its first space, as HAMi's ``ParseReason`` reads a
    ``count/cards Reason`` token (``%s``): ``TopologyNotFit (search limit reached)``
    counts as ``TopologyNotFit``."""
    return reason.split(" ", 1)[0]


def failing_by_reason(failures: Mapping[str, FailedNode],
                      refusals: Collection[str] = ()) -> dict[str, list[str]]:
    """Reason -> its nodes, sorted, the reason with the most nodes first (ties by name).

    Every reason of a node's ``count/cards Reason`` tokens, as HAMi's ``ParseReason``
    takes them (a node failing for two reasons is under both); a node refused before the
    decision core judged its cards (``NodeRefusal``) only when its reason is among
    ``refusals``, the ones that say something of that node rather than of the pod."""
    nodes: dict[str, list[str]] = {}
    # Nodes that fail the same way share one reasons object: its reasons read once.
    types: dict[int, tuple[str, ...]] = {}
    for name, failure in failures.items():
        found = types.get(id(failure))
        if found is None:
            if isinstance(failure, NodeReasons):
                found = tuple(dict.fromkeys(reason_type(r) for r, _ in failure.counts))
            else:
                found = (failure.reason,) if failure.reason in refusals else ()
            types[id(failure)] = found
        for reason in found:
            nodes.setdefault(reason, []).append(name)
    for names in nodes.values():
        names.sort()
    return dict(sorted(nodes.items(), key=lambda item: (-len(item[1]), item[0])))


def filtering_failures(failures: Mapping[str, FailedNode],
                       refusals: Collection[str] = ()) -> list[str]:
    """HAMi's per-reason ``FilteringFailed`` messages, ``<k> nodes <Reason>(<n1>,<n2>...)``,
    one for each reason ``failing_by_reason`` finds."""
    messages = []
    for reason, names in failing_by_reason(failures, refusals).items():
        head = f"{len(names)} nodes {reason}("
        shown = _listed(names[:NODES_LISTED], len(names),
                        MESSAGE_LIMIT - len(head.encode()) - 1)
        parts = shown + ([_more(len(names) - len(shown))] if len(names) > len(shown) else [])
        messages.append(f"{head}{','.join(parts)})")
    return messages


def no_node_summary(total: int, sentence: str | None) -> str:
    """``no available node, <total> nodes do not meet``, HAMi's last ``FilteringFailed``
    message, then ``: `` and pyhami's sentence on why (``Decision.message``, which ``pyhami
    explain`` prints). The sentence leaves the summary ``SUMMARY_ROOM`` bytes; a longer one
    (a sentence the daemon made longer) is cut."""
    summary = f"no available node, {total} nodes do not meet"
    return cut(f"{summary}: {sentence}", MESSAGE_LIMIT) if sentence else summary


def binding_succeed(node: str, namespace: str, name: str) -> str:
    """``Successfully binding node [<node>] to <namespace>/<pod>``: HAMi's, its node list
    printed with Go's ``%v`` (hence the brackets)."""
    return f"Successfully binding node [{node}] to {namespace}/{name}"
