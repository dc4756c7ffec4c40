"""What one simulated run yields: the state after each arrival, and the run's totals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

# A series in the JSON document keeps at most this many points, spread evenly.
DOCUMENT_POINTS = 200
SHARE_DIGITS = 4

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Sample:
    """The cluster just after one arrival was decided (one sample per arrival)."""

    time: float
    """Seconds from the workload's start (in ``inflate`` mode, repeats follow each other)."""
    arrived: float
    """GPU demand arrived so far / the cluster's GPU capacity (may exceed 1). A pod's
    demand, in cards, is the sum over its containers (init containers aside) of cards x
    the share of a card each takes: the larger of its ``gpucores`` / 100 and its memory share
    (``gpumem-percentage`` / 100, or ``gpumem`` over the cluster's mean card memory)."""
    allocation: float
    """Allocated share of all cards' cores (booked cores / the cards' cores), 0..1."""
    fragmentation: float
    """Share of the cluster's GPU capacity that is fragmented, 0..1, per Weng et al.
    (ATC '23): for each typical pod (the workload's GPU requests, weighted by how often
    they occur; a request is its first GPU container's cards, share of a card and GPU
    type constraint), a node's free GPU capacity that the pod cannot use (a card whose free
    share is below the pod's per-card share; all of the node's free capacity when the
    pod fits the node nowhere), averaged over the typical pods and summed over nodes.
    Computed exactly after every change (only the node that changed is recomputed).
    Unlike the paper, pods asking for no GPU are not among the typical pods and nodes
    have no CPU limit: pyhami models GPUs only."""


@dataclass(frozen=True, slots=True)
class NamespaceTally:
    """One namespace's pods in a run: how many arrived, were placed, and were never placed
    for its ResourceQuotas or for another reason."""

    pods: int
    placed: int
    refused_for_quota: int
    """Pods still waiting at the end whose reason (as ``refused_by_reason`` counts it) is
    ``ResourceQuotaNotFit``."""
    refused_otherwise: int
    """Malformed pods, and pods still waiting at the end for any other reason."""

    def document(self) -> dict[str, int]:
        return {"pods": self.pods, "placed": self.placed,
                "refused_for_quota": self.refused_for_quota,
                "refused_otherwise": self.refused_otherwise}


@dataclass(frozen=True, slots=True)
class GroupTally:
    """A run's groups (distributed jobs): how many started, how many did not, and the card
    time members held while their job could not run."""

    placement: str = "all-or-nothing"
    """``all-or-nothing``: a group's members placed together or none; ``one-at-a-time``:
    each member on its own as it arrives, as kube-scheduler alone places them."""
    jobs: int = 0
    started: int = 0
    """Groups whose members were all placed."""
    waiting: int = 0
    """Groups not all placed at the end (``jobs - started``)."""
    holding: int = 0
    """Of the waiting groups, those whose placed members hold cards at the end (none all
    or nothing)."""
    idle_gpu_hours: float = 0.0
    """Card-hours held by placed members of groups not yet whole, up to the run's last
    event: each such member's demand (cards, a share of one for a sharing pod) times how
    long it held them before its group was whole. 0 all or nothing, by construction."""

    def document(self) -> dict[str, object]:
        return {"placement": self.placement, "jobs": self.jobs, "started": self.started,
                "waiting": self.waiting, "holding_cards": self.holding,
                "idle_gpu_hours": round(self.idle_gpu_hours, 3)}


@dataclass(frozen=True, slots=True)
class PolicyRun:
    policy: str
    node_policy: str
    pods: int
    placed: int
    refused: int
    refused_by_reason: dict[str, int]
    """Malformed pods by the kind of their error (``PodRejected``); pods still waiting at
    the end by the reason that removed most cards over the nodes, as the daemon counts."""
    peak_allocation: float
    samples: list[Sample]
    """One per arrival, in order."""
    waits: list[float]
    """Seconds each placed pod waited, in the order they were placed."""
    by_namespace: dict[str, NamespaceTally] = field(default_factory=dict)
    """Per namespace of the workload, sorted by name."""
    groups: GroupTally = field(default_factory=GroupTally)
    mig_instances: dict[str, int] = field(default_factory=dict)
    """MIG instances the placed pods were given, by profile (none on a cluster without MIG
    cards)."""

    def document(self) -> dict[str, object]:
        """The run as ``--output json`` prints it."""
        points = thinned(self.samples, DOCUMENT_POINTS)
        return {
            "policy": self.policy,
            "node_policy": self.node_policy,
            "pods": self.pods,
            "placed": self.placed,
            "refused": self.refused,
            "refused_by_reason": dict(sorted(self.refused_by_reason.items())),
            "by_namespace": {namespace: tally.document()
                             for namespace, tally in self.by_namespace.items()},
            "groups": self.groups.document(),
            "mig_instances": dict(sorted(self.mig_instances.items())),
            "peak_allocation": self.peak_allocation,
            "allocation_at_arrived": [[round(s.arrived, SHARE_DIGITS),
                                       round(s.allocation, SHARE_DIGITS)] for s in points],
            "fragmentation_at_arrived": [[round(s.arrived, SHARE_DIGITS),
                                          round(s.fragmentation, SHARE_DIGITS)]
                                         for s in points],
            "allocation_over_time": [[round(s.time, 3), round(s.allocation, SHARE_DIGITS)]
                                     for s in points],
            "wait_seconds": {"p50": milliseconds(percentile(self.waits, 0.5)),
                             "p95": milliseconds(percentile(self.waits, 0.95)),
                             "max": milliseconds(max(self.waits, default=None))},
        }


def thinned(items: Sequence[T], limit: int) -> list[T]:
    """At most ``limit`` (at least 2) of ``items``, evenly spread, the first and the last
    kept."""
    if len(items) <= limit:
        return list(items)
    last = len(items) - 1
    return [items[round(i * last / (limit - 1))] for i in range(limit)]


def milliseconds(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def percentile(values: Sequence[float], share: float) -> float | None:
    """Linear between the closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = share * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)
