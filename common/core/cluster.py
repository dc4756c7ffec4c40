"""The cluster file that ``pyhami decide``, ``explain`` and ``simulate`` read: its shape,
and the fleet built from it (nodes, the ledger of pods holding cards, ResourceQuotas)."""

from __future__ import annotations

import msgspec

from common.core.annotations import ALLOCATED_ANNOTATION, AnnotationError, decode_allocation
from common.core.deviceconfig import DeviceConfig
from common.core.errors import InvalidInput
from common.core.fleet import Fleet
from common.core.ledger import Allocation
from common.core.mig import MIG_ALLOCATIONS_ANNOTATION
from common.core.model import Node, PodRecord, repeated_card
from common.core.names import shown
from common.core.pod import DEFAULT_DEVICE, QuotaSubject
from common.core.quota import QuotaRejected, ResourceQuotaManifest, parse_quota

QUOTA_KIND = "ResourceQuota"


class QuotaEntry(ResourceQuotaManifest):
    """A ResourceQuota as ``kubectl get resourcequota NAME -o json`` prints it. Of the
    fields pyhami does not read (status, resourceVersion, ...) only ``kind`` is checked:
    another kind of object pasted here would otherwise read as a quota of nothing."""

    kind: str = QUOTA_KIND


class QuotaList(msgspec.Struct):
    """``kubectl get resourcequota -A -o json``: a List whose ``items`` are the quotas."""

    items: list[QuotaEntry] = []


class ClusterFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    nodes: list[Node]
    pods: list[PodRecord] = []
    quotas: list[QuotaEntry] | QuotaList = []
    """ResourceQuota manifests, or the List kubectl prints."""


class ClusterFileError(InvalidInput):
    """The cluster description is inconsistent; the message names the entry."""


def fleet_from_cluster(cluster: ClusterFile, device: DeviceConfig = DEFAULT_DEVICE) -> Fleet:
    """The fleet a cluster description holds; its quotas read under ``device``'s resource
    names and ``memoryFactor``."""
    fleet = Fleet()
    for position, node in enumerate(cluster.nodes):
        where = f"nodes[{position}] ({node.name!r})"
        if fleet.node(node.name) is not None:
            raise ClusterFileError(f"{where}: node name is listed twice")
        repeated = repeated_card(node.cards)
        if repeated is not None:
            raise ClusterFileError(f"{where}: {repeated}")
        fleet.upsert_node(node)
    for position, pod in enumerate(cluster.pods):
        _book(fleet, pod, f"pods[{position}] ({pod.namespace}/{pod.name})")
    # After the pods: a quota set counts the pods it charges, so the order of the
    # file's lists does not matter.
    _set_quotas(fleet, cluster.quotas, device)
    return fleet


def _book(fleet: Fleet, pod: PodRecord, where: str) -> None:
    key = f"{pod.namespace}/{pod.name}"
    if fleet.allocation(key) is not None:
        raise ClusterFileError(f"{where}: pod is listed twice")
    host = fleet.node(pod.node)
    if host is None:
        raise ClusterFileError(f"{where}: node {pod.node!r} is not among the cluster's nodes")
    try:
        containers = decode_allocation(pod.annotations.get(ALLOCATED_ANNOTATION, ""),
                                       pod.annotations.get(MIG_ALLOCATIONS_ANNOTATION, ""))
    except AnnotationError as error:
        raise ClusterFileError(f"{where}: {error}") from None
    known = {d.uuid for d in host.cards}
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
    subject = QuotaSubject(namespace=pod.namespace, priority_class=pod.priority_class_name,
                           terminating=pod.active_deadline_seconds is not None,
                           best_effort=pod.best_effort)
    fleet.allocate(key, Allocation(pod.node, containers, pod.init_containers, subject))


def _set_quotas(fleet: Fleet, quotas: list[QuotaEntry] | QuotaList,
                device: DeviceConfig) -> None:
    entries, prefix = (quotas, "quotas") if isinstance(quotas, list) else (
        quotas.items, "quotas.items")
    first_at: dict[str, str] = {}
    for position, entry in enumerate(entries):
        where = f"{prefix}[{position}]"
        if entry.kind != QUOTA_KIND:
            raise ClusterFileError(f"{where}: kind is {shown(entry.kind)}, expected "
                                   f"{QUOTA_KIND!r}")
        try:
            quota = parse_quota(entry, device)
        except QuotaRejected as error:
            raise ClusterFileError(f"{where}: {error}") from None
        if quota.key in first_at:
            raise ClusterFileError(f"{where}: ResourceQuota {quota.key} is listed twice "
                                   f"(first at {first_at[quota.key]})")
        first_at[quota.key] = where
        fleet.quotas.set_quota(quota)
