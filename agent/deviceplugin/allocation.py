"""Which pod the kubelet is admitting, and what its container gets: no I/O, no clock, no gRPC.

The kubelet's Allocate names devices, never the pod. The daemon lists the pods it bound
to this node whose cards are still to be allocated, oldest ``bind_time`` first; a
container request is given to the pending pod whose next unserved GPU container (init
containers first, in the annotation's order) holds exactly the cards the kubelet chose
(``GetPreferredAllocation`` steers it there), else to the oldest one whose container
wants as many cards as the kubelet asks for devices. ``Progress`` remembers, per pod, how
many of its annotation's containers were served.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from agent.vendors.port import ContainerRefused, ContainerRuntime, Mount
from common.core.annotations import AnnotationError, CardGrant, decode_allocation
from common.core.vendors import NVIDIA
from common.wire import AllocationOutcome, PendingPod, ReportedCard

DEFAULT_RESOURCE_NAME = NVIDIA.resources.count
"""HAMi's default ``resourceCountName``: the resource the plugin registers unless the
device configuration names another."""
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

Progress = Mapping[str, int]
"""Per pod UID: the position, in its annotation, after the last container served."""


def device_id(uuid: str, replica: int) -> str:
    return f"{uuid}-{replica}"


def card_of(device: str) -> str:
    """The card UUID a device ID names (``device_id`` reversed)."""
    return device.rpartition("-")[0] or device


@dataclass(frozen=True, slots=True)
class Device:
    """One device as ListAndWatch advertises it: one of a card's ``count`` shares."""

    id: str
    healthy: bool
    numa: int | None


def advertised_devices(cards: Sequence[ReportedCard], *,
                       numa_topology: bool) -> tuple[Device, ...]:
    """``count`` devices per card, healthy as the card is; on its NUMA node when known and
    ``numa_topology`` (HAMi's ``enableNumaTopology``) says to tell the kubelet."""
    return tuple(Device(device_id(card.uuid, replica), card.health,
                        card.numa if numa_topology and card.numa >= 0 else None)
                 for card in cards for replica in range(card.count))


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """What one container gets: its pod's cards for that container, as the vendor gives
    them (``agent.vendors.port.ContainerRuntime``), or the MIG instances reserved for it."""

    pod: PendingPod
    position: int
    """The container's place in the annotation (init containers first)."""
    grants: tuple[CardGrant, ...]
    envs: dict[str, str]
    mounts: tuple[Mount, ...]
    folder: str | None = None
    """The host folder to make (empty, 0777) before the container starts; None where the
    vendor needs none (NVIDIA: without HAMi-core)."""

    @property
    def on_mig(self) -> bool:
        """The container's cards are MIG instances: the plugin makes them and names them in
        the vendor's variable (``NVIDIA_VISIBLE_DEVICES``); no HAMi-core."""
        return any(grant.instance is not None for grant in self.grants)


@dataclass(frozen=True, slots=True)
class Granted:
    allocations: tuple[ContainerAllocation, ...]
    progress: dict[str, int]
    outcomes: tuple[AllocationOutcome, ...]
    """Pods now fully served (ok) and pods whose annotation cannot be read (failed)."""


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str
    outcomes: tuple[AllocationOutcome, ...]
    """The pod refused (when one was chosen) and pods whose annotation cannot be read."""


@dataclass(frozen=True, slots=True)
class _Candidate:
    pod: PendingPod
    position: int
    grants: tuple[CardGrant, ...]


def outcome(pod: PendingPod, reason: str = "") -> AllocationOutcome:
    """Ok without a reason, failed with one."""
    return AllocationOutcome(namespace=pod.namespace, name=pod.name, uid=pod.uid,
                             ok=not reason, reason=reason)


def _pod_name(pod: PendingPod) -> str:
    return f"{pod.namespace}/{pod.name}"


def _decoded(pending: Sequence[PendingPod]
             ) -> tuple[list[tuple[PendingPod, tuple[tuple[CardGrant, ...], ...]]],
                        list[AllocationOutcome]]:
    """The pods in bind order with their containers, and a failed outcome for each pod whose
    annotation does not decode (it can never be served)."""
    readable = []
    malformed = []
    for pod in sorted(pending, key=lambda p: (p.bind_time, p.namespace, p.name)):
        try:
            readable.append((pod, decode_allocation(pod.devices, pod.mig_allocations)))
        except AnnotationError as error:
            malformed.append(outcome(pod, f"pod {_pod_name(pod)}: {error}"))
    return readable, malformed


def _next_container(containers: tuple[tuple[CardGrant, ...], ...], start: int) -> int | None:
    return next((position for position in range(start, len(containers))
                 if containers[position]), None)


