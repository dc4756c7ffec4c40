"""Background tasks that must keep running: a crash is logged and the task started again.

A long-running loop that raises (or returns, which such a loop never should)
is logged with its traceback and restarted after a backoff that doubles up to
``MAX_DELAY_S``. While it waits to restart it is reported down, so that the
process's readiness can say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterator

logger = logging.getLogger(__name__)

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 30.0
STOP_TIMEOUT_S = 2.0

Loop = Callable[[], Coroutine[None, None, None]]


def restart_delay(crashes: int) -> float:
    """Seconds before restarting a task that crashed ``crashes`` times in a row (1 first)."""
    return min(MAX_DELAY_S, FIRST_DELAY_S * 2.0 ** min(crashes - 1, 16))


class Supervisor:
    def __init__(self, *, stable_after: float = 60.0) -> None:
        self._stable_after = stable_after
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.down: dict[str, str] = {}
        """Tasks waiting to restart after a crash, with the crash."""
        self.crashes: dict[str, int] = {}
        """Crashes per task since start."""

    def start(self, name: str, loop: Loop) -> None:
        """Run ``loop()`` until ``stop()``, starting it again whenever it crashes."""
        self._tasks.append(asyncio.create_task(self._keep(name, loop), name=name))

    async def _keep(self, name: str, loop: Loop) -> None:
        in_a_row = 0
        while not self._stopping:
            started = asyncio.get_running_loop().time()
            try:
                await loop()
            except Exception as error:
                if self._stopping:
                    return
                why = f"{type(error).__name__}: {error}"
                logger.exception("background task %s crashed", name)
            else:
                if self._stopping:
                    return
                why = "it returned, and it should run for ever"
                logger.error("background task %s ended: %s", name, why)
            if asyncio.get_running_loop().time() - started > self._stable_after:
                in_a_row = 0
            in_a_row += 1
            self.crashes[name] = self.crashes.get(name, 0) + 1
            delay = restart_delay(in_a_row)
            self.down[name] = f"background task {name} crashed ({why}); restarting in {delay:g}s"
            logger.warning("restarting background task %s in %gs", name, delay)
            await asyncio.sleep(delay)
            del self.down[name]

    @contextlib.contextmanager
    def contained(self, name: str) -> Iterator[None]:
        """One unit of work (a message): a crash is logged with its traceback and counted,
        and the next unit runs as usual."""
        try:
            yield
        except Exception:
            self.crashes[name] = self.crashes.get(name, 0) + 1
            logger.exception("%s: handling it crashed; it is dropped", name)

    def problems(self) -> list[str]:
        return sorted(self.down.values())

    async def stop(self) -> None:
        self._stopping = True  # a task that outlives its cancellation is not started again
        for task in self._tasks:
            task.cancel()
        # asyncio.wait, not wait_for: wait_for waits on for a task that ignored its
        # cancellation, and stopping must end in bounded time.
        if self._tasks:
            _, still_running = await asyncio.wait(self._tasks, timeout=STOP_TIMEOUT_S)
            for task in still_running:
                logger.error("background task %s did not stop within %gs; left behind",
                             task.get_name(), STOP_TIMEOUT_S)
        self._tasks = []
