"""What the node registers of each card under HAMi's device configuration, the same for
every inventory source (NVML or simulated): ``ConfiguredSource`` wraps a source and
applies the node's ``NodeDeviceConfig`` to every read.

As HAMi's device plugin registers a card (``rm/devices.go``, ``plugin/register.go``):

- ``filterdevices``: a card named by UUID or index is left out: neither reported nor
  advertised to the kubelet;
- ``preConfiguredDeviceMemory``: the MiB of a card for which NVML has no memory figure
  (the source reports 0, as NVML's NOT_SUPPORTED on unified-memory cards);
- ``deviceMemoryScaling``: registered memory ``int(MiB x s)``;
- ``deviceCoreScaling``: registered cores ``int(s x 100)`` (of a card's own cores);
- ``deviceSplitCount``: every card's ``count``.

The card's own figures stay beside the registered ones (``physical_memory``,
``physical_cores``) where they differ. Pure apart from the wrapped source.
"""

from __future__ import annotations

import logging

import msgspec

from agent.mig.static import is_mig_device
from agent.vendors.port import InventorySource
from common.core.deviceconfig import NodeDeviceConfig
from common.core.mig import MIG_MODE
from common.core.model import CARD_COUNT_MAX, CARD_MEMORY_MAX_MIB
from common.wire import ReportedCard

logger = logging.getLogger(__name__)


def registered_card(card: ReportedCard, config: NodeDeviceConfig) -> ReportedCard:
    """``card`` as the node registers it under ``config`` (filters aside). A card in MIG
    mode registers its own memory and 100 cores, and as many slots as its largest profile
    has instances: HAMi applies neither scaling nor the split count to it; nor to a static
    MIG device, one whole card."""
    settings = config.settings
    if card.mode == MIG_MODE or is_mig_device(card.uuid):
        # A static MIG device is a whole card of its own (``agent.mig.static``).
        return card
    physical_memory = card.memory or settings.preconfigured_device_memory
    physical_cores = card.cores
    # int() truncates toward zero as Go's int32(float64) does; the bounds are the wire's.
    memory = min(int(physical_memory * settings.device_memory_scaling), CARD_MEMORY_MAX_MIB)
    cores = min(int(physical_cores * settings.device_core_scaling), CARD_COUNT_MAX)
    return msgspec.structs.replace(
        card, memory=memory, cores=cores, count=settings.device_split_count,
        physical_memory=None if memory == physical_memory else physical_memory,
        physical_cores=None if cores == physical_cores else physical_cores)


def registered_cards(cards: list[ReportedCard], config: NodeDeviceConfig,
                     ) -> list[ReportedCard]:
    """The cards the node reports and advertises: the filtered ones left out, the others
    registered under ``config``."""
    return [registered_card(card, config) for card in cards
            if not config.filter_devices.excludes(card.uuid, card.index)]


class ConfiguredSource:
    """An ``InventorySource`` whose cards are ``source``'s, registered under ``config``."""

    def __init__(self, source: InventorySource, config: NodeDeviceConfig) -> None:
        self._source = source
        self._config = config
        self._warned: set[str] = set()

    def open(self) -> None:
        self._source.open()

    def close(self) -> None:
        self._source.close()

    def read(self) -> list[ReportedCard]:
        cards = registered_cards(self._source.read(), self._config)
        for card in cards:
            if card.memory == 0 and card.uuid not in self._warned:
                # A card registered with no memory takes no pod asking for memory.
                logger.warning("card %s reports no memory figure (NVML's NOT_SUPPORTED): "
                               "set preConfiguredDeviceMemory for this node", card.uuid)
                self._warned.add(card.uuid)
        return cards
