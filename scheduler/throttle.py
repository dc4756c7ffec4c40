"""Log lines about refused input, at a rate an attacker cannot raise."""

from __future__ import annotations

from collections.abc import Callable


class LogThrottle:
    """Allows one line per ``period`` seconds for each kind; counts the ones held back."""

    def __init__(self, period: float, clock: Callable[[], float]) -> None:
        self._period = period
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def allow(self, kind: str) -> int | None:
        """None to stay quiet; else how many lines of this kind were held back since the last."""
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self._period:
            self._held[kind] = self._held.get(kind, 0) + 1
            return None
        self._last[kind] = now
        return self._held.pop(kind, 0)
