"""A node in MIG mode reports its cards with the profiles its allowlist allows, NVML's
figures, and as many slots as its largest profile has instances."""

from __future__ import annotations

import argparse

import pytest

from agent.cli import inventory_spec, mig_for
from agent.mig.nvml import NvmlMigDevices
from agent.mig.setup import mig_node, simulated_mig_node
from agent.mig.simulated import SimulatedMigLibrary
from agent.mig.tables import A100_80GB
from agent.registration import registered_cards
from agent.vendors.nvidia.simulated import MIG_PROFILES, SimulatedSource, profile_cards
from agent.vendors.port import InventoryError
from common.core.deviceconfig import (
    CHART_MIG_PROFILE_ALLOWLIST,
    DeviceConfig,
    MigProfiles,
    NodeDeviceConfig,
)
from common.core.errors import SettingsError
from common.core.model import Node
from common.core.registration import node_register
from tests.builders import H100_NVML_NAMES, H200_NVML_NAMES


def mig_cards(profile: str, allowlist: tuple[MigProfiles, ...] = CHART_MIG_PROFILE_ALLOWLIST):
    source = SimulatedSource(profile_cards(profile, "n"))
    node = simulated_mig_node(source, MIG_PROFILES[profile], allowlist)
    node.source.open()
    return node, node.source.read()


def test_an_a100_node_reports_its_allowed_profiles_with_nvmls_figures() -> None:
    node, cards = mig_cards("a100x8-mig")
    assert len(cards) == 8
    card = cards[0]
    assert (card.mode, card.count, card.memory) == ("mig", 7, 81920)
    assert [(p.name, p.memory, p.cores, p.slices, len(p.placements), p.instances)
            for p in card.mig_profiles] == [
        ("1g.10gb", 9728, 15, 1, 7, 7), ("2g.20gb", 19968, 29, 2, 3, 3),
        ("3g.40gb", 40192, 43, 3, 2, 2), ("7g.79gb", 80896, 100, 7, 1, 1)]
    # The manager learns the same profiles, with NVML's ids to create them by.
    assert {name: info.id for name, info in node.source.profiles[card.uuid].items()} == {
        "1g.10gb": 19, "2g.20gb": 14, "3g.40gb": 9, "7g.79gb": 0}


def test_the_node_registers_them_unscaled_and_with_its_own_slot_count() -> None:
    _, cards = mig_cards("a100x8-mig")
    config = NodeDeviceConfig(DeviceConfig())
    registered = registered_cards(cards, config)
    assert registered == cards  # no split count, no scaling on a MIG card
    text = node_register(Node(name="n", cards=[c.card() for c in registered]))
    assert text is not None and '"mode":"mig","migProfiles":[{"name":"1g.10gb"' in text


H100_PROFILES = [("1g.10gb", 9984, 13, 7), ("2g.20gb", 20096, 25, 3),
                 ("3g.40gb", 40448, 46, 2), ("7g.80gb", 81152, 100, 1)]
# The H200's memory figures are estimates until the GPU check reads them (agent/mig/tables.py).
H200_PROFILES = [("1g.18gb", 16384, 13, 7), ("2g.35gb", 33280, 25, 3),
                 ("3g.71gb", 71424, 46, 2), ("7g.141gb", 143360, 100, 1)]


