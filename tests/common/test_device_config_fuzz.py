"""Fuzz targets for the device configuration's two doors: whatever a ``device-config.yaml``
or a ``config.json`` holds, it is either read whole or refused with one line naming the
file, never a traceback (hypothesis).

Documents are HAMi's chart files with keys replaced by arbitrary values, keys added, and
whole arbitrary documents; the bytes target feeds the file reader itself.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.core.deviceconfig import (
    DeviceConfigError,
    effective_for,
    parse_device_config,
    parse_node_config,
)
from common.deviceconfig import load_device_config, load_node_config
from common.files import InputFileError

pytestmark = pytest.mark.slow  # long fuzzing

HAMI = Path(__file__).parent / "hami"
CHANGED_NVIDIA: dict[str, Any] = yaml.safe_load(
    (HAMI / "device-config-changed.yaml").read_text())["nvidia"]
CHANGED_ENTRY: dict[str, Any] = json.loads(
    (HAMI / "config-changed.json").read_text())["nodeconfig"][0]
FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.sampled_from(["nvidia.com/gpu", "example.com/x", "-1", "1e309", "hami-core", "mig",
                     "force", "default", "", "GPU-aaaa", "101"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12)


def _one_line(error: Exception, source: str) -> None:
    message = str(error)
    assert message.startswith(source), message
    assert "\n" not in message, message
    assert "Traceback" not in message


@FUZZ
@given(changes=st.dictionaries(st.sampled_from([*CHANGED_NVIDIA, "unknownKey"]), values,
                               max_size=4))
def test_a_changed_nvidia_section_is_read_or_refused_in_one_line(
        changes: dict[str, Any]) -> None:
    document = {"nvidia": {**CHANGED_NVIDIA, **changes}}
    try:
        parse_device_config(document, "device-config.yaml")
    except DeviceConfigError as error:
        _one_line(error, "device-config.yaml")


@FUZZ
@given(document=values)
def test_any_device_config_document_is_read_or_refused_in_one_line(document: object) -> None:
    try:
        parse_device_config(document, "device-config.yaml")
    except DeviceConfigError as error:
        _one_line(error, "device-config.yaml")


@FUZZ
@given(changes=st.dictionaries(st.sampled_from([*CHANGED_ENTRY, "unknownkey"]), values,
                               max_size=4),
       node=st.sampled_from(["gpu-1", "gpu-2"]))
def test_a_changed_node_entry_is_read_or_refused_in_one_line(changes: dict[str, Any],
                                                             node: str) -> None:
    document = {"nodeconfig": [{**CHANGED_ENTRY, **changes}]}
    try:
        nodes = parse_node_config(document, "config.json").value
    except DeviceConfigError as error:
        _one_line(error, "config.json")
        return
    effective_for(parse_device_config(None, "device-config.yaml").value, nodes, node)


@FUZZ
@given(document=values)
def test_any_node_config_document_is_read_or_refused_in_one_line(document: object) -> None:
    try:
        parse_node_config(document, "config.json")
    except DeviceConfigError as error:
        _one_line(error, "config.json")


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(content=st.one_of(st.binary(max_size=200),
                         st.text(max_size=200).map(lambda text: text.encode())))
def test_any_file_is_read_or_refused_in_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "file"
    path.write_bytes(content)
    _loaded_by(path)


def _loaded_by(path: Path) -> int:
    """How many of the two loaders read ``path``; each other one refused it in one line
    naming it."""
    read = 0
    for load in (load_device_config, load_node_config):
        try:
            load(path)
        except (InputFileError, DeviceConfigError) as error:
            _one_line(error, str(path))
        else:
            read += 1
    return read


def test_a_key_with_a_newline_is_quoted_in_the_one_line() -> None:
    # Found by the fuzz target above: the key was written as is, breaking the line.
    document = {"nodeconfig": [{**CHANGED_ENTRY, "filterdevices": {"\n": None}}]}
    message = ("config.json: nodeconfig[0].filterdevices['\\n'] is not a filterdevices key "
               "(uuid, index)")
    with pytest.raises(DeviceConfigError, match=f"^{re.escape(message)}$"):
        parse_node_config(document, "config.json")


# Documents that give keys twice, merge them and alias them (issue 45): read or refused in
# one line; a key given twice or a merge key is always refused.
_fragment_keys = st.sampled_from(["nvidia", "deviceSplitCount", "nodeconfig", "name",
                                  "Name", "<<", "'<<'", "memoryFactor", "x"])
_fragment_values = st.sampled_from(["2", "gpu-1", "*a", "&a {deviceSplitCount: 2}",
                                    "&a 3", "[*a, *a]", "{}", "[]", "{<<: *a}"])


@st.composite
def _repeating_mappings(draw: st.DrawFn, depth: int = 2) -> tuple[str, bool]:
    """A flow mapping, and whether it surely holds a key twice or a merge key."""
    items: list[str] = []
    written: list[str] = []
    surely = False
    for _ in range(draw(st.integers(0, 4))):
        key = draw(_fragment_keys)
        if depth and draw(st.booleans()):
            value, inner = draw(_repeating_mappings(depth - 1))
            surely |= inner
        else:
            value = draw(_fragment_values)
            surely |= "<<" in value and not value.startswith("'")
        surely |= key in written or key == "<<"
        written.append(key)
        items.append(f"{key}: {value}")
    return "{" + ", ".join(items) + "}", surely


@FUZZ
@given(document=_repeating_mappings())
def test_repeated_keys_merges_and_aliases_are_refused_in_one_line(
        tmp_path: Path, document: tuple[str, bool]) -> None:
    text, surely_refused = document
    path = tmp_path / "file"
    path.write_text(text)
    assert not (surely_refused and _loaded_by(path)), text


@pytest.fixture
def special_paths(tmp_path: Path) -> list[Path]:
    """Paths that are not regular files: a FIFO no one writes to, a link to it, devices
    that never end or hold nothing, a directory, a link to a device."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(fifo)
    device_link = tmp_path / "device-link"
    device_link.symlink_to("/dev/zero")
    return [fifo, link, Path("/dev/zero"), Path("/dev/null"), Path("/dev/urandom"),
            tmp_path, device_link]


@FUZZ
@given(pick=st.integers(min_value=0))
def test_what_is_not_a_regular_file_is_refused_in_one_line_without_reading(
        special_paths: list[Path], pick: int) -> None:
    path = special_paths[pick % len(special_paths)]
    for load in (load_device_config, load_node_config):
        with pytest.raises(InputFileError, match=r": is a (FIFO|character device|directory), "
                                                  r"not a regular file$") as refused:
            load(path)
        _one_line(refused.value, str(path))
