"""Pod groups on the standalone daemon, through its pod API: a group's members get their
cards together, or none of them holds any (issue 30).

The lab: one simulated node of four T4 cards. A member asks for one card with 12,000 MiB,
so a card holds one member and the node one 4-member group.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from common.core.groups import (
    COSCHEDULING_GROUP_LABEL,
    KUEUE_COUNT_ANNOTATION,
    KUEUE_GROUP_LABEL,
)
from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsServer
from pyhami.sandbox import DEFAULTS, RunningDaemon, SimulatedAgent, standalone_config
from scheduler.service import verbs
from scheduler.service.shared import ServiceSettings
from tests.harness import (
    GROUP_MEMBER_LIMITS,
    PodClient,
    eventually,
    filtering_failed,
    metric_sample,
)
from tests.harness import group_member as member


class Stand:
    def __init__(self, daemon: RunningDaemon, pods: PodClient) -> None:
        self.daemon = daemon
        self.pods = pods

    async def bound(self, *names: str) -> list[str]:
        found = {pod["name"]: pod for pod in await self.pods.pods()}
        return [name for name in names if found[name]["node"] is not None]

    async def ledger(self) -> dict[str, Any]:
        async with self.pods.session.get(f"{self.daemon.url}/ledgerz") as answer:
            ledger: dict[str, Any] = await answer.json()
            return ledger


async def stand_up(server: LocalNatsServer, http: aiohttp.ClientSession, *,
                   drive_pending: bool = True, group_ttl: float = 60.0,
                   group_patience: float = 60.0) -> tuple[Stand, SimulatedAgent]:
    node = SimulatedAgent.start("gpu-node-1", server.url)
    daemon = await RunningDaemon(standalone_config(
        server.url, drive_pending=drive_pending,
        service=ServiceSettings(DEFAULTS, group_ttl=group_ttl,
                                group_patience=group_patience))).start()
    return Stand(daemon, PodClient(http, daemon.url)), node


@pytest.fixture
async def stand(jetstream_server: LocalNatsServer,
                http: aiohttp.ClientSession) -> AsyncIterator[Stand]:
    running, node = await stand_up(jetstream_server, http)
    yield running
    await running.daemon.stop()
    await node.halt()


A = [f"a-{i}" for i in range(4)]
B = [f"b-{i}" for i in range(4)]


async def test_of_two_groups_that_fit_one_at_a_time_one_binds_whole_the_other_none(
        stand: Stand) -> None:
    for a, b in zip(A, B, strict=True):  # interleaved, as two jobs starting together
        await stand.pods.submit(member(a, "train-a"))
        await stand.pods.submit(member(b, "train-b"))
    for name in A:
        await stand.pods.placed(name)
    assert await stand.bound(*B) == []
    waiting = await stand.pods.pending_with("b-3", "FilteringFailed")
    messages = filtering_failed(waiting)
    assert any(m.startswith("no available node, 1 nodes do not meet: group train-b: 0 of 4 "
                            "members fit; b-") for m in messages), messages
    assert len((await stand.ledger())["reservations"]) == 0  # train-b holds nothing
    for name in A:
        await stand.pods.delete(name)
    for name in B:
        await stand.pods.placed(name)


async def test_without_groups_the_same_pods_are_placed_partly(stand: Stand) -> None:
    """What the groups prevent: the first two of each job take the four cards."""
    for a, b in zip(A, B, strict=True):
        await stand.pods.submit(member(a, None))
        await stand.pods.submit(member(b, None))

    async def four_bound() -> bool:
        return len(await stand.bound(*A, *B)) == 4

    await eventually(four_bound, "four pods bound")
    assert await stand.bound(*A, *B) == ["a-0", "a-1", "b-0", "b-1"]


async def test_members_waiting_for_the_rest_hold_no_cards_and_say_so(stand: Stand) -> None:
    await stand.pods.submit(member("lost-0", "train-a", namespace="other"))
    await stand.pods.pending_with("lost-0", "FilteringFailed", namespace="other")
    await stand.pods.submit(member("a-0", "train-a"))
    await stand.pods.submit(member("a-1", "train-a"))
    pod = await stand.pods.pending_with("a-1", "FilteringFailed")
    # The group's reason is the pod's, not a node's: HAMi's summary alone.
    assert filtering_failed(pod) == [
        "no available node, 1 nodes do not meet: "
        "group train-a: waiting for its members: 2 of 4 exist in namespace default (1 pods of "
        "a group train-a are in other namespaces: a group's members share one namespace); "
        "none is given cards before all are"]
    ledger = await stand.ledger()
    assert ledger["reservations"] == {} and ledger["pods"] == {}


async def test_a_group_placed_together_is_released_whole_when_its_binds_do_not_come(
        jetstream_server: LocalNatsServer, http: aiohttp.ClientSession) -> None:
    """Nobody drives the pods here: the group is placed by one member's /filter, and no
    bind follows within the group's time."""
    running, node = await stand_up(jetstream_server, http, drive_pending=False, group_ttl=1.0)
    try:
        for name in A[:3]:
            await running.pods.submit(member(name, "train-a", count=3))
        manifest = member("a-0", "train-a", count=3)

        async def placed_together() -> bool:  # once the daemon has seen all three
            async with http.post(f"{running.daemon.url}/filter",
                                 json={"Pod": manifest, "NodeNames": ["gpu-node-1"]}) as answer:
                return bool((await answer.json())["NodeNames"] == ["gpu-node-1"])

        await eventually(placed_together, "the group placed by one member's /filter")
        assert sorted((await running.ledger())["reservations"]) == [
            f"default/{name}" for name in A[:3]]

        async def released() -> bool:
            return (await running.ledger())["reservations"] == {}

        await eventually(released, "the group's reservations released", timeout=10)
        service = running.daemon.service
        assert service is not None
        assert service.metrics.registry.get_sample_value(
            "pyhami_reservations_released_total", {"cause": "group"}) == 3
    finally:
        await running.daemon.stop()
        await node.halt()


