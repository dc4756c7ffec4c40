"""``pyhami demo``: the article's lab, replayed through the decision core.

One node with four Tesla T4 cards; every pod asks one card with a 1000 MiB slice.
Each step prints where the pods land and, for the composed chain, the selection
path: every card with its tenants, its score, the filter that removed it, and its rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from common.core import (
    Decision,
    Defaults,
    Device,
    Fleet,
    Node,
    PodManifest,
    PodRejected,
    decide,
    parse_pod,
    rejected,
)
from common.core.pod import Container, ObjectMeta, PodSpec, ResourceRequirements
from pyhami.options import Subcommands, add_policy_defaults, defaults_from

LAB_NODE = "gpu-node-1"


def register(commands: Subcommands) -> None:
    parser = commands.add_parser("demo", help="replay the article's lab on four Tesla T4 cards")
    add_policy_defaults(parser)
    parser.set_defaults(handler=lambda args: run(defaults_from(args)))


def lab_node() -> Node:
    return Node(name=LAB_NODE, devices=[
        Device(uuid=f"GPU-{i}", index=i, type="NVIDIA-Tesla T4", memory=15360, numa=0,
               links={})
        for i in range(4)
    ])


def lab_pod(name: str, annotations: dict[str, str] | None = None) -> PodManifest:
    limits: dict[str, str | int | float] = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}
    return PodManifest(
        metadata=ObjectMeta(name=name, namespace="default", annotations=annotations or {}),
        spec=PodSpec(containers=[Container(name="app",
                                           resources=ResourceRequirements(limits=limits))]),
    )


@dataclass
class Lab:
    """The lab's one-node cluster and the pods placed on it."""

    defaults: Defaults
    console: Console
    fleet: Fleet

    def decide(self, pod: PodManifest, explain: bool = False) -> Decision:
        try:
            request = parse_pod(pod, self.defaults)
        except PodRejected as error:
            return rejected(pod.key, str(error))
        return decide(self.fleet, request, explain=explain)

    def submit(self, pod: PodManifest, explain: bool = False) -> Decision:
        decision = self.decide(pod, explain)
        if decision.allocation is not None:
            self.fleet.allocate(decision.pod, decision.allocation)
        self.report(pod, decision)
        return decision

    def report(self, pod: PodManifest, decision: Decision) -> None:
        policy = (pod.metadata.annotations or {}).get("hami.io/gpu-scheduler-policy", "default")
        if decision.node is not None:
            cards = ", ".join(f"GPU {c.index}" for cards in decision.cards for c in cards)
            self.console.print(f"  {pod.metadata.name:<14} [dim]{policy:<14}[/] -> "
                               f"[green]{cards}[/] on {decision.node}")
        else:
            why = decision.reason or "; ".join(
                f"{node}: {reason}" for node, reason in (decision.failed_nodes or {}).items())
            self.console.print(f"  {pod.metadata.name:<14} [dim]{policy:<14}[/] -> "
                               f"[yellow]Pending[/] ({why})")
        if decision.explain is not None:
            self.console.print(selection_path(decision))

    def clear(self) -> None:
        for key in list(self.fleet.allocations()):
            self.fleet.release(key)


def selection_path(decision: Decision) -> Table:
    table = Table(title=f"selection path for {decision.pod}", title_justify="left")
    for column in ("card", "tenants", "score", "filtered by", "rank", ""):
        table.add_column(column)
    for row in decision.explain or ():
        table.add_row(
            f"GPU {row.index}", str(row.used), f"{row.score:.6f}",
            row.filtered_by or "-", "-" if row.rank is None else str(row.rank),
            "[bold green]<- chosen[/]" if row.chosen else "",
        )
    return table


def run(defaults: Defaults, console: Console | None = None) -> int:
    out = console or Console()
    fleet = Fleet()
    fleet.upsert_node(lab_node())
    lab = Lab(defaults, out, fleet)
    binpack = {"hami.io/gpu-scheduler-policy": "binpack"}

    out.rule("1. default spread: four pods without a policy")
    for i in range(4):
        lab.submit(lab_pod(f"spread-{i}"))
    lab.clear()

    out.rule("2. binpack stacking: three pods annotated binpack")
    for i in range(3):
        lab.submit(lab_pod(f"binpack-{i}", binpack))
    lab.clear()

    out.rule("3. mutex blocking and release")
    for i in range(4):
        lab.submit(lab_pod(f"tenant-{i}"))
    mutex = lab_pod("mutex", {"hami.io/gpu-scheduler-policy": "mutex"})
    lab.submit(mutex)
    out.print("  delete tenant-1 (on GPU 1); the pending mutex pod is tried again")
    fleet.release("default/tenant-1")
    lab.submit(mutex)
    lab.clear()

    out.rule("4. composed mutex,binpack")
    lab.submit(lab_pod("binpack-a", binpack))
    lab.submit(lab_pod("binpack-b", binpack))
    lab.submit(lab_pod("pinned", {"nvidia.com/use-gpuuuid": "GPU-1"}))
    lab.submit(lab_pod("mutex-binpack", {"hami.io/gpu-scheduler-policy": "mutex,binpack"}),
               explain=True)
    out.print("  the same pod with plain binpack (decided, not placed):")
    lab.report(lab_pod("plain-binpack", binpack),
               lab.decide(lab_pod("plain-binpack", binpack), explain=True))
    return 0


