"""``pyhami preflight``: HAMi's two device files checked offline before a move, with no
cluster and no GPU: what each setting becomes in pyhami, where it takes effect, what is
not read, and every value the daemon or the agents would refuse at their start.

The files go through the loaders' own reading (``common.core.deviceconfig``'s
``read_device_config`` and ``read_node_config``, behind ``parse_device_config`` and
``parse_node_config``), read through to the end instead of stopping at the first
refusal, so that what this command refuses is what ``pyhami scheduler`` and
``pyhami agent`` would refuse, all of it at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from common.arguments import Subcommands
from common.core.deviceconfig import (
    DeviceConfig,
    NodeConfigFile,
    NodeDeviceConfig,
    NodeEntryReading,
    Reading,
    Refusal,
    effective_for,
    read_device_config,
    read_node_config,
)
from common.deviceconfig import config_document, ignored_summary
from common.files import InputFileError
from pyhami.output import add_output_argument, print_json, stdout_console

SCHEDULER, WEBHOOK, AGENT = "scheduler", "webhook", "agent"
VALUE_SHOWN = 40
"""Characters of a value as the file writes it, in the table (JSON holds it whole)."""


def register(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "preflight",
        help="check HAMi's device-config.yaml and config.json offline before moving to pyhami",
        description="Read HAMi's device-config.yaml (the hami-scheduler-device ConfigMap) "
                    "and its device plugin's config.json (the hami-device-plugin ConfigMap) "
                    "as pyhami's scheduler and agents read them, without a cluster or a GPU: "
                    "what each setting becomes in pyhami and where it takes effect, the keys "
                    "pyhami does not read, and every value pyhami would refuse. Exit status: "
                    "0 when nothing is refused, 2 when anything is (pyhami's scheduler or "
                    "agents would not start with these files).")
    parser.add_argument("--device-config", type=Path, metavar="FILE",
                        help="HAMi's device-config.yaml, its nvidia: section checked as the "
                             "scheduler and the agents read it (default: none; HAMi's chart "
                             "values stand for it)")
    parser.add_argument("--node-config", type=Path, metavar="FILE",
                        help="HAMi's device plugin config.json, every nodeconfig entry "
                             "checked as the agents read it (default: none)")
    add_output_argument(parser, "table", "table: the settings, then the refusals; json: one "
                                         "document")
    parser.set_defaults(handler=command)


# ---------------------------------------------------------------------------- the report


@dataclass(frozen=True, slots=True)
class _Setting:
    """One setting pyhami reads: the key as pyhami spells it, the parts it takes effect
    in, its value in what pyhami read, and what that value does."""

    key: str
    where: tuple[str, ...]
    value: Callable[[NodeDeviceConfig], object]
    effect: Callable[[Any], str]


def _cards(count: int) -> str:
    return f"{count} card" if count == 1 else f"{count} cards"


def _memory_scaling(value: float) -> str:
    if value == 1:
        return "each card registered with its own memory"
    extra = "; containers get CUDA_OVERSUBSCRIBE=true" if value > 1 else ""
    return f"each card registered with its MiB x {value:g}{extra}"


_NODE_SETTINGS = (
    _Setting("deviceSplitCount", (AGENT,), lambda c: c.settings.device_split_count,
             lambda v: f"{v} pods at once on one card"),
    _Setting("deviceMemoryScaling", (AGENT,), lambda c: c.settings.device_memory_scaling,
             _memory_scaling),
    _Setting("deviceCoreScaling", (AGENT,), lambda c: c.settings.device_core_scaling,
             lambda v: f"each card registered with {int(100 * v)} cores"),
    _Setting("preConfiguredDeviceMemory", (AGENT,),
             lambda c: c.settings.preconfigured_device_memory,
             lambda v: f"{v} MiB for a card NVML gives no memory figure for" if v
             else "none: NVML's memory figure"),
    _Setting("libCudaLogLevel", (AGENT,), lambda c: c.settings.libcuda_log_level,
             lambda v: f"containers' LIBCUDA_LOG_LEVEL={v}" if v
             else "LIBCUDA_LOG_LEVEL left unset"),
    _Setting("enableNumaTopology", (AGENT,), lambda c: c.settings.enable_numa_topology,
             lambda v: "each advertised device names its card's NUMA node to the kubelet"
             if v else "no NUMA topology advertised to the kubelet"),
)
"""The ``NodeDefaultConfig`` keys: in the ``nvidia:`` section for every node, in a
``nodeconfig`` entry (lower case) for one."""

_DEVICE_SETTINGS = (
    _Setting("resourceCountName", (SCHEDULER, WEBHOOK, AGENT),
             lambda c: c.device.resources.count,
             lambda v: "pods ask for cards with it; the agents advertise it"),
    _Setting("resourceMemoryName", (SCHEDULER, WEBHOOK), lambda c: c.device.resources.memory,
             lambda v: "MiB of each card; a quota's limits.<name>"),
    _Setting("resourceMemoryPercentageName", (SCHEDULER, WEBHOOK),
             lambda c: c.device.resources.memory_percentage,
             lambda v: "a share of each card's memory"),
    _Setting("resourceCoreName", (SCHEDULER, WEBHOOK), lambda c: c.device.resources.cores,
             lambda v: "% of each card's cores; a quota's limits.<name>"),
    _Setting("resourcePriorityName", (WEBHOOK,), lambda c: c.device.resources.priority,
             lambda v: "containers' CUDA_TASK_PRIORITY from their limit"),
    _Setting("overwriteEnv", (WEBHOOK,), lambda c: c.device.overwrite_env,
             lambda v: "NVIDIA_VISIBLE_DEVICES=none in containers naming no GPU" if v
             else "containers naming no GPU left as they are"),
    _Setting("defaultMemory", (SCHEDULER,), lambda c: c.device.default_memory,
             lambda v: f"{v} MiB for a GPU container naming no memory" if v
             else "the whole card for a GPU container naming no memory"),
    _Setting("defaultCores", (SCHEDULER,), lambda c: c.device.default_cores,
             lambda v: f"{v} % of each card's cores where memory is named, not cores"),
    _Setting("defaultGPUNum", (SCHEDULER,), lambda c: c.device.default_gpu_num,
             lambda v: f"{_cards(v)} for a container naming memory or cores, no count"
             if v else "no card for a container naming memory or cores, no count"),
    _Setting("memoryFactor", (SCHEDULER,), lambda c: c.device.memory_factor,
             lambda v: f"memory requests and quota limits x {v}" if v != 1
             else "memory requests in MiB"),
    *_NODE_SETTINGS,
    _Setting("gpuCorePolicy", (WEBHOOK,), lambda c: c.device.gpu_core_policy,
             lambda v: f"GPU_CORE_UTILIZATION_POLICY={v} in every container"
             if v not in ("", "default") else "GPU_CORE_UTILIZATION_POLICY not written"),
    _Setting("disableCoreLimit", (AGENT,), lambda c: c.device.disable_core_limit,
             lambda v: "containers get GPU_CORE_UTILIZATION_POLICY=disable" if v
             else "HAMi-core holds containers to their cores"),
    _Setting("runtimeClassName", (WEBHOOK,), lambda c: c.device.runtime_class_name,
             lambda v: f"runtimeClassName {v} for a GPU pod naming none" if v
             else "no runtimeClassName given"),
    _Setting("migProfileAllowlist", (AGENT,), lambda c: c.device.mig_profile_allowlist,
             lambda v: f"the MIG profiles a node in MIG mode may make ({len(v)} items)"),
)
"""The ``nvidia:`` keys pyhami reads, in the order the migration guide lists them."""

_ENTRY_SETTINGS = (
    _Setting("operatingmode", (AGENT,), lambda c: c.operating_mode,
             lambda v: "the agent makes MIG instances for the pods (MIG mode)" if v == "mig"
             else "cards shared through HAMi-core"),
    *(_Setting(setting.key.lower(), setting.where, setting.value, setting.effect)
      for setting in _NODE_SETTINGS),
    _Setting("migstrategy", (AGENT,), lambda c: c.mig_strategy,
             lambda v: "not used, nor by HAMi v2.10: see the agent's --mig-strategy"),
    _Setting("filterdevices", (AGENT,), lambda c: c.filter_devices,
             lambda v: "these cards neither reported nor advertised"
             if v.uuids or v.indexes else "no card kept out"),
    _Setting("enablegetpreferredallocation", (AGENT,),
             lambda c: c.enable_get_preferred_allocation,
             lambda v: "the kubelet asks the agent which cards to give" if v
             else "the kubelet chooses the cards it gives"),
)
"""The keys of a ``nodeconfig`` entry besides its name, as pyhami spells them."""


def _plain(value: object) -> Any:
    """A value pyhami read as JSON takes it."""
    if is_dataclass(value) and not isinstance(value, type):
        return _plain(asdict(value))
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    return value


def _json_safe(value: object) -> Any:
    """A value as the file wrote it, as JSON takes it (YAML may hold a date)."""
    return json.loads(json.dumps(value, default=str))


def _line(flag: str, refusal: Refusal) -> str:
    """A refusal as the daemon or the agent prints it after its name."""
    return f"{flag} {refusal.message}"


def _device_report(path: Path) -> tuple[dict[str, Any], DeviceConfig]:
    """``--device-config``'s part of the report, and what the agents read from it (HAMi's
    chart values where the file is refused)."""
    try:
        reading = read_device_config(config_document(path), str(path))
    except InputFileError as error:
        reading = Reading(DeviceConfig(), refused=(Refusal("the file", str(error)),))
    refused = {refusal.key: _line("--device-config", refusal) for refusal in reading.refused}
    written = {item.key: item for item in reading.written}
    config = NodeDeviceConfig(reading.value)
    settings: list[dict[str, Any]] = []
    if not any(key in refused for key in ("the file", "the document", "nvidia")):
        for setting in _DEVICE_SETTINGS:
            item = written.get(setting.key)
            line = refused.get(item.path) if item is not None else None
            value = setting.value(config)
            settings.append({
                "key": item.path if item is not None else f"nvidia.{setting.key}",
                "written": item is not None,
                "hami": _json_safe(item.value) if item is not None else None,
                "pyhami": None if line else _plain(value),
                "in": list(setting.where),
                "effect": None if line else setting.effect(value),
                "refused": line})
    return ({"file": str(path), "settings": settings, "ignored": list(reading.ignored),
             "refused": [_line("--device-config", r) for r in reading.refused]},
            reading.value)


def _node_report(path: Path, device: DeviceConfig) -> dict[str, Any]:
    """``--node-config``'s part of the report: per entry, what it changes for its node
    over what every other node reads."""
    try:
        reading = read_node_config(config_document(path), str(path))
    except InputFileError as error:
        reading = Reading((), refused=(Refusal("the file", str(error)),))
    others = NodeDeviceConfig(device)
    return {"file": str(path),
            "entries": [_entry_report(entry, device, others) for entry in reading.value],
            "ignored": list(reading.ignored),
            "refused": [_line("--node-config", refusal) for refusal in reading.refused]}


def _entry_report(reading: NodeEntryReading, device: DeviceConfig,
                  others: NodeDeviceConfig) -> dict[str, Any]:
    refused = {refusal.key: _line("--node-config", refusal) for refusal in reading.refused}
    written = {item.key.lower(): item for item in reading.written}
    node = None if reading.entry is None else reading.entry.name
    config = None if reading.entry is None else effective_for(
        device, NodeConfigFile((reading.entry,)), reading.entry.name)
    settings: list[dict[str, Any]] = []
    for setting in _ENTRY_SETTINGS:
        item = written.get(setting.key)
        if item is None:
            continue  # the node keeps what every other node reads
        line = refused.get(item.path)
        value = None if line or config is None else setting.value(config)
        settings.append({
            "key": setting.key, "hami": _json_safe(item.value),
            "pyhami": _plain(value), "others": _plain(setting.value(others)),
            "effect": None if line or config is None else setting.effect(value),
            "refused": line})
    return {"entry": reading.path, "node": node, "settings": settings,
            "refused": [_line("--node-config", refusal) for refusal in reading.refused]}


def preflight_report(device_config: Path | None, node_config: Path | None) -> dict[str, Any]:
    """The whole report: each file's part (None for a file not given) and every refusal,
    the device file's first."""
    device: dict[str, Any] | None = None
    config = DeviceConfig()
    if device_config is not None:
        device, config = _device_report(device_config)
    nodes = None if node_config is None else _node_report(node_config, config)
    refused = [*(device or {}).get("refused", ()), *(nodes or {}).get("refused", ())]
    return {"device_config": device, "node_config": nodes, "refused": refused}


