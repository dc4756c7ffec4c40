"""The pods a node runs, as a test says: a stand-in for the device plugin's ``LivePods``."""

from __future__ import annotations

from agent.deviceplugin.source import AllocationSourceError


class LivePodsByHand:
    """Answers ``uids``, or fails while ``unreachable``; counts the questions."""

    def __init__(self, *uids: str) -> None:
        self.uids = frozenset(uids)
        self.unreachable = False
        self.asked = 0

    async def live_pods(self, node: str) -> frozenset[str]:
        self.asked += 1
        if self.unreachable:
            raise AllocationSourceError(f"no answer for node {node}")
        return self.uids
