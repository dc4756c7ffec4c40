"""The kube-scheduler extender protocol (k8s.io/kube-scheduler/extender/v1).

The JSON keys are the Go field names, since those types carry no json tags.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec

from common.core import PodManifest
from common.core.names import InvalidName, check_label, check_subdomain


class NodeMeta(msgspec.Struct):
    name: str = ""


class NamedNode(msgspec.Struct):
    metadata: NodeMeta = msgspec.field(default_factory=NodeMeta)


NODES_MAX = 2**16
"""Nodes in one ExtenderArgs: four times the 15,000 a cluster is sized for. Each node
not known costs a reason in the answer: 790,000 short names (8 MiB) took 1 s and 53 MB."""


class NodeList(msgspec.Struct):
    """A v1.NodeList whose items are kept as sent, to be echoed back unchanged."""

    items: Annotated[list[msgspec.Raw], msgspec.Meta(max_length=NODES_MAX)] | None = None


class ExtenderArgs(msgspec.Struct, rename={"pod": "Pod", "nodes": "Nodes",
                                          "node_names": "NodeNames"}):
    pod: PodManifest
    nodes: NodeList | None = None
    node_names: Sequence[str] | None = None
    """As ``ExtenderArgsDecoder`` reads it, a tuple."""

    def offered_names(self) -> Sequence[str]:
        """The names of the nodes offered, the one place NodeNames-or-Nodes is read:
        NodeNames as decoded (the same tuple while the same list is sent again: the
        daemon knows it again by its identity), else the names of Nodes' objects."""
        if self.node_names is not None:
            return self.node_names
        return [node_name(item) for item in (self.nodes.items or [])] if self.nodes else []


NodeNames = Annotated[tuple[str, ...], msgspec.Meta(max_length=NODES_MAX)] | None
_NO_NAMES = msgspec.Raw(b"null")


class _ExtenderArgsSent(msgspec.Struct, rename={"pod": "Pod", "nodes": "Nodes"}):
    pod: PodManifest
    nodes: NodeList | None = None
    node_names: msgspec.Raw = msgspec.field(default=_NO_NAMES, name="NodeNames")


class ExtenderArgsDecoder:
    """Reads ExtenderArgs from JSON. While NodeNames's bytes are the same as last time's,
    the tuple decoded then is given again, the same object, so that neither the decoding
    nor a comparison of the names is done again. kube-scheduler sends the same list call
    after call when it sends every node (clusters of up to 100 nodes, or
    ``percentageOfNodesToScore: 100``); on larger clusters it sends a window of the nodes
    that pass its own filters, starting where its last search stopped, and every list is
    decoded."""

    def __init__(self) -> None:
        self._sent = msgspec.json.Decoder(_ExtenderArgsSent)
        self._names = msgspec.json.Decoder(NodeNames)
        self._last: tuple[msgspec.Raw, tuple[str, ...] | None] = (_NO_NAMES, None)

    def decode(self, body: bytes) -> ExtenderArgs:
        """Raises ``msgspec.DecodeError`` naming what is wrong, ``$.NodeNames`` included."""
        sent = self._sent.decode(body)
        raw, names = self._last
        if sent.node_names != raw:
            try:
                names = self._names.decode(sent.node_names)
            except msgspec.ValidationError as error:
                raise msgspec.ValidationError(_under_node_names(str(error))) from None
            self._last = (sent.node_names, names)
        return ExtenderArgs(pod=sent.pod, nodes=sent.nodes, node_names=names)


def _under_node_names(message: str) -> str:
    """A message about the NodeNames value alone, with its path from the body's root."""
    if " - at `$" in message:
        return message.replace(" - at `$", " - at `$.NodeNames", 1)
    return f"{message} - at `$.NodeNames`"


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
    pod_uid: Annotated[str, msgspec.Meta(max_length=128)] = msgspec.field(default="",
                                                                         name="PodUID")
    node: str = ""


class ExtenderBindingResult(msgspec.Struct, rename="pascal"):
    error: str = ""


