"""MIG: a card's hardware partitions, the choice of one for a container, and the
reservation annotation that records the choice.

A card in MIG mode (``Card.mode == "mig"``) lists the GPU-instance profiles its node
allows (NVML's figures: memory, compute share, slices, and the placements NVML offers
for each). A container placed on such a card gets one GPU instance per card it asks for,
sized to its memory request as HAMi v2.10 sizes it (``select_instance``): the profiles in
order of memory, then of slices; the first whose memory covers the request and that has
a placement free of every instance already on the card. Placements are tried highest
start first for ``1g.*`` and ``3g.*`` profiles, lowest first for the others, which keeps
the large contiguous ranges free for the large profiles.

The choice is recorded on the pod in ``hami.io/vgpu-mig-allocations`` (HAMi's JSON,
``encode_reservations``); reading it back (``decode_reservations``) applies HAMi's rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal

import msgspec

from common.core.errors import InvalidInput
from common.core.names import shown

HAMI_CORE_MODE = "hami-core"
MIG_MODE = "mig"
MPS_MODE = "mps"
CardMode = Literal["hami-core", "mig"]
"""A card's operating mode, its node's ``operatingmode``: shared by HAMi-core's limits,
or cut into MIG instances."""
POD_MODES = (HAMI_CORE_MODE, MIG_MODE, MPS_MODE)
"""What ``nvidia.com/vgpu-mode`` may name: HAMi's three (no card serves ``mps``: HAMi
stubs it, and pyhami has no MPS mode either)."""

MIG_ALLOCATIONS_ANNOTATION = "hami.io/vgpu-mig-allocations"

SLICES_MAX = 64
"""Bound on a placement's start and size: NVML's largest GPU has 8 memory slices."""
PROFILES_MAX = 64
PLACEMENTS_MAX = 64
PROFILE_NAME_MAX = 32
RESERVATIONS_MAX = 4096
"""Reservations one pod may carry: far more than the cards of any node times their
instances; bounds the work of reading an annotation anyone who creates a pod may write."""
_ID_MAX = 2**32 - 1
PROFILE_NAME_PATTERN = r"^[1-9][0-9]*g\.[A-Za-z0-9.+]+$"
"""``<n>g.<...>``: the slices a profile takes, then its memory and options
(``1g.10gb``, ``1g.10gb+me``)."""
_PROFILE_NAME = re.compile(PROFILE_NAME_PATTERN)

SliceNumber = Annotated[int, msgspec.Meta(ge=0, le=SLICES_MAX)]
SliceSize = Annotated[int, msgspec.Meta(ge=1, le=SLICES_MAX)]
ProfileName = Annotated[str, msgspec.Meta(max_length=PROFILE_NAME_MAX,
                                          pattern=PROFILE_NAME_PATTERN)]


class MigPlacement(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Where an instance sits on its card: ``size`` memory slices from ``start``."""

    start: SliceNumber
    size: SliceSize

    def overlaps(self, other: MigPlacement) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


