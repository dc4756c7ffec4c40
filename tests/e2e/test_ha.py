"""Failover in Kubernetes mode on the real control plane: two scheduler pods' worth of
processes, the leading pair killed mid-burst.

The session's pair (kube-scheduler and its daemon, both named by this machine's host name)
holds the Lease pyhami-system/pyhami-scheduler. A second pair is started beside it: a daemon
with ``--identity sched-b`` and a kube-scheduler with the shipped configuration pointing at
that daemon, running under the host name sched-b (a UTS namespace of its own), so it takes
the Lease as ``sched-b_<uuid>``, as a second scheduler pod would. Lab pods are created in a
burst; once a few are bound the leading pair is killed with SIGKILL. Every pod must end
bound by the survivors, no card over its memory, cores or slots, and the surviving daemon's
ledger equal to the pods' annotations. The time from the kill to the next bound pod and to
the Lease naming sched-b is printed and appended to ``ha-failover.jsonl`` in the suite's
log folder.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest

from harness.controlplane import ApiError, wait_for
from pyhami.bench.loopback import http_get
from pyhami.natsserver import free_port
from tests.e2e.controlplane import DAEMON, KUBE_SCHEDULER, ControlPlane, DaemonPorts
from tests.e2e.pods import ALLOCATED, PODS, POLICY, lab_pod
from tests.harness import metric_sample
from tests.invariants import agreement_violations, capacity_violations, reservation_violations

STANDBY = "sched-b"
STANDBY_DAEMON = "pyhami-scheduler-b"
STANDBY_KUBE_SCHEDULER = "kube-scheduler-b"
BURST = 24
# The kill comes once this many pods are bound, and at the latest before the last
# LEFT_AFTER_KILL pods are created: those are certainly left to the second pair.
BOUND_BEFORE_KILL = 3
LEFT_AFTER_KILL = 8
CREATE_PACE_S = 0.04
POLL_S = 0.05
# The second kube-scheduler waits out the lease (15 s by default) before it schedules.
ALL_BOUND_S = 120.0
# A Binding sent by the killed daemon may still land just after the kill: pods bound this
# soon after it are counted as the first pair's. The second kube-scheduler cannot bind
# anything so soon: it needs the Lease first.
IN_FLIGHT_S = 1.0
SETTLE_S = 10.0
RESULTS = "ha-failover.jsonl"


@dataclass
class Observed:
    """What a poller saw every ``POLL_S``: when each pod was first bound, and each holder of
    the Lease from when it was first seen."""

    bound_at: dict[str, float] = field(default_factory=dict)
    holders: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bound_count(self) -> int:
        with self.lock:
            return len(self.bound_at)

    def holder_since(self, prefix: str) -> float | None:
        with self.lock:
            return next((at for at, holder in self.holders if holder.startswith(prefix)), None)


def observe(plane: ControlPlane, observed: Observed, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            holder = plane.lease_holder()
            pods = plane.api.get(PODS)["items"]
        except (ApiError, OSError, ValueError):
            pass  # a slow answer under load: the next poll sees the same and more
        else:
            now = time.monotonic()
            with observed.lock:
                if not observed.holders or observed.holders[-1][1] != holder:
                    observed.holders.append((now, holder))
                for pod in pods:
                    if pod["spec"].get("nodeName"):
                        observed.bound_at.setdefault(pod["metadata"]["name"], now)
        stop.wait(POLL_S)


def burst_pod(index: int) -> dict[str, Any]:
    """Lab pods of three sizes, spread and binpack: 24 of them use 36 GiB, 240 cores and 24
    slots of the node's four 15 GiB cards (100 cores, 10 slots each), so all fit."""
    policy = "binpack" if index % 2 else "spread"
    pod = lab_pod(f"burst-{index:02d}", {POLICY: policy})
    pod["spec"]["containers"][0]["resources"]["limits"].update({
        "nvidia.com/gpumem": str(1000 * (1 + index % 2)),
        "nvidia.com/gpucores": str(10 * (index % 3))})
    return pod


