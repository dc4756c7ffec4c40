"""The MIG check's pure part: NVML's answers for each GPU-instance profile constant, written
as ``agent/mig/tables.py`` writes a table, and compared with the table there field by field.
No NVML here: the check reads, this judges (and is tested without a GPU)."""

from __future__ import annotations

import dataclasses

from agent.mig.tables import GpuInstanceProfileInfo, MigCardTable, profile_name
from tests.gpu.report import CheckLog

CONSTANT_NAMES = {0: "GI_PROFILE_1_SLICE", 1: "GI_PROFILE_2_SLICE", 2: "GI_PROFILE_3_SLICE",
                  3: "GI_PROFILE_4_SLICE", 4: "GI_PROFILE_7_SLICE", 5: "GI_PROFILE_8_SLICE",
                  6: "GI_PROFILE_6_SLICE", 7: "GI_PROFILE_1_SLICE_REV1",
                  9: "GI_PROFILE_1_SLICE_REV2"}


@dataclasses.dataclass
class Profile:
    """One constant's answer: NVML's figures, or why it has none."""

    constant: int
    info: GpuInstanceProfileInfo | None = None
    name: str = ""
    engines: dict[str, int] = dataclasses.field(default_factory=dict)
    placements_error: str = ""
    error: str = ""


def profile_label(raw: object) -> str:
    """NVML's profile or card name (bytes from older pynvml), without C's padding."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return text.strip("\x00 ")


def as_python(name: str, memory_mib: int, profiles: list[Profile]) -> list[str]:
    """NVML's answers written as ``agent/mig/tables.py`` writes a table."""
    lines = [f'MigCardTable("{name}", {memory_mib}, (']
    for profile in profiles:
        info = profile.info
        if info is None:
            continue
        constant = CONSTANT_NAMES.get(info.constant, str(info.constant))
        lines.append(f"    GpuInstanceProfileInfo({constant}, {info.id}, {info.memory_mib}, "
                     f"{info.slices}, {info.instances}, {info.multiprocessors}, "
                     f"{info.placements}),  # {profile.name}")
    lines.append("))")
    return lines


def compare_with_table(seen: CheckLog, gpu: str, table: MigCardTable, card_memory: int,
                       profiles: list[Profile]) -> int:
    """Each of the table's profiles against NVML's answer for its constant; the number of
    fields compared."""
    compared = 0
    seen.compare(f"{gpu} card memory (MiB)", table.memory_mib, card_memory,
                 ours_name="tables.py", theirs_name="NVML")
    answered = {p.constant: p for p in profiles if p.info is not None}
    for ours in table.profiles:
        theirs = answered.get(ours.constant)
        where = f"{gpu} {CONSTANT_NAMES.get(ours.constant, ours.constant)}"
        if theirs is None or theirs.info is None:
            seen.differs(f"{where}: in tables.py, NVML has none")
            continue
        for field in ("id", "memory_mib", "slices", "instances", "multiprocessors"):
            seen.compare(f"{where} {field}", getattr(ours, field), getattr(theirs.info, field),
                         ours_name="tables.py", theirs_name="NVML")
            compared += 1
        if not theirs.placements_error:
            seen.compare(f"{where} placements", ours.placements, theirs.info.placements,
                         ours_name="tables.py", theirs_name="NVML")
            compared += 1
        base = theirs.name.removeprefix("MIG ").split("+")[0]
        if base:
            seen.compare(f"{where} name", profile_name(ours, card_memory), base,
                         ours_name="profile_name", theirs_name="NVML")
    for constant, theirs in answered.items():
        if table.profile(constant) is None:
            seen.differs(f"{gpu} constant {constant} ({theirs.name}): NVML has it, "
                         "tables.py does not")
    return compared


