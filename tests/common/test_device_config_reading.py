"""The device files read through to the end (``read_device_config``, ``read_node_config``):
every refusal named, in the order the keys are taken, and the loaders' answer the first of
them, so that ``pyhami preflight`` refuses exactly what the daemon and the agents refuse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.core.deviceconfig import (
    DeviceConfigError,
    parse_device_config,
    parse_node_config,
    read_device_config,
    read_node_config,
)

HAMI = Path(__file__).parent / "hami"
CHANGED_NVIDIA: dict[str, Any] = yaml.safe_load(
    (HAMI / "device-config-changed.yaml").read_text())["nvidia"]
CHANGED_ENTRY: dict[str, Any] = json.loads(
    (HAMI / "config-changed.json").read_text())["nodeconfig"][0]
SOURCE = "f"


@pytest.mark.parametrize(("nvidia", "refused"), [
    ({"deviceSplitCount": 0, "memoryFactor": 0},
     ["nvidia.memoryFactor", "nvidia.deviceSplitCount"]),
    ({"resourceCountName": "gpu", "defaultCores": 101, "gpuCorePolicy": "x"},
     ["nvidia.resourceCountName", "nvidia.defaultCores", "nvidia.gpuCorePolicy"]),
    ({"resourceCountName": "a.com/x", "resourceMemoryName": "a.com/x"},
     ["nvidia.resource*Name"]),
    ({"migProfileAllowlist": [{"models": ["A30"]}], "overwriteEnv": "yes"},
     ["nvidia.overwriteEnv", "nvidia.migProfileAllowlist"]),
    ({}, []),
], ids=["two-numbers", "three-kinds", "names-clash", "allowlist-and-switch", "empty"])
def test_every_refused_nvidia_key_is_named_in_the_order_taken(
        nvidia: dict[str, Any], refused: list[str]) -> None:
    reading = read_device_config({"nvidia": nvidia}, SOURCE)
    assert [refusal.key for refusal in reading.refused] == refused
    assert all(r.message.startswith(f"{SOURCE}: ") and "\n" not in r.message
               for r in reading.refused)


@pytest.mark.parametrize(("document", "entries", "refused"), [
    ({"nodeconfig": [{"name": "a", "devicesplitcount": 0},
                     {"name": "b", "devicememoryscaling": 0, "operatingmode": "x"}]},
     ["a", "b"], ["nodeconfig[0].devicesplitcount", "nodeconfig[1].devicememoryscaling",
                  "nodeconfig[1].operatingmode"]),
    ({"nodeconfig": [{"name": "a"}, {"name": "a"}]}, ["a", "a"], ["nodeconfig[1].name"]),
    ({"nodeconfig": [{"devicesplitcount": 2}, 7]}, [None, None],
     ["nodeconfig[0]", "nodeconfig[1]"]),
    ({"nodeconfig": [{"name": "A_B"}]}, [None], ["nodeconfig[0].name"]),
    ({"nodeconfig": {"name": "a"}}, [], ["nodeconfig"]),
    ([], [], ["the document"]),
], ids=["two-entries", "a-node-twice", "no-name-not-a-mapping", "bad-name",
        "not-a-list", "not-a-mapping"])
def test_every_entry_is_read_on_its_own(document: object, entries: list[str | None],
                                        refused: list[str]) -> None:
    reading = read_node_config(document, SOURCE)
    assert [e.entry.name if e.entry else None for e in reading.value] == entries
    assert [refusal.key for refusal in reading.refused] == refused
    # Each entry holds its own refusals, and the whole holds them all.
    assert [r for e in reading.value for r in e.refused] == [
        r for r in reading.refused if r.key.startswith("nodeconfig[")]


def test_the_keys_read_are_given_as_written() -> None:
    reading = read_node_config({"nodeconfig": [{"Name": "a", "DeviceSplitCount": 3}]}, SOURCE)
    written = reading.value[0].written
    assert [(w.key, w.path, w.value) for w in written] == [
        ("name", "nodeconfig[0].Name", "a"),
        ("deviceSplitCount", "nodeconfig[0].DeviceSplitCount", 3)]


scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**20), st.floats(),
                    st.text(max_size=12), st.sampled_from(["a.com/x", "mig", "gpu-1", "1"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8)
SAME = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _loader_answer(parse: Any, document: object) -> object:
    try:
        parsed = parse(document, SOURCE)
    except DeviceConfigError as error:
        return str(error)
    return parsed


@SAME
@given(changes=st.dictionaries(st.sampled_from([*CHANGED_NVIDIA, "x"]), values, max_size=5),
       document=values, whole=st.booleans())
def test_the_loader_refuses_the_first_refusal_of_the_reading(
        changes: dict[str, Any], document: object, whole: bool) -> None:
    chosen = document if whole else {"nvidia": {**CHANGED_NVIDIA, **changes}}
    reading = read_device_config(chosen, SOURCE)
    answer = _loader_answer(parse_device_config, chosen)
    if reading.refused:
        assert answer == reading.refused[0].message
    else:
        assert answer == reading.parsed()


@SAME
@given(entries=st.lists(st.dictionaries(st.sampled_from([*CHANGED_ENTRY, "x"]), values,
                                        max_size=5), max_size=3),
       names=st.lists(st.sampled_from(["gpu-1", "gpu-2"]), min_size=3, max_size=3),
       document=values, whole=st.booleans())
def test_the_node_loader_refuses_the_first_refusal_of_the_reading(
        entries: list[dict[str, Any]], names: list[str], document: object,
        whole: bool) -> None:
    chosen = document if whole else {"nodeconfig": [
        {**CHANGED_ENTRY, "name": name, **entry} for entry, name in zip(entries, names,
                                                                        strict=False)]}
    reading = read_node_config(chosen, SOURCE)
    answer = _loader_answer(parse_node_config, chosen)
    if reading.refused:
        assert answer == reading.refused[0].message
    else:
        assert not isinstance(answer, str)
        assert [e.entry for e in reading.value] == list(answer.value.entries)  # type: ignore[attr-defined]