def _candidates(pods: Sequence[tuple[PendingPod, tuple[tuple[CardGrant, ...], ...]]],
                progress: Progress) -> list[_Candidate]:
    found = []
    for pod, containers in pods:
        position = _next_container(containers, progress.get(pod.uid, 0))
        if position is not None:
            found.append(_Candidate(pod, position, containers[position]))
    return found


def _choose(candidates: Sequence[_Candidate], devices: Sequence[str]) -> _Candidate | None:
    chosen_cards = sorted(card_of(device) for device in devices)
    for candidate in candidates:
        if sorted(grant.uuid for grant in candidate.grants) == chosen_cards:
            return candidate
    return next((c for c in candidates if len(c.grants) == len(devices)), None)


def container_allocation(candidate: _Candidate,
                         runtime: ContainerRuntime) -> ContainerAllocation:
    """The container's cards as the vendor gives them; raises ``ContainerRefused``."""
    setup = runtime.setup(candidate.pod, candidate.position, candidate.grants)
    return ContainerAllocation(candidate.pod, candidate.position, candidate.grants,
                               setup.envs, setup.mounts, setup.folder)


def allocate(pending: Sequence[PendingPod], progress: Progress,
             requests: Sequence[Sequence[str]], *, node: str, node_cards: Collection[str],
             runtime: ContainerRuntime,
             resource: str = DEFAULT_RESOURCE_NAME) -> Granted | Refused:
    """Serve one Allocate call: ``requests`` holds, per container, the device IDs the
    kubelet chose. Either every container is served or none is. ``resource`` is the
    resource the plugin registered (HAMi's ``resourceCountName``), which a refusal names."""
    pods, malformed = _decoded(pending)
    pending_uids = {pod.uid for pod, _ in pods}
    working = {uid: served for uid, served in progress.items() if uid in pending_uids}
    allocations = []
    for devices in requests:
        candidates = _candidates(pods, working)
        chosen = _choose(candidates, devices)
        if chosen is None:
            return _refusal(candidates, devices, node, resource, malformed)
        foreign = [grant.uuid for grant in chosen.grants if grant.uuid not in node_cards]
        if foreign:
            reason = (f"pod {_pod_name(chosen.pod)}: card {foreign[0]} of its annotation "
                      f"is not one of node {node}'s cards")
            return Refused(reason, (*malformed, outcome(chosen.pod, reason)))
        try:
            allocations.append(container_allocation(chosen, runtime))
        except ContainerRefused as error:
            reason = f"pod {_pod_name(chosen.pod)}: {error}"
            return Refused(reason, (*malformed, outcome(chosen.pod, reason)))
        working[chosen.pod.uid] = chosen.position + 1
    done = [outcome(pod) for pod, containers in pods
            if any(a.pod.uid == pod.uid for a in allocations)
            and _next_container(containers, working[pod.uid]) is None]
    return Granted(tuple(allocations), working, (*malformed, *done))


def _refusal(candidates: Sequence[_Candidate], devices: Sequence[str], node: str,
             resource: str, malformed: list[AllocationOutcome]) -> Refused:
    if not candidates:
        reason = (f"no pod bound to node {node} waits for {len(devices)} device(s) of "
                  f"{resource}")
        if malformed:
            reason += "; unreadable: " + "; ".join(o.reason for o in malformed)
        return Refused(reason, tuple(malformed))
    oldest = candidates[0]
    reason = (f"pod {_pod_name(oldest.pod)}: its container #{oldest.position} was given "
              f"{len(oldest.grants)} card(s) but the kubelet asks for {len(devices)} "
              f"device(s) of {resource}")
    return Refused(reason, (*malformed, outcome(oldest.pod, reason)))


def preferred_devices(pending: Sequence[PendingPod], progress: Progress,
                      available: Sequence[str], must_include: Sequence[str],
                      size: int) -> list[str]:
    """The devices to steer the kubelet to: one of each card of the oldest pending
    container that wants ``size`` cards, then whatever completes ``size``."""
    pods, _ = _decoded(pending)
    wanted = next((c for c in _candidates(pods, progress) if len(c.grants) == size), None)
    chosen = list(must_include)
    if wanted is not None:
        for grant in wanted.grants:
            if any(card_of(device) == grant.uuid for device in chosen):
                continue
            device = next((d for d in available
                           if card_of(d) == grant.uuid and d not in chosen), None)
            if device is not None:
                chosen.append(device)
    # Complete with devices of cards not chosen yet: a container's cards are distinct.
    for device in sorted(available, key=lambda d: any(card_of(d) == card_of(c) for c in chosen)):
        if len(chosen) >= size:
            break
        if device not in chosen:
            chosen.append(device)
    return chosen[:size]
