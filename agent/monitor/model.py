"""What the node's monitor measures, whatever the source: the model the agent's
``/metrics``, the usage it sends the daemon and the tests share. Plain values, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

Source = Literal["hami-core", "nvml"]
"""Where a container's figures come from: HAMi-core's cache file, or NVML's processes."""


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """One container's use of one card."""

    vdevice_index: int
    """The card's place among the container's cards (HAMi's ``vdevice_index``)."""
    device_uuid: str
    memory_used: int
    """Bytes: HAMi-core's sum of its processes' ``used[i].total``, or NVML's
    ``usedGpuMemory`` summed over the container's processes on the card."""
    utilization: int
    """Percent, the sum of the processes' SM utilization (not clamped, as HAMi sums it)."""
    memory_limit: int | None = None
    """Bytes: HAMi-core's ``limit[i]``; None from NVML."""
    context: int | None = None
    """Bytes of CUDA contexts, modules and buffers (HAMi-core only)."""
    module: int | None = None
    buffer: int | None = None


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    """One container's use of its cards."""

    pod_uid: str
    container: str
    """The container's name; empty where NVML's processes of one pod on one card cannot be
    told apart (several of its containers hold that card)."""
    devices: tuple[DeviceUsage, ...]
    source: Source
    last_kernel_time: int | None = None
    """Unix seconds of the container's last kernel launch (HAMi-core's v1 layout, when
    set); None otherwise."""


@dataclass(frozen=True, slots=True)
class HostCard:
    """One card as NVML sees it at a scrape, whoever uses it."""

    index: int
    uuid: str
    name: str
    """NVML's name (HAMi's ``device_type`` is ``NVIDIA-`` and this)."""
    memory_used: int | None
    """Bytes; None where NVML has no figure (NOT_SUPPORTED)."""
    utilization: int | None
    """NVML's ``utilization.gpu``, percent; None where NVML has none."""
    memory_utilization: int | None
    """NVML's ``utilization.memory`` (the memory controller), percent."""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process NVML lists on a card."""

    pid: int
    """Its pid in the host's namespace (NVML's)."""
    device_uuid: str
    memory_used: int
    """Bytes (0 where NVML has no figure)."""
    utilization: int = 0
    """Percent of the card's SMs over NVML's last sample (0 where NVML has none)."""


class HostProbe(Protocol):
    """The node's cards and their processes, now (NVML, or the simulated inventory). May
    block: the agent calls it in a worker thread."""

    def host_cards(self) -> list[HostCard]:
        """Every card; a card NVML cannot read is left out."""

    def gpu_processes(self) -> list[GpuProcess]:
        """Every process on every card (compute processes)."""
