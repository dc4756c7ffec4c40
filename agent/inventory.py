"""Where the agent learns its node's cards: the seam between the agent and the hardware."""

from __future__ import annotations

from typing import Protocol

from agent.errors import AgentError
from common.wire import ReportedCard


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
