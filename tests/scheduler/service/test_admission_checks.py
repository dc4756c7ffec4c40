"""The Kueue admission check's controller: a workload's pods placed all or nothing on the
live fleet, their cards held under placeholders until the pods take them, and the check's
state written as Kueue reads it (Ready, Pending with pyhami's sentence, Retry, Rejected)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from common.core import PodManifest, parse_pod
from common.core.quota import ResourceQuotaManifest, parse_quota
from common.core.workloads import (
    POD_SET_ANNOTATION,
    WORKLOAD_ANNOTATION,
    CheckState,
    Workload,
    placeholder_key,
)
from pyhami.sandbox import DEFAULTS
from scheduler.cluster import AdmissionCheckChange, WorkloadChange
from scheduler.leadership import AlwaysLeader
from scheduler.leadership.port import Role
from scheduler.service import SchedulerService, ServiceSettings
from scheduler.service.admission import AdmissionChecks
from tests.builders import gpu_limits, manifest
from tests.fakes.clock import Clock
from tests.fakes.kueue import CHECK, RecordingKueue, admission_check, gpu_pod_template, workload
from tests.fakes.node_list import NodeList, inventory, silent

NODES = ["a", "b"]  # four T4 each, 15360 MiB a card
WALL = 1_796_551_200.0  # 2026-12-06T10:00:00Z, the fake Workloads' stamps
RETRY_AFTER = 30.0


class Lab:
    def __init__(self) -> None:
        self.clock = Clock(100.0)
        self.wall = Clock(WALL)
        self.kueue = RecordingKueue()
        settings = ServiceSettings(DEFAULTS, kueue_retry_after=RETRY_AFTER, group_ttl=60.0)
        self.service = SchedulerService(settings, NodeList(set(NODES)), silent,
                                        clock=self.clock, wall_clock=self.wall,
                                        kueue=self.kueue)
        for name in NODES:
            self.service.state.nodes.ingest(inventory(name, 1), now=self.clock.now)
        self.service.shared.ready = True
        self.checks.check_changed(AdmissionCheckChange(admission_check(), deleted=False))

    @property
    def checks(self) -> AdmissionChecks:
        assert self.service.admission is not None
        return self.service.admission

    def see(self, *workloads: Workload, deleted: bool = False) -> None:
        for one in workloads:
            self.checks.workload_changed(WorkloadChange(one, deleted))

    async def run_pass(self) -> None:
        await self.checks.run_pass()

    def fill_every_card(self, memory: int) -> None:
        """A bound pod of ``memory`` MiB on every card: what is free is spread."""
        cache = self.service.state.cache
        for index in range(len(NODES) * 4):
            request = parse_pod(manifest(f"tenant-{index}", containers=[gpu_limits(memory)]),
                                DEFAULTS)
            decision = cache.filter(request, None, self.clock.now)
            assert decision.allocation is not None
            cache.confirm(request.key, decision.allocation)

    def held(self) -> dict[str, str]:
        """Every reservation: key → node."""
        return {key: allocation.node
                for key, allocation, _ in self.service.state.cache.reservations()}

    async def filter(self, pod: PodManifest, names: list[str] | None = None) -> str | None:
        filtered = await self.service.verbs.filter(pod, NODES if names is None else names)
        decision = filtered.decision
        assert decision is not None
        return decision.node


def worker(name: str, workload_name: str = "train", pod_set: str = "workers",
           memory: int = 10000) -> PodManifest:
    """A pod of the workload, as the Job makes it from the pod set's template once Kueue
    added the check's annotations."""
    template = gpu_pod_template(memory=memory, annotations={
        WORKLOAD_ANNOTATION: workload_name, POD_SET_ANNOTATION: pod_set})
    return msgspec.convert({**template, "metadata": {**template["metadata"], "name": name,
                                                      "namespace": "lab"}}, PodManifest)


WORKERS = gpu_pod_template(memory=10000)


@pytest.fixture
def lab() -> Lab:
    return Lab()


