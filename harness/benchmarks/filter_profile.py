"""One /filter at N nodes inside the daemon, profiled: the extender verb as the HTTP layer
calls it (body in, answer bytes out), over a service that holds N simulated 8-card
inventories (as ``pyhami bench extender`` publishes them), each pod's booking confirmed
after its /filter as its /bind would.

    python harness/benchmarks/filter_profile.py [--nodes 5000] [--pods 2000] [--window 0]
                                        [--profile cprofile|sample|none]

``--window W`` sends a window of W names, from where the last one stopped, as
kube-scheduler does on large clusters (a different list each call), rather than every
name each time. Printed: the mean time of one /filter (no profiler, after a warm-up),
then with ``--profile cprofile`` the top functions by own time and by cumulative time,
or with ``sample`` the innermost frames seen by a thread sampling the loop every 0.5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import pstats
import sys
import threading
import time
from collections import Counter
from types import FrameType

import msgspec
import uvloop

from agent.report import Report
from agent.vendors.nvidia.simulated import profile_cards
from common.wire import encode, inventory_subject
from pyhami.bench.extender import PROFILES, pod
from pyhami.bench.load import filter_body
from pyhami.sandbox import DEFAULTS
from scheduler.cli import GC_YOUNG_THRESHOLD
from scheduler.service import SchedulerService, ServiceSettings
from scheduler.web.extender import extender_verbs
from tests.fakes.node_list import NodeList


async def service_with(nodes: int) -> tuple[SchedulerService, list[str]]:
    async def publish(_: object) -> None:
        pass

    names = [f"node-{i:05d}" for i in range(nodes)]
    service = SchedulerService(ServiceSettings(DEFAULTS), NodeList(set(names)), publish)
    service.shared.ready = True
    for i, name in enumerate(names):
        report = Report(name, "bench", 3600.0)
        report.observe(profile_cards(PROFILES[i % len(PROFILES)], name))
        message = report.message("start", time.time())
        await service.handlers.inventories.receive_inventory(inventory_subject(name),
                                                             encode(message))
    return service, names


def bodies(names: list[str], pods: int, window: int, start: int) -> list[bytes]:
    """Each pod's /filter body: every name, or a window moving on each call."""
    if not window:
        every = json.dumps(names).encode()
        return [filter_body(pod(f"p-{start + i}"), every) for i in range(pods)]
    out = []
    for i in range(pods):
        first = (i * window) % len(names)
        part = (names + names)[first:first + window]
        out.append(filter_body(pod(f"p-{start + i}"), json.dumps(part).encode()))
    return out


class Sampler:
    """Innermost frames of one thread, sampled every ``interval`` seconds."""

    def __init__(self, thread_id: int, interval: float = 0.0005) -> None:
        self.thread_id = thread_id
        self.interval = interval
        self.own: Counter[str] = Counter()
        self.within: Counter[str] = Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            frame: FrameType | None = sys._current_frames().get(self.thread_id)
            if frame is None:
                continue
            self.samples += 1
            self.own[describe(frame)] += 1
            seen = set()
            while frame is not None:
                seen.add(describe(frame))
                frame = frame.f_back
            self.within.update(seen)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def describe(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_filename.rsplit('/', 2)[-2:]}:{code.co_firstlineno}({code.co_name})"


class Collections:
    """Time the garbage collector spends, by generation (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds: Counter[int] = Counter()
        self.counts: Counter[int] = Counter()
        self._started = 0.0
        gc.callbacks.append(self._observe)

    def _observe(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._started
            self.counts[info["generation"]] += 1

    def reset(self) -> None:
        self.seconds.clear()
        self.counts.clear()


async def main(args: argparse.Namespace) -> None:
    # The daemon's collector settings (scheduler/cli.py): its start-up objects frozen
    # before the inventories come.
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    gc.freeze()
    collections = Collections()
    service, names = await service_with(args.nodes)
    verb = extender_verbs(service)["/filter"]

    cpu: list[float] = []

    async def run(batch: list[bytes]) -> float:
        started, cpu_started = time.perf_counter(), time.process_time()
        for body in batch:
            answer = await verb(body)
            # The work it leaves for after its answer (telemetry, events) runs now, as it
            # would between two requests in the daemon.
            await asyncio.sleep(0)
            result = msgspec.json.decode(answer.body)
            assert answer.status == 200 and result["NodeNames"], answer
            # The pod's key without decoding the body again: "Pod" comes first, its
            # metadata's name and namespace near its start.
            head = msgspec.json.decode(body[:body.index(b', "spec"')] + b"}}",
                                       type=dict[str, dict[str, object]])
            metadata = head["Pod"]["metadata"]
            assert isinstance(metadata, dict)
            key = f"{metadata['namespace']}/{metadata['name']}"
            held = service.state.cache.reservation(key)
            assert held is not None
            service.state.cache.confirm(key, held)  # as its /bind would
        cpu.append((time.process_time() - cpu_started) / len(batch))
        return (time.perf_counter() - started) / len(batch)

    await run(bodies(names, 200, args.window, 0))  # warm-up
    batch = bodies(names, args.pods, args.window, 1000)
    collections.reset()
    mean = await run(batch)
    print(f"{args.nodes} nodes, window {args.window or 'all'}: /filter {mean * 1e6:.0f} us "
          f"a call, {cpu[-1] * 1e6:.0f} us of CPU (verb, answer decoded, booking confirmed); "
          "the collector "
          + ", ".join(f"gen{g} {collections.counts[g]}x "
                      f"{collections.seconds[g] / len(batch) * 1e6:.0f} us"
                      for g in sorted(collections.counts)) + " a call")
    batch = bodies(names, args.pods, args.window, 100_000)
    if args.profile == "cprofile":
        profile = cProfile.Profile()
        profile.enable()
        await run(batch)
        profile.disable()
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top + 10)
    elif args.profile == "sample":
        # The sampler gets the GIL only when the loop lets it go: every 20 us, not 5 ms.
        sys.setswitchinterval(2e-5)
        with Sampler(threading.get_ident()) as sampler:
            await run(batch)
        print(f"{sampler.samples} samples; innermost frame:")
        for where, count in sampler.own.most_common(15):
            print(f"  {count / sampler.samples:6.1%}  {where}")
        print("within:")
        for where, count in sampler.within.most_common(30):
            print(f"  {count / sampler.samples:6.1%}  {where}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--window", type=int, default=0)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--profile", choices=("cprofile", "sample", "none"), default="none")
    uvloop.run(main(parser.parse_args()))