@pytest.mark.parametrize(("profile", "allowlist", "expected"), [
    # HAMi's chart names the H100 SXM5 "H100-SXM5-80GB"; NVML calls it "NVIDIA H100 80GB HBM3".
    ("h100x8-mig", CHART_MIG_PROFILE_ALLOWLIST, None),
    ("h100x8-mig", (*CHART_MIG_PROFILE_ALLOWLIST, H100_NVML_NAMES), H100_PROFILES),
    # NVML calls an H200 SXM "NVIDIA H200", which contains the chart's "H20": matched by
    # substring, as HAMi matches, it takes the H20's names over the H200's figures.
    ("h200x8-mig", CHART_MIG_PROFILE_ALLOWLIST,
     [("1g.12gb", 16384, 13, 7), ("2g.24gb", 33280, 25, 3), ("3g.48gb", 71424, 46, 2),
      ("7g.96gb", 143360, 100, 1)]),
    # The first entry that matches wins: the H200's own entry must come before the H20's.
    ("h200x8-mig", (*CHART_MIG_PROFILE_ALLOWLIST, H200_NVML_NAMES),
     [("1g.12gb", 16384, 13, 7), ("2g.24gb", 33280, 25, 3), ("3g.48gb", 71424, 46, 2),
      ("7g.96gb", 143360, 100, 1)]),
    ("h200x8-mig", (H200_NVML_NAMES, *CHART_MIG_PROFILE_ALLOWLIST), H200_PROFILES),
])
def test_a_hopper_is_matched_by_its_nvml_name(
        profile: str, allowlist: tuple[MigProfiles, ...],
        expected: list[tuple[str, int, int, int]] | None) -> None:
    if expected is None:
        with pytest.raises(InventoryError, match="no card can serve MIG"):
            mig_cards(profile, allowlist)
        return
    _, cards = mig_cards(profile, allowlist)
    assert len(cards) == 8
    assert (cards[0].mode, cards[0].count) == ("mig", 7)
    assert [(p.name, p.memory, p.cores, p.instances) for p in cards[0].mig_profiles] == expected


@pytest.mark.parametrize(("inventory", "mode", "serves_mig"), [
    ("sim:a100x8-mig", "hami-core", True),
    ("sim:a100x8-nvswitch", "hami-core", False),
    ("sim:a100x8-mig", "mig", True),
    ("sim:h200x8-mig", "hami-core", True),
    ("sim:h200x8-nvswitch", "hami-core", False),
])
def test_the_agent_is_in_mig_mode_by_its_profile_or_its_operating_mode(
        inventory: str, mode: str, serves_mig: bool) -> None:
    spec = inventory_spec(inventory)
    source = SimulatedSource(profile_cards(spec.value, "n"))
    node = mig_for(spec, NodeDeviceConfig(DeviceConfig(), operating_mode=mode), source)
    assert (node is not None) is serves_mig


def test_mig_mode_over_a_simulation_without_mig_gpus_is_refused_at_start() -> None:
    spec = inventory_spec("sim:t4x4")
    with pytest.raises(SettingsError, match="simulates no MIG GPU"):
        mig_for(spec, NodeDeviceConfig(DeviceConfig(), operating_mode="mig"),
                SimulatedSource(profile_cards("t4x4", "n")))


def test_inventory_spec_knows_the_mig_profiles() -> None:
    assert inventory_spec("sim:h100x8-mig").value == "h100x8-mig"
    assert inventory_spec("sim:h200x8-mig").value == "h200x8-mig"
    with pytest.raises(argparse.ArgumentTypeError):
        inventory_spec("sim:a100x8-mog")


@pytest.mark.parametrize(("enabled", "needs_reset", "busy", "reported"), [
    (True, False, False, 8),
    (False, False, False, 8),  # idle and off: switched on at start
    (False, True, False, 0),  # the switch waits for a GPU reset
    (False, False, True, 7),  # GPU 0 runs a process: not switched, left out
])
def test_a_gpu_not_in_mig_mode_is_switched_only_when_idle(
        enabled: bool, needs_reset: bool, busy: bool, reported: int) -> None:
    source = SimulatedSource(profile_cards("a100x8-mig", "n"))
    uuids = [c.uuid for c in source.read()]
    library = SimulatedMigLibrary([A100_80GB] * 8, uuids, mig_enabled=enabled,
                                  needs_reset=needs_reset)
    if busy:
        library.set_processes(0, 1)
    node = mig_node(source, NvmlMigDevices(library), CHART_MIG_PROFILE_ALLOWLIST)
    if reported == 0:
        with pytest.raises(InventoryError, match="no card can serve MIG"):
            node.source.open()
        return
    node.source.open()
    cards = node.source.read()
    assert len(cards) == reported
    assert (uuids[0] in {c.uuid for c in cards}) is not busy