async def test_a_workload_that_fits_is_ready_its_cards_held_until_its_pods_take_them(
        lab: Lab) -> None:
    lab.see(workload("train", ("launcher", 1, {"spec": {"containers": [{"name": "l"}]}}),
                     ("workers", 3, WORKERS)))
    await lab.run_pass()
    said = lab.kueue.last("lab/train")
    assert said.state is CheckState.READY
    assert "3 GPU pods" in said.message
    assert [(u.name, u.annotations) for u in said.pod_set_updates] == [
        ("launcher", {WORKLOAD_ANNOTATION: "train", POD_SET_ANNOTATION: "launcher"}),
        ("workers", {WORKLOAD_ANNOTATION: "train", POD_SET_ANNOTATION: "workers"})]
    placeholders = {placeholder_key("lab", "train", "workers", i) for i in range(3)}
    assert set(lab.held()) == placeholders
    # The pods come (Kueue started the job): each takes one placeholder's cards, on its node.
    for i in range(3):
        node = await lab.filter(worker(f"train-{i}"))
        assert node == lab.held()[f"lab/train-{i}"]
    assert set(lab.held()) == {f"lab/train-{i}" for i in range(3)}
    assert lab.service.state.fleet.allocation(placeholder_key("lab", "train", "workers", 0)) \
        is None
    # A fourth pod finds nothing held for it: placed alone, as any pod.
    assert await lab.filter(worker("train-3")) is not None
    assert lab.kueue.states("lab/train") == ["Ready"]


async def test_spread_memory_keeps_the_check_pending_with_the_sentence_and_nothing_held(
        lab: Lab) -> None:
    lab.fill_every_card(8000)  # 7360 MiB free on each of 8 cards: 58880 MiB in all
    lab.see(workload("train", ("workers", 2, WORKERS)))
    await lab.run_pass()
    said = lab.kueue.last("lab/train")
    assert said.state is CheckState.PENDING
    assert said.message.startswith("0 of 2 GPU pods fit now; train[workers#")
    assert "10000 MiB" in said.message
    assert lab.held() == {}
    # A pass with nothing changed tries nothing and writes nothing.
    await lab.run_pass()
    assert lab.kueue.states("lab/train") == ["Pending"]
    # Two tenants on one card end: it has room for one pod, not two.
    cache = lab.service.state.cache
    cache.release("default/tenant-0")
    lab.see(workload("train", ("workers", 2, WORKERS), message=said.message, version="2"))
    await lab.run_pass()
    assert lab.kueue.last("lab/train").message.startswith("1 of 2 GPU pods fit now")
    cache.release("default/tenant-1")
    await lab.run_pass()
    assert lab.kueue.last("lab/train").state is CheckState.READY
    assert len(lab.held()) == 2


async def test_a_workload_that_does_not_fit_in_time_gives_its_quota_back(lab: Lab) -> None:
    lab.fill_every_card(8000)
    lab.see(workload("big", ("workers", 2, WORKERS)))
    await lab.run_pass()
    lab.clock.now += RETRY_AFTER - 1
    await lab.run_pass()
    assert lab.kueue.states("lab/big") == ["Pending"]
    lab.clock.now += 1
    await lab.run_pass()
    said = lab.kueue.last("lab/big")
    assert said.state is CheckState.RETRY
    assert "pyhami gives its quota back to the queue" in said.message
    # Kueue evicts it (no quota), queues it again, and reserves quota once more: Pending
    # again, and its wait counted afresh.
    lab.see(workload("big", ("workers", 2, WORKERS), quota=False, version="3"))
    await lab.run_pass()
    lab.see(workload("big", ("workers", 2, WORKERS), version="4"))
    await lab.run_pass()
    assert lab.kueue.states("lab/big") == ["Pending", "Retry", "Pending"]


async def test_of_two_workloads_competing_for_the_same_cards_one_starts_whole(
        lab: Lab) -> None:
    # Room for four 10000 MiB pods in all (one a card, cards of node b only).
    cache = lab.service.state.cache
    for index in range(4):
        request = parse_pod(manifest(f"tenant-{index}", containers=[gpu_limits(15360)]),
                                DEFAULTS)
        decision = cache.filter(request, ["a"], lab.clock.now)
        assert decision.allocation is not None
        cache.confirm(request.key, decision.allocation)
    first = workload("first", ("workers", 3, WORKERS), created="2026-12-06T10:00:00Z")
    second = workload("second", ("workers", 3, WORKERS), created="2026-12-06T10:01:00Z")
    lab.see(second, first)
    await lab.run_pass()
    assert lab.kueue.last("lab/first").state is CheckState.READY
    assert lab.kueue.last("lab/second").state is CheckState.PENDING
    assert lab.kueue.last("lab/second").message.startswith("1 of 3 GPU pods fit now")
    assert all(key.startswith("lab/first[") for key in lab.held())
    # The first ends (Kueue marks it Finished): its cards go to the second, whole.
    lab.see(workload("first", ("workers", 3, WORKERS), check_state="Ready", finished=True,
                     version="5"))
    await lab.run_pass()
    assert lab.kueue.last("lab/second").state is CheckState.READY
    assert sorted(lab.held()) == [placeholder_key("lab", "second", "workers", i)
                                  for i in range(3)]


