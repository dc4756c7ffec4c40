"""What a simulation replays: the cluster's nodes and the pods that arrive, as the
formats (``_formats``) read them and the engine (``_engine``) takes them."""

from __future__ import annotations

from dataclasses import dataclass

from common.core import PodManifest
from common.core.groups import GroupRef
from common.core.model import Node
from common.core.quota import Quota


@dataclass(frozen=True, slots=True)
class SimPod:
    """One pod of the workload."""

    manifest: PodManifest
    """Name, namespace, containers' GPU limits and annotations (policy, GPU type), as a
    pod manifest carries them."""
    arrival: float
    """Seconds from the workload's start."""
    duration: float | None = None
    """How long it runs once placed; None: until the end of the simulation. A group's
    member runs it from the moment its whole group is placed."""
    group: GroupRef | None = None
    """The group it declares (Kueue's label and count), None for a pod on its own."""


@dataclass(frozen=True, slots=True)
class Trace:
    nodes: list[Node]
    pods: list[SimPod]
    """In arrival order."""
    cpu_only: int = 0
    """Pods of the workload file that ask for no GPU, left out of ``pods``."""
    quotas: tuple[Quota, ...] = ()
    """The cluster file's ResourceQuotas that limit GPU memory or cores."""
