"""The runs of one ``pyhami simulate``, one per policy chain, side by side in processes.

Each chain's replay is independent of the others' (its own fleet, the same trace), so on
Linux each runs in a process of its own, forked from this one: the trace, and the pods'
requests already read (``Parses``, filled here before forking), are shared by the fork,
not sent. Each child sends back through a pipe its progress, ``(done, total)`` as the
replay reports it, and at the end its ``PolicyRun`` or the exception it raised; this
process draws the bars as the messages come and raises, once every child has ended, the
exception of the first chain that failed, as running the chains one after the other
would have. With one chain, or where ``fork`` is not available, the chains run here, one
after the other. The runs are the same either way: a child runs ``simulate`` exactly as
this process would.
"""

from __future__ import annotations

import gc
import multiprocessing
import sys
from collections.abc import Callable, Sequence
from contextlib import suppress
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from common.core import Defaults, NodePolicy, PodRejected, parse_default_chain
from common.core.deviceconfig import DeviceConfig
from pyhami.simulate._engine import Parses, simulate
from pyhami.simulate._results import PolicyRun
from pyhami.simulate._trace import Trace

Progress = Callable[[int, int], None]


def simulate_all(trace: Trace, policies: Sequence[str], progress: Sequence[Progress | None],
                 *, node_policy: NodePolicy, inflate: float | None,
                 device: DeviceConfig, all_or_nothing: bool,
                 parallel: bool = True) -> list[PolicyRun]:
    """``simulate`` under each of ``policies``, ``progress[i]`` told of the ``i``-th;
    in forked processes where there are several and ``parallel``."""
    runs = PolicyRuns(trace, policies, node_policy=node_policy, inflate=inflate,
                      device=device, all_or_nothing=all_or_nothing, parallel=parallel)
    return runs.results(progress)


class PolicyRuns:
    """The runs of ``policies``, started (forked) on construction, before any progress
    display starts its thread (forking a process with threads may deadlock the child, and
    Python 3.12 warns of it); ``results`` collects them."""

    def __init__(self, trace: Trace, policies: Sequence[str], *, node_policy: NodePolicy,
                 inflate: float | None, device: DeviceConfig, all_or_nothing: bool,
                 parallel: bool = True) -> None:
        self.policies = list(policies)
        parses = Parses()
        if self.policies:
            # Read every distinct pod once here (a chain named wrongly raises here, before
            # any process starts), so that the children inherit the requests.
            defaults = Defaults(parse_default_chain(self.policies[0]), node_policy, device)
            for chain in self.policies[1:]:
                parse_default_chain(chain)
            for pod in trace.pods:
                with suppress(PodRejected):  # the run counts it
                    parses.signature(pod.manifest, defaults)

        def run(index: int, report: Progress | None) -> PolicyRun:
            return simulate(trace, policy=self.policies[index], node_policy=node_policy,
                            inflate=inflate, progress=report, device=device,
                            all_or_nothing=all_or_nothing, parses=parses)

        self.run = run
        self.pipes: dict[Connection, int] = {}
        self.children: list[BaseProcess] = []
        if not parallel or len(self.policies) < 2 \
                or "fork" not in multiprocessing.get_all_start_methods():
            return
        context = multiprocessing.get_context("fork")
        # The trace and the modules, frozen: the children's collections do not walk them
        # (nor touch their pages, which the fork shares until written). With the children
        # collecting their youngest objects every 20,000 allocations rather than 700 (as
        # the daemon does), the collector's share of a replay fell from about 5% to 1%.
        gc.freeze()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # a child flushes its copies on its way out: none left
        for index in range(len(self.policies)):
            receiving, sending = context.Pipe(duplex=False)
            child = context.Process(target=_child, args=(run, index, sending), daemon=True)
            child.start()
            sending.close()
            self.pipes[receiving] = index
            self.children.append(child)
        gc.unfreeze()  # here, the trace is collected as before once the runs are in

    def results(self, progress: Sequence[Progress | None]) -> list[PolicyRun]:
        """Each run, ``progress[i]`` told of the ``i``-th as it goes; the exception of the
        first run that failed is raised once all have ended."""
        if not self.children:
            return [self.run(index, report) for index, report in enumerate(progress)]
        pipes = self.pipes
        results: dict[int, PolicyRun] = {}
        errors: dict[int, BaseException] = {}
        try:
            while pipes:
                for ready in wait(list(pipes)):
                    assert isinstance(ready, Connection)
                    index = pipes[ready]
                    try:
                        kind, *payload = ready.recv()
                    except EOFError:  # ended without a word: killed
                        del pipes[ready]
                        errors.setdefault(index, RuntimeError(
                            f"the run of {self.policies[index]} ended unexpectedly"))
                        continue
                    if kind == "progress":
                        report = progress[index]
                        if report is not None:
                            report(*payload)
                        continue
                    del pipes[ready]
                    ready.close()
                    if kind == "run":
                        results[index] = payload[0]
                    else:
                        errors[index] = payload[0]
        finally:
            for child in self.children:
                if child.is_alive() and pipes:
                    child.terminate()
                child.join()
        if errors:
            raise errors[min(errors)]
        return [results[index] for index in range(len(self.policies))]


def _child(run: Callable[[int, Progress | None], PolicyRun], index: int,
           sending: Connection) -> None:
    """One chain's run, in its process: its progress and result (or error) sent back."""
    gc.set_threshold(20_000)

    def report(done: int, total: int) -> None:
        sending.send(("progress", done, total))

    message: tuple[Any, ...]
    try:
        message = ("run", run(index, report))
    except (KeyboardInterrupt, BrokenPipeError):
        return  # Ctrl-C, or the command gone: it says so itself, once
    except BaseException as error:
        message = ("error", error)
    try:
        sending.send(message)
    except OSError:
        return  # the command gone
    except Exception as error:  # the run or its error would not pickle
        sending.send(("error", RuntimeError(f"{type(error).__name__}: {error}")))
    sending.close()

