"""The seam between the agent and a card vendor: what the agent asks of the vendor's cards
(their inventory) and what the kubelet's device plugin asks of the vendor (the socket it
serves on, the variable naming the cards, what Allocate gives a container).

Each vendor is a package beside this module (``agent.vendors.nvidia``) implementing these
Protocols; the agent's command chooses one at start-up (``agent.cli``), and nothing
below it asks which.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from agent.errors import AgentError
from common.core.annotations import CardGrant
from common.wire import PendingPod, ReportedCard

if TYPE_CHECKING:
    from agent.deviceplugin.plugin import PluginSettings


class InventoryError(AgentError):
    """The inventory cannot be read or set up (NVML fails to start, a simulation file is
    refused); the text says what and why."""


class InventorySource(Protocol):
    """Reports the node's cards. ``read`` may block (hardware calls): the agent runs it in a
    worker thread, so implementations must be safe to call from one."""

    def open(self) -> None:
        """Start reading; raises ``InventoryError`` when that is impossible."""

    def read(self) -> list[ReportedCard]:
        """Every card the node has now, ordered by index.

        A card that cannot be read is reported unhealthy rather than raised.
        """

    def close(self) -> None:
        """Release what ``open`` acquired."""


class ContainerRefused(AgentError):
    """The vendor cannot give a container the cards chosen for it; the text says why (the
    device plugin refuses the Allocate with it)."""


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class ContainerSetup:
    """What Allocate gives one container beside its cards: its variables, its mounts, and
    a host folder the plugin makes (empty, 0777) before the container starts."""

    envs: dict[str, str]
    mounts: tuple[Mount, ...] = ()
    folder: str | None = None


class ContainerRuntime(Protocol):
    """How the vendor's cards reach a container, once the device plugin knows which cards a
    container gets (found on the node at the plugin's start)."""

    @property
    def slices_enforced(self) -> bool:
        """Whether the node enforces a container's memory and core share (NVIDIA:
        HAMi-core is installed)."""

    def setup(self, pod: PendingPod, position: int,
              grants: tuple[CardGrant, ...]) -> ContainerSetup:
        """What the container at ``position`` of ``pod`` gets for ``grants``; raises
        ``ContainerRefused`` when it cannot be given them."""


class DevicePluginVendor(Protocol):
    """What the kubelet's device plugin asks of a vendor. The devices it lists are the
    inventory's cards, ``count`` devices a card (``agent.deviceplugin.allocation``); the
    resource names are the device configuration's (``common.core.vendors``)."""

    @property
    def socket(self) -> str:
        """The plugin's socket in the kubelet's folder."""

    @property
    def visible_devices_env(self) -> str:
        """The variable naming the cards a container sees (the Allocate log line's)."""

    def open_runtime(self, settings: PluginSettings) -> ContainerRuntime:
        """The node's way to give containers cards, found (and prepared) on the node."""
