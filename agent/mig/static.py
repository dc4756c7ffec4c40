"""Static MIG: GPUs an operator already cut into MIG instances (``nvidia-smi mig``,
mig-parted), served as they are, under HAMi's ``--mig-strategy``:

- ``single``: each MIG device is a card of its own, whole (one container, no HAMi-core),
  under the node's resource (``nvidia.com/gpu``): pyhami schedules pods onto it as onto any
  card, and the kubelet hands the container its MIG UUID;
- ``mixed``: each profile is a resource of its own, ``nvidia.com/mig-<profile>``, which the
  kubelet counts and pyhami does not schedule; the device plugin serves each one with
  HAMi's pass-through Allocate.

A GPU not in MIG mode stays a shared card under either. ``StaticMigSource`` wraps the
node's inventory and reads the MIG devices at every read (an operator may repartition).
"""

from __future__ import annotations

import argparse
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from agent.mig.inventory import close_with, open_with
from agent.mig.port import MigDevices, MigError
from agent.mig.tables import GpuInstanceProfileInfo, profile_name
from agent.vendors.port import InventorySource
from common.wire import ReportedCard

logger = logging.getLogger(__name__)

MigStrategy = Literal["none", "single", "mixed"]
MIG_STRATEGIES: tuple[MigStrategy, ...] = ("none", "single", "mixed")
MIG_DEVICE_INDEX_BASE = 100
"""A MIG device's card index: this, plus its GPU's index times 8, plus its position on the
GPU; apart from every GPU's own index."""


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device an operator made: its UUID, its GPU and its profile."""

    uuid: str
    gpu_uuid: str
    gpu_index: int
    profile: str
    memory_mib: int

    @property
    def resource_suffix(self) -> str:
        """``mig-<profile>``, as NVIDIA's device plugin names a mixed resource (a ``+`` in
        the profile becomes ``.``)."""
        return f"mig-{self.profile.replace('+', '.')}"


def mig_strategy(text: str) -> MigStrategy:
    """``--mig-strategy``: none, single or mixed."""
    for strategy in MIG_STRATEGIES:
        if text == strategy:
            return strategy
    raise argparse.ArgumentTypeError(f"{text!r} is none of {', '.join(MIG_STRATEGIES)}")


def is_mig_device(uuid: str) -> bool:
    """Whether a card's UUID names a MIG device (``MIG-...``) rather than a GPU."""
    return uuid.startswith("MIG-")


class StaticMigSource:
    """An ``InventorySource`` whose GPUs in MIG mode are served as their MIG devices:
    reported as whole cards (``single``), or left out of the cards the daemon sees and
    listed in ``mig_devices`` for the device plugin's MIG resources (``mixed``). A GPU in
    MIG mode whose devices cannot be read is served as neither (one line)."""

    def __init__(self, source: InventorySource, devices: MigDevices,
                 strategy: Literal["single", "mixed"]) -> None:
        self._source = source
        self._devices = devices
        self._strategy = strategy
        self._found: tuple[MigDevice, ...] = ()
        self._lock = threading.Lock()
        self._unreadable: set[int] = set()
        self._profiles: dict[int, dict[int, GpuInstanceProfileInfo]] = {}

    @property
    def mig_devices(self) -> tuple[MigDevice, ...]:
        """The MIG devices the last read found, by GPU and slice."""
        with self._lock:
            return self._found

    def open(self) -> None:
        open_with(self._source, self._devices, f"--mig-strategy {self._strategy}")

    def close(self) -> None:
        close_with(self._source, self._devices)

    def read(self) -> list[ReportedCard]:
        cards = self._source.read()
        by_uuid = {card.uuid: card for card in cards}
        found: list[MigDevice] = []
        partitioned: set[str] = set()
        try:
            count = self._devices.gpu_count()
        except MigError as error:
            logger.warning("MIG devices not read, every card served as before: %s", error)
            return cards
        for gpu in range(count):
            try:
                uuid = self._devices.gpu_uuid(gpu)
                card = by_uuid.get(uuid)
                if card is None or not self._devices.mig_mode(gpu).current:
                    continue
                partitioned.add(uuid)
                found.extend(self._read_gpu(gpu, card))
                self._unreadable.discard(gpu)
            except MigError as error:
                if gpu not in self._unreadable:  # one line until it reads again
                    logger.warning("GPU %d left out: its MIG devices cannot be read: %s",
                                   gpu, error)
                    self._unreadable.add(gpu)
        with self._lock:
            self._found = tuple(found)
        served = [card for card in cards if card.uuid not in partitioned]
        if self._strategy == "single":
            served.extend(_as_card(by_uuid[device.gpu_uuid], device, position)
                          for device, position in _positions(found))
        return sorted(served, key=lambda card: card.index)

    def _read_gpu(self, gpu: int, card: ReportedCard) -> list[MigDevice]:
        profiles = self._profiles.get(gpu)
        if profiles is None:
            # A GPU's profiles are fixed while its driver is loaded: asked once (each with
            # its placements, several NVML calls), not at every read.
            profiles = self._profiles[gpu] = {
                info.id: info for info in self._devices.profiles(gpu)}
        devices = []
        for instance in sorted(self._devices.instances(gpu), key=lambda i: i.placement.start):
            info = profiles.get(instance.profile_id)
            if info is None or not instance.mig_uuid:
                continue  # no compute instance yet: no device to hand out
            devices.append(MigDevice(instance.mig_uuid, card.uuid, card.index,
                                     profile_name(info, card.memory), info.memory_mib))
        return devices


def _positions(devices: Sequence[MigDevice]) -> list[tuple[MigDevice, int]]:
    """Each device with its position among its GPU's."""
    seen: dict[str, int] = {}
    placed = []
    for device in devices:
        position = seen.get(device.gpu_uuid, 0)
        seen[device.gpu_uuid] = position + 1
        placed.append((device, position))
    return placed


def _as_card(gpu: ReportedCard, device: MigDevice, position: int) -> ReportedCard:
    """A MIG device as a whole card of its own: its memory, one tenant, its GPU's NUMA node
    and health, no NVLink peer."""
    return ReportedCard(uuid=device.uuid,
                        index=MIG_DEVICE_INDEX_BASE + gpu.index * 8 + position,
                        type=f"{gpu.type} MIG {device.profile}", memory=device.memory_mib,
                        count=1, numa=gpu.numa, health=gpu.health, links={},
                        health_detail=gpu.health_detail)