class MetaPod(msgspec.Struct, rename={"uid": "UID"}):
    uid: Annotated[str, msgspec.Meta(max_length=128)] = ""


class MetaVictims(msgspec.Struct, rename="pascal"):
    pods: Annotated[list[MetaPod], msgspec.Meta(max_length=NODES_MAX)] | None = None
    num_pdb_violations: int = msgspec.field(default=0, name="NumPDBViolations")


class ObjectUid(msgspec.Struct):
    uid: Annotated[str, msgspec.Meta(max_length=128)] = ""


class PodUid(msgspec.Struct):
    """A victim sent whole (``nodeCacheCapable: false``): only its uid is read."""

    metadata: ObjectUid = msgspec.field(default_factory=ObjectUid)


class Victims(msgspec.Struct, rename="pascal"):
    pods: Annotated[list[PodUid], msgspec.Meta(max_length=NODES_MAX)] | None = None
    num_pdb_violations: int = msgspec.field(default=0, name="NumPDBViolations")


class ExtenderPreemptionArgs(msgspec.Struct, rename="pascal"):
    pod: PodManifest
    node_name_to_victims: Annotated[dict[str, Victims | None],
                                    msgspec.Meta(max_length=NODES_MAX)] | None = None
    node_name_to_meta_victims: Annotated[dict[str, MetaVictims | None],
                                         msgspec.Meta(max_length=NODES_MAX)] | None = None

    def offered(self) -> dict[str, tuple[list[str], int]]:
        """Each candidate node, with the uids of the victims kube-scheduler offers there
        and its count of the disruption budgets they violate: the one place
        NodeNameToMetaVictims-or-NodeNameToVictims is read."""
        if self.node_name_to_meta_victims is not None:
            return {node: ([p.uid for p in (victims.pods or ())], victims.num_pdb_violations)
                    if victims else ([], 0)
                    for node, victims in self.node_name_to_meta_victims.items()}
        return {node: ([p.metadata.uid for p in (victims.pods or ())],
                       victims.num_pdb_violations) if victims else ([], 0)
                for node, victims in (self.node_name_to_victims or {}).items()}


class ExtenderPreemptionResult(msgspec.Struct, rename="pascal"):
    node_name_to_meta_victims: dict[str, MetaVictims] = {}


_node_name = msgspec.json.Decoder(NamedNode)


def node_name(raw: msgspec.Raw) -> str:
    return _node_name.decode(raw).metadata.name


def check_pod_names(pod: PodManifest, where: str) -> None:
    """Raises ``InvalidName`` unless the pod's name (required) and namespace (when given)
    are names Kubernetes accepts: they become keys in the ledger and the pod store."""
    check_subdomain(f"{where}metadata.name", pod.metadata.name)
    if pod.metadata.namespace:
        check_label(f"{where}metadata.namespace", pod.metadata.namespace)


def check_extender_args(args: ExtenderArgs) -> None:
    """Raises ``InvalidName`` for a pod name or namespace Kubernetes would refuse, or
    for a node object in ``Nodes`` whose name does not decode."""
    check_pod_names(args.pod, "Pod.")
    if args.node_names is None and args.nodes is not None:
        for position, item in enumerate(args.nodes.items or ()):
            try:
                node_name(item)
            except msgspec.DecodeError as error:
                raise InvalidName(f"Nodes.items[{position}]: {error}") from None


def check_binding_args(args: ExtenderBindingArgs) -> None:
    """Raises ``InvalidName`` naming the field that Kubernetes would refuse."""
    check_subdomain("PodName", args.pod_name)
    check_label("PodNamespace", args.pod_namespace)
    check_subdomain("Node", args.node)


def check_preemption_args(args: ExtenderPreemptionArgs) -> None:
    """Raises ``InvalidName`` for a pod or candidate node name Kubernetes would refuse."""
    check_pod_names(args.pod, "Pod.")
    for node in args.offered():
        check_subdomain("NodeNameToMetaVictims key", node)
