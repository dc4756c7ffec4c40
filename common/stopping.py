"""How every pyhami command stops: SIGTERM (Kubernetes, docker) or SIGINT (Ctrl-C)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signals(stop: Callable[[], object], logger: logging.Logger | None = None,
                    doing: str = "stopping") -> None:
    """Have the running loop call ``stop`` on either stop signal; with ``logger``, log
    ``"<SIGNAL> received: <doing>"`` first. Set it before anything that may wait, so that
    stopping works in every state."""
    def received(which: signal.Signals) -> None:
        if logger is not None:
            logger.info("%s received: %s", which.name, doing)
        stop()

    loop = asyncio.get_running_loop()
    for which in STOP_SIGNALS:
        loop.add_signal_handler(which, received, which)
