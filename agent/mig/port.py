"""The NVML calls MIG needs, as a port: ``MigDevices``, implemented over pynvml (the real
library, or the simulated one) by ``agent.mig.nvml.NvmlMigDevices``.

GPUs are named by NVML index. Every call may block (driver calls): the agent runs them in
a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from agent.errors import AgentError
from agent.mig.tables import GpuInstanceProfileInfo
from common.core.errors import ExternalFailure
from common.core.mig import MigPlacement


class MigError(AgentError, ExternalFailure):
    """An NVML MIG call failed or was refused; the text names the GPU, the call and NVML's
    error."""


@dataclass(frozen=True, slots=True)
class MigMode:
    """A GPU's MIG mode now and after its next reset (NVML's current and pending modes)."""

    current: bool
    pending: bool

    @property
    def changing(self) -> bool:
        """A mode change waits for a GPU reset: no instance can be made or trusted."""
        return self.current != self.pending


@dataclass(frozen=True, slots=True)
class LiveInstance:
    """A GPU instance NVML reports on a GPU, with its compute instances."""

    gpu: int
    gpu_instance_id: int
    profile_id: int
    """NVML's profile id (``nvmlGpuInstanceInfo_t.profileId``), as ``GpuInstanceProfileInfo.id``."""
    placement: MigPlacement
    compute_instance_ids: tuple[int, ...]
    mig_uuid: str
    """The MIG device's UUID (``MIG-...``) of its first compute instance; empty while it
    has none."""


class MigDevices(Protocol):
    """NVML's MIG calls, one GPU at a time; every one raises ``MigError``."""

    def open(self) -> None:
        """Start NVML (``nvmlInit``; the driver counts starts, so the inventory's own start
        does not interfere)."""

    def close(self) -> None:
        """Stop what ``open`` started."""

    def gpu_count(self) -> int:
        """The GPUs NVML lists."""

    def gpu_uuid(self, gpu: int) -> str:
        """The GPU's UUID (``GPU-...``)."""

    def gpu_name(self, gpu: int) -> str:
        """The GPU's name as NVML gives it (``nvmlDeviceGetName``: ``NVIDIA H100 80GB
        HBM3``), which ``migProfileAllowlist``'s models are matched in."""

    def mig_mode(self, gpu: int) -> MigMode:
        """``nvmlDeviceGetMigMode``."""

    def enable_mig(self, gpu: int) -> MigMode:
        """``nvmlDeviceSetMigMode`` to enabled; the mode after it (still pending where the
        driver needs a GPU reset)."""

    def busy(self, gpu: int) -> bool:
        """Whether the GPU runs compute or graphics processes. A GPU whose processes cannot
        be listed counts as busy: it is never reset."""

    def profiles(self, gpu: int) -> list[GpuInstanceProfileInfo]:
        """Every GPU-instance profile NVML answers for the GPU
        (``nvmlDeviceGetGpuInstanceProfileInfo`` for each ``NVML_GPU_INSTANCE_PROFILE_*``,
        those NVML does not support left out), each with its possible placements
        (``nvmlDeviceGetGpuInstancePossiblePlacements``)."""

    def instances(self, gpu: int) -> list[LiveInstance]:
        """Every GPU instance on the GPU, with its compute instances and MIG UUID."""

    def create(self, gpu: int, profile_id: int, placement: MigPlacement) -> LiveInstance:
        """A GPU instance of ``profile_id`` at exactly ``placement``
        (``nvmlDeviceCreateGpuInstanceWithPlacement``), then one compute instance spanning
        it (its profile of the same slice count, shared engines); the instance as NVML
        reports it then. A compute instance that cannot be made destroys the GPU instance
        again before ``MigError`` is raised."""

    def destroy(self, gpu: int, gpu_instance_id: int) -> None:
        """Destroy a GPU instance's compute instances, then the GPU instance."""