class MigProfile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One GPU-instance profile a MIG card offers, with NVML's figures.

    ``cores`` is the profile's compute share in percent of the card (HAMi's ``core``:
    its multiprocessors over the largest profile's, rounded up); ``instances`` how many
    of it the card holds at most (NVML's instance count; HAMi registers the largest as
    the card's slot count)."""

    name: ProfileName
    memory: Annotated[int, msgspec.Meta(ge=0, le=2**24)]
    cores: Annotated[int, msgspec.Meta(ge=0, le=100)]
    slices: SliceSize
    placements: Annotated[tuple[MigPlacement, ...], msgspec.Meta(max_length=PLACEMENTS_MAX)]
    instances: Annotated[int, msgspec.Meta(ge=0, le=SLICES_MAX)] = 0


MigProfiles = Annotated[tuple[MigProfile, ...], msgspec.Meta(max_length=PROFILES_MAX)]


@dataclass(frozen=True, slots=True)
class MigInstance:
    """The GPU instance chosen for one card of one container: its profile and where; once
    the node made it, its runtime identity (which does not make it another instance)."""

    profile: str
    placement: MigPlacement
    mig_uuid: str = field(default="", compare=False)
    gpu_instance_id: int | None = field(default=None, compare=False)
    compute_instance_id: int | None = field(default=None, compare=False)


def prefers_high_start(profile: str) -> bool:
    """Whether a profile's placements are tried from the highest start down (HAMi's
    order for ``1g.*`` and ``3g.*``: small instances fill the card from its end)."""
    return profile.startswith(("1g.", "3g."))


def ordered_placements(profile: MigProfile) -> list[MigPlacement]:
    """The profile's placements in the order they are tried; equal starts keep NVML's
    order."""
    return sorted(profile.placements, key=lambda p: -p.start if prefers_high_start(
        profile.name) else p.start)


def by_size(profiles: Iterable[MigProfile]) -> list[MigProfile]:
    """Profiles in the order a request tries them: memory, then slices, ascending; equal
    ones keep the card's order."""
    return sorted(profiles, key=lambda p: (p.memory, p.slices))


def select_instance(profiles: Sequence[MigProfile], occupied: Iterable[MigPlacement],
                    memory: int) -> MigInstance | None:
    """The smallest profile whose memory covers ``memory`` MiB and that has a placement
    free of ``occupied``, with that placement; None when none has."""
    taken = tuple(occupied)
    for profile in by_size(profiles):
        if profile.memory < memory:
            continue
        for placement in ordered_placements(profile):
            if not any(placement.overlaps(other) for other in taken):
                return MigInstance(profile.name, placement)
    return None


def memory_asked(memory_mib: int | None, percent: int, card_memory: int,
                 profiles: Sequence[MigProfile]) -> int:
    """The MiB a container's instance must hold on a MIG card: its ``gpumem``, or its
    share of the card's memory; a container asking the whole card (no ``gpumem``, 100 %)
    asks for the largest profile.

    HAMi asks the whole card's memory there, which no profile holds (NVML keeps some of
    the card for itself: an A100 80GB's 7g instance has 80,896 of its 81,920 MiB), so a
    plain ``nvidia.com/gpu: 1`` would never fit a MIG card; pyhami gives it the whole
    card's instance, as its owner expects."""
    if memory_mib is not None:
        return memory_mib
    if percent >= 100 and profiles:
        return max(profile.memory for profile in profiles)
    return card_memory * percent // 100


def instances_that_fit(profiles: Sequence[MigProfile], occupied: Iterable[MigPlacement],
                       memory: int, most: int) -> list[MigInstance]:
    """Up to ``most`` instances of ``memory`` MiB chosen one after the other on one card,
    each seeing the ones before it: what one container asking several cards may take of
    a single MIG card."""
    taken = list(occupied)
    chosen: list[MigInstance] = []
    while len(chosen) < most:
        instance = select_instance(profiles, taken, memory)
        if instance is None:
            break
        chosen.append(instance)
        taken.append(instance.placement)
    return chosen


def profile_of(profiles: Sequence[MigProfile], name: str) -> MigProfile | None:
    return next((profile for profile in profiles if profile.name == name), None)


# The reservation annotation ---------------------------------------------------------


class MigReservation(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """One entry of ``hami.io/vgpu-mig-allocations``: the instance reserved for one card
    of one container (``container_index`` counts init containers first,
    ``device_index`` is the card's position in the container's list), and, once the
    node's agent created it, its runtime identity."""

    container_index: int
    device_index: int
    gpu_uuid: str = msgspec.field(name="gpuUUID")
    profile: str
    placement: MigPlacement
    mig_uuid: str = msgspec.field(default="", name="migUUID")
    gpu_instance_id: int | None = msgspec.field(default=None, name="gpuInstanceID")
    compute_instance_id: int | None = msgspec.field(default=None, name="computeInstanceID")

    @property
    def live(self) -> bool:
        """Whether the agent recorded the instance it created (all three runtime fields)."""
        return self.mig_uuid != ""


class MigReservationError(InvalidInput):
    """A ``hami.io/vgpu-mig-allocations`` annotation that HAMi's rules refuse; the
    message names the entry."""


# Decoding is lenient on the fields' types (HAMi's JSON decoder takes any in-range
# integer) and strict on HAMi's rules, applied after it.
class _RawPlacement(msgspec.Struct):
    start: Annotated[int, msgspec.Meta(ge=0, le=_ID_MAX)] = 0
    size: Annotated[int, msgspec.Meta(ge=0, le=_ID_MAX)] = 0


class _RawReservation(msgspec.Struct, rename="camel"):
    container_index: int = 0
    device_index: int = 0
    gpu_uuid: str = msgspec.field(default="", name="gpuUUID")
    profile: str = ""
    placement: _RawPlacement = msgspec.field(default_factory=_RawPlacement)
    mig_uuid: str = msgspec.field(default="", name="migUUID")
    gpu_instance_id: Annotated[int, msgspec.Meta(ge=0, le=_ID_MAX)] | None = msgspec.field(
        default=None, name="gpuInstanceID")
    compute_instance_id: Annotated[int, msgspec.Meta(ge=0, le=_ID_MAX)] | None = msgspec.field(
        default=None, name="computeInstanceID")


_RAW_DECODER = msgspec.json.Decoder(
    Annotated[list[_RawReservation], msgspec.Meta(max_length=RESERVATIONS_MAX)])
_ENCODER = msgspec.json.Encoder()


def encode_reservations(reservations: Sequence[MigReservation]) -> str:
    """The annotation's JSON; the runtime fields only where set."""
    return _ENCODER.encode(list(reservations)).decode()


def decode_reservations(text: str) -> tuple[MigReservation, ...]:
    """The reservations of an annotation, by HAMi's rules: an empty text holds none;
    every entry needs its container and device positions, its card's UUID, a profile
    and a placement of a non-zero size; the runtime identity is all three fields or none;
    no (container, device) pair twice.

    Raises ``MigReservationError`` naming the first entry that breaks a rule. Beyond
    HAMi, a placement past 64 slices and a profile not of the form ``<n>g.<...>`` are
    refused: no GPU has either."""
    if text == "":
        return ()
    try:
        raw = _RAW_DECODER.decode(text)
    except msgspec.DecodeError as error:
        raise MigReservationError(
            f"{MIG_ALLOCATIONS_ANNOTATION}: {shown(text)} is not a JSON list of MIG "
            f"allocations: {error}") from None
    seen: set[tuple[int, int]] = set()
    out: list[MigReservation] = []
    for i, entry in enumerate(raw):
        where = f"{MIG_ALLOCATIONS_ANNOTATION}: MIG allocation {i}"
        if (entry.container_index < 0 or entry.device_index < 0 or not entry.gpu_uuid
                or not entry.profile or entry.placement.size == 0):
            raise MigReservationError(f"{where} is incomplete: it needs containerIndex, "
                                      "deviceIndex, gpuUUID, profile and a placement size")
        runtime = (entry.mig_uuid != "", entry.gpu_instance_id is not None,
                   entry.compute_instance_id is not None)
        if any(runtime) and not all(runtime):
            raise MigReservationError(f"{where} has partial runtime identity: migUUID, "
                                      "gpuInstanceID and computeInstanceID go together")
        key = (entry.container_index, entry.device_index)
        if key in seen:
            raise MigReservationError(
                f"{where} repeats container {key[0]} device {key[1]}")
        seen.add(key)
        if _PROFILE_NAME.fullmatch(entry.profile) is None or len(entry.profile) > \
                PROFILE_NAME_MAX:
            raise MigReservationError(
                f"{where}: profile {shown(entry.profile)} is not of the form <n>g.<...>")
        placement = entry.placement
        if placement.start > SLICES_MAX or placement.size > SLICES_MAX:
            raise MigReservationError(
                f"{where}: placement {placement.start}+{placement.size} is beyond "
                f"{SLICES_MAX} slices")
        out.append(MigReservation(
            container_index=entry.container_index, device_index=entry.device_index,
            gpu_uuid=entry.gpu_uuid, profile=entry.profile,
            placement=MigPlacement(placement.start, placement.size),
            mig_uuid=entry.mig_uuid, gpu_instance_id=entry.gpu_instance_id,
            compute_instance_id=entry.compute_instance_id))
    return tuple(out)


def with_runtime(reservations: Sequence[MigReservation],
                 made: Iterable[tuple[int, int, str, int, int]]) -> tuple[MigReservation, ...]:
    """``reservations`` with the runtime identity of the instances a node made: per
    instance its (container index, device index, MIG UUID, GPU instance id, compute
    instance id). Raises ``MigReservationError`` for an instance no reservation has."""
    by_position = {(r.container_index, r.device_index): r for r in reservations}
    for container, device, mig_uuid, gpu_instance, compute_instance in made:
        known = by_position.get((container, device))
        if known is None:
            raise MigReservationError(
                f"{MIG_ALLOCATIONS_ANNOTATION}: the node made an instance for container "
                f"{container} device {device}, which no reservation names")
        by_position[(container, device)] = msgspec.structs.replace(
            known, mig_uuid=mig_uuid, gpu_instance_id=gpu_instance,
            compute_instance_id=compute_instance)
    return tuple(by_position.values())
