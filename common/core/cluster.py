"""Building a fleet and its ledger from a cluster description (``pyhami decide``)."""

from __future__ import annotations

from common.core.annotations import ALLOCATED_ANNOTATION, AnnotationError, decode_devices
from common.core.errors import InvalidInput
from common.core.fleet import Fleet
from common.core.ledger import Allocation
from common.core.model import ClusterFile, repeated_card


class ClusterFileError(InvalidInput):
    """The cluster description is inconsistent; the message names the entry."""


def fleet_from_cluster(cluster: ClusterFile) -> Fleet:
    fleet = Fleet()
    for position, node in enumerate(cluster.nodes):
        where = f"nodes[{position}] ({node.name!r})"
        if fleet.node(node.name) is not None:
            raise ClusterFileError(f"{where}: node name is listed twice")
        repeated = repeated_card(node.devices)
        if repeated is not None:
            raise ClusterFileError(f"{where}: {repeated}")
        fleet.upsert_node(node)
    for position, pod in enumerate(cluster.pods):
        where = f"pods[{position}] ({pod.namespace}/{pod.name})"
        key = f"{pod.namespace}/{pod.name}"
        if fleet.allocation(key) is not None:
            raise ClusterFileError(f"{where}: pod is listed twice")
        host = fleet.node(pod.node)
        if host is None:
            raise ClusterFileError(f"{where}: node {pod.node!r} is not among the cluster's nodes")
        try:
            containers = decode_devices(pod.annotations.get(ALLOCATED_ANNOTATION, ""))
        except AnnotationError as error:
            raise ClusterFileError(f"{where}: {error}") from None
        known = {d.uuid for d in host.devices}
        for grants in containers:
            for grant in grants:
                if grant.uuid not in known:
                    raise ClusterFileError(
                        f"{where}: {ALLOCATED_ANNOTATION} names card {grant.uuid!r}, "
                        f"which node {pod.node!r} does not have"
                    )
        if pod.init_containers > len(containers):
            raise ClusterFileError(
                f"{where}: init_containers is {pod.init_containers} but the annotation "
                f"holds {len(containers)} containers"
            )
        fleet.allocate(key, Allocation(pod.node, containers, pod.init_containers))
    return fleet
