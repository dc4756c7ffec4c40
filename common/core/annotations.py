"""The allocation annotations written on a Pod, and reading them back for the ledger."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.core.errors import InvalidInput
from common.core.mig import (
    MIG_ALLOCATIONS_ANNOTATION,
    MigInstance,
    MigReservation,
    MigReservationError,
    decode_reservations,
    encode_reservations,
)
from common.core.model import CARD_COUNT_MAX, CARD_MEMORY_MAX_MIB
from common.core.names import shown
from common.core.vendors import NVIDIA, Vendor

ALLOCATED_ANNOTATION = "hami.io/vgpu-devices-allocated"
TO_ALLOCATE_ANNOTATION = "hami.io/vgpu-devices-to-allocate"
NODE_ANNOTATION = "hami.io/vgpu-node"
VGPU_NODE_LABEL = NODE_ANNOTATION
"""HAMi writes the node's name under the same key as a pod label too, for its monitor."""
TIME_ANNOTATION = "hami.io/vgpu-time"
BIND_PHASE_ANNOTATION = "hami.io/bind-phase"
BIND_TIME_ANNOTATION = "hami.io/bind-time"
CORDON_ANNOTATION = "hami.io/device-cordon"


class AnnotationError(InvalidInput):
    """An allocation annotation that does not decode; the message says where."""


def comma_list(text: str) -> list[str]:
    """The entries of a comma-separated list (a card list annotation or flag), blanks left out."""
    return [entry.strip() for entry in text.split(",") if entry.strip()]


def cordoned_uuids(annotations: Mapping[str, str]) -> frozenset[str]:
    """The UUIDs of the cards a node's annotations cordon (``hami.io/device-cordon``,
    whether the agent reported it or the Node carries it)."""
    return frozenset(comma_list(annotations.get(CORDON_ANNOTATION, "")))


@dataclass(frozen=True, slots=True)
class CardGrant:
    """One card given to one container: its memory slice (MiB) and core share (%); on a
    MIG card, the instance reserved (its profile's memory and compute share are the
    grant's)."""

    uuid: str
    memory: int
    cores: int
    instance: MigInstance | None = None


Containers = tuple[tuple[CardGrant, ...], ...]


def encode_devices(containers: Sequence[Sequence[CardGrant]], vendor: Vendor = NVIDIA) -> str:
    """``UUID,NVIDIA,mem,cores:`` per card (the vendor's name) and ``;`` closing each
    container."""
    return "".join(
        "".join(f"{g.uuid},{vendor.name},{g.memory},{g.cores}:" for g in grants) + ";"
        for grants in containers
    )


def decode_devices(text: str) -> Containers:
    if text and not text.endswith(";"):
        raise AnnotationError(f"{ALLOCATED_ANNOTATION}: {shown(text)} does not end with ';'")
    containers: list[tuple[CardGrant, ...]] = []
    for segment in text.split(";")[:-1] if text else ():
        grants: list[CardGrant] = []
        for card in segment.split(":"):
            if not card:
                continue
            fields = card.split(",")
            if len(fields) != 4:
                raise AnnotationError(
                    f"{ALLOCATED_ANNOTATION}: card {shown(card)} is not UUID,TYPE,MEMORY,CORES"
                )
            uuid, _vendor, memory, cores = (field.strip() for field in fields)
            memory_mib = _amount(memory, CARD_MEMORY_MAX_MIB)
            core_share = _amount(cores, CARD_COUNT_MAX)
            if not uuid or memory_mib is None or core_share is None:
                raise AnnotationError(
                    f"{ALLOCATED_ANNOTATION}: card {shown(card)} needs a UUID, memory of "
                    f"0..{CARD_MEMORY_MAX_MIB} MiB and cores of 0..{CARD_COUNT_MAX}"
                )
            grants.append(CardGrant(uuid, memory_mib, core_share))
        containers.append(tuple(grants))
    return tuple(containers)


def _amount(text: str, bound: int) -> int | None:
    """``text`` as an integer of 0..``bound``, or None. Anyone who may create a pod may
    write this annotation: its numbers must fit the ledger's int64 sums."""
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(bound)):
        return None
    value = int(text)
    return value if value <= bound else None


def mig_reservations(containers: Containers) -> list[MigReservation]:
    """``hami.io/vgpu-mig-allocations``'s entries for the MIG instances among ``containers``
    (init containers first, as the allocation lists them)."""
    return [MigReservation(container_index=position, device_index=index,
                           gpu_uuid=grant.uuid, profile=grant.instance.profile,
                           placement=grant.instance.placement,
                           mig_uuid=grant.instance.mig_uuid,
                           gpu_instance_id=grant.instance.gpu_instance_id,
                           compute_instance_id=grant.instance.compute_instance_id)
            for position, grants in enumerate(containers)
            for index, grant in enumerate(grants) if grant.instance is not None]


def allocation_annotations(node: str, containers: Containers) -> dict[str, str]:
    """The allocation annotations of a pod given ``containers``' cards on ``node``, those
    that do not depend on the clock: the devices allocated and to allocate, the node, and
    the MIG instances when it holds any."""
    devices = encode_devices(containers)
    annotations = {
        ALLOCATED_ANNOTATION: devices,
        TO_ALLOCATE_ANNOTATION: devices,
        NODE_ANNOTATION: node,
    }
    reservations = mig_reservations(containers)
    if reservations:
        annotations[MIG_ALLOCATIONS_ANNOTATION] = encode_reservations(reservations)
    return annotations


def with_reservations(containers: Containers,
                      reservations: Sequence[MigReservation]) -> Containers:
    """``containers`` read from the allocation annotation with the MIG instances of the
    reservation annotation put on their grants.

    Raises ``MigReservationError`` for a reservation naming a container or card the
    allocation does not have, or another card's UUID than the allocation's."""
    placed = [list(grants) for grants in containers]
    for reservation in reservations:
        where = (f"{MIG_ALLOCATIONS_ANNOTATION}: container {reservation.container_index} "
                 f"device {reservation.device_index}")
        if (reservation.container_index >= len(placed)
                or reservation.device_index >= len(placed[reservation.container_index])):
            raise MigReservationError(f"{where} is not in {ALLOCATED_ANNOTATION}")
        grant = placed[reservation.container_index][reservation.device_index]
        if grant.uuid != reservation.gpu_uuid:
            raise MigReservationError(
                f"{where} names card {shown(reservation.gpu_uuid)}, the allocation "
                f"{shown(grant.uuid)}")
        placed[reservation.container_index][reservation.device_index] = CardGrant(
            grant.uuid, grant.memory, grant.cores,
            MigInstance(reservation.profile, reservation.placement, reservation.mig_uuid,
                        reservation.gpu_instance_id, reservation.compute_instance_id))
    return tuple(tuple(grants) for grants in placed)


def decode_allocation(devices: str, reservations: str = "") -> Containers:
    """A pod's cards from its allocation annotation, with the MIG instances of its
    ``hami.io/vgpu-mig-allocations`` (``reservations``) on their grants.

    Raises ``AnnotationError`` naming the annotation and the entry that does not
    decode."""
    containers = decode_devices(devices)
    if not reservations:
        return containers
    try:
        return with_reservations(containers, decode_reservations(reservations))
    except MigReservationError as error:
        raise AnnotationError(str(error)) from None
