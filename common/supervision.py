"""Background tasks that must keep running: a crash is logged and the task started again.

A long-running loop that raises (or returns, which such a loop never should)
is logged with its traceback and restarted after a backoff that doubles up to
``MAX_DELAY_S``. While it waits to restart it is reported down, so that the
process's readiness can say so.

A loop started with ``restart=False`` is one the process cannot run without: it is not
started again, and ``until_stopped`` returns when it ends, raising its crash for the owner
to end on (the agent, which its DaemonSet starts again).
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
    """A process's named background tasks: started, kept running or ended together, and
    the crashes of its units of work counted."""

    def __init__(self, *, stable_after: float = 60.0) -> None:
        self._stable_after = stable_after
        self._tasks: list[asyncio.Task[None]] = []
        self._unrestarted: list[asyncio.Task[None]] = []
        """The tasks started with ``restart=False``, whose end ``until_stopped`` waits for."""
        self._stopping = False
        self.down: dict[str, str] = {}
        """Tasks waiting to restart after a crash, with the crash."""
        self.crashes: dict[str, int] = {}
        """Crashes per task since start."""

    def start(self, name: str, loop: Loop, *, restart: bool = True) -> None:
        """Run ``loop()`` until ``stop()``, starting it again whenever it crashes; with
        ``restart=False``, once: its end wakes ``until_stopped``, which raises its crash."""
        if restart:
            task = asyncio.create_task(self._keep(name, loop), name=name)
        else:
            task = asyncio.create_task(loop(), name=name)
            self._unrestarted.append(task)
        self._tasks.append(task)

    async def until_stopped(self, stop: asyncio.Event) -> None:
        """Wait until ``stop`` is set, or until a task started with ``restart=False``
        ends: its crash is raised here; one that returned ends the wait as ``stop`` does."""
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({stopping, *self._unrestarted},
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        for task in self._unrestarted:
            if task.done() and not task.cancelled():
                task.result()

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

    def cancel(self) -> None:
        """Cancel every task and start none again, without waiting: for an owner with
        something to close first that ends a task whose cancellation may be lost (a NATS
        connection); ``stop()`` then waits."""
        self._stopping = True  # a task that outlives its cancellation is not started again
        for task in self._tasks:
            task.cancel()

    async def stop(self) -> None:
        """Cancel every task and wait for them, a bounded time: a task still running then
        (its cancellation swallowed) is logged and left behind."""
        self.cancel()
        # asyncio.wait, not wait_for: wait_for waits on for a task that ignored its
        # cancellation, and stopping must end in bounded time.
        if self._tasks:
            _, still_running = await asyncio.wait(self._tasks, timeout=STOP_TIMEOUT_S)
            for task in still_running:
                logger.error("background task %s did not stop within %gs; left behind",
                             task.get_name(), STOP_TIMEOUT_S)
        self._tasks = []
        self._unrestarted = []
