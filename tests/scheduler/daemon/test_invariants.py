"""The invariant checker itself: silent on a healthy daemon, loud on each kind of breakage."""

from __future__ import annotations

import copy
from typing import Any

import aiohttp

from common.core.pod import QuotaSubject
from common.core.quota import Quota, Scope, ScopeRule
from pyhami.demo import lab_pod
from tests.harness import Lab
from tests.invariants import Snapshot, decode_allocated, quota_violations, snapshot, violations


def multi_container_pod(name: str) -> dict[str, Any]:
    pod = lab_pod(name)
    pod["spec"]["initContainers"] = [{"name": "init", "resources": {"limits": {
        "nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}}}]
    pod["spec"]["containers"] += [
        {"name": "sidecar", "resources": {"limits": {"cpu": 1}}},
        {"name": "pair", "resources": {"limits": {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 2000,
                                                  "nvidia.com/gpucores": 30}}}]
    return pod


async def healthy_snapshot(lab: Lab, http: aiohttp.ClientSession) -> Snapshot:
    await lab.pods.submit_and_place(lab_pod("one"))
    await lab.pods.submit_and_place(multi_container_pod("many"))
    await lab.pods.submit_and_place(lab_pod("binpack", {"hami.io/gpu-scheduler-policy":
                                                        "binpack"}))
    await lab.pods.submit(lab_pod("too-big", limits={"nvidia.com/gpu": 1,
                                                     "nvidia.com/gpumem": 99999}))
    await lab.pods.pending_with("too-big", "FilteringFailed")
    return await snapshot(http, lab.daemon.url)


async def test_a_healthy_daemon_breaks_no_invariant(lab: Lab, http: aiohttp.ClientSession) -> None:
    taken = await healthy_snapshot(lab, http)
    assert violations(taken) == []
    assert set(taken.ledger["bound"]) == {"default/one", "default/many", "default/binpack"}
    assert len(taken.ledger["cards"]) == 4
    await lab.pods.delete("many")
    assert violations(await snapshot(http, lab.daemon.url)) == []


async def test_each_kind_of_breakage_is_reported(lab: Lab, http: aiohttp.ClientSession) -> None:
    healthy = await healthy_snapshot(lab, http)

    def broken(change: Any) -> list[str]:
        ledger, pods = copy.deepcopy(healthy.ledger), copy.deepcopy(healthy.pods)
        change(ledger, pods)
        return violations(Snapshot(ledger, pods))

    def drop_entry(ledger: dict[str, Any], _: Any) -> None:
        del ledger["pods"]["default/one"]

    assert any("ledger holds nothing" in v for v in broken(drop_entry))

    def over_memory(ledger: dict[str, Any], _: Any) -> None:
        entry = ledger["pods"]["default/one"]
        entry["containers"][0][0]["memory"] = 20000
        card = next(c for c in ledger["cards"]
                    if c["uuid"] == entry["containers"][0][0]["uuid"])
        card["usedmem"] += 19000

    found = broken(over_memory)
    assert any("over its memory" in v for v in found)
    assert any("the store says" in v for v in found)

    def drifted_usage(ledger: dict[str, Any], _: Any) -> None:
        ledger["cards"][0]["tenants"] += 1

    assert any("the daemon counts" in v for v in broken(drifted_usage))

    def stale_reservation(ledger: dict[str, Any], _: Any) -> None:
        ledger["reservations"]["default/ghost"] = {"node": "gpu-node-1", "age_s": 3600.0,
                                                   "expires_in_s": -3540.0}

    assert any("reservation of default/ghost" in v for v in broken(stale_reservation))

    def reserved_while_bound(ledger: dict[str, Any], _: Any) -> None:
        ledger["reservations"]["default/one"] = {"node": "gpu-node-1", "age_s": 1.0,
                                                 "expires_in_s": 59.0}

    assert any("yet holds a reservation" in v for v in broken(reserved_while_bound))

    def same_card_twice(ledger: dict[str, Any], _: Any) -> None:
        ledger["cards"].append(dict(ledger["cards"][0]))

    assert any("reported 2 times" in v for v in broken(same_card_twice))

    def ghost_binding(_: Any, pods: list[dict[str, Any]]) -> None:
        waiting = next(p for p in pods if p["name"] == "too-big")
        waiting["node"] = "gpu-node-1"
        waiting["annotations"]["hami.io/vgpu-devices-allocated"] = "GPU-x,NVIDIA,1,0:;"

    assert any("default/too-big" in v for v in broken(ghost_binding))


def test_the_annotation_is_decoded_per_container() -> None:
    assert decode_allocated("GPU-a,NVIDIA,1000,30:GPU-b,NVIDIA,1000,30:;;GPU-c,NVIDIA,5,0:;") == [
        [("GPU-a", 1000, 30), ("GPU-b", 1000, 30)], [], [("GPU-c", 5, 0)]]


async def test_the_quota_invariant_sums_what_the_daemon_charges_and_names_a_quota_exceeded(
        lab: Lab, http: aiohttp.ClientSession) -> None:
    ledger = (await healthy_snapshot(lab, http)).ledger
    assert lab.daemon.service is not None
    held = lab.daemon.service.state.fleet.quotas.namespace_used()["default"].memory
    high = (ScopeRule(Scope.PRIORITY_CLASS, "In", frozenset({"high"})),)
    quotas = [Quota("default", "at-limit", memory=held), Quota("team-a", "elsewhere", memory=0),
              Quota("default", "high-only", memory=999, rules=high)]
    assert quota_violations(ledger, quotas, {}) == []
    assert quota_violations(ledger, [Quota("default", "below", memory=held - 1)], {}) == [
        f"ResourceQuota default/below: its pods hold {held} of GPU memory, over its limit of "
        f"{held - 1}"]
    subjects = {"default/one": QuotaSubject("default", priority_class="high")}
    assert quota_violations(ledger, quotas, subjects) == [
        "ResourceQuota default/high-only: its pods hold 1000 of GPU memory, over its limit of "
        "999"]
