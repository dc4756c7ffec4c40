"""The agent's error root; the tree is drawn in ``common.core.errors``."""

from __future__ import annotations

from common.core.errors import PyhamiError


class AgentError(PyhamiError):
    """Raised by the agent: the cards cannot be read, or one card's NVML call failed."""