# ---------------------------------------------------------------------------- printing


def _shown(value: object) -> str:
    """A value for a cell: as the file writes it (JSON), cut short."""
    if isinstance(value, str):
        text = value if value else '""'
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, list) and len(value) > 3:
        text = f"a list of {len(value)}"
    else:
        text = json.dumps(value, default=str)
    return text if len(text) <= VALUE_SHOWN else f"{text[:VALUE_SHOWN - 1]}…"


def _reading(row: dict[str, Any]) -> str:
    value = row["pyhami"]
    if isinstance(value, dict) and set(value) == {"uuids", "indexes"}:
        if not value["uuids"] and not value["indexes"]:
            return "none"
        return f"uuid {value['uuids']}, index {value['indexes']}"
    return _shown(value)


def _table() -> Table:
    return Table(show_edge=False, pad_edge=False, box=None, padding=(0, 1, 0, 2))


def _columns(table: Table, *names: str) -> None:
    """On a terminal narrower than the table, a cell wraps, a word too long for its column
    folds onto the next line: a value is never cut short (``nvidia.com/gpu…``)."""
    for name in names:
        # The names stay on one line where they can: the values and sentences wrap first.
        table.add_column(name, overflow="fold", no_wrap=name in ("key", "node"))


def _device_table(part: dict[str, Any]) -> Table:
    table = _table()
    _columns(table, "key", "HAMi", "pyhami", "in", "what it does in pyhami")
    for row in part["settings"]:
        key = row["key"].removeprefix("nvidia.")
        hami = _shown(row["hami"]) if row["written"] else "(not set)"
        if row["refused"]:
            table.add_row(key, hami, Text("refused", "red"), ", ".join(row["in"]), "")
            continue
        table.add_row(key, hami, _read(row, row["hami"]), ", ".join(row["in"]),
                      row["effect"])
    return table


