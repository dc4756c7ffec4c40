"""The kube-scheduler extender protocol (k8s.io/kube-scheduler/extender/v1).

The JSON keys are the Go field names, since those types carry no json tags.
"""

from __future__ import annotations

import msgspec

from common.core import PodManifest


class NodeMeta(msgspec.Struct):
    name: str = ""


class NamedNode(msgspec.Struct):
    metadata: NodeMeta = msgspec.field(default_factory=NodeMeta)


class NodeList(msgspec.Struct):
    """A v1.NodeList whose items are kept as sent, to be echoed back unchanged."""

    items: list[msgspec.Raw] | None = None


class ExtenderArgs(msgspec.Struct, rename={"pod": "Pod", "nodes": "Nodes",
                                          "node_names": "NodeNames"}):
    pod: PodManifest
    nodes: NodeList | None = None
    node_names: list[str] | None = None


class ExtenderFilterResult(msgspec.Struct, rename="pascal"):
    nodes: dict[str, object] | None = None
    node_names: list[str] | None = None
    failed_nodes: dict[str, str] = {}
    failed_and_unresolvable_nodes: dict[str, str] = {}
    error: str = ""


class HostPriority(msgspec.Struct, rename="pascal"):
    host: str
    score: int


class ExtenderBindingArgs(msgspec.Struct, rename="pascal"):
    pod_name: str
    pod_namespace: str
    pod_uid: str = msgspec.field(default="", name="PodUID")
    node: str = ""


class ExtenderBindingResult(msgspec.Struct, rename="pascal"):
    error: str = ""


_node_name = msgspec.json.Decoder(NamedNode)


def node_name(raw: msgspec.Raw) -> str:
    return _node_name.decode(raw).metadata.name
