"""Check 5, MIG: what NVML answers for every GPU-instance profile of the real card, against
``agent/mig/tables.py``, the table the simulated NVML serves and every MIG test trusts.

Read-only by default: the MIG mode and, for every ``NVML_GPU_INSTANCE_PROFILE_*`` constant,
``nvmlDeviceGetGpuInstanceProfileInfo`` (v2, with NVML's own name for the profile) and the
possible placements, where NVML gives them with MIG mode off. The report holds the whole
table, and the same table written as ``agent/mig/tables.py`` writes one, to paste there.

With ``--mig-write`` (``PYHAMI_GPU_MIG_WRITE=1``), and only on an idle GPU 0 or one already
in MIG mode: MIG mode switched on, the agent's discovery run over it (``MigSource``, what
the card would register), one 1g instance made and destroyed through
``agent.mig.nvml.NvmlMigDevices``, and the mode switched back off when the check switched it
on. The mode is restored in a ``finally``; a restore that needs a GPU reset is reported.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
from typing import Any

import msgspec
import pynvml
import pytest

from agent.mig.nvml import NvmlMigDevices, pynvml_library
from agent.mig.port import MigError, MigMode
from agent.mig.setup import nvml_mig_node
from agent.mig.tables import (
    GI_PROFILE_1_SLICE,
    GpuInstanceProfileInfo,
    allowed_profiles,
    table_for,
)
from agent.vendors.nvidia.nvml import NvmlSource
from common.core.deviceconfig import CHART_MIG_PROFILE_ALLOWLIST
from common.core.mig import MigPlacement
from tests.builders import H100_NVML_NAMES, H200_NVML_NAMES
from tests.gpu.machine import SMI_ERRORS, gpu_count, gpu_marks, smi
from tests.gpu.migtable import Profile, as_python, compare_with_table, profile_label
from tests.gpu.report import MIG_WRITE_ENV, CheckLog

pytestmark = gpu_marks()

ALLOWLIST = (H200_NVML_NAMES, *CHART_MIG_PROFILE_ALLOWLIST, H100_NVML_NAMES)
"""HAMi's chart allowlist with the entries naming the H100 and H200 as NVML does."""
def _placements(handle: object, profile_id: int) -> tuple[tuple[int, int], ...]:
    """NVML's two calls, as ``NvmlMigDevices`` makes them: the count, then the array."""
    count = ctypes.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None,
                                                      ctypes.pointer(count))
    if count.value == 0:
        return ()
    array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array,
                                                      ctypes.pointer(count))
    return tuple((array[i].start, array[i].size) for i in range(min(count.value, len(array))))


def _why(error: Exception) -> str:
    """NVML's error as the report keeps it: its class, its words and its code."""
    return f"{type(error).__name__}: {error} ({getattr(error, 'value', '?')})"


def read_profiles(handle: object) -> list[Profile]:
    """Every constant the installed pynvml knows, answered or not."""
    found = []
    for constant in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        profile = Profile(constant)
        found.append(profile)
        try:
            raw = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, constant)
        except pynvml.NVMLError as error:
            profile.error = _why(error)
            continue
        try:
            placements = _placements(handle, raw.id)
        except pynvml.NVMLError as error:
            placements, profile.placements_error = (), _why(error)
        profile.info = GpuInstanceProfileInfo(
            constant=constant, id=raw.id, memory_mib=raw.memorySizeMB, slices=raw.sliceCount,
            instances=raw.instanceCount, multiprocessors=raw.multiprocessorCount,
            placements=placements)
        profile.name = profile_label(getattr(raw, "name", b""))
        profile.engines = {field: getattr(raw, field) for field in (
            "copyEngineCount", "decoderCount", "encoderCount", "jpegCount", "ofaCount",
            "isP2pSupported") if hasattr(raw, field)}
    return found


def _card_memory(handle: object) -> int:
    return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024))


def test_nvmls_mig_profiles_are_the_tables(seen: CheckLog) -> None:
    compared = 0
    unanswered: list[str] = []
    pynvml.nvmlInit()
    try:
        for index in range(gpu_count()):
            gpu = f"GPU {index}"
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = profile_label(pynvml.nvmlDeviceGetName(handle))
            memory = _card_memory(handle)
            try:
                current, pending = pynvml.nvmlDeviceGetMigMode(handle)
            except pynvml.NVMLError as error:
                seen.saw(f"{gpu} MIG mode", f"{type(error).__name__}: the card has no MIG")
                unanswered.append(f"{gpu} ({name}) has no MIG")
                continue
            seen.saw(f"{gpu} MIG mode", {"current": current, "pending": pending})
            profiles = read_profiles(handle)
            seen.saw(f"{gpu} profiles", [
                {"constant": p.constant, "name": p.name, "error": p.error,
                 "placements_error": p.placements_error, "engines": p.engines,
                 **(dataclasses.asdict(p.info) if p.info is not None else {})}
                for p in profiles])
            seen.saw(f"{gpu} table_python", as_python(name, memory, profiles))
            seen.saw(f"{gpu} HAMi's chart allowlist gives",
                     allowed_profiles(name, CHART_MIG_PROFILE_ALLOWLIST))
            if not any(p.info is not None for p in profiles):
                unanswered.append(f"{gpu} ({name}) answers no profile with MIG mode "
                                  f"{'on' if current else 'off'}")
                continue
            table = table_for(name)
            if table is None:
                unanswered.append(f"{gpu}: no table in agent/mig/tables.py for {name!r}: "
                                  "paste the report's table_python there")
                continue
            compared += compare_with_table(seen, gpu, table, memory, profiles)
    finally:
        pynvml.nvmlShutdown()
    if not compared:
        pytest.skip("; ".join(unanswered) or "nothing compared")
    seen.assert_same()


