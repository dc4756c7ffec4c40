"""The agents' reports: each inventory applied to the node registry (refused when
malformed, forged or out of order), the cards that left while pods hold them, slices
exceeded where nothing enforces them, the resync's answers, the gaps forgiven after a
NATS outage, and the nodes that fall silent or leave the cluster."""

from __future__ import annotations

import asyncio
import logging

from common.messaging import RateLimitedLog
from common.wire import Inventory, WireError, decode_inventory
from scheduler.metrics import Metrics
from scheduler.service.shared import Reports, ServicePart, Shared

logger = logging.getLogger(__name__)

NODE_WATCH_S = 1.0


class Inventories(ServicePart):
    """What the daemon does with the agents' inventories and the nodes' silence."""

    def __init__(self, shared: Shared, metrics: Metrics, reports: Reports) -> None:
        super().__init__(shared, metrics, reports)
        self._refusals = RateLimitedLog(shared.clock, logger)
        # Looked up once: every inventory message counts one of these.
        self._accepted = metrics.inventory.labels("accepted")
        self._out_of_order = metrics.inventory.labels("out_of_order")

    async def receive_inventory(self, subject: str, data: bytes) -> None:
        """Ingest one agent message; a card that left while pods hold it is reported on them."""
        result = self.ingest(subject, data)
        if result is None:
            return
        inventory, vanished = result
        if inventory.reason == "resync" and self.shared.leadership.leading():
            # Usage goes out on change only: a watcher that asked the agents to report
            # (``pyhami watch``, on connecting) would see the node's cards without their
            # tenants until the next pod came or went. The answers to a resync are
            # answered with the node's usage as it stands (the leader's, which decides).
            self.reports.usage_asked(inventory.node)
        await self._watch_slices(inventory)
        if not vanished:
            return
        holders = [(key, allocation) for key, allocation in self.state.fleet.allocations().items()
                   if allocation.node == inventory.node]
        for key, allocation in holders:
            lost = sorted({g.uuid for grants in allocation.containers for g in grants} & vanished)
            if lost:
                namespace, _, name = key.partition("/")
                await self.cluster.record_event(
                    namespace, name, "Warning", "CardVanished",
                    f"node {inventory.node} no longer reports {', '.join(lost)}, which this pod "
                    "holds; the cards stay booked until the pod ends")

    async def _watch_slices(self, inventory: Inventory) -> None:
        """On a node where nothing enforces the slices (the agent's device plugin runs
        without HAMi-core), a container measured using more memory than its slice gets a
        Warning Event ``SliceExceeded``, once per container and card per window."""
        slices = self.state.slices
        if inventory.measured is None or inventory.slices_enforced is not False:
            slices.clear(inventory.node)
            return
        check = slices.check(inventory.node, inventory.measured, self.shared.pods.bound_by_uid,
                             self.state.fleet.allocation, self._clock())
        if check.unmatched:
            self.metrics.measured_unmatched.inc(check.unmatched)
        for over in check.announce:
            self.metrics.slice_exceeded.inc()
            logger.warning("pod %s/%s on node %s: %s", over.namespace, over.pod,
                           inventory.node, over.sentence())
            await self.cluster.record_event(over.namespace, over.pod, "Warning",
                                            "SliceExceeded", over.sentence())

    def ingest(self, subject: str, data: bytes) -> tuple[Inventory, set[str]] | None:
        """Apply one agent message: the inventory and the cards that left holding allocations.

        A message refused (malformed, out of bounds, on another node's subject, claiming
        another live node's card, numbered too far ahead) is counted by result and logged at
        a bounded rate.
        """
        try:
            inventory = decode_inventory(data, subject)
        except WireError as error:
            self._refuse_inventory(error.result, str(error))
            return None
        result = self.state.nodes.ingest(inventory, self._clock())
        if result.conflict is not None:
            self._refuse_inventory("card_conflict", f"inventory refused: {result.conflict}")
            return None
        if result.too_far_ahead is not None:
            self._refuse_inventory("sequence_jump", f"inventory refused: {result.too_far_ahead}")
            return None
        if not result.accepted:
            self._out_of_order.inc()
            return None
        self._accepted.inc()
        self.shared.inventory_accepted += 1
        if not result.changed:
            return inventory, set()
        if result.back_after is not None:
            logger.info("node %s is heard from again after %.0fs of silence", inventory.node,
                        result.back_after)
        self.reports.mark_changed(inventory.node)
        for uuid, usage in result.vanished.items():
            logger.error("node %s: card %s left the inventory while allocations hold it "
                         "(%d tenants, %d MiB); they stay booked until their pods end",
                         inventory.node, uuid, usage.tenants, usage.memory)
        self.reports.retry_waiting()
        return inventory, set(result.vanished)

    def connection_resumed(self) -> None:
        """The daemon is on the bus again after an outage: whatever the agents sent
        meanwhile was missed, so their next messages may skip any number of sequences."""
        self.state.nodes.forgive_gaps(self._clock())

    def _refuse_inventory(self, result: str, why: str) -> None:
        self.metrics.inventory.labels(result).inc()
        self._refusals.warning(result, "%s", why)

    async def watch_nodes(self, period: float = NODE_WATCH_S) -> None:
        while True:
            await asyncio.sleep(period)
            self.check_nodes()

    def check_nodes(self) -> None:
        """Log each node once as it goes stale; forget those silent beyond the retention."""
        now = self._clock()
        for name, why in self.state.nodes.newly_stale(now).items():
            logger.warning("node %s is stale: %s", name, why.text())
        for name, quiet in self.state.nodes.silent_beyond_retention(now).items():
            self.forget(name, f"silent for {quiet:.0f}s (retention "
                              f"{self.settings.node_retention:g}s)")

    def forget(self, name: str, why: str) -> None:
        """Forget a node (silent too long, or no longer in the cluster); pods still
        holding its cards keep them."""
        self.state.nodes.forget(name)
        held = sum(1 for a in self.state.fleet.allocations().values() if a.node == name)
        logger.warning("node %s forgotten: %s%s", name, why,
                       f"; {held} pods still hold its cards" if held else "")
