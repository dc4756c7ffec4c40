"""Preemption for GPU pods on a live standalone daemon (docs/preemption.md): the lab's
four-T4 node, pods pinned to cards, priorities in the pods' specs (no admission sets
them here). The daemon preempts by itself for a pod /filter refused, and answers the
extender's preempt verb."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from agent.vendors.nvidia.simulated import uuid_for
from tests.harness import Lab

pytestmark = pytest.mark.slow  # each test waits out the preemption grace on the lab

NODE = "gpu-node-1"
LOW, HIGH = 100, 1000
# The daemon waits PREEMPT_GRACE_S (1 s) for kube-scheduler's preempt verb, then acts;
# a pod that may not preempt is watched this long for any eviction.
QUIET_S = 3.0


def pod(name: str, *, priority: int, card: int | None = None, policy: str | None = None,
        memory: int = 1000, never: bool = False) -> dict[str, Any]:
    annotations = {}
    if card is not None:
        annotations["nvidia.com/use-gpuuuid"] = uuid_for(NODE, card)
    if policy is not None:
        annotations["hami.io/gpu-scheduler-policy"] = policy
    spec: dict[str, Any] = {
        "priority": priority,
        "containers": [{"name": "cuda", "image": "ubuntu:22.04", "resources": {
            "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory}}}]}
    if never:
        spec["preemptionPolicy"] = "Never"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": spec}


TENANTS = {0: 3, 1: 3, 2: 3, 3: 2}
"""Low-priority tenants per card: card 3 has the fewest."""


async def fill_the_node(lab: Lab, priorities: dict[int, int] | None = None,
                        counts: dict[int, int] | None = None) -> dict[str, int]:
    """Pods on every card as ``counts`` (TENANTS by default) says; their names and cards."""
    placed = {}
    for card, count in (counts or TENANTS).items():
        for number in range(count):
            name = f"low-{card}-{number}"
            priority = (priorities or {}).get(card, LOW)
            allocated = await lab.pods.submit_and_place(pod(name, priority=priority, card=card))
            assert allocated.startswith(uuid_for(NODE, card))
            placed[name] = card
    return placed


async def names(lab: Lab) -> set[str]:
    return {p["name"] for p in await lab.pods.pods()}


async def test_a_high_priority_mutex_pod_evicts_exactly_the_tenants_of_one_card(
        lab: Lab) -> None:
    tenants = await fill_the_node(lab)
    await lab.pods.submit(pod("urgent", priority=HIGH, policy="mutex"))
    placed = await lab.pods.placed("urgent")
    victims = {name for name, card in tenants.items() if card == 3}
    assert await names(lab) == (tenants.keys() - victims) | {"urgent"}
    assert placed["annotations"]["hami.io/vgpu-devices-allocated"].startswith(
        uuid_for(NODE, 3))
    preempting = [e for e in placed["events"] if e["reason"] == "Preempting"]
    assert len(preempting) == 1
    assert all(victim in preempting[0]["message"] for victim in victims)
    assert lab.daemon.service is not None
    exposition = lab.daemon.service.metrics.exposition().decode()
    assert 'pyhami_preemptions_total{by="daemon",result="evicted"} 1.0' in exposition
    assert "pyhami_preemption_victims_total 2.0" in exposition


async def test_refusals_of_the_preemptor_within_the_grace_evict_once(
        lab: Lab, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """kube-scheduler may filter a pod again before the grace is over: the refusals lead to
    one preemption, not one each (seen once on the real control plane: two evictions
    16 ms apart, card 3's tenants and card 0's). The budgets are read as slowly as from an
    API server, so that the preemptions, were there several, would overlap."""
    service = lab.daemon.service
    assert service is not None

    async def budgets_over_the_network() -> list[object]:
        await asyncio.sleep(0.3)
        return []

    monkeypatch.setattr(service.shared.cluster, "disruption_budgets", budgets_over_the_network)
    tenants = await fill_the_node(lab)
    urgent = pod("urgent", priority=HIGH, policy="mutex")
    await lab.pods.submit(urgent)
    for _ in range(3):
        async with http.post(f"{lab.daemon.url}/filter",
                             json={"Pod": urgent, "NodeNames": [NODE]}) as answer:
            assert answer.status == 200
    placed = await lab.pods.placed("urgent")
    await asyncio.sleep(QUIET_S)  # room for a second eviction, were there one
    victims = {name for name, card in tenants.items() if card == 3}
    assert await names(lab) == (tenants.keys() - victims) | {"urgent"}
    assert len([e for e in placed["events"] if e["reason"] == "Preempting"]) == 1


async def test_of_cards_with_as_few_tenants_the_lowest_priorities_go(lab: Lab) -> None:
    # Cards 1 and 3 have two tenants each; card 1's have the lower priority.
    tenants = await fill_the_node(lab, priorities={0: 50, 1: 50, 2: 50, 3: 500},
                                  counts={0: 3, 1: 2, 2: 3, 3: 2})
    await lab.pods.submit(pod("urgent", priority=HIGH, policy="mutex"))
    placed = await lab.pods.placed("urgent")
    assert placed["annotations"]["hami.io/vgpu-devices-allocated"].startswith(
        uuid_for(NODE, 1))
    assert await names(lab) == {n for n, card in tenants.items() if card != 1} | {"urgent"}


async def expect_no_eviction(lab: Lab, name: str, expected: set[str]) -> None:
    await asyncio.sleep(QUIET_S)
    assert await names(lab) == expected
    waiting = await lab.pods.get(name)
    assert waiting["node"] is None
    assert not [e for e in waiting["events"] if e["reason"] == "Preempting"]


async def test_a_pod_of_equal_priority_preempts_nobody(lab: Lab) -> None:
    tenants = await fill_the_node(lab)
    await lab.pods.submit(pod("peer", priority=LOW, policy="mutex"))
    await expect_no_eviction(lab, "peer", set(tenants) | {"peer"})


async def test_a_request_no_victims_can_satisfy_preempts_nobody(lab: Lab) -> None:
    tenants = await fill_the_node(lab)
    # More memory than a T4 has: emptying any card would not make it fit.
    await lab.pods.submit(pod("too-big", priority=HIGH, memory=20000))
    await expect_no_eviction(lab, "too-big", set(tenants) | {"too-big"})


async def test_a_pod_that_never_preempts_waits(lab: Lab) -> None:
    tenants = await fill_the_node(lab)
    await lab.pods.submit(pod("patient", priority=HIGH, policy="mutex", never=True))
    await expect_no_eviction(lab, "patient", set(tenants) | {"patient"})


async def preempt(lab: Lab, session: aiohttp.ClientSession, preemptor: dict[str, Any],
                  offered: list[str]) -> dict[str, Any]:
    body = {"Pod": preemptor, "NodeNameToMetaVictims": {
        NODE: {"Pods": [{"UID": uid} for uid in offered], "NumPDBViolations": 0}}}
    async with session.post(f"{lab.daemon.url}/preempt", json=body) as answer:
        assert answer.status == 200, await answer.text()
        result: dict[str, Any] = await answer.json()
        return result


async def test_the_preempt_verb_names_victims_only_where_they_free_the_cards(
        lab: Lab, http: aiohttp.ClientSession) -> None:
    tenants = await fill_the_node(lab)
    uids = {p["name"]: p["uid"] for p in await lab.pods.pods()}
    card_3 = sorted(uids[name] for name, card in tenants.items() if card == 3)
    # Never sent to /filter, so the daemon does not preempt for it by itself.
    urgent = pod("urgent", priority=HIGH, policy="mutex")
    # Nothing offered (a node only pyhami rejects): pyhami names the victims.
    named = await preempt(lab, http, urgent, [])
    assert sorted(p["UID"] for p in named["NodeNameToMetaVictims"][NODE]["Pods"]) == card_3
    assert named["NodeNameToMetaVictims"][NODE]["NumPDBViolations"] == 0
    # Offered victims that free no whole card: the node is left out.
    assert await preempt(lab, http, urgent, [uids["low-0-0"]]) == {
        "NodeNameToMetaVictims": {}}
    # Offered victims that do: answered as offered.
    both = await preempt(lab, http, urgent, card_3)
    assert sorted(p["UID"] for p in both["NodeNameToMetaVictims"][NODE]["Pods"]) == card_3
    # A pod of equal priority may take nobody's cards.
    assert await preempt(lab, http, pod("peer", priority=LOW, policy="mutex"), []) == {
        "NodeNameToMetaVictims": {}}
    assert await names(lab) == set(tenants)
