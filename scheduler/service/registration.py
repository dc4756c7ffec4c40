"""The node registration: each Node's ``hami.io/node-nvidia-register`` annotation, written
by the leader from its agent's inventory as HAMi's device plugin writes it from the node,
so that HAMi-WebUI (and any tool reading HAMi's annotation) sees pyhami's nodes and cards
(docs/scheduler.md, "HAMi-WebUI and the node annotation")."""

from __future__ import annotations

import asyncio
import logging

from common.core import Node
from common.core.registration import node_register
from common.core.vendors import NVIDIA
from common.messaging import RateLimitedLog
from scheduler.cluster import ClusterError
from scheduler.metrics import Metrics
from scheduler.service.shared import Reports, ServicePart, Shared

logger = logging.getLogger(__name__)

REGISTER_REFRESH_S = 5.0
"""How often the annotations are compared with the inventories (HAMi's plugin: 30 s)."""


class NodeRegistration(ServicePart):
    """Writes each reported node's register annotation when its value changes, removes it
    once the node's agent is gone for good, and only while this daemon leads."""

    def __init__(self, shared: Shared, metrics: Metrics, reports: Reports) -> None:
        super().__init__(shared, metrics, reports)
        self._failures = RateLimitedLog(shared.clock, logger)
        # Node -> the value its annotation holds, as this daemon last wrote or read it; None
        # until read from the cluster since this daemon last began to lead (another leader
        # may have written meanwhile, and a restart must not write every Node again).
        self._written: dict[str, str] | None = None
        # The nodes this daemon wrote, so that it removes what it wrote on a node it has
        # since forgotten (a Node deleted), and nothing on a node it never heard of.
        self._mine: set[str] = set()
        # Node -> (the fleet's Node, its value): the fleet replaces a Node only when it
        # changes, so an unchanged node is not encoded again at every refresh.
        self._encoded: dict[str, tuple[Node, str | None]] = {}

    async def run(self, period: float = REGISTER_REFRESH_S) -> None:
        """Refresh the annotations every ``period`` seconds, for as long as it runs."""
        while True:
            await self.refresh()
            await asyncio.sleep(period)

    async def refresh(self) -> None:
        """Bring every Node's annotation in line with its inventory. A write that fails is
        counted, logged at a bounded rate and tried again at the next refresh."""
        if not (self.shared.leadership.leading() and self.shared.ready):
            self._written = None  # read afresh once this daemon leads again
            return
        if self._written is None:
            try:
                self._written = dict(await self.cluster.node_registrations())
            except ClusterError as error:
                self._fail("Node annotations not read: %s", error)
                return
        written = self._written
        wanted = self._wanted()
        ours = self.state.nodes.known | self._mine
        for name in sorted(set(wanted) | set(written)):
            value = wanted.get(name)
            if value == written.get(name) or (value is None and name not in ours):
                continue
            try:
                await self.cluster.register_node(name, value)
            except ClusterError as error:
                self._fail("%s", error)
                continue
            if value is None:
                written.pop(name, None)
                self._mine.discard(name)
                self.metrics.registrations.labels("removed").inc()
                logger.info("node %s: %s removed, its agent gone", name,
                            NVIDIA.register_annotation)
            else:
                written[name] = value
                self._mine.add(name)
                self.metrics.registrations.labels("written").inc()

    def _wanted(self) -> dict[str, str]:
        """Per node an agent reports and that was heard within the retention, its
        annotation's value (none for a node without cards)."""
        silence = self.state.nodes.silence(self._clock())
        retention = self.settings.registration_retention
        encoded: dict[str, tuple[Node, str | None]] = {}
        wanted = {}
        for node in self.state.fleet.nodes():
            if silence.get(node.name, 0.0) > retention:
                continue
            known = self._encoded.get(node.name)
            value = known[1] if known is not None and known[0] is node else node_register(node)
            encoded[node.name] = (node, value)
            if value is not None:
                wanted[node.name] = value
        self._encoded = encoded
        return wanted

    def _fail(self, message: str, *args: object) -> None:
        self.metrics.registrations.labels("failed").inc()
        self._failures.warning("node_registration", message, *args)
