"""The kube-scheduler extender protocol (k8s.io/kube-scheduler/extender/v1).

The JSON keys are the Go field names, since those types carry no json tags.
"""

from __future__ import annotations

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
    node_names: Annotated[list[str], msgspec.Meta(max_length=NODES_MAX)] | None = None


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

    def offered(self) -> dict[str, list[str]]:
        """Each candidate node and the uids of the victims kube-scheduler offers there."""
        if self.node_name_to_meta_victims is not None:
            return {node: [p.uid for p in (victims.pods or ())] if victims else []
                    for node, victims in self.node_name_to_meta_victims.items()}
        return {node: [p.metadata.uid for p in (victims.pods or ())] if victims else []
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
