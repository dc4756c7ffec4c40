"""HAMi's device configuration files read at start: ``--device-config`` (the
``device-config.yaml`` of HAMi's ``hami-scheduler-device`` ConfigMap) on every command
that decides or reports cards, and ``--node-config`` (the device plugin's ``config.json``)
on the agent. The files are read here, bounded; their contents are checked by the pure
parsers of ``common.core.deviceconfig``.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from common.core.deviceconfig import (
    DeviceConfig,
    DeviceConfigError,
    NodeConfigFile,
    Parsed,
    parse_device_config,
    parse_node_config,
)
from common.core.errors import SettingsError
from common.files import InputFileError, parse_document, read_bounded

logger = logging.getLogger(__name__)
T = TypeVar("T")

CONFIG_FILE_MAX_BYTES = 1024 * 1024
"""A ConfigMap holds at most 1 MiB, so neither file can be larger where HAMi reads it."""


def config_document(path: Path) -> object:
    """Either file's YAML or JSON (JSON is YAML) as plain values, read as the loaders read
    it; raises ``InputFileError`` naming the file."""
    return parse_document(read_bounded(path, CONFIG_FILE_MAX_BYTES), str(path))


IGNORED_SHOWN = 12
"""Keys named at most in the log line of what is not read (HAMi's chart renders twelve
other vendors' sections); the rest are counted."""
IGNORED_KEY_SHOWN = 80
"""Characters of each key named there (a key's path, its quoted parts already cut)."""
IGNORED_TEXT_MAX = 800
"""Characters of the keys named there: the line stays under 1 KB with a file's path of
150 characters, however many keys, however long, the file holds."""


def ignored_summary(keys: Sequence[str]) -> str:
    """``keys`` for one log line: the first ones, ``IGNORED_SHOWN`` at most, each cut to
    ``IGNORED_KEY_SHOWN`` characters, as many as ``IGNORED_TEXT_MAX`` holds; then how
    many more."""
    named: list[str] = []
    size = 0
    for key in keys[:IGNORED_SHOWN]:
        text = key if len(key) <= IGNORED_KEY_SHOWN else f"{key[:IGNORED_KEY_SHOWN - 3]}..."
        size += len(text) + 2
        if size > IGNORED_TEXT_MAX:
            break
        named.append(text)
    more = len(keys) - len(named)
    return ", ".join(named) + (f" and {more} more" if more else "")


def _logged(parsed: Parsed[T], path: Path) -> T:
    if parsed.ignored:
        logger.info("%s: not read by pyhami, ignored: %s", path,
                    ignored_summary(parsed.ignored))
    return parsed.value


def load_device_config(path: Path) -> DeviceConfig:
    """HAMi's ``device-config.yaml``: its ``nvidia:`` section, the other vendors' sections
    and unknown keys ignored with one log line. Raises ``InputFileError`` (a
    ``DeviceConfigError`` for a value refused) naming the file."""
    return _logged(parse_device_config(config_document(path), str(path)), path)


def load_node_config(path: Path) -> NodeConfigFile:
    """The device plugin's ``config.json`` (its ``nodeconfig`` list). Raises
    ``InputFileError`` or ``DeviceConfigError`` naming the file."""
    return _logged(parse_node_config(config_document(path), str(path)), path)


def add_device_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device-config", type=Path, metavar="FILE",
        help="HAMi's device-config.yaml (the hami-scheduler-device ConfigMap), read as HAMi "
             "reads its nvidia: section (docs/migrating-from-hami.md); default: HAMi's chart "
             "values")


def device_config_from(args: argparse.Namespace) -> DeviceConfig:
    """``--device-config``'s file, or HAMi's chart values without it. Raises
    ``SettingsError`` naming the flag, the file, the key and the value."""
    path: Path | None = args.device_config
    if path is None:
        return DeviceConfig()
    try:
        return load_device_config(path)
    except (InputFileError, DeviceConfigError) as error:
        raise SettingsError(f"--device-config {error}") from None


def node_config_from(args: argparse.Namespace) -> NodeConfigFile:
    """``--node-config``'s file, or no node entries without it. Raises ``SettingsError``."""
    path: Path | None = args.node_config
    if path is None:
        return NodeConfigFile()
    try:
        return load_node_config(path)
    except (InputFileError, DeviceConfigError) as error:
        raise SettingsError(f"--node-config {error}") from None