def _free_placement(devices: NvmlMigDevices, info: GpuInstanceProfileInfo) -> MigPlacement:
    """The highest placement no instance on GPU 0 overlaps (where pyhami puts a 1g)."""
    taken = [instance.placement for instance in devices.instances(0)]
    for start, size in sorted(info.placements, reverse=True):
        placement = MigPlacement(start, size)
        if not any(placement.overlaps(other) for other in taken):
            return placement
    pytest.skip(f"no free placement for a 1g instance on GPU 0 (taken: {taken})")


def test_an_instance_is_made_and_destroyed_through_the_agents_nvml(seen: CheckLog) -> None:
    if os.environ.get(MIG_WRITE_ENV) != "1":
        pytest.skip("read-only: run scripts/gpu-check.sh --mig-write to switch an idle GPU 0 "
                    "into MIG mode, make and destroy one 1g instance, and switch it back")
    devices = NvmlMigDevices(pynvml_library())
    devices.open()
    try:
        try:
            before = devices.mig_mode(0)
        except MigError as error:
            pytest.skip(f"GPU 0 has no MIG: {error}")
        seen.saw("mode_before", dataclasses.asdict(before))
        if before.changing:
            pytest.skip("GPU 0's MIG mode change waits for a GPU reset: left alone")
        if not before.current and devices.busy(0):
            pytest.skip("GPU 0 runs processes: not switched into MIG mode")
        try:
            if not before.current:
                enabled = devices.enable_mig(0)
                seen.saw("mode_enabled", dataclasses.asdict(enabled))
                if not enabled.current:
                    pytest.skip("MIG mode waits for a GPU reset here: switched back")
            _exercise(seen, devices)
        finally:
            _restore(seen, devices, before)
    finally:
        devices.close()
    seen.assert_same()


def _exercise(seen: CheckLog, devices: NvmlMigDevices) -> None:
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name, memory = _card_memory_and_name(handle)
        profiles = read_profiles(handle)
        seen.saw("profiles_in_mig_mode", [
            {"constant": p.constant, "name": p.name, "error": p.error,
             "placements_error": p.placements_error,
             **(dataclasses.asdict(p.info) if p.info is not None else {})}
            for p in profiles])
        seen.saw("table_python_in_mig_mode", as_python(name, memory, profiles))
        table = table_for(name)
        if table is not None:
            compare_with_table(seen, "GPU 0 (MIG on)", table, memory, profiles)
    finally:
        pynvml.nvmlShutdown()
    _discover(seen)
    read = devices.profiles(0)
    one = next((p for p in read if p.constant == GI_PROFILE_1_SLICE), None)
    if one is None:
        seen.differs("NVML offers no 1-slice profile on GPU 0 in MIG mode")
        return
    existing = devices.instances(0)
    seen.saw("instances_before", [dataclasses.asdict(i) for i in existing])
    made = devices.create(0, one.id, _free_placement(devices, one))
    try:
        seen.saw("made", dataclasses.asdict(made))
        listed = devices.instances(0)
        if made not in listed:
            seen.differs(f"the instance made is not listed: {listed}")
        if not made.mig_uuid.startswith("MIG-"):
            seen.differs(f"the instance made has no MIG device UUID: {made.mig_uuid!r}")
        try:
            seen.saw("nvidia_smi_L", smi("-L").splitlines())
        except SMI_ERRORS as error:
            seen.saw("nvidia_smi_L", str(error))
    finally:
        devices.destroy(0, made.gpu_instance_id)
    seen.compare("the instances after destroy", devices.instances(0), existing,
                 ours_name="NVML", theirs_name="before")


def _card_memory_and_name(handle: object) -> tuple[str, int]:
    return profile_label(pynvml.nvmlDeviceGetName(handle)), _card_memory(handle)


def _discover(seen: CheckLog) -> None:
    """The agent's discovery over the real card in MIG mode: what it would register."""
    node = nvml_mig_node(NvmlSource(), ALLOWLIST)
    node.source.open()
    try:
        cards = node.source.read()
    finally:
        node.source.close()
    registered: list[dict[str, Any]] = [
        {"uuid": card.uuid, "count": card.count, "memory": card.memory, "mode": card.mode,
         "profiles": msgspec.to_builtins(card.mig_profiles)} for card in cards]
    seen.saw("registered", registered)
    if not cards:
        seen.differs("the agent's MIG discovery registers no card")


def _restore(seen: CheckLog, devices: NvmlMigDevices, before: MigMode) -> None:
    """Put GPU 0's MIG mode back as the check found it (its current mode, pending the same);
    say so loudly when the driver leaves the change pending (a GPU reset is then needed)."""
    after = devices.mig_mode(0)
    if after != before:
        pynvml.nvmlInit()
        try:
            pynvml.nvmlDeviceSetMigMode(pynvml.nvmlDeviceGetHandleByIndex(0),
                                        int(before.current))
        finally:
            pynvml.nvmlShutdown()
        after = devices.mig_mode(0)
    seen.saw("mode_after", dataclasses.asdict(after))
    seen.compare("GPU 0's MIG mode at the end", after, before, ours_name="now",
                 theirs_name="before the check")