def lease_time(lease: dict[str, Any], stamp: str) -> float:
    """A MicroTime of the Lease's spec (``renewTime``, ``acquireTime``) as a Unix time."""
    return datetime.fromisoformat(lease["spec"][stamp]).timestamp()


def role(plane: ControlPlane, ports: DaemonPorts) -> str | None:
    leadership = plane.statusz(ports).get("leadership") or {}
    found: str | None = leadership.get("role")
    return found


def leader_metric(ports: DaemonPorts) -> float | None:
    status, body = http_get(f"{ports.metrics_url}/metrics")
    assert status == 200, f"{ports.metrics_url}/metrics answered {status}"
    return metric_sample(body.decode(), "pyhami_leader")


def wait_role(plane: ControlPlane, ports: DaemonPorts, name: str, expected: str) -> None:
    try:
        wait_for(lambda: role(plane, ports) == expected,
                 f"{name}'s /statusz to say leadership.role == {expected!r}",
                 watch=plane.all_processes())
    except AssertionError as error:
        leadership = plane.statusz(ports).get("leadership")
        raise AssertionError(f"{error}\nits leadership now: {leadership!r}") from None


def as_store_pods(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pods from the API server in the shape tests/invariants.py reads."""
    return [{"namespace": pod["metadata"].get("namespace"), "name": pod["metadata"]["name"],
             "node": pod["spec"].get("nodeName"), "phase": pod["status"].get("phase"),
             "annotations": pod["metadata"].get("annotations") or {}} for pod in pods]


def settled_violations(plane: ControlPlane, ports: DaemonPorts) -> list[str]:
    """The broken invariants of the daemon's ledger against every pod of the cluster, once
    a watch event in flight has landed: checked until none or ``SETTLE_S``."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        ledger = plane.ledgerz(ports)
        pods = as_store_pods(plane.api.get("/api/v1/pods")["items"])
        found = (capacity_violations(ledger) + reservation_violations(ledger)
                 + agreement_violations(ledger, pods))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.fixture
def second_pair(control_plane: ControlPlane, clean_namespace: None) -> Iterator[DaemonPorts]:
    """The second scheduler pod's daemon and kube-scheduler, standing by. Afterwards, even
    after a failure, they are stopped and the session's pair runs again holding the Lease
    (then clean_namespace deletes the pods)."""
    plane = control_plane
    ports = DaemonPorts.free()
    try:
        plane.launch_daemon(STANDBY_DAEMON, ports, "--identity", STANDBY)
        plane.wait_daemon_ready(STANDBY_DAEMON, ports)
        plane.launch_kube_scheduler(STANDBY_KUBE_SCHEDULER,
                                    plane.kube_scheduler_config(ports.url), free_port(),
                                    hostname=STANDBY)
        yield ports
    finally:
        # kube-scheduler releases the Lease on SIGTERM (ReleaseOnCancel): the session's
        # restarted kube-scheduler takes it at once.
        for name in (STANDBY_KUBE_SCHEDULER, STANDBY_DAEMON):
            if name in plane.processes:
                plane.processes[name].stop()
        if not plane.processes[DAEMON].running:
            plane.start_daemon()
        if not plane.processes[KUBE_SCHEDULER].running:
            plane.start_kube_scheduler()
        wait_role(plane, plane.daemon_ports, DAEMON, "leader")


def test_leader_pair_killed_mid_burst_the_standby_pair_binds_every_pod(
        control_plane: ControlPlane, second_pair: DaemonPorts) -> None:
    plane, standby = control_plane, second_pair
    leader_prefix = f"{socket.gethostname()}_"

    # Before: the session's pair leads, the second stands by.
    assert plane.lease_holder().startswith(leader_prefix), (
        f"the second kube-scheduler took the lease: {plane.lease_holder()!r}")
    wait_role(plane, plane.daemon_ports, DAEMON, "leader")
    wait_role(plane, standby, STANDBY_DAEMON, "standby")
    assert plane.statusz(standby)["leadership"]["identity"] == STANDBY
    assert leader_metric(plane.daemon_ports) == 1
    assert leader_metric(standby) == 0

    observed, stop = Observed(), threading.Event()
    poller = threading.Thread(target=observe, args=(plane, observed, stop), daemon=True)
    poller.start()
    killed_at = killed_wall = last_renewal = 0.0
    bound_at_kill: set[str] = set()
    try:
        for index in range(BURST):
            plane.api.create(PODS, burst_pod(index))
            if not killed_at and (observed.bound_count() >= BOUND_BEFORE_KILL
                                  or index == BURST - LEFT_AFTER_KILL):
                wait_for(lambda: observed.bound_count() >= BOUND_BEFORE_KILL,
                         f"{BOUND_BEFORE_KILL} pods of the burst to be bound",
                         watch=plane.all_processes())
                last_renewal = lease_time(plane.lease(), "renewTime")
                killed_at, killed_wall = time.monotonic(), time.time()
                plane.processes[KUBE_SCHEDULER].kill()
                plane.processes[DAEMON].kill()
            time.sleep(CREATE_PACE_S)
        time.sleep(max(0.0, killed_at + IN_FLIGHT_S - time.monotonic()))
        with observed.lock:
            bound_at_kill = set(observed.bound_at)
        left = BURST - len(bound_at_kill)
        assert left > 0, "every pod was bound before the kill: nothing was left to fail over"

        names = {f"burst-{index:02d}" for index in range(BURST)}
        wait_for(lambda: observed.bound_count() == BURST and set(observed.bound_at) == names,
                 f"all {BURST} pods to be bound by the second pair "
                 f"({observed.bound_count()} are)", ALL_BOUND_S, interval=0.5,
                 watch=plane.all_processes())
        wait_for(lambda: observed.holder_since(f"{STANDBY}_"),
                 f"the lease to name {STANDBY}_...", interval=0.1)
    finally:
        stop.set()
        poller.join()

    # After: the survivors booked every pod once, within every card.
    pods = plane.api.get(PODS)["items"]
    for pod in pods:
        annotations = pod["metadata"].get("annotations") or {}
        assert ALLOCATED in annotations, (
            f"pod {pod['metadata']['name']} is bound without {ALLOCATED}: {annotations}")
    violations = settled_violations(plane, standby)
    assert not violations, "the surviving daemon's ledger:\n" + "\n".join(violations)
    assert plane.lease_holder().startswith(f"{STANDBY}_"), plane.lease_holder()
    wait_role(plane, standby, STANDBY_DAEMON, "leader")
    assert leader_metric(standby) == 1

    with observed.lock:
        after = sorted(at for name, at in observed.bound_at.items()
                       if name not in bound_at_kill)
    lease_at = observed.holder_since(f"{STANDBY}_")
    assert lease_at is not None
    lease = plane.lease()
    figures = {
        "pods": BURST, "bound_before_kill": len(bound_at_kill),
        "lease_duration_s": lease["spec"].get("leaseDurationSeconds"),
        # From the Lease's own time stamps (microseconds, this machine's clock).
        "renewed_before_kill_s": round(killed_wall - last_renewal, 3),
        "kill_to_lease_acquired_s": round(lease_time(lease, "acquireTime") - killed_wall, 3),
        # From the poller, within POLL_S.
        "kill_to_lease_s": round(lease_at - killed_at, 2),
        "kill_to_next_bound_s": round(after[0] - killed_at, 2),
        "kill_to_all_bound_s": round(after[-1] - killed_at, 2),
        "poll_s": POLL_S,
    }
    print(f"failover: {json.dumps(figures)}")
    with (plane.logs / RESULTS).open("a") as results:
        results.write(json.dumps(figures) + "\n")
