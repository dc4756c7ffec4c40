"""Declared data: cards, nodes, the ledger's pod records and the cluster file.

These types are the one declaration of the shapes the core consumes; the agent's
wire messages and the daemon's state are converted into them.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
NumaId = Annotated[int, msgspec.Meta(ge=-1)]


class Device(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One physical GPU card as the scheduler sees it.

    ``links`` is ``None`` when the card's NVLink topology is unknown and ``{}``
    when the card has no NVLink peers.
    """

    uuid: str
    index: NonNegative
    type: str
    memory: NonNegative
    cores: NonNegative = 100
    count: NonNegative = 10
    numa: NumaId = -1
    health: bool = True
    links: dict[str, NonNegative] | None = None
    processes: NonNegative = 0


class Node(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    devices: list[Device]
    annotations: dict[str, str] = {}


class PodRecord(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A pod that already holds cards, known from its allocation annotation.

    ``init_containers`` says how many leading containers of the annotation are
    init containers, whose cards count at their peak rather than summed.
    """

    namespace: str
    name: str
    node: str
    annotations: dict[str, str] = {}
    init_containers: NonNegative = 0


class ClusterFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    nodes: list[Node]
    pods: list[PodRecord] = []
