"""The real machine as the GPU checks read it beside pyhami: whether an NVIDIA driver is
there, nvidia-smi's own answers (parsed here, so the parsers are tested without a GPU),
sysfs, and the facts the report starts with.

nvidia-smi is the independent witness: it reads the driver through its own code, so a
field pyhami's NVML path gets wrong shows as a difference between the two.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SMI_TIMEOUT_S = 30.0
SMI_ERRORS = (RuntimeError, OSError, subprocess.TimeoutExpired)
"""What ``smi`` may raise: nvidia-smi failed, cannot be run, or hung."""
QUERY_FIELDS = ("index", "uuid", "name", "memory.total", "pci.bus_id", "compute_cap")


@functools.cache
def driver_absent() -> str | None:
    """Why the GPU checks cannot run here, or None when NVML starts. Asked once a run."""
    try:
        import pynvml  # noqa: PLC0415 - only a machine with the package can answer
    except ImportError as error:
        return f"pynvml (nvidia-ml-py) is not installed: {error}"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return f"no NVIDIA driver: {type(error).__name__} ({error})"
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return "NVML starts but lists no GPU"
    finally:
        pynvml.nvmlShutdown()
    return None


@dataclass(frozen=True)
class SmiCard:
    """One card as ``nvidia-smi --query-gpu`` prints it (``nounits``: MiB)."""

    index: int
    uuid: str
    name: str
    memory_mib: int | None
    bus_id: str
    compute_cap: str | None
    """``9.0``; None where nvidia-smi has no such field or prints ``[N/A]``."""


def _number(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def parse_query(text: str, fields: Sequence[str] = QUERY_FIELDS) -> list[SmiCard]:
    """``nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits``'s lines."""
    cards = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = dict(zip(fields, (value.strip() for value in line.split(",")), strict=False))
        cap = values.get("compute_cap")
        cards.append(SmiCard(
            index=int(values["index"]), uuid=values["uuid"], name=values["name"],
            memory_mib=_number(values.get("memory.total", "")), bus_id=values["pci.bus_id"],
            compute_cap=cap if cap and cap[0].isdigit() else None))
    return cards


@dataclass(frozen=True)
class Topology:
    """``nvidia-smi topo -m``: per GPU row, its NVLink peers and its NUMA affinity."""

    nvlinks: dict[int, dict[int, int]]
    """GPU index to {peer GPU index: links}, from the ``NV<n>`` cells."""
    numa: dict[int, str]
    """GPU index to its ``NUMA Affinity`` cell as printed (``0``, ``0-1``, ``N/A``)."""


_GPU_COLUMN = re.compile(r"GPU(\d+)")
_NVLINK_CELL = re.compile(r"NV(\d+)")


def parse_topology(text: str) -> Topology:
    """The matrix nvidia-smi prints with tabs: a header naming the GPU (and NIC) columns,
    then the affinity columns; one row per GPU. Empty cells come from its alignment, so
    past the matrix the non-empty cells are matched to the affinity headers in order."""
    lines = [line for line in text.splitlines() if line.strip()]
    header_at = next((i for i, line in enumerate(lines) if _GPU_COLUMN.search(line)), None)
    nvlinks: dict[int, dict[int, int]] = {}
    numa: dict[int, str] = {}
    if header_at is None:
        return Topology(nvlinks, numa)
    headers = [cell.strip() for cell in lines[header_at].split("\t") if cell.strip()]
    matrix = [h for h in headers if re.fullmatch(r"(GPU|NIC)\d+", h)]
    affinities = headers[len(matrix):]
    for line in lines[header_at + 1:]:
        cells = [cell.strip() for cell in line.split("\t")]
        row = _GPU_COLUMN.fullmatch(cells[0]) if cells else None
        if row is None:
            continue
        gpu = int(row.group(1))
        peers = {}
        for column, cell in zip(matrix, cells[1:1 + len(matrix)], strict=False):
            peer, links = _GPU_COLUMN.fullmatch(column), _NVLINK_CELL.fullmatch(cell)
            if peer is not None and links is not None:
                peers[int(peer.group(1))] = int(links.group(1))
        nvlinks[gpu] = peers
        rest = [cell for cell in cells[1 + len(matrix):] if cell]
        named = dict(zip(affinities, rest, strict=False))
        if "NUMA Affinity" in named:
            numa[gpu] = named["NUMA Affinity"]
    return Topology(nvlinks, numa)


def smi(*args: str) -> str:
    """nvidia-smi's output; raises ``RuntimeError`` with its words when it fails."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        raise RuntimeError("nvidia-smi is not on PATH")
    done = subprocess.run([binary, *args], capture_output=True, text=True,
                          timeout=SMI_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"nvidia-smi {' '.join(args)} exited {done.returncode}: "
                           f"{(done.stdout + done.stderr).strip()[:500]}")
    return done.stdout


def query_cards() -> tuple[list[SmiCard], list[str]]:
    """nvidia-smi's cards, and the fields it could not be asked for (an older nvidia-smi
    has no ``compute_cap``)."""
    try:
        return parse_query(smi(f"--query-gpu={','.join(QUERY_FIELDS)}",
                               "--format=csv,noheader,nounits")), []
    except RuntimeError:
        fields = QUERY_FIELDS[:-1]
        return parse_query(smi(f"--query-gpu={','.join(fields)}",
                               "--format=csv,noheader,nounits"), fields), ["compute_cap"]


def sysfs_numa(bus_id: str, root: Path = Path("/sys")) -> int | None:
    """The PCI device's ``numa_node`` (``-1`` where the machine has one node); None when
    sysfs has no such device."""
    try:
        return int((root / "bus" / "pci" / "devices" / bus_id / "numa_node").read_text())
    except (OSError, ValueError):
        return None


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_facts() -> dict[str, Any]:
    """What the report starts with; every fact that cannot be read says why."""
    facts: dict[str, Any] = {
        "python": sys.version.split()[0], "executable": sys.executable,
        "kernel": platform.release(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "commit": os.environ.get("PYHAMI_GPU_COMMIT", "unknown"),
        "mig_write": os.environ.get("PYHAMI_GPU_MIG_WRITE") == "1",
    }
    absent = driver_absent()
    if absent is not None:
        facts["driver"] = absent
        return facts
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    try:
        facts["driver"] = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        facts["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        facts["nvidia-ml-py"] = _version("nvidia-ml-py")
        facts["gpus"] = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
                         for index in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError as error:
        facts["nvml_error"] = str(error)
    finally:
        pynvml.nvmlShutdown()
    try:
        facts["nvidia_smi_L"] = smi("-L").strip().splitlines()
    except SMI_ERRORS as error:
        facts["nvidia_smi_L"] = str(error)
    return facts


def gpu_marks() -> list[pytest.MarkDecorator]:
    """A GPU check module's ``pytestmark``: marked ``gpu``, skipped with the reason where NVML
    cannot start."""
    absent = driver_absent()
    return [pytest.mark.gpu, pytest.mark.skipif(absent is not None, reason=absent or "")]


@functools.cache
def gpu_count() -> int:
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()
