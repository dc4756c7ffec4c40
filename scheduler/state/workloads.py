"""The Kueue workloads whose cards pyhami's admission check holds, and which of their pods
took them.

When the check places a workload, each of its pods is reserved under a placeholder key
(``common.core.workloads.placeholder_key``) in the one ledger, beside the pods'
reservations. A pod of the workload, once Kueue has started the job, claims one
placeholder of its pod set (``claim``): the cache then hands the placeholder's cards over
to the pod. The placeholders not claimed are released together when the workload ends or
is evicted, or when ``until`` passes (as a group's reservations are, ``--group-ttl``).
Synchronous, the time an argument, as the rest of the state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from common.core import PodRequest
from common.core.workloads import POD_SET_ANNOTATION, WORKLOAD_ANNOTATION, Member


@dataclass(slots=True)
class _Held:
    uid: str
    waiting: dict[str, Member]
    """Placeholder key → the member it stands for, not claimed yet."""
    until: float
    claims: dict[str, str] = field(default_factory=dict)
    """Pod key → the placeholder key it claimed."""


class HeldWorkloads:
    """The workloads placed by the check whose pods have not all come, by
    ``namespace/name``; and, for every workload, the keys of its pods seen bound."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}
        self._bound: dict[str, tuple[str, str]] = {}
        """Pod key → its workload's key and pod set, for the pods of workloads seen bound."""

    def __len__(self) -> int:
        return len(self._held)

    def held(self, workload: str) -> bool:
        """Whether the check placed ``workload`` (its cards may all be taken, or its time
        passed, since): it is not placed again until it ends."""
        return workload in self._held

    def hold(self, workload: str, uid: str, members: Sequence[Member], until: float) -> None:
        """The cards of ``members`` are reserved under their keys until ``until``."""
        self._held[workload] = _Held(uid, {m.request.key: m for m in members}, until)

    def uid(self, workload: str) -> str | None:
        held = self._held.get(workload)
        return held.uid if held is not None else None

    def claim(self, workload: str, pod_set: str, request: PodRequest) -> str | None:
        """The placeholder ``request``'s pod takes: one of ``pod_set`` of ``workload``
        still waiting, whose request asks what the pod asks (the same containers, cards,
        memory and cores); the one it took before, if it did; None if none is left (the
        pod is then placed alone)."""
        held = self._held.get(workload)
        if held is None:
            return None
        if (taken := held.claims.get(request.key)) is not None:
            return taken
        for key, member in held.waiting.items():
            if member.pod_set == pod_set and member.request.containers == request.containers:
                del held.waiting[key]
                held.claims[request.key] = key
                return key
        return None

    def waiting(self, workload: str) -> list[str]:
        """The placeholder keys of ``workload`` not claimed yet."""
        held = self._held.get(workload)
        return list(held.waiting) if held is not None else []

    def let_go(self, workload: str) -> list[str]:
        """Forget ``workload`` (it ended, was evicted or deleted): the placeholder keys
        whose cards are to be released."""
        held = self._held.pop(workload, None)
        return list(held.waiting) if held is not None else []

    def expire(self, now: float) -> list[str]:
        """The placeholder keys of the workloads held past their time, no longer waiting
        (the workloads stay known: their pods that come later are placed alone, and the
        check does not place them again)."""
        late: list[str] = []
        for held in self._held.values():
            if held.waiting and held.until <= now:
                late.extend(held.waiting)
                held.waiting.clear()
        return late

    def let_go_all(self) -> list[str]:
        """Stop holding every workload (a standby holds nothing): their placeholder keys."""
        keys = [key for held in self._held.values() for key in held.waiting]
        self._held.clear()
        return keys

    def workloads(self) -> Iterable[str]:
        return list(self._held)

    # Pods seen bound ------------------------------------------------------------------

    def pod_bound(self, workload: str, pod_set: str, pod: str) -> None:
        """The pod ``pod`` of ``workload``'s ``pod_set`` is bound (the pod watch)."""
        self._bound[pod] = (workload, pod_set)

    def note_bound(self, namespace: str, pod: str, annotations: Mapping[str, str]) -> None:
        """A bound pod, seen by the pod watch or the ledger's rebuild: counted for its
        workload if it carries one's annotations (a new leader then holds only the rest)."""
        if (workload := annotations.get(WORKLOAD_ANNOTATION)) is not None:
            self.pod_bound(f"{namespace}/{workload}", annotations.get(POD_SET_ANNOTATION, ""),
                           pod)

    def pod_gone(self, pod: str) -> None:
        self._bound.pop(pod, None)

    def bound_in(self, workload: str) -> dict[str, int]:
        """How many pods of each pod set of ``workload`` are seen bound."""
        counts: dict[str, int] = {}
        for owner, pod_set in self._bound.values():
            if owner == workload:
                counts[pod_set] = counts.get(pod_set, 0) + 1
        return counts