async def test_an_evicted_or_deleted_workload_lets_its_cards_go(lab: Lab) -> None:
    lab.see(workload("train", ("workers", 2, WORKERS)))
    await lab.run_pass()
    assert len(lab.held()) == 2
    lab.see(workload("train", ("workers", 2, WORKERS), quota=False, check_state="Pending",
                     version="2"))
    await lab.run_pass()
    assert lab.held() == {}
    lab.see(workload("other", ("workers", 2, WORKERS)))
    await lab.run_pass()
    assert len(lab.held()) == 2
    lab.see(workload("other", ("workers", 2, WORKERS)), deleted=True)
    await lab.run_pass()
    assert lab.held() == {}


async def test_a_workload_made_again_under_the_same_name_is_placed_afresh(lab: Lab) -> None:
    lab.see(workload("train", ("workers", 2, WORKERS)))
    await lab.run_pass()
    assert len(lab.held()) == 2
    # Deleted and made again, one pod now, before the next pass: the old one's two
    # placeholders go, and the new one is placed and said Ready for its one pod.
    again = msgspec.structs.replace(workload("train", ("workers", 1, WORKERS), version="9"),
                                    metadata=msgspec.structs.replace(
                                        workload("train").metadata, uid="uid-train-2",
                                        resource_version="9"))
    lab.see(again)
    await lab.run_pass()
    assert sorted(lab.held()) == [placeholder_key("lab", "train", "workers", 0)]
    assert lab.kueue.last("lab/train").message.endswith("its 1 GPU pod until they start")


async def test_the_cards_held_go_when_their_time_passes(lab: Lab) -> None:
    lab.see(workload("train", ("workers", 2, WORKERS)))
    await lab.run_pass()
    assert await lab.filter(worker("train-0")) is not None
    lab.clock.now += 60.0
    await lab.run_pass()
    assert set(lab.held()) == {"lab/train-0"}  # the pod's own reservation, not yet expired
    # Kueue says Ready now; the check does not place the workload again.
    lab.see(workload("train", ("workers", 2, WORKERS), check_state="Ready", version="2",
                     since="2026-12-06T10:00:00Z"))
    await lab.run_pass()
    assert set(lab.held()) == {"lab/train-0"}


@pytest.mark.parametrize(("template", "state", "says"), [
    ({"spec": {"containers": [{"name": "main", "resources": {"limits": {
        "nvidia.com/gpu": "lots"}}}]}}, CheckState.REJECTED,
     "pyhami cannot place this workload: spec.podSets[0].template: "),
    ({"spec": {"containers": 7}}, CheckState.REJECTED, "does not read as a pod"),
    ({"spec": {"containers": [{"name": "main"}]}}, CheckState.READY,
     "no pod asks for a GPU: pyhami holds no card for it"),
], ids=["unreadable-request", "not-a-pod", "no-gpu"])
async def test_a_workload_pyhami_cannot_or_need_not_place_holds_nothing(
        lab: Lab, template: dict[str, Any], state: CheckState, says: str) -> None:
    lab.see(workload("odd", ("main", 3, template)))
    await lab.run_pass()
    said = lab.kueue.last("lab/odd")
    assert said.state is state
    assert says in said.message
    assert lab.held() == {}


async def test_a_huge_workload_is_rejected_without_a_decision(lab: Lab) -> None:
    lab.see(workload("huge", ("main", 2**31 - 1, WORKERS)))
    await lab.run_pass()
    said = lab.kueue.last("lab/huge")
    assert said.state is CheckState.REJECTED
    assert "2147483647 pods; pyhami places at most 1024" in said.message