@pytest.mark.parametrize(("patience", "single_bound"), [
    pytest.param(0.5, False, id="past-its-patience-the-group-goes-first"),
    pytest.param(600.0, True, id="within-its-patience-a-single-pod-takes-the-card"),
])
async def test_a_group_waiting_past_its_patience_goes_ahead_of_smaller_pods(
        jetstream_server: LocalNatsServer, http: aiohttp.ClientSession, patience: float,
        single_bound: bool) -> None:
    """A single pod holds one of the four cards, so the 4-member group does not fit. A
    second single pod arriving after the group's patience may not take a card the group
    could use (it would fit one member fewer); within the patience it may. Once the first
    pod ends, the group starts whole in the first case."""
    running, node = await stand_up(jetstream_server, http, group_patience=patience)
    try:
        await running.pods.submit(member("single-0", None))
        await running.pods.placed("single-0")
        for name in A:
            await running.pods.submit(member(name, "train-a"))
        await running.pods.pending_with("a-3", "FilteringFailed")
        await asyncio.sleep(patience if patience < 1 else 0)
        await running.pods.submit(member("single-1", None))
        if single_bound:
            await running.pods.placed("single-1")
            return
        pod = await running.pods.pending_with("single-1", "FilteringFailed")
        # Its nodes withheld for the group ahead: HAMi's per-reason Event names them.
        by_reason, summary = filtering_failed(pod)
        assert by_reason == "1 nodes GroupAhead(gpu-node-1)"
        assert summary.startswith("no available node, 1 nodes do not meet: waiting behind "
                                  "group default/train-a, whole and not fitting: for at most ")
        await running.pods.delete("single-0")
        for name in A:
            await running.pods.placed(name)
        assert await running.bound("single-1") == []
    finally:
        await running.daemon.stop()
        await node.halt()


@pytest.mark.parametrize(("labels", "annotations", "refusal"), [
    pytest.param({KUEUE_GROUP_LABEL: "g"}, {KUEUE_COUNT_ANNOTATION: "0"},
                 f"metadata.annotations[{KUEUE_COUNT_ANNOTATION}]: '0' is not a member count",
                 id="count-0"),
    pytest.param({KUEUE_GROUP_LABEL: "g"}, {KUEUE_COUNT_ANNOTATION: "2000"},
                 f"metadata.annotations[{KUEUE_COUNT_ANNOTATION}]: '2000' is not a member "
                 "count", id="count-above-the-bound"),
    pytest.param({KUEUE_GROUP_LABEL: "not a label"}, {KUEUE_COUNT_ANNOTATION: "4"},
                 f"metadata.labels[{KUEUE_GROUP_LABEL}]: 'not a label' is not a valid label "
                 "value", id="name-not-a-label-value"),
    pytest.param({COSCHEDULING_GROUP_LABEL: "g"}, {},
                 f"metadata.labels[{COSCHEDULING_GROUP_LABEL}] names a PodGroup object, which "
                 "standalone pyhami does not keep", id="podgroup-object"),
    pytest.param({KUEUE_GROUP_LABEL: "g"}, {KUEUE_COUNT_ANNOTATION: "3"},
                 f"metadata.annotations[{KUEUE_COUNT_ANNOTATION}]: group 'g' counts 4 members "
                 "on pod first, not 3: its members must agree", id="counts-disagree"),
])
async def test_a_bad_group_declaration_is_a_400_naming_the_field(
        stand: Stand, labels: dict[str, str], annotations: dict[str, str],
        refusal: str) -> None:
    await stand.pods.submit(member("first", "g", count=4))
    pod = lab_pod("second", dict(annotations), limits=dict(GROUP_MEMBER_LIMITS))
    pod["metadata"]["labels"] = labels
    async with stand.pods.session.post(f"{stand.daemon.url}/api/pods", json=pod) as answer:
        text = await answer.text()
    assert answer.status == 400
    assert text.startswith(f"request body: {refusal}"), text


