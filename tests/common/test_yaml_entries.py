"""The daemon reads a YAML body only if it may hold at most so many nodes (issue 45):
PyYAML reads a document in one uninterruptible call, several microseconds a node. The
count found without parsing must bound the nodes PyYAML makes, whatever the text."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from common.files import InputFileError, parse_document, parse_pod_manifest, yaml_entries

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
values: st.SearchStrategy[Any] = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                     st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=40)


def nodes(node: yaml.Node) -> int:
    if isinstance(node, yaml.SequenceNode):
        return 1 + sum(nodes(item) for item in node.value)
    if isinstance(node, yaml.MappingNode):
        return 1 + sum(nodes(key) + nodes(value) for key, value in node.value)
    return 1


@settings(max_examples=400, deadline=None, derandomize=True)
@given(value=values, flow=st.sampled_from([None, True, False]))
def test_the_count_bounds_the_nodes_in_any_style(value: Any, flow: bool | None) -> None:
    text = yaml.safe_dump(value, default_flow_style=flow, width=40)
    composed = yaml.compose(text, Loader=yaml.SafeLoader)
    if composed is not None:
        assert nodes(composed) <= yaml_entries(text)
        assert nodes(composed) <= yaml_entries(text.encode())


@pytest.mark.parametrize("body", [
    pytest.param("x: [" + ",".join(["1"] * 20_000) + "]", id="a-long-flow-list"),
    pytest.param("".join(f"k{i}: v\n" for i in range(20_000)), id="many-keys"),
    pytest.param("x:\n" + "  - [[[[a]]]]\n" * 4_000, id="nested-brackets"),
])
def test_a_body_of_too_many_nodes_is_refused_unread(body: str) -> None:
    with pytest.raises(InputFileError) as refused:
        parse_document(body, "request body", entries_max=10_000)
    assert str(refused.value).startswith("request body: up to ")
    assert "more than the 10000 read as YAML here: send it as JSON" in str(refused.value)
    parse_document(body, "a file")  # without the bound it is read


def test_a_json_pod_of_any_size_is_read_without_the_yaml_bound() -> None:
    labels = ",".join(f'"k{i}": "v"' for i in range(20_000))
    body = ('{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {'
            + labels + '}}, "spec": {"containers": []}}')
    pod = parse_pod_manifest(body.encode(), "request body", yaml_entries_max=10_000)
    assert pod.metadata.labels is not None and len(pod.metadata.labels) == 20_000