async def test_a_write_the_api_server_refuses_is_counted_and_made_again(lab: Lab) -> None:
    lab.kueue.refuse = True
    lab.see(workload("train", ("workers", 2, WORKERS)))
    await lab.run_pass()
    assert lab.kueue.written == []
    assert lab.service.metrics.admission_check_failures._value.get() == 1
    assert len(lab.held()) == 2  # held: Kueue is told on the next pass
    lab.kueue.refuse = False
    await lab.run_pass()
    assert lab.kueue.states("lab/train") == ["Ready"]
    assert len(lab.held()) == 2


async def test_a_pod_whose_held_node_is_not_offered_is_placed_alone(lab: Lab) -> None:
    lab.see(workload("train", ("workers", 1, WORKERS)))
    await lab.run_pass()
    (held_node,) = lab.held().values()
    other = next(n for n in NODES if n != held_node)
    assert await lab.filter(worker("train-0"), [other]) == other


async def test_a_new_leader_holds_again_what_is_left_of_a_ready_workload(lab: Lab) -> None:
    lab.service.state.workloads.pod_bound("lab/train", "workers", "lab/train-0")
    # Said Ready 20 s ago (by the daemon that led then): 40 s of its hold are left.
    lab.wall.now = WALL + 20
    lab.see(workload("train", ("workers", 3, WORKERS), check_state="Ready"))
    await lab.run_pass()
    assert sorted(lab.held()) == [placeholder_key("lab", "train", "workers", i)
                                  for i in (1, 2)]
    assert {expires for *_, expires in lab.service.state.cache.reservations()} == {
        lab.clock.now + 40}
    assert lab.kueue.written == []  # Kueue admitted it already: nothing to say


async def test_a_ready_workload_past_its_time_is_not_held_again(lab: Lab) -> None:
    lab.wall.now = WALL + 61
    lab.see(workload("train", ("workers", 3, WORKERS), check_state="Ready"))
    await lab.run_pass()
    assert lab.held() == {}


async def test_the_checks_pyhami_answers_are_marked_active(lab: Lab) -> None:
    lab.checks.check_changed(AdmissionCheckChange(
        admission_check("provisioning", controller="kueue.x-k8s.io/provisioning-request"),
        deleted=False))
    await lab.run_pass()
    assert lab.kueue.activated == [CHECK]
    await lab.run_pass()
    assert lab.kueue.activated == [CHECK]
    # Another controller's check on a workload: pyhami leaves it alone.
    lab.see(workload("theirs", ("workers", 1, WORKERS), check="provisioning"))
    await lab.run_pass()
    assert lab.kueue.states("lab/theirs") == []


async def test_a_workload_is_charged_its_namespaces_quota_as_a_whole(lab: Lab) -> None:
    quota = msgspec.convert({"metadata": {"name": "gpu", "namespace": "lab"},
                             "spec": {"hard": {"limits.nvidia.com/gpumem": "15000"}}},
                            ResourceQuotaManifest)
    lab.service.state.fleet.quotas.set_quota(parse_quota(quota, DEFAULTS.device))
    lab.see(workload("train", ("workers", 2, WORKERS)))  # 20,000 MiB in all
    await lab.run_pass()
    said = lab.kueue.last("lab/train")
    assert said.state is CheckState.PENDING
    assert said.message.startswith("1 of 2 GPU pods fit now")
    assert ("lab would use 20000 of 15000 MiB nvidia.com/gpumem under ResourceQuota gpu"
            in said.message)
    assert lab.held() == {}


class StandingBy(AlwaysLeader):
    role: Role = "standby"

    def leading(self) -> bool:
        return False

    def refusal(self) -> str | None:
        return "pyhami-0 leads"


async def test_a_standby_places_and_writes_nothing() -> None:
    kueue = RecordingKueue()
    service = SchedulerService(ServiceSettings(DEFAULTS), NodeList(set(NODES)), silent,
                               kueue=kueue, leadership=StandingBy("pyhami-1"))
    for name in NODES:
        service.state.nodes.ingest(inventory(name, 1), now=0.0)
    service.shared.ready = True
    checks = service.admission
    assert checks is not None
    checks.check_changed(AdmissionCheckChange(admission_check(), deleted=False))
    checks.workload_changed(WorkloadChange(workload("train", ("workers", 2, WORKERS)), False))
    running = asyncio.create_task(checks.run())
    await asyncio.sleep(0.1)  # the changes woke it: a pass would have run by now
    running.cancel()
    assert kueue.written == [] and kueue.activated == []
    assert list(service.state.cache.reservations()) == []
