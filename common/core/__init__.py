"""The pure decision core: data in, decision out; no I/O, no clock."""

from common.core.annotations import AnnotationError, CardGrant, decode_devices, encode_devices
from common.core.cluster import ClusterFile, ClusterFileError, fleet_from_cluster
from common.core.decide import Decision, ExplainRow, PlacedCard, decide, rejected
from common.core.fleet import Fleet
from common.core.ledger import Allocation, Usage
from common.core.model import Card, Node, PodRecord
from common.core.pod import Defaults, PodManifest, PodRequest, parse_pod
from common.core.policy import (
    Chain,
    NodePolicy,
    PodRejected,
    parse_chain,
    parse_default_chain,
)
from common.core.preemption import Preemption, Tenant, best_preemption, preemption_on_node
from common.core.reasons import FailedNode, NodeReasons, NodeRefusal
from common.core.render import decision_document

__all__ = [
    "Allocation",
    "AnnotationError",
    "Card",
    "CardGrant",
    "Chain",
    "ClusterFile",
    "ClusterFileError",
    "Decision",
    "Defaults",
    "ExplainRow",
    "FailedNode",
    "Fleet",
    "Node",
    "NodePolicy",
    "NodeReasons",
    "NodeRefusal",
    "PlacedCard",
    "PodManifest",
    "PodRecord",
    "PodRejected",
    "PodRequest",
    "Preemption",
    "Tenant",
    "Usage",
    "best_preemption",
    "decide",
    "decision_document",
    "decode_devices",
    "encode_devices",
    "fleet_from_cluster",
    "parse_chain",
    "parse_default_chain",
    "parse_pod",
    "preemption_on_node",
    "rejected",
]