async def test_fifty_groups_on_room_for_ten_start_ten_at_a_time_whole(
        jetstream_server: LocalNatsServer, http: aiohttp.ClientSession) -> None:
    """Five nodes of four cards hold ten 2-member groups: of fifty queued, ten start at
    once (not one or two), each whole; when they end, the next ten start."""
    nodes = [SimulatedAgent.start(f"gpu-node-{n}", jetstream_server.url) for n in range(1, 6)]
    daemon = await RunningDaemon(standalone_config(jetstream_server.url)).start()
    pods = PodClient(http, daemon.url)
    groups = {f"job-{g:02d}": [f"job-{g:02d}-{m}" for m in range(2)] for g in range(50)}
    try:
        for group, members in groups.items():
            for name in members:
                await pods.submit(member(name, group, count=2))

        async def started() -> dict[str, int]:
            bound = {pod["name"] for pod in await pods.pods() if pod["node"] is not None}
            return {group: sum(name in bound for name in members)
                    for group, members in groups.items()}

        async def wave_started() -> bool:
            counts = await started()
            return sum(1 for count in counts.values() if count == 2) == 10

        await eventually(wave_started, "ten groups started", timeout=60)
        first = await started()
        assert sorted(set(first.values())) == [0, 2]  # whole, or not at all
        for group, count in first.items():
            if count:
                for name in groups[group]:
                    await pods.delete(name)

        async def next_wave() -> bool:
            counts = await started()
            return sum(1 for group, count in counts.items()
                       if count == 2 and not first[group]) == 10

        await eventually(next_wave, "the next ten groups started", timeout=60)
        assert sorted(set((await started()).values())) == [0, 2]
    finally:
        await daemon.stop()
        for node in nodes:
            await node.halt()


WHOLE_CARD = {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 100}


async def test_a_group_larger_than_the_fleet_holds_back_no_other_namespace(
        jetstream_server: LocalNatsServer, http: aiohttp.ClientSession) -> None:
    """Two nodes of eight cards hold sixteen whole-card members: a 20-member group could
    never start there, even with every card free. It is refused with a reason of its own
    and, past its patience, goes ahead of no one: a 1-card pod of another namespace binds
    at once (before issue 45 it was refused GroupAhead until the group was deleted)."""
    nodes = [SimulatedAgent.start(f"gpu-node-{n}", jetstream_server.url, "a100x8-nvswitch")
             for n in (1, 2)]
    daemon = await RunningDaemon(standalone_config(
        jetstream_server.url, service=ServiceSettings(DEFAULTS, group_patience=0.2))).start()
    pods = PodClient(http, daemon.url)
    try:
        for i in range(20):
            pod = member(f"huge-{i:02d}", "huge", count=20, namespace="team-a")
            pod["spec"]["containers"][0]["resources"]["limits"] = dict(WHOLE_CARD)
            await pods.submit(pod)
        refused = await pods.pending_with("huge-00", "FilteringFailed", namespace="team-a")
        message = filtering_failed(refused)[-1]
        assert message.startswith("no available node, 2 nodes do not meet: group huge can "
                                  "never start on these nodes: even with every card free, 16 "
                                  "of 20 members fit"), message
        await asyncio.sleep(0.5)  # past the group's patience
        single = lab_pod("small", limits=dict(WHOLE_CARD))
        single["metadata"]["namespace"] = "team-b"
        started = asyncio.get_running_loop().time()
        await pods.submit(single)
        await pods.placed("small", namespace="team-b", timeout=10)
        waited = asyncio.get_running_loop().time() - started
        print(f"the other namespace's pod bound {waited:.3f}s after its submission")
        assert await pods.pods() and not [
            p for p in await pods.pods() if p["namespace"] == "team-a" and p["node"]]
        assert daemon.service is not None
        exposition = daemon.service.metrics.exposition().decode()
        assert (metric_sample(exposition, "pyhami_groups_never_fit_total") or 0) >= 1
        assert metric_sample(exposition, "pyhami_group_held_back_total") == 0
    finally:
        await daemon.stop()
        for node in nodes:
            await node.halt()


async def test_a_group_placed_while_the_lease_is_lost_reserves_nothing(
        jetstream_server: LocalNatsServer, http: aiohttp.ClientSession,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A group's placement runs in slices, the loop serving others between them: if the
    daemon stopped deciding meanwhile (its lease lost), the placement is not reserved
    and /filter answers the standby's error, as a single pod's does."""
    running, node = await stand_up(jetstream_server, http, drive_pending=False)
    try:
        for name in A:
            await running.pods.submit(member(name, "train-a"))
        service = running.daemon.service
        assert service is not None
        placing = verbs.in_slices

        async def lease_lost_meanwhile(steps: Any) -> Any:
            placed = await placing(steps)
            monkeypatch.setattr(service.shared.leadership, "refusal",
                                lambda: "standing by: another daemon decides")
            return placed

        monkeypatch.setattr(verbs, "in_slices", lease_lost_meanwhile)
        pod = member("a-0", "train-a")
        async with http.post(f"{running.daemon.url}/filter",
                             json={"Pod": pod, "NodeNames": ["gpu-node-1"]}) as answer:
            result = await answer.json()
        assert result["Error"] == "standing by: another daemon decides"
        assert service.state.cache.reservation_count == 0
    finally:
        await running.daemon.stop()
        await node.halt()
