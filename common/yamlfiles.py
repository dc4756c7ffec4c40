"""Reading YAML safely: the loader ``common.files.parse_document`` uses, apart so that
PyYAML is imported only when a document is read (a command that reads none, such as
``pyhami simulate`` on CSV files, does not pay for it)."""

from __future__ import annotations

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import Node

try:
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]

YAMLError = yaml.YAMLError


class _ManifestLoader(_SafeLoader):
    """Safe YAML without aliases: a few bytes of aliases can stand for a document of
    billions of nodes ("billion laughs"). libyaml bounds the nesting at 1,000 levels;
    the pure-Python loader at the recursion limit."""

    def construct_object(self, node: Node, deep: bool = False) -> object:
        if node in self.constructed_objects:  # a node met twice is an alias's target
            raise ConstructorError(None, None, "YAML aliases (*name) are not accepted",
                                   node.start_mark)
        return super().construct_object(node, deep)


def load_document(text: bytes | str) -> object:
    """A YAML (or JSON) document as plain values, without aliases. Raises PyYAML's
    ``YAMLError`` (``YAMLError`` here), ``RecursionError`` or ``ValueError``."""
    return yaml.load(text, Loader=_ManifestLoader)
