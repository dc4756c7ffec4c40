"""ExtenderArgs as the daemon reads them: the NodeNames of the last call kept while the
same bytes come again; a bad list refused naming where it is wrong."""

from __future__ import annotations

import json

import msgspec
import pytest

from scheduler.web.protocol import NODES_MAX, ExtenderArgsDecoder
from tests.builders import manifest

POD = msgspec.to_builtins(manifest())


def _body(names: object) -> bytes:
    return json.dumps({"Pod": POD, "NodeNames": names}).encode()


def test_the_same_names_give_the_same_tuple_and_other_names_a_new_one() -> None:
    decoder = ExtenderArgsDecoder()
    first = decoder.decode(_body(["node-a", "node-b"])).node_names
    assert first == ("node-a", "node-b")
    assert decoder.decode(_body(["node-a", "node-b"])).node_names is first
    assert decoder.decode(_body(["node-b"])).node_names == ("node-b",)
    assert decoder.decode(_body(["node-a", "node-b"])).node_names == ("node-a", "node-b")


def test_no_names_are_none_and_the_nodes_are_read_beside_them() -> None:
    decoder = ExtenderArgsDecoder()
    assert decoder.decode(_body(None)).node_names is None
    args = decoder.decode(json.dumps({"Pod": POD, "Nodes": {"items": [
        {"metadata": {"name": "node-a"}}]}}).encode())
    assert args.node_names is None
    assert args.nodes is not None and len(args.nodes.items or []) == 1
    assert args.pod == manifest()


@pytest.mark.parametrize(("names", "problem"), [
    (["node-a", 7], "Expected `str`, got `int` - at `$.NodeNames[1]`"),
    ({"node-a": 1}, "Expected `array | null`, got `object` - at `$.NodeNames`"),
    (["n"] * (NODES_MAX + 1), f"Expected `array` of length <= {NODES_MAX} - at `$.NodeNames`"),
])
def test_a_bad_node_list_is_refused_naming_where(names: object, problem: str) -> None:
    decoder = ExtenderArgsDecoder()
    decoder.decode(_body(["node-a"]))
    with pytest.raises(msgspec.ValidationError) as raised:
        decoder.decode(_body(names))
    assert str(raised.value) == problem
    # The good list read before is still the one kept.
    assert decoder.decode(_body(["node-a"])).node_names == ("node-a",)


def test_a_body_that_is_not_json_is_refused() -> None:
    with pytest.raises(msgspec.DecodeError):
        ExtenderArgsDecoder().decode(b'{"Pod": ')