def _read(row: dict[str, Any], hami: object) -> str:
    """pyhami's reading, ``same`` where it is the value as written (1 for 1, not '1'
    for 1: a number and its text differ)."""
    value = row["pyhami"]
    if (type(value) is type(hami) and value == hami) or (
            isinstance(value, float) and isinstance(hami, int)
            and not isinstance(hami, bool) and value == hami):
        return "same"
    if isinstance(value, str):
        return json.dumps(value)  # quoted: the text "1" where the file wrote the number 1
    return _reading(row)


def _node_table(part: dict[str, Any]) -> Table:
    table = _table()
    _columns(table, "node", "key", "HAMi", "pyhami", "other nodes", "what it does there")
    for entry in part["entries"]:
        node = entry["node"] or entry["entry"]
        for row in entry["settings"]:
            others = _shown(row["others"])
            if isinstance(row["others"], dict):
                others = _reading({"pyhami": row["others"]})
            if row["refused"]:
                table.add_row(node, row["key"], _shown(row["hami"]), Text("refused", "red"),
                              others, "")
            else:
                table.add_row(node, row["key"], _shown(row["hami"]), _read(row, row["hami"]),
                              others, row["effect"])
            node = ""
        if not entry["settings"]:
            table.add_row(node, "", "", "refused" if entry["refused"] else "", "",
                          "" if entry["refused"] else "nothing changed")
    return table


