"""ResourceQuota in standalone mode, the issue's lab through the pod API: a real
nats-server, a simulated four-T4 node, the daemon, its pending loop, every step over HTTP
(``/api/resourcequotas`` and ``/api/pods``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from common.core.quota import QuotaStanding
from pyhami.sandbox import RunningDaemon, standalone_config
from scheduler.service import SchedulerService
from tests.harness import Lab, eventually, filtering_failed, refusal_sentence
from tests.quotas import NAMESPACE, QUOTAS, call, quota, sentence, standings, team_pod

PROMPT_S = 2.0
"""The issue's bound on binding a waiting pod once its namespace's quota has room."""


async def store_quota(lab: Lab, manifest: dict[str, Any], status: int = 201) -> None:
    """POST a new quota; PUT (``status`` 200) one that exists."""
    if status == 201:
        answer = await call(lab.pods.session, "POST", f"{lab.daemon.url}{QUOTAS}",
                            json_body=manifest)
    else:
        metadata = manifest["metadata"]
        answer = await call(lab.pods.session, "PUT", f"{lab.daemon.url}{QUOTAS}/"
                            f"{metadata['namespace']}/{metadata['name']}", json_body=manifest)
    assert answer[0] == status, answer


def service_of(daemon: RunningDaemon) -> SchedulerService:
    assert daemon.service is not None
    return daemon.service


async def refusal_of(lab: Lab, name: str) -> str:
    """The sentence of the FilteringFailed summary of a pod left waiting (it stays
    unbound), HAMi's per-reason Event before it naming the quota's reason."""
    pod = await lab.pods.pending_with(name, "FilteringFailed", NAMESPACE)
    assert pod["node"] is None
    assert filtering_failed(pod)[0] == "1 nodes ResourceQuotaNotFit(gpu-node-1)"
    return refusal_sentence(pod)


async def test_a_pod_over_the_quota_waits_with_the_sentence_and_binds_once_room_is_freed(
        lab: Lab) -> None:
    await store_quota(lab, quota("gpu-quota", memory=4000))
    await lab.pods.submit(team_pod("first", 3000))
    await lab.pods.placed("first", NAMESPACE)
    await lab.pods.submit(team_pod("second", 3000))

    expected = sentence(6000, 4000, "gpu-quota", 3000)
    assert (await refusal_of(lab, "second")).startswith(expected)
    async with lab.pods.session.post(f"{lab.daemon.url}/explain",
                                     json=team_pod("second", 3000)) as response:
        assert response.status == 200
        assert expected in await response.text()
    assert standings(lab.daemon) == [
        QuotaStanding(NAMESPACE, "gpu-quota", "nvidia.com/gpumem", 3000, 4000)]

    await lab.pods.delete("first", NAMESPACE)
    started = time.monotonic()
    await lab.pods.placed("second", NAMESPACE, timeout=PROMPT_S)
    assert time.monotonic() - started < PROMPT_S


async def test_twenty_pods_submitted_at_once_under_5000_mib_exactly_five_bind(lab: Lab) -> None:
    await store_quota(lab, quota("gpu-quota", memory=5000))
    names = [f"burst-{i}" for i in range(20)]
    await asyncio.gather(*(lab.pods.submit(team_pod(name, 1000)) for name in names))

    async def all_decided() -> bool:
        pods = [p for p in await lab.pods.pods() if p["namespace"] == NAMESPACE]
        return sum(p["node"] is not None for p in pods) == 5 and all(
            p["node"] is not None or p["events"] for p in pods)

    await eventually(all_decided, "five pods bound and the others refused")
    await asyncio.sleep(1.5)  # three rounds of the pending loop: still five
    pods = [p for p in await lab.pods.pods() if p["namespace"] == NAMESPACE]
    assert sum(p["node"] is not None for p in pods) == 5
    refused = [p for p in pods if p["node"] is None]
    assert len(refused) == 15
    for pod in refused:
        assert filtering_failed(pod)[0] == "1 nodes ResourceQuotaNotFit(gpu-node-1)"
        assert refusal_sentence(pod).startswith(sentence(6000, 5000, "gpu-quota", 1000))
    assert standings(lab.daemon) == [
        QuotaStanding(NAMESPACE, "gpu-quota", "nvidia.com/gpumem", 5000, 5000)]


async def test_a_restarted_daemon_rebuilds_the_usage_and_the_quota(lab: Lab) -> None:
    await store_quota(lab, quota("gpu-quota", memory=4000))
    await lab.pods.submit(team_pod("held", 3000))
    await lab.pods.placed("held", NAMESPACE)

    await lab.restart_daemon()

    assert standings(lab.daemon) == [
        QuotaStanding(NAMESPACE, "gpu-quota", "nvidia.com/gpumem", 3000, 4000)]
    await lab.pods.submit(team_pod("too-much", 2000))
    assert (await refusal_of(lab, "too-much")).startswith(
        sentence(5000, 4000, "gpu-quota", 2000))
    await lab.pods.submit(team_pod("fits", 1000))
    await lab.pods.placed("fits", NAMESPACE)


async def test_of_two_quotas_in_a_namespace_the_smaller_wins(lab: Lab) -> None:
    await store_quota(lab, quota("large", memory=10000))
    await store_quota(lab, quota("small", memory=2500))
    await lab.pods.submit(team_pod("a", 2000))
    await lab.pods.placed("a", NAMESPACE)
    await lab.pods.submit(team_pod("b", 1000))
    assert (await refusal_of(lab, "b")).startswith(sentence(3000, 2500, "small", 1000))

    async with lab.pods.session.delete(
            f"{lab.daemon.url}/api/resourcequotas/{NAMESPACE}/small") as response:
        assert response.status == 204
    await lab.pods.placed("b", NAMESPACE)  # only the larger one is left


async def test_a_priority_class_scoped_quota_charges_only_that_class(lab: Lab) -> None:
    selector = {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In",
                                      "values": ["high"]}]}
    await store_quota(lab, quota("high-only", memory=2000, scopeSelector=selector))
    await lab.pods.submit(team_pod("high-1", 2000, "high"))
    await lab.pods.placed("high-1", NAMESPACE)
    await lab.pods.submit(team_pod("high-2", 1000, "high"))
    assert (await refusal_of(lab, "high-2")).startswith(
        sentence(3000, 2000, "high-only", 1000))
    await lab.pods.submit(team_pod("low", 3000, "low"))
    await lab.pods.placed("low", NAMESPACE)
    await lab.pods.submit(team_pod("unclassed", 3000))
    await lab.pods.placed("unclassed", NAMESPACE)
    assert standings(lab.daemon) == [
        QuotaStanding(NAMESPACE, "high-only", "nvidia.com/gpumem", 2000, 2000)]


async def test_raising_the_quota_with_a_put_lets_a_waiting_pod_bind(lab: Lab) -> None:
    await store_quota(lab, quota("gpu-quota", memory=2000))
    await lab.pods.submit(team_pod("a", 2000))
    await lab.pods.placed("a", NAMESPACE)
    await lab.pods.submit(team_pod("waiting", 1000))
    assert (await refusal_of(lab, "waiting")).startswith(
        sentence(3000, 2000, "gpu-quota", 1000))

    await store_quota(lab, quota("gpu-quota", memory=3000), status=200)
    started = time.monotonic()
    await lab.pods.placed("waiting", NAMESPACE, timeout=PROMPT_S)
    assert time.monotonic() - started < PROMPT_S


async def test_a_cores_quota_refuses_by_percent(lab: Lab) -> None:
    await store_quota(lab, quota("cores", cores=50))
    pod = team_pod("half", 1000)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] = 50
    await lab.pods.submit(pod)
    await lab.pods.placed("half", NAMESPACE)
    pod = team_pod("more", 1000)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] = 10
    await lab.pods.submit(pod)
    assert (await refusal_of(lab, "more")).startswith(
        f"{NAMESPACE} would use 60 of 50 nvidia.com/gpucores under ResourceQuota cores "
        "(asked 10)")


async def test_a_standby_applies_the_quotas_through_the_watch_and_enforces_them_on_taking_over(
        lab: Lab) -> None:
    standby = await RunningDaemon(standalone_config(lab.nats.url)).start()
    try:
        await store_quota(lab, quota("gpu-quota", memory=4000))

        def limit_on_standby() -> int | None:
            found = service_of(standby).state.fleet.quotas.quota(NAMESPACE, "gpu-quota")
            return None if found is None else found.memory

        async def standby_has(limit: int | None) -> bool:
            return limit_on_standby() == limit

        await eventually(lambda: standby_has(4000), "the standby to apply the quota")
        status, text = await call(lab.pods.session, "POST", f"{standby.url}{QUOTAS}",
                                  json_body=quota("elsewhere", memory=1))
        assert (status, text.startswith("standby: ")) == (503, True)  # it writes nothing
        await store_quota(lab, quota("gpu-quota", memory=3000), status=200)
        await eventually(lambda: standby_has(3000), "the standby to apply the new limit")
        await lab.pods.submit(team_pod("held", 3000))
        await lab.pods.placed("held", NAMESPACE)

        await lab.daemon.stop()  # the lease passes to the standby, which reads the pods
        lab.daemon, lab.pods.url = standby, standby.url

        async def leading() -> bool:
            async with lab.pods.session.get(f"{standby.url}/readyz") as response:
                return response.status == 200

        await eventually(leading, "the standby to take over")
        await lab.pods.submit(team_pod("over", 1000))
        assert (await refusal_of(lab, "over")).startswith(
            sentence(4000, 3000, "gpu-quota", 1000))
        async with lab.pods.session.delete(
                f"{standby.url}/api/resourcequotas/{NAMESPACE}/gpu-quota") as response:
            assert response.status == 204
        await lab.pods.placed("over", NAMESPACE)
    finally:
        if lab.daemon is not standby:
            await standby.stop()
