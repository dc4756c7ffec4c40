"""Reading YAML safely: the loader ``common.files.parse_document`` uses, apart so that
PyYAML is imported only when a document is read (a command that reads none, such as
``pyhami simulate`` on CSV files, does not pay for it)."""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.error import Mark
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from common.core.errors import InvalidInput

try:
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]

YAMLError = yaml.YAMLError

_MERGE_TAG = "tag:yaml.org,2002:merge"
_VALUE_TAG = "tag:yaml.org,2002:value"
_TEXT_TAG = "tag:yaml.org,2002:str"
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""A key written as it is in a path; any other is quoted and cut short."""
_KEY_SHOWN = 40


class DuplicateKeyError(InvalidInput, YAMLError):
    """A mapping that gives one key twice; the message names the key by its path from the
    document's top and both places, without the source."""


class _ManifestLoader(_SafeLoader):
    """Safe YAML without aliases, merge keys or a key given twice.

    A few bytes of aliases can stand for a document of billions of nodes ("billion
    laughs"); merge keys (``<<: *a``) are refused by their tag before PyYAML flattens
    them, as PyYAML before 6.0.4 did in time and memory exponential in the number of
    merges, and without aliases a merge adds nothing that could not be written in place.
    A key given twice would silently take its last value, as in a Kubernetes manifest
    only where field validation is off. libyaml bounds the nesting at 1,000 levels; the
    pure-Python loader at the recursion limit."""

    _document: Node | None = None

    def construct_document(self, node: Node) -> object:
        self._document = node  # for the path of a duplicated key; the graph is composed
        return super().construct_document(node)

    def construct_object(self, node: Node, deep: bool = False) -> object:
        if node in self.constructed_objects:  # a node met twice is an alias's target
            raise ConstructorError(None, None, "YAML aliases (*name) are not accepted",
                                   node.start_mark)
        return super().construct_object(node, deep)

    def flatten_mapping(self, node: MappingNode) -> None:
        """PyYAML's merging replaced: a merge key refused; the value key (``=``) read as
        a text key, as PyYAML reads it."""
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                raise ConstructorError(None, None, "YAML merge keys (<<) are not accepted",
                                       key_node.start_mark)
            if key_node.tag == _VALUE_TAG:
                key_node.tag = _TEXT_TAG

    def construct_mapping(self, node: MappingNode,
                          deep: bool = False) -> dict[Hashable, Any]:
        mapping = super().construct_mapping(node, deep=deep)
        if len(mapping) < len(node.value):
            self._refuse_duplicate(node)
        return mapping

    def _refuse_duplicate(self, node: MappingNode) -> None:
        first: dict[object, Node] = {}
        for key_node, _ in node.value:
            key = self.constructed_objects[key_node]
            if key in first:
                where = _path(self._document, node, key_node)
                places = _places(first[key].start_mark, key_node.start_mark)
                raise DuplicateKeyError(f"{where} is given twice ({places})")
            first[key] = key_node


def _places(first: Mark, second: Mark) -> str:
    if first.line == second.line:
        return f"line {first.line + 1}, columns {first.column + 1} and {second.column + 1}"
    return f"lines {first.line + 1} and {second.line + 1}"


def _segment(key_node: Node) -> str:
    """A key as a step of a path: ``.name``, or quoted and cut short, ``['a b']``."""
    text = key_node.value if isinstance(key_node, ScalarNode) else "?"
    if _PLAIN_KEY.fullmatch(text):
        return f".{text}"
    return f"[{text[:_KEY_SHOWN]!r}...]" if len(text) > _KEY_SHOWN else f"[{text!r}]"


def _path(document: Node | None, mapping: MappingNode, key_node: Node) -> str:
    """``key_node``'s path from the document's top, as ``nvidia.deviceSplitCount``,
    ``nodeconfig[0].name``, ``metadata.annotations['nvidia.com/use-gputype']``: found by
    walking the composed graph once (an error's cost only)."""
    steps: list[str] = []
    stack: list[tuple[Node, list[str]]] = [] if document is None else [(document, [])]
    seen: set[int] = set()
    while stack:
        node, at = stack.pop()
        if node is mapping:
            steps = at
            break
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, MappingNode):
            stack.extend((value, [*at, _segment(key)]) for key, value in node.value)
        elif isinstance(node, SequenceNode):
            stack.extend((item, [*at, f"[{index}]"]) for index, item in enumerate(node.value))
    return "".join([*steps, _segment(key_node)]).removeprefix(".")


def load_document(text: bytes | str) -> object:
    """A YAML (or JSON) document as plain values, without aliases, merge keys or a key
    given twice. Raises PyYAML's ``YAMLError`` (``YAMLError`` here; ``DuplicateKeyError``
    for a key given twice), ``RecursionError`` or ``ValueError``."""
    return yaml.load(text, Loader=_ManifestLoader)
