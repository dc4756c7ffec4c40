"""The node's monitor as the agent runs it: every ``monitor_interval`` (HAMi's 5 s) one
round in a worker thread (HAMi-core's cache files scanned, the priority feedback loop, NVML's
processes mapped to pods), the result kept for the scrape and for the daemon; the scrape
reads NVML's host figures then, within a bound.

Nothing here blocks the agent's loop: the rounds and the probe's calls run in threads, a
scrape waits at most ``scrape_timeout`` for the probe (the last figures are served
otherwise), and a round that fails is logged and counted, the last snapshot kept.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest

from agent.deviceplugin.source import AllocationSourceError
from agent.monitor.containers import CacheSettings, ContainerCaches, allocations_of
from agent.monitor.exporter import MonitorCollector, MonitorSnapshot
from agent.monitor.model import ContainerUsage, HostCard, HostProbe
from agent.monitor.processes import container_usage
from agent.usage import LatestUsage
from common.arguments import address, positive_seconds
from common.messaging import RateLimitedLog
from common.settings import setting
from common.wire import HoldingPod, Measured

logger = logging.getLogger(__name__)

MONITOR_INTERVAL_S = 5.0
"""HAMi's monitor looks at the containers and runs its feedback loop every 5 s."""


@dataclass(frozen=True)
class MonitorSettings:
    """The node monitor: where its metrics are served, how often it looks."""

    metrics: tuple[str, int] | None = setting(
        None, parse=address, metavar="HOST:PORT",
        help="serve HAMi's node monitor metrics on /metrics here, as HAMi's vGPUmonitor "
             "does on :9394 (default: not served)")
    monitor_interval: float = setting(
        MONITOR_INTERVAL_S, parse=positive_seconds, metavar="SECONDS",
        help="scan the containers' cache files and processes and run the priority feedback "
             "loop this often (default: {default}, HAMi's)")
    scrape_timeout: float = setting(
        2.0, parse=positive_seconds, metavar="SECONDS",
        help="a scrape waits at most this long for NVML's figures, else serves the last "
             "ones (default: {default})")
    caches: CacheSettings = field(default_factory=CacheSettings)
    """Where HAMi-core's cache files are and how much a round reads (their own flags)."""
    proc_root: Path = Path("/proc")
    """Where processes' cgroups are read (the host's /proc: the chart's agent pod shares
    the host's pid namespace)."""


class HoldingSource(Protocol):
    async def holding_pods(self, node: str) -> list[HoldingPod]:
        """The pods holding cards on ``node``, with their containers; raises
        ``AllocationSourceError``."""


class NodeMonitor:
    """Runs the rounds (``run``) and answers the scrape (``exposition``) and the daemon's
    usage (``snapshot``)."""

    def __init__(self, node: str, settings: MonitorSettings, probe: HostProbe,
                 pods: HoldingSource, *, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._node = node
        self._wall_clock = wall_clock
        self._usage = LatestUsage()
        self._settings = settings
        self._probe = probe
        self._caches = ContainerCaches(settings.caches)
        self._pods = pods
        self._log = RateLimitedLog(clock, logger)
        self._holding: dict[str, HoldingPod] = {}
        self._snapshot = MonitorSnapshot()
        self._host: list[HostCard] = []
        self._process_skips: Counter[str] = Counter()
        self._failures: Counter[str] = Counter()
        self.rounds = 0
        """Rounds completed since the start."""

    def measured(self) -> Measured | None:
        """The last round's measurement as the inventory carries it to the daemon (the
        agent's ``UsageSnapshot``)."""
        return self._usage.measured()

    def snapshot(self) -> MonitorSnapshot:
        """The last round's measurements, named by the pods then holding cards; what was
        skipped counted up to now."""
        skipped = Counter(self._snapshot.skipped)
        skipped.update(self._failures)
        return replace(self._snapshot, skipped=dict(skipped))

    @property
    def host_cards(self) -> list[HostCard]:
        """NVML's host figures as the last scrape or round read them."""
        return self._host

    async def run(self) -> None:
        """A round every ``monitor_interval``, until cancelled."""
        while True:
            await self.round()
            await asyncio.sleep(self._settings.monitor_interval)

    async def round(self) -> None:
        """Learn the pods holding cards (the last list is kept while the daemon is not
        heard), then scan, feed back and map the processes in a worker thread."""
        try:
            pods = await self._pods.holding_pods(self._node)
            self._holding = {pod.uid: pod for pod in pods}
        except AllocationSourceError as error:
            self._fail("pods_unknown", "the node's monitor keeps its last list of pods: %s",
                       error)
        holding = dict(self._holding)
        try:
            self._snapshot = await asyncio.to_thread(self._measure, holding)
            self._host = await asyncio.to_thread(self._probe.host_cards)
            self._usage.record(self._host, self._snapshot.containers, self._wall_clock())
        except Exception as error:
            self._fail("round_failed", "the node's monitor round failed, the last figures "
                       "kept: %s", error)
        self.rounds += 1

    async def exposition(self) -> bytes:
        """The scrape's text: NVML read now, within ``scrape_timeout``."""
        try:
            self._host = await asyncio.wait_for(asyncio.to_thread(self._probe.host_cards),
                                                self._settings.scrape_timeout)
        except TimeoutError:
            self._fail("scrape_timeout", "NVML did not answer the scrape within %gs: the last "
                       "figures served", self._settings.scrape_timeout)
        except Exception as error:
            self._fail("scrape_failed", "NVML failed during a scrape, the last figures "
                       "served: %s", error)
        registry = CollectorRegistry(auto_describe=False)
        host, snapshot = self._host, self.snapshot()
        registry.register(MonitorCollector(self._node, lambda: host, lambda: snapshot))
        # In a thread too: the text of a thousand containers takes the loop's time.
        return await asyncio.to_thread(generate_latest, registry)

    def _measure(self, holding: Mapping[str, HoldingPod]) -> MonitorSnapshot:
        """One round's work (a worker thread): the cache files first; NVML's processes for
        the pods no cache file speaks for (a node, or a pod, without HAMi-core)."""
        # Each container's file speaks for the cards the daemon says it was given only.
        scan = self._caches.scan(live_pods=set(holding) if holding else None,
                                 allocations=allocations_of(holding.values()))
        self._caches.feedback(scan)
        cached = scan.usage
        measured = container_usage(self._probe.gpu_processes(), list(holding.values()),
                                   self._settings.proc_root)
        self._process_skips.update(measured.skipped)
        covered = {usage.pod_uid for usage in cached}
        usages: Sequence[ContainerUsage] = [
            *cached, *(usage for usage in measured.usages if usage.pod_uid not in covered)]
        skipped = Counter({str(reason): count for reason, count in
                           self._caches.skipped.items()})
        skipped.update(self._process_skips)
        return MonitorSnapshot(containers=tuple(usages), pods=holding, skipped=dict(skipped),
                               cache_lies=self._caches.lies)

    def _fail(self, reason: str, message: str, *args: object) -> None:
        self._failures[reason] += 1
        self._log.warning(reason, message, *args)
