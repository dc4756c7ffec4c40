"""NVML's MIG tables for the cards the simulated inventory offers in MIG mode, and how
the agent turns what NVML reports into the profiles a card registers.

The figures are NVML's (``nvmlDeviceGetGpuInstanceProfileInfo`` and
``nvmlDeviceGetGpuInstancePossiblePlacements``) on an A100 80GB and an H100 80GB HBM3 with
a current driver (R535 and later): memory in MiB as ``memorySizeMB`` gives it, ``slices``
NVML's ``sliceCount`` (compute slices), placements in memory slices out of 8; the H200's
were read from a driver by the GPU check (``H200_141GB``). The simulated inventory and
the fake NVML serve them, so the whole MIG path runs without a GPU; on a GPU node the
agent reads the same fields from the driver, and ``scripts/gpu-check.sh`` compares the two
(``docs/gpu-check.md``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from common.core.deviceconfig import MigProfiles as AllowedProfiles
from common.core.mig import MigPlacement, MigProfile

# NVML's GPU-instance profile constants (nvml.h NVML_GPU_INSTANCE_PROFILE_*): the index
# nvmlDeviceGetGpuInstanceProfileInfo takes, one per slice count.
GI_PROFILE_1_SLICE = 0
GI_PROFILE_2_SLICE = 1
GI_PROFILE_3_SLICE = 2
GI_PROFILE_4_SLICE = 3
GI_PROFILE_7_SLICE = 4
GI_PROFILE_8_SLICE = 5
GI_PROFILE_6_SLICE = 6
GI_PROFILE_1_SLICE_REV1 = 7
"""A one-slice instance with the media engines (NVIDIA's ``1g.<n>gb+me``)."""
GI_PROFILE_1_SLICE_REV2 = 9
"""A one-slice instance with two memory slices (an H100's ``1g.20gb``)."""
GI_PROFILE_BY_SLICES = {1: GI_PROFILE_1_SLICE, 2: GI_PROFILE_2_SLICE, 3: GI_PROFILE_3_SLICE,
                        4: GI_PROFILE_4_SLICE, 6: GI_PROFILE_6_SLICE, 7: GI_PROFILE_7_SLICE,
                        8: GI_PROFILE_8_SLICE}
"""A profile name's ``<n>g`` prefix to the constant HAMi asks NVML about (HAMi's
``profileNameToGIProfileID``)."""


@dataclass(frozen=True, slots=True)
class GpuInstanceProfileInfo:
    """The fields of NVML's ``nvmlGpuInstanceProfileInfo_t`` the agent reads, and the
    placements NVML offers for the profile."""

    constant: int
    """The ``NVML_GPU_INSTANCE_PROFILE_*`` index asked for."""
    id: int
    """The profile id NVML answers (``nvidia-smi mig -lgip``'s ID): what creating an
    instance and listing placements take."""
    memory_mib: int
    slices: int
    instances: int
    multiprocessors: int
    placements: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class MigCardTable:
    """One model's NVML answers in MIG mode."""

    name: str
    memory_mib: int
    profiles: tuple[GpuInstanceProfileInfo, ...]

    def profile(self, constant: int) -> GpuInstanceProfileInfo | None:
        return next((p for p in self.profiles if p.constant == constant), None)


def _ones(count: int) -> tuple[tuple[int, int], ...]:
    return tuple((start, 1) for start in range(count))


_TWO_SLICE = ((0, 2), (2, 2), (4, 2))
_THREE_SLICE = ((0, 4), (4, 4))

A100_80GB = MigCardTable("NVIDIA A100-SXM4-80GB", 81920, (
    GpuInstanceProfileInfo(GI_PROFILE_1_SLICE, 19, 9728, 1, 7, 14, _ones(7)),
    GpuInstanceProfileInfo(GI_PROFILE_2_SLICE, 14, 19968, 2, 3, 28, _TWO_SLICE),
    GpuInstanceProfileInfo(GI_PROFILE_3_SLICE, 9, 40192, 3, 2, 42, _THREE_SLICE),
    GpuInstanceProfileInfo(GI_PROFILE_4_SLICE, 5, 40192, 4, 1, 56, ((0, 4),)),
    GpuInstanceProfileInfo(GI_PROFILE_7_SLICE, 0, 80896, 7, 1, 98, ((0, 8),)),
))
"""NVIDIA A100 80GB (SXM4; the PCIe card answers the same)."""

H100_80GB = MigCardTable("NVIDIA H100 80GB HBM3", 81559, (
    GpuInstanceProfileInfo(GI_PROFILE_1_SLICE, 19, 9984, 1, 7, 16, _ones(7)),
    GpuInstanceProfileInfo(GI_PROFILE_2_SLICE, 14, 20096, 2, 3, 32, _TWO_SLICE),
    GpuInstanceProfileInfo(GI_PROFILE_3_SLICE, 9, 40448, 3, 2, 60, _THREE_SLICE),
    GpuInstanceProfileInfo(GI_PROFILE_4_SLICE, 5, 40448, 4, 1, 64, ((0, 4),)),
    GpuInstanceProfileInfo(GI_PROFILE_7_SLICE, 0, 81152, 7, 1, 132, ((0, 8),)),
))
"""NVIDIA H100 80GB HBM3 (SXM5)."""

H200_141GB = MigCardTable("NVIDIA H200", 143771, (
    GpuInstanceProfileInfo(GI_PROFILE_1_SLICE, 19, 16384, 1, 7, 16, _ones(7)),
    GpuInstanceProfileInfo(GI_PROFILE_2_SLICE, 14, 33280, 2, 3, 32, _TWO_SLICE),
    GpuInstanceProfileInfo(GI_PROFILE_3_SLICE, 9, 71424, 3, 2, 60, _THREE_SLICE),
    GpuInstanceProfileInfo(GI_PROFILE_4_SLICE, 5, 71424, 4, 1, 64, ((0, 4),)),
    GpuInstanceProfileInfo(GI_PROFILE_7_SLICE, 0, 143360, 7, 1, 132, ((0, 8),)),
    GpuInstanceProfileInfo(GI_PROFILE_1_SLICE_REV1, 20, 16384, 1, 1, 16, _ones(7)),
    GpuInstanceProfileInfo(GI_PROFILE_1_SLICE_REV2, 15, 33280, 1, 4, 26,
                           ((0, 2), (2, 2), (4, 2), (6, 2))),
))
"""NVIDIA H200 141GB HBM3e (SXM; NVML names it plainly ``NVIDIA H200``): 1g.18gb (7),
2g.35gb (3), 3g.71gb (2), 4g.71gb (1), 7g.141gb (1), and, as NVML also lists them,
1g.18gb+me (1) and 1g.35gb (4). Every figure is NVML's own, read by
``scripts/gpu-check.sh`` on an H200 lent to this project (driver 580.159.04, MIG mode
off: NVML answers the profiles all the same): the card's 143,771 MiB, a slice of 16,384
MiB (two 33,280; four 71,424; eight 143,360), and the H100's ids, instance counts,
multiprocessors and placements. The check's report prints NVML's table in this form: a
new driver's figures are pasted here."""

TABLES = (A100_80GB, H100_80GB, H200_141GB)
"""Every model whose NVML answers are known here, by ``MigCardTable.name``."""


def table_for(card_name: str) -> MigCardTable | None:
    """The table of the model NVML names ``card_name`` exactly; None for any other."""
    return next((table for table in TABLES if table.name == card_name), None)


def allowed_profiles(card_name: str, allowlist: Iterable[AllowedProfiles]
                     ) -> tuple[str, ...] | None:
    """The profile names ``migProfileAllowlist`` allows on a card of NVML name
    ``card_name``: the first entry one of whose models the name contains (HAMi's
    ``containsModel``); None when no entry matches (the card cannot serve MIG)."""
    for entry in allowlist:
        if any(model in card_name for model in entry.models):
            return entry.profiles
    return None


def slices_of(profile_name: str) -> int:
    """The ``<n>`` of a profile named ``<n>g.<...>``."""
    return int(profile_name.split("g.", 1)[0])


def nvml_profile(table: Sequence[GpuInstanceProfileInfo], name: str
                 ) -> GpuInstanceProfileInfo | None:
    """NVML's answer for the profile ``name`` names: the one of its ``<n>g`` slice count
    (HAMi's ``profileNameToGIProfileID``), None when NVML has none."""
    constant = GI_PROFILE_BY_SLICES.get(slices_of(name), -1)
    return next((info for info in table if info.constant == constant), None)


def register_profiles(table: Sequence[GpuInstanceProfileInfo], allowed: Iterable[str]
                      ) -> tuple[MigProfile, ...]:
    """The profiles a MIG card registers, from NVML's answers, as HAMi's
    ``discoverMigProfiles`` derives them: each allowed name asks NVML for the profile of
    its slice count; its compute share is its multiprocessors over the largest profile's
    (of all NVML answered), rounded up; a name NVML has no profile for is left out."""
    largest = max((info.multiprocessors for info in table), default=0)
    profiles: list[MigProfile] = []
    for name in allowed:
        info = nvml_profile(table, name)
        if info is None or largest == 0:
            continue
        profiles.append(MigProfile(
            name=name, memory=info.memory_mib,
            cores=math.ceil(info.multiprocessors * 100 / largest), slices=info.slices,
            placements=tuple(MigPlacement(start, size) for start, size in info.placements),
            instances=info.instances))
    return tuple(profiles)


def slot_count(profiles: Iterable[MigProfile]) -> int:
    """A MIG card's registered slot count: the most instances of any of its profiles."""
    return max((profile.instances for profile in profiles), default=0)


def profile_name(info: GpuInstanceProfileInfo, card_memory_mib: int) -> str:
    """The name NVIDIA gives a profile (``1g.10gb``): its slices, and its memory as a share
    of the card's in eighths, rounded up, times the card's GiB rounded up (an A100 80GB's
    3g instance of 40,192 MiB is ``3g.40gb``). A half rounds up, as NVIDIA names an
    H200's half (70.5 GiB) ``3g.71gb``; Python's ``round`` would make it 70."""
    if card_memory_mib <= 0:
        return f"{info.slices}g.{_half_up(info.memory_mib / 1024)}gb"
    eighths = math.ceil(info.memory_mib * 8 / card_memory_mib)
    return f"{info.slices}g.{_half_up(eighths / 8 * math.ceil(card_memory_mib / 1024))}gb"


def _half_up(value: float) -> int:
    return math.floor(value + 0.5)
