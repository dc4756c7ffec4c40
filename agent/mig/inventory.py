"""A node in MIG mode reports its cards with the profiles its allowlist allows, as HAMi's
device plugin discovers them (``discoverMigProfiles``): ``MigSource`` wraps the node's
inventory source and asks NVML, once per card at start, what each allowed profile is."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import msgspec

from agent.mig.port import MigDevices, MigError
from agent.mig.tables import (
    GpuInstanceProfileInfo,
    allowed_profiles,
    nvml_profile,
    register_profiles,
    slot_count,
)
from agent.vendors.port import InventoryError, InventorySource
from common.core.deviceconfig import MigProfiles as AllowedProfiles
from common.core.mig import MIG_MODE, MigProfile
from common.wire import ReportedCard

logger = logging.getLogger(__name__)


class MigSource:
    """An ``InventorySource`` whose cards are ``source``'s in MIG mode: each with its allowed
    profiles, NVML's figures, and as many slots as its largest profile has instances. A
    card whose model no allowlist entry names, or for which NVML has none of the allowed
    profiles, is left out (one line at start): it cannot serve MIG, and HAMi registers
    it neither."""

    def __init__(self, source: InventorySource, devices: MigDevices,
                 allowlist: Iterable[AllowedProfiles]) -> None:
        self._source = source
        self._devices = devices
        self._allowlist = tuple(allowlist)
        self._profiles: dict[str, tuple[MigProfile, ...]] = {}
        self._nvml: dict[str, dict[str, GpuInstanceProfileInfo]] = {}

    @property
    def profiles(self) -> Mapping[str, Mapping[str, GpuInstanceProfileInfo]]:
        """Per card UUID, its allowed profiles by name with NVML's figures (the MIG
        manager's), known once ``open`` returned."""
        return self._nvml

    def open(self) -> None:
        """Open the source and discover each card's profiles; raises ``InventoryError``
        when NVML cannot answer, or no card can serve MIG."""
        open_with(self._source, self._devices, "MIG profiles not discovered")
        try:
            cards = {card.uuid: card for card in self._source.read()}
            for gpu in range(self._devices.gpu_count()):
                self._discover(gpu, cards)
        except MigError as error:
            raise InventoryError(f"MIG profiles not discovered: {error}") from None
        if not self._profiles:
            raise InventoryError("the node is in MIG mode, but no card can serve MIG: a model "
                                 "no migProfileAllowlist entry names, no allowed profile NVML "
                                 "offers, or a GPU not in MIG mode (each card's reason is "
                                 "logged above)")

    def _discover(self, gpu: int, cards: Mapping[str, ReportedCard]) -> None:
        uuid = self._devices.gpu_uuid(gpu)
        card = cards.get(uuid)
        if card is None:
            return
        name = self._devices.gpu_name(gpu)
        allowed = allowed_profiles(name, self._allowlist)
        if allowed is None:
            logger.warning("card %d (%s, %s) left out: no migProfileAllowlist entry names its "
                           "model", card.index, uuid, name)
            return
        if not self._in_mig_mode(gpu, card.index, uuid):
            return
        table = self._devices.profiles(gpu)
        profiles = register_profiles(table, allowed)
        if not profiles:
            logger.warning("card %d (%s) left out: NVML offers none of the allowed MIG "
                           "profiles %s", card.index, uuid, ", ".join(allowed))
            return
        self._profiles[uuid] = profiles
        self._nvml[uuid] = {profile.name: info for profile in profiles
                            if (info := nvml_profile(table, profile.name)) is not None}

    def _in_mig_mode(self, gpu: int, index: int, uuid: str) -> bool:
        """Whether the GPU is in MIG mode, an idle one put in it first (NVML lists no
        profiles otherwise). A busy GPU is not changed, nor one whose change waits for a
        GPU reset: left out, with one line saying why."""
        mode = self._devices.mig_mode(gpu)
        why = None
        if mode.changing:
            why = "its MIG mode change waits for a GPU reset"
        elif not mode.current:
            if self._devices.busy(gpu):
                why = "it is not in MIG mode and runs processes, so it is not switched"
            elif not self._devices.enable_mig(gpu).current:
                why = "MIG mode takes effect after a GPU reset (nvidia-smi -r)"
            else:
                logger.info("card %d (%s) put in MIG mode", index, uuid)
        if why is not None:
            logger.warning("card %d (%s) left out: %s", index, uuid, why)
            return False
        return True

    def read(self) -> list[ReportedCard]:
        return [msgspec.structs.replace(card, mode=MIG_MODE, mig_profiles=profiles,
                                        count=slot_count(profiles))
                for card in self._source.read()
                if (profiles := self._profiles.get(card.uuid)) is not None]

    def close(self) -> None:
        close_with(self._source, self._devices)


def open_with(source: InventorySource, devices: MigDevices, what: str) -> None:
    """Open the inventory source, then NVML's MIG calls; the source closed again when NVML
    cannot start. Raises ``InventoryError`` beginning with ``what``."""
    source.open()
    try:
        devices.open()
    except MigError as error:
        source.close()
        raise InventoryError(f"{what}: {error}") from None


def close_with(source: InventorySource, devices: MigDevices) -> None:
    """Stop NVML's MIG calls (a failure logged: nothing is left to do about it), then the
    source."""
    try:
        devices.close()
    except MigError as error:
        logger.warning("NVML did not stop cleanly: %s", error)
    source.close()
