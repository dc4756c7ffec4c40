"""``pyhami agent``: the per-node agent (a DaemonSet) reporting the node's GPUs on NATS."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from agent.deviceplugin.plugin import PluginSettings
from agent.mig.nvml import NvmlMigDevices, pynvml_library
from agent.mig.setup import MigNode, nvml_mig_node, simulated_mig_node
from agent.mig.static import MigStrategy, StaticMigSource
from agent.monitor.containers import CacheSettings
from agent.monitor.monitor import MonitorSettings
from agent.service import Agent, AgentSettings
from agent.vendors.nvidia.hamicore import hami_core_settings
from agent.vendors.nvidia.nvml import DEFAULT_SPLIT_COUNT, NvmlSource
from agent.vendors.nvidia.plugin import DEVICE_PLUGIN
from agent.vendors.nvidia.simulated import (
    MIG_PROFILES,
    PROFILES,
    SimulatedSource,
    file_cards,
    profile_cards,
)
from agent.vendors.port import DevicePluginVendor, InventoryError
from common.arguments import Subcommands, positive_int, variable_for
from common.core.deviceconfig import NodeDeviceConfig, effective_for
from common.core.errors import SettingsError
from common.core.model import CARD_COUNT_MAX
from common.core.names import InvalidName, check_subdomain
from common.deviceconfig import add_device_config_argument, device_config_from, node_config_from
from common.logs import add_log_arguments, configure_logging
from common.messaging import add_nats_arguments, nats_settings
from common.settings import add_settings, settings_from
from common.stopping import stop_on_signals

logger = logging.getLogger(__name__)

NODE_NAME_ENV = "NODE_NAME"
# The command is the one place the agent chooses its cards' vendor (the imports of
# agent.vendors.nvidia above: its inventory sources, MIG, its device plugin part); nothing
# below the command asks which.
VENDOR_DEVICE_PLUGIN: DevicePluginVendor = DEVICE_PLUGIN
"""What the device plugin asks of the cards' vendor."""


@dataclass(frozen=True)
class InventorySpec:
    kind: Literal["nvml", "profile", "file"]
    value: str = ""

    @property
    def text(self) -> str:
        """As the flag takes it."""
        return "nvml" if self.kind == "nvml" else f"sim:{self.value}"


def inventory_spec(text: str) -> InventorySpec:
    """``nvml``, ``sim:PROFILE`` or ``sim:FILE.yaml`` (a name ending in .yaml/.yml or with a /)."""
    if text == "nvml":
        return InventorySpec("nvml")
    prefix, _, rest = text.partition(":")
    if prefix != "sim" or not rest:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected nvml, sim:PROFILE or sim:FILE.yaml")
    if rest.endswith((".yaml", ".yml")) or "/" in rest:
        return InventorySpec("file", rest)
    if rest not in PROFILES:
        raise argparse.ArgumentTypeError(
            f"unknown simulated profile {rest!r} (known: {', '.join(sorted(PROFILES))}; "
            "or sim:FILE.yaml)")
    return InventorySpec("profile", rest)


def split_count(text: str) -> int:
    count = positive_int(text)
    if count > CARD_COUNT_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} must be at most {CARD_COUNT_MAX}")
    return count


def register(commands: Subcommands) -> None:
    parser = commands.add_parser("agent", help="report this node's GPUs to the daemon over NATS")
    parser.add_argument("--node", help=f"this node's name (default: ${NODE_NAME_ENV}, which a "
                                       "DaemonSet sets from spec.nodeName)")
    parser.add_argument("--inventory", type=inventory_spec, default=InventorySpec("nvml"),
                        metavar="nvml|sim:PROFILE|sim:FILE.yaml",
                        help="where the cards come from (default: nvml); profiles: "
                             + ", ".join(sorted(PROFILES)))
    add_settings(parser, AgentSettings, "poll_interval", "heartbeat_interval", "usage_interval")
    parser.add_argument("--device-split-count", type=split_count, metavar="N",
                        help="pods one card may hold at once, as HAMi's deviceSplitCount "
                             f"(default: {DEFAULT_SPLIT_COUNT}); not with --device-config or "
                             "--node-config, where deviceSplitCount says it")
    add_settings(parser, AgentSettings, "cordoned")
    add_device_config_argument(parser)
    parser.add_argument("--node-config", type=Path, metavar="FILE",
                        help="HAMi's device plugin config.json (the hami-device-plugin "
                             "ConfigMap): this node's nodeconfig entry applied over "
                             "--device-config's values")
    plugin = parser.add_argument_group("kubelet device plugin")
    plugin.add_argument("--device-plugin", action="store_true",
                        help="serve the kubelet's device plugin API: advertise the cards as "
                             "resourceCountName (nvidia.com/gpu by default) and give "
                             "containers the cards pyhami chose")
    add_settings(plugin, PluginSettings, "kubelet_dir", "hami_core_dir", "folder_grace",
                 "folder_sweep_interval", "allocate_patience", "mig_strategy")
    monitor = parser.add_argument_group("node monitor (HAMi's vGPUmonitor)")
    add_settings(monitor, MonitorSettings, "metrics", "monitor_interval", "scrape_timeout")
    add_settings(monitor, CacheSettings)
    add_log_arguments(parser)
    add_nats_arguments(parser)
    parser.set_defaults(handler=run)


def node_name(flag: str | None, environ: Mapping[str, str]) -> str:
    name = flag if flag is not None else environ.get(NODE_NAME_ENV, "")
    if not name:
        raise SettingsError(f"no node name: pass --node, or set {variable_for('--node')} or "
                         f"{NODE_NAME_ENV}")
    try:  # the daemon refuses inventories of any other name
        check_subdomain("node name", name)
    except InvalidName as error:
        raise SettingsError(str(error)) from None
    return name


