"""What ``pyhami simulate`` keeps between pods and shares between chains changes no run:
requests read once per distinct manifest (``Parses``) and reused across the chains give
the same runs as every pod read afresh (``Parses(reuse=False)``), and the chains replayed
in forked processes (``simulate_all``) the same as one after the other, on the openb-format
example trace and on random traces."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.core import Card, Node, NodePolicy, PodManifest
from common.core.deviceconfig import DeviceConfig
from common.core.pod import (
    GPU_POLICY_ANNOTATION,
    Container,
    ObjectMeta,
    PodSpec,
    ResourceRequirements,
)
from pyhami.cli import main
from pyhami.simulate._engine import Parses, simulate
from pyhami.simulate._formats import load_trace
from pyhami.simulate._parallel import simulate_all
from pyhami.simulate._results import PolicyRun
from pyhami.simulate._trace import SimPod, Trace
from tests.simulate_example import write_example

CHAINS = ("spread", "binpack", "mutex,binpack")


def afresh(trace: Trace, chain: str, node_policy: NodePolicy,
           inflate: float | None) -> PolicyRun:
    """The reference: every pod read by ``parse_pod`` on its own."""
    return simulate(trace, policy=chain, node_policy=node_policy, inflate=inflate,
                    parses=Parses(reuse=False))


def shared(trace: Trace, node_policy: NodePolicy, inflate: float | None) -> list[PolicyRun]:
    """Every chain with one ``Parses``, one after the other, as the command runs them
    where it cannot fork."""
    parses = Parses()
    return [simulate(trace, policy=chain, node_policy=node_policy, inflate=inflate,
                     parses=parses) for chain in CHAINS]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    nodes, pods = write_example(tmp_path_factory.mktemp("example"))
    return load_trace(nodes, pods, DeviceConfig())


@pytest.mark.parametrize("node_policy", list(NodePolicy))
@pytest.mark.parametrize("inflate", [None, 2.0])
def test_the_example_runs_alike_shared_or_afresh(example: Trace, node_policy: NodePolicy,
                                                 inflate: float | None) -> None:
    reference = [afresh(example, chain, node_policy, inflate) for chain in CHAINS]
    assert shared(example, node_policy, inflate) == reference
    assert simulate_all(example, CHAINS, [None] * len(CHAINS), node_policy=node_policy,
                        inflate=inflate, device=DeviceConfig(),
                        all_or_nothing=True) == reference


def test_processes_report_progress_and_end_complete(example: Trace) -> None:
    seen: dict[int, list[tuple[int, int]]] = {i: [] for i in range(len(CHAINS))}
    runs = simulate_all(example, CHAINS,
                        [lambda done, total, i=i: seen[i].append((done, total))
                         for i in range(len(CHAINS))],
                        node_policy=NodePolicy.BINPACK, inflate=None,
                        device=DeviceConfig(), all_or_nothing=True)
    for i, run in enumerate(runs):
        assert seen[i][-1] == (run.pods, run.pods)
        assert [done for done, _ in seen[i]] == sorted(done for done, _ in seen[i])


def test_an_error_in_a_process_is_raised_here(example: Trace) -> None:
    empty = Trace(nodes=[], pods=example.pods)
    with pytest.raises(Exception) as forked:
        simulate_all(empty, CHAINS, [None] * 3, node_policy=NodePolicy.BINPACK,
                     inflate=1.0, device=DeviceConfig(), all_or_nothing=True)
    with pytest.raises(Exception) as here:
        simulate_all(empty, CHAINS, [None] * 3, node_policy=NodePolicy.BINPACK,
                     inflate=1.0, device=DeviceConfig(), all_or_nothing=True,
                     parallel=False)
    assert (type(forked.value), str(forked.value)) == (type(here.value), str(here.value))


SHAPES = st.sampled_from([(1, None), (1, 30), (1, 50), (2, None), (1, 100), (4, None)])


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    nodes = [Node(name=f"n{n}", cards=[
        Card(uuid=f"n{n}-GPU-{i}", index=i, type=draw(st.sampled_from(["NVIDIA-T4", "A100"])),
             memory=1000) for i in range(draw(st.integers(1, 4)))])
        for n in range(draw(st.integers(1, 5)))]
    pods = []
    arrival = 0.0
    for number in range(draw(st.integers(1, 30))):
        gpus, percent = draw(SHAPES)
        limits: dict[str, str | int | float] = {"nvidia.com/gpu": gpus,
                                                "nvidia.com/gpucores": percent or 100}
        if percent is not None:
            limits["nvidia.com/gpumem-percentage"] = percent
        chain = draw(st.sampled_from([None, None, "spread", "binpack", "mutex"]))
        annotations = None if chain is None else {GPU_POLICY_ANNOTATION: chain}
        manifest = PodManifest(
            metadata=ObjectMeta(name=f"p{number}", annotations=annotations,
                                namespace=draw(st.sampled_from([None, "team"]))),
            spec=PodSpec(containers=[Container(
                name="main", resources=ResourceRequirements(limits=limits))]))
        arrival += draw(st.sampled_from([0.0, 1.0, 5.0]))
        duration = draw(st.sampled_from([None, 2.0, 10.0]))
        pods.append(SimPod(manifest, arrival, duration))
    return Trace(nodes=nodes, pods=pods)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), node_policy=st.sampled_from(list(NodePolicy)),
       inflate=st.sampled_from([None, 1.5]))
def test_random_traces_run_alike_shared_or_afresh(trace: Trace, node_policy: NodePolicy,
                                                  inflate: float | None) -> None:
    reference = [afresh(trace, chain, node_policy, inflate) for chain in CHAINS]
    assert shared(trace, node_policy, inflate) == reference


def test_the_openb_trace_runs_alike_shared_or_afresh() -> None:
    """On the public openb trace, in the folder ``$PYHAMI_OPENB_DIR`` names (it is not
    shipped: public data, fetched where it is measured; docs/performance.md)."""
    folder = Path(os.environ.get("PYHAMI_OPENB_DIR", "/nonexistent"))
    nodes = folder / "openb_node_list_gpu_node.csv"
    pods = folder / "openb_pod_list_default.csv"
    if not (nodes.is_file() and pods.is_file()):
        pytest.skip("PYHAMI_OPENB_DIR names no folder holding the openb trace")
    trace = load_trace(nodes, pods, DeviceConfig())
    reference = [afresh(trace, chain, NodePolicy.BINPACK, 1.0) for chain in CHAINS]
    assert simulate_all(trace, CHAINS, [None] * 3, node_policy=NodePolicy.BINPACK,
                        inflate=1.0, device=DeviceConfig(), all_or_nothing=True) == reference


@pytest.mark.parametrize("chains", [["spread"], ["spread", "binpack"]])
def test_a_run_that_fails_is_refused_in_one_line(tmp_path: Path, chains: list[str],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Alone (here) or forked: a cluster without a card cannot be inflated."""
    _, pods = write_example(tmp_path)
    nodes = tmp_path / "no-gpu.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1000,0,\n")
    policies = [flag for chain in chains for flag in ("--policy", chain)]
    code = main(["simulate", "--cluster", str(nodes), "--workload", str(pods), *policies,
                 "--inflate", "1"])
    assert (code, capsys.readouterr().err) == (
        2, "pyhami simulate: inflate: the cluster has no GPU card\n")
