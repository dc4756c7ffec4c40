"""The extender's listener is run on both event loops: asyncio's, and uvloop's, which
the daemon runs on and whose transports differ from asyncio's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop

BOTH_LOOPS_IN = ("test_fastpath.py",)


def pytest_asyncio_loop_factories(
        config: pytest.Config,
        item: pytest.Item) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]] | None:
    if item.path.name not in BOTH_LOOPS_IN:
        return None
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
