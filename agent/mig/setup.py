"""Putting a node in MIG mode together: its inventory reports its cards with their
profiles (``MigSource``) and its device plugin makes the instances (``MigManager``), both
over one ``MigDevices``: the driver's NVML, or the simulated library of a ``-mig``
simulated profile."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agent.mig.inventory import MigSource
from agent.mig.manager import MigManager
from agent.mig.nvml import NvmlMigDevices, pynvml_library
from agent.mig.simulated import SimulatedMigLibrary
from agent.mig.tables import MigCardTable
from agent.vendors.port import InventorySource
from common.core.deviceconfig import MigProfiles as AllowedProfiles


@dataclass(frozen=True, slots=True)
class MigNode:
    """A node in MIG mode: the inventory to report, the manager of its instances."""

    source: MigSource
    manager: MigManager


def mig_node(source: InventorySource, devices: NvmlMigDevices,
             allowlist: Iterable[AllowedProfiles]) -> MigNode:
    """``source`` in MIG mode over ``devices``. The manager learns each card's profiles
    from the inventory's discovery, when the source is opened."""
    mig_source = MigSource(source, devices, allowlist)
    return MigNode(mig_source, MigManager(devices, mig_source.profiles))


def nvml_mig_node(source: InventorySource, allowlist: Iterable[AllowedProfiles]) -> MigNode:
    """The node's own GPUs, through the driver's NVML (the inventory's ``NvmlSource``
    starts NVML)."""
    return mig_node(source, NvmlMigDevices(pynvml_library()), allowlist)


def simulated_mig_node(source: InventorySource, table: MigCardTable,
                       allowlist: Iterable[AllowedProfiles]) -> MigNode:
    """The source's cards as simulated GPUs of ``table``, answering NVML's MIG calls with
    placements enforced as the driver enforces them."""
    uuids = [card.uuid for card in source.read()]
    return mig_node(source, NvmlMigDevices(SimulatedMigLibrary([table] * len(uuids), uuids)),
                    allowlist)
