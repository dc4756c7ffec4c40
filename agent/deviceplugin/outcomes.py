"""The outcomes the device plugin owes the daemon, kept until the daemon is seen to have
written them.

An outcome is published, not requested: nothing says it was written. It can be lost on
the way (a NATS server dying with it in its buffers) or after it (the daemon that heard it
standing by before the pod store took it, a lease moving twice within a minute). The pod
would then stay ``allocating`` with its container running, and whoever waits for its
bind-phase would wait for ever. So the plugin keeps each outcome it sent and looks at the
daemon's next answer for its node: a pod no longer listed as waiting was answered (or is
gone); one still listed ``CONFIRM_AFTER_S`` after the outcome went out is sent again. The
daemon takes an outcome once (a pod already answered is left as it is), so sending again is
harmless. Pure: the caller passes the times.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from common.wire import AllocationOutcome

CONFIRM_AFTER_S = 2.0
"""An outcome still listed as waiting this long after it went out is sent again: more than
the daemon takes to write one (a get and a compare-and-set) while its store answers."""
CONFIRM_INTERVAL_S = 2.0
"""How often the plugin asks the daemon while outcomes wait to be confirmed."""
KEEP_S = 600.0
"""An outcome not confirmed this long after it was first sent is given up (logged): the
daemon has been unable to write for ten minutes, and its pod is beyond this plugin's help."""
KEPT_MAX = 10_000
"""At most this many outcomes kept; the oldest is given up beyond it (a node starts far
fewer pods in ``KEEP_S``)."""


@dataclass(slots=True)
class _Owed:
    outcome: AllocationOutcome
    first_sent: float | None = None
    last_sent: float | None = None
    """None: to be sent (again)."""


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What one of the daemon's answers settled."""

    confirmed: int
    again: tuple[AllocationOutcome, ...]
    """Sent, still listed as waiting: to be sent again."""
    given_up: tuple[AllocationOutcome, ...]


class OwedOutcomes:
    """The outcomes to send and those sent but not yet seen written, by pod uid."""

    def __init__(self) -> None:
        self._owed: dict[str, _Owed] = {}

    def __len__(self) -> int:
        return len(self._owed)

    @property
    def awaiting(self) -> bool:
        """Whether an outcome was sent and not yet confirmed."""
        return any(owed.last_sent is not None for owed in self._owed.values())

    def owe(self, outcomes: Iterable[AllocationOutcome]) -> tuple[AllocationOutcome, ...]:
        """Add outcomes to send (a newer one for a pod replaces the older); returns those
        given up to stay within ``KEPT_MAX``."""
        for outcome in outcomes:
            self._owed.pop(outcome.uid, None)
            self._owed[outcome.uid] = _Owed(outcome)
        given_up = []
        while len(self._owed) > KEPT_MAX:
            oldest = next(iter(self._owed))
            given_up.append(self._owed.pop(oldest).outcome)
        return tuple(given_up)

    def due(self) -> list[AllocationOutcome]:
        """The outcomes to send now, in the order they were owed."""
        return [owed.outcome for owed in self._owed.values() if owed.last_sent is None]

    def sent(self, outcome: AllocationOutcome, now: float) -> None:
        owed = self._owed.get(outcome.uid)
        if owed is None or owed.outcome != outcome:
            return
        if owed.first_sent is None:
            owed.first_sent = now
        owed.last_sent = now

    def reconcile(self, waiting: Collection[str], asked_at: float) -> Reconciled:
        """Settle the outcomes sent before ``asked_at`` by the daemon's answer to a question
        asked then: ``waiting`` holds the uids of the pods it lists as waiting for cards."""
        confirmed = 0
        again: list[AllocationOutcome] = []
        given_up: list[AllocationOutcome] = []
        for uid, owed in list(self._owed.items()):
            if owed.last_sent is None or owed.last_sent >= asked_at:
                continue  # not sent, or sent after the question: the answer says nothing
            if uid not in waiting:
                del self._owed[uid]
                confirmed += 1
            elif asked_at - owed.last_sent >= CONFIRM_AFTER_S:
                first_sent = owed.last_sent if owed.first_sent is None else owed.first_sent
                if asked_at - first_sent >= KEEP_S:
                    del self._owed[uid]
                    given_up.append(owed.outcome)
                else:
                    owed.last_sent = None
                    again.append(owed.outcome)
        return Reconciled(confirmed, tuple(again), tuple(given_up))