def print_report(report: dict[str, Any], console: Console) -> None:
    """The report as tables: each file's settings, what is not read, then the refusals,
    one line each, as the daemon and the agents word them."""
    parts = [part for part in (report["device_config"], report["node_config"]) if part]
    for part in parts:
        has_rows = part["settings"] if "settings" in part else part["entries"]
        if has_rows:
            # The title as a line of its own: a table's title is padded to its width.
            device = "settings" in part
            console.print(Text(f"{part['file']}: " + ("the nvidia: section" if device else
                               "nodeconfig, each entry read by the agent of the node it "
                               "names"), "bold"))
            console.print(_device_table(part) if device else _node_table(part))
        elif "entries" in part and not part["refused"]:
            console.print(Text(f"{part['file']}: no nodeconfig entries: every node reads the "
                               "nvidia: values"))
        if part["ignored"]:
            console.print(Text(f"{part['file']}: not read by pyhami, ignored: "
                               f"{ignored_summary(part['ignored'])}"))
        console.print()
    if report["refused"]:
        console.print(Text("refused:", "red bold"))
        for line in report["refused"]:
            console.print(Text(f"  {line}"), overflow="fold")
    else:
        console.print(Text("nothing refused: pyhami's scheduler and agents start with "
                           "these files", "green"))


def _consequence(report: dict[str, Any]) -> str:
    """Who would not start: the daemon and every command reading the device file, every
    agent for any refused entry (each agent reads the whole config.json)."""
    who: list[str] = []
    if (report["device_config"] or {}).get("refused"):
        who.append("the scheduler and the agents would not start with --device-config")
    if (report["node_config"] or {}).get("refused"):
        who.append("no agent would start with --node-config")
    return "; ".join(who)


def command(args: argparse.Namespace) -> int:
    if args.device_config is None and args.node_config is None:
        print("pyhami preflight: nothing to check: give --device-config FILE, "
              "--node-config FILE or both", file=sys.stderr)
        return 2
    report = preflight_report(args.device_config, args.node_config)
    if args.output == "json":
        print_json(report)
    else:
        print_report(report, stdout_console())
    if report["refused"]:
        count = len(report["refused"])
        print(f"pyhami preflight: {count} refused: {_consequence(report)}", file=sys.stderr)
        return 2
    return 0

