"""The allocation annotations written on a Pod, and reading them back for the ledger."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ALLOCATED_ANNOTATION = "hami.io/vgpu-devices-allocated"
TO_ALLOCATE_ANNOTATION = "hami.io/vgpu-devices-to-allocate"
NODE_ANNOTATION = "hami.io/vgpu-node"
TIME_ANNOTATION = "hami.io/vgpu-time"
BIND_PHASE_ANNOTATION = "hami.io/bind-phase"
BIND_TIME_ANNOTATION = "hami.io/bind-time"
CORDON_ANNOTATION = "hami.io/device-cordon"

VENDOR = "NVIDIA"


class AnnotationError(ValueError):
    """An allocation annotation that does not decode; the message says where."""


@dataclass(frozen=True, slots=True)
class CardGrant:
    """One card given to one container: its memory slice (MiB) and core share (%)."""

    uuid: str
    memory: int
    cores: int


Containers = tuple[tuple[CardGrant, ...], ...]


def encode_devices(containers: Sequence[Sequence[CardGrant]]) -> str:
    """``UUID,NVIDIA,mem,cores:`` per card and ``;`` closing each container."""
    return "".join(
        "".join(f"{g.uuid},{VENDOR},{g.memory},{g.cores}:" for g in grants) + ";"
        for grants in containers
    )


def decode_devices(text: str) -> Containers:
    if text and not text.endswith(";"):
        raise AnnotationError(f"{ALLOCATED_ANNOTATION}: {text!r} does not end with ';'")
    containers: list[tuple[CardGrant, ...]] = []
    for segment in text.split(";")[:-1] if text else ():
        grants: list[CardGrant] = []
        for card in segment.split(":"):
            if not card:
                continue
            fields = card.split(",")
            if len(fields) != 4:
                raise AnnotationError(
                    f"{ALLOCATED_ANNOTATION}: card {card!r} is not UUID,TYPE,MEMORY,CORES"
                )
            uuid, _vendor, memory, cores = (field.strip() for field in fields)
            if not uuid or not memory.isdigit() or not cores.isdigit():
                raise AnnotationError(
                    f"{ALLOCATED_ANNOTATION}: card {card!r} needs a UUID and "
                    "non-negative integer memory and cores"
                )
            grants.append(CardGrant(uuid, int(memory), int(cores)))
        containers.append(tuple(grants))
    return tuple(containers)