def inventory_source(spec: InventorySpec, node: str,
                     proc_root: Path) -> NvmlSource | SimulatedSource:
    """Raises ``InventoryError`` for a simulation file that cannot be used. NVML's
    processes are attributed to their pods through ``proc_root`` (the monitor's), so that
    a card's tenants seen count a pod once."""
    if spec.kind == "nvml":
        return NvmlSource(proc_root=proc_root)
    if spec.kind == "profile":
        return SimulatedSource(profile_cards(spec.value, node))
    return SimulatedSource(file_cards(Path(spec.value), node))


def mig_for(spec: InventorySpec, device: NodeDeviceConfig,
            source: NvmlSource | SimulatedSource) -> MigNode | None:
    """The node's MIG parts when it is in MIG mode: its ``operatingmode`` is ``mig``, or
    its simulated profile is one of the ``-mig`` ones; None otherwise. Raises
    ``SettingsError`` for MIG mode over a simulation that has no MIG GPU."""
    table = MIG_PROFILES.get(spec.value) if spec.kind == "profile" else None
    if device.operating_mode != "mig" and table is None:
        return None
    allowlist = device.device.mig_profile_allowlist
    if spec.kind == "nvml":
        return nvml_mig_node(source, allowlist)
    if table is None:
        raise SettingsError(f"the node's operatingmode is mig, but --inventory {spec.text} "
                            "simulates no MIG GPU: use nvml, sim:a100x8-mig, "
                            "sim:h100x8-mig or sim:h200x8-mig")
    return simulated_mig_node(source, table, allowlist)


def static_mig_for(strategy: MigStrategy, spec: InventorySpec, dynamic: MigNode | None,
                   source: NvmlSource | SimulatedSource) -> StaticMigSource | None:
    """The node's MIG devices an operator made, served as ``--mig-strategy`` says; None
    for ``none``. Raises ``SettingsError`` for a node in MIG mode (pyhami makes its
    instances: the two do not mix) and for a simulated inventory (the devices are read
    through NVML)."""
    if strategy == "none":
        return None
    if dynamic is not None:
        raise SettingsError(f"--mig-strategy {strategy} serves MIG devices an operator made, "
                            "but this node is in MIG mode (operatingmode mig or a -mig "
                            "profile), whose instances pyhami makes: use one or the other")
    if spec.kind != "nvml":
        raise SettingsError(f"--mig-strategy {strategy} reads the MIG devices through NVML: "
                            f"use --inventory nvml, not {spec.text}")
    return StaticMigSource(source, NvmlMigDevices(pynvml_library()), strategy)


def node_device_config(args: argparse.Namespace, node: str) -> NodeDeviceConfig:
    """``--device-config`` with ``node``'s ``--node-config`` entry applied, the split count
    from ``--device-split-count`` where no file is given; raises ``SettingsError`` for a
    file that cannot be used, and for a split count given in both places."""
    split: int | None = args.device_split_count
    files = [flag for flag, path in (("--device-config", args.device_config),
                                     ("--node-config", args.node_config)) if path is not None]
    if split is not None and files:
        # Two places for one number: HAMi declares the flag and reads only the file.
        raise SettingsError(f"--device-split-count is given with {files[0]}: set the split "
                            "count in one place (deviceSplitCount, or a node's "
                            "devicesplitcount), not both")
    config = effective_for(device_config_from(args), node_config_from(args), node)
    if split is None:
        return config
    node_settings = replace(config.settings, device_split_count=split)
    return replace(config, device=replace(config.device, node=node_settings))


def plugin_settings(args: argparse.Namespace, device: NodeDeviceConfig) -> PluginSettings:
    """The device plugin's flags, and what the node's device configuration tells it: the
    resource name, whether it steers the kubelet's choice or names the cards' NUMA nodes,
    HAMi-core's settings."""
    return settings_from(PluginSettings, args, vendor=VENDOR_DEVICE_PLUGIN,
                         hami_core=hami_core_settings(device),
                         resource_name=device.device.resources.count,
                         preferred_allocation=device.enable_get_preferred_allocation,
                         numa_topology=device.settings.enable_numa_topology)


def run(args: argparse.Namespace) -> int:
    configure_logging(args)  # first: reading the device files logs the keys they ignore
    try:
        node = node_name(args.node, os.environ)
        nats = nats_settings(args)
        device = node_device_config(args, node)
        monitor = settings_from(MonitorSettings, args, caches=settings_from(CacheSettings, args))
        source = inventory_source(args.inventory, node, monitor.proc_root)
        mig = mig_for(args.inventory, device, source)
        static = static_mig_for(args.mig_strategy, args.inventory, mig, source)
    except SettingsError as error:
        print(f"pyhami agent: {error}", file=sys.stderr)
        return 2
    except InventoryError as error:
        print(f"pyhami agent: --inventory: {error}", file=sys.stderr)
        return 2
    settings = settings_from(AgentSettings, args, node=node, device=device)
    plugin = plugin_settings(args, device) if args.device_plugin else None
    try:
        inventory = static or (mig.source if mig is not None else source)
        asyncio.run(serve(Agent(settings, inventory, nats, device_plugin=plugin,
                                monitor=monitor, probe=source,
                                mig=None if mig is None else mig.manager,
                                static_mig=static if args.mig_strategy == "mixed" else None)))
    except InventoryError as error:
        print(f"pyhami agent: {error}", file=sys.stderr)
        return 1
    return 0


async def serve(agent: Agent) -> None:
    """Run the agent until SIGTERM or SIGINT, then drain."""
    stop = asyncio.Event()
    stop_on_signals(stop.set, logger, "draining")
    await agent.run(stop)

