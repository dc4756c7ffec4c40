"""The node's device configuration applied by the agent: what each card registers, which
cards are left out, the split count's one rule, MIG mode refused, HAMi-core's settings."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from agent.cli import node_device_config
from agent.registration import ConfiguredSource, registered_cards
from agent.vendors.nvidia.hamicore import HamiCoreSettings, hami_core_settings
from agent.vendors.nvidia.nvml import NvmlSource
from common.core.deviceconfig import (
    DeviceConfig,
    FilterDevices,
    NodeDeviceConfig,
    NodeSettings,
)
from common.core.errors import SettingsError
from common.wire import ReportedCard
from tests.fakes.nvml import NvmlStandIn, StandInCard

T4 = ReportedCard(uuid="GPU-a", index=0, type="NVIDIA-Tesla T4", memory=15360)
A10 = ReportedCard(uuid="GPU-b", index=1, type="NVIDIA-A10", memory=23028)


NO_FILTER = FilterDevices()


def _config(filters: FilterDevices = NO_FILTER, **node: object) -> NodeDeviceConfig:
    return NodeDeviceConfig(DeviceConfig(node=replace(NodeSettings(), **node)),
                            filter_devices=filters)


@pytest.mark.parametrize(("config", "expected"), [
    (_config(), [(15360, 100, 10, None, None), (23028, 100, 10, None, None)]),
    (_config(device_memory_scaling=1.5),
     [(23040, 100, 10, 15360, None), (34542, 100, 10, 23028, None)]),
    (_config(device_core_scaling=2.5), [(15360, 250, 10, None, 100),
                                        (23028, 250, 10, None, 100)]),
    (_config(device_split_count=3), [(15360, 100, 3, None, None), (23028, 100, 3, None, None)]),
    (_config(filters=FilterDevices(uuids=("GPU-a",))), [(23028, 100, 10, None, None)]),
    (_config(filters=FilterDevices(indexes=(1,))), [(15360, 100, 10, None, None)]),
], ids=["chart-defaults", "memory-scaling", "core-scaling", "split-count", "filter-by-uuid",
        "filter-by-index"])
def test_each_key_changes_what_the_cards_register(
        config: NodeDeviceConfig, expected: list[tuple[int, int, int, int | None, int | None]],
        ) -> None:
    assert [(c.memory, c.cores, c.count, c.physical_memory, c.physical_cores)
            for c in registered_cards([T4, A10], config)] == expected


@pytest.mark.parametrize(("preconfigured", "memory"), [(0, 0), (98304, 98304)],
                         ids=["none-configured", "preconfigured"])
def test_a_card_nvml_has_no_memory_for_registers_the_preconfigured_memory(
        preconfigured: int, memory: int) -> None:
    library = NvmlStandIn([StandInCard("GPU-gb10", "00000000:01:00.0", name="NVIDIA GB10",
                                       unsupported={"nvmlDeviceGetMemoryInfo"})])
    source = ConfiguredSource(NvmlSource(library, sysfs_root=Path("/nonexistent"),
                                         event_wait_ms=20),
                              _config(preconfigured_device_memory=preconfigured))
    source.open()
    try:
        (card,) = source.read()
    finally:
        source.close()
    assert (card.memory, card.physical_memory) == (memory, None)


def _args(split: int | None, device_config: Path | None = None,
          node_config: Path | None = None) -> argparse.Namespace:
    return argparse.Namespace(device_split_count=split, device_config=device_config,
                              node_config=node_config)


def _files(tmp_path: Path, mode: str = "hami-core") -> tuple[Path, Path]:
    device = tmp_path / "device-config.yaml"
    device.write_text("nvidia:\n  deviceSplitCount: 6\n")
    nodes = tmp_path / "config.json"
    nodes.write_text(json.dumps({"nodeconfig": [
        {"name": "gpu-1", "operatingmode": mode, "devicesplitcount": 4}]}))
    return device, nodes


@pytest.mark.parametrize(("split", "files", "expected"), [
    (None, "", 10),
    (7, "", 7),
    (None, "device", 6),
    (None, "both", 4),
], ids=["neither", "flag-only", "device-config-only", "node-entry-wins"])
def test_the_split_count_comes_from_one_place(tmp_path: Path, split: int | None, files: str,
                                               expected: int) -> None:
    device, nodes = _files(tmp_path)
    args = _args(split, device if files else None, nodes if files == "both" else None)
    assert node_device_config(args, "gpu-1").settings.device_split_count == expected


@pytest.mark.parametrize("file_flag", ["device_config", "node_config"])
def test_a_split_count_given_with_a_file_is_refused(tmp_path: Path, file_flag: str) -> None:
    device, nodes = _files(tmp_path)
    args = _args(5, device if file_flag == "device_config" else None,
                 nodes if file_flag == "node_config" else None)
    with pytest.raises(SettingsError, match="set the split count in one place"):
        node_device_config(args, "gpu-1")


def _agent(*args: str, **environment: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items()
           if name != "NODE_NAME" and not name.startswith("PYHAMI_")}
    env.update(environment)
    return subprocess.run([sys.executable, "-m", "pyhami.cli", "agent", "--node", "gpu-1",
                           "--inventory", "sim:t4x4", *args], capture_output=True, text=True,
                          timeout=60, check=False, env=env)


def test_the_split_count_variable_with_a_file_exits_2_with_one_line(tmp_path: Path) -> None:
    device, _ = _files(tmp_path)
    done = _agent("--device-config", str(device), PYHAMI_DEVICE_SPLIT_COUNT="5")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "pyhami agent: --device-split-count is given with --device-config: set the split "
        "count in one place (deviceSplitCount, or a node's devicesplitcount), not both")
    assert "Traceback" not in done.stderr


def test_mig_mode_over_a_simulation_without_mig_gpus_exits_2_with_one_line(
        tmp_path: Path) -> None:
    _, nodes = _files(tmp_path, mode="mig")
    done = _agent("--node-config", str(nodes))
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "pyhami agent: the node's operatingmode is mig, but --inventory sim:t4x4 simulates "
        "no MIG GPU: use nvml, sim:a100x8-mig, sim:h100x8-mig or sim:h200x8-mig")


@pytest.mark.parametrize(("config", "expected"), [
    (NodeDeviceConfig(), HamiCoreSettings()),
    (_config(libcuda_log_level="4"), HamiCoreSettings(lib_cuda_log_level="4")),
    (_config(device_memory_scaling=2.0), HamiCoreSettings(device_memory_scaling=2.0)),
    (NodeDeviceConfig(DeviceConfig(disable_core_limit=True)),
     HamiCoreSettings(disable_core_limit=True)),
], ids=["defaults", "log-level", "memory-scaling", "disable-core-limit"])
def test_hami_core_settings_come_from_the_node_config(config: NodeDeviceConfig,
                                                      expected: HamiCoreSettings) -> None:
    assert hami_core_settings(config) == expected
