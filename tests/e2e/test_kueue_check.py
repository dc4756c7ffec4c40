"""pyhami as Kueue's admission check on the real control plane (issue 47, docs/kueue.md):
Kueue v0.17 with its "Using HAMi" transformation, kube-controller-manager's job
controller, kube-scheduler with pyhami's extender, and the daemon run with
``--kueue-admission-check``. Every Workload, check state and message is Kueue's object,
read from the API server.

The lab node holds four T4 cards of 15,360 MiB. Fillers, plain pods outside Kueue, take
9,000 MiB of each: 6,360 MiB free on every card, 25,440 in all. A job of two pods of
7,000 MiB then has quota (14,000 of ``nvidia.com/total-gpumem``) and no card for either
pod; when one filler goes, its card holds both."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.controlplane import SCHEDULER_NAME, ApiError, render_chart, wait_for
from harness.kueue import API, Kueue, condition, has_condition
from harness.kueue import check_state as kueue_check_state
from tests.e2e.controlplane import ControlPlane
from tests.e2e.kueue_jobs import (
    KUEUE_FLAVOR,
    create_job,
    delete_job,
    delete_jobs,
    gpu_job,
    job_pods,
    read_job,
)
from tests.e2e.pods import ClusterLab, lab_pod

CHECK = "pyhami-placement"
RETRY_AFTER_S = 4
CARD_MIB = 15360
START_BOUND_S = 10.0
"""A job is bound this soon after a card frees, at most (measured: docs/kueue.md,
"Measured on the real control plane"; the goal is 2 s)."""


@pytest.fixture(scope="module")
def checking(control_plane: ControlPlane, kueue: Kueue) -> Iterator[str]:
    """The session's daemon answering Kueue's AdmissionCheck ``CHECK``, as the chart sets
    it up with ``scheduler.kueue.admissionCheck``: its ClusterRole's rules and its
    AdmissionCheck object applied, the daemon given the chart's flags (the daemon marks
    the check Active); the daemon and its role as they were after the module."""
    documents = render_chart(control_plane.bin_dir, ["scheduler.kueue.admissionCheck=true",
                                                     f"scheduler.kueue.checkName={CHECK}",
                                                     f"scheduler.kueue.retryAfter={RETRY_AFTER_S}"])
    role = next(doc for doc in documents if doc["kind"] == "ClusterRole"
                and doc["metadata"]["name"] == SCHEDULER_NAME)
    (check,) = [doc for doc in documents if doc["kind"] == "AdmissionCheck"]
    (deployment,) = [doc for doc in documents if doc["kind"] == "Deployment"
                     and doc["metadata"]["name"] == SCHEDULER_NAME]
    (extender,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                   if c["name"] == "extender"]
    flags = [flag for flag in extender["command"] if flag.startswith("--kueue")]
    assert flags == ["--kueue-admission-check", f"--kueue-retry-after={RETRY_AFTER_S}"], flags
    role_path = f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{SCHEDULER_NAME}"
    rules_before = control_plane.api.get(role_path)["rules"]
    control_plane.api.merge_patch(role_path, {"rules": role["rules"]})
    control_plane.api.create(f"{API}/admissionchecks", check)
    try:
        control_plane.restart_scheduler(*flags, nodes=1)
        wait_for(lambda: has_condition(kueue.get("admissionchecks", CHECK), "Active"),
                 f"pyhami to mark AdmissionCheck {CHECK} Active",
                 watch=control_plane.all_processes())
        yield CHECK
    finally:
        kueue.delete("admissionchecks", CHECK)
        control_plane.api.merge_patch(role_path, {"rules": rules_before})
        control_plane.restart_scheduler(nodes=1)


@pytest.fixture
def queues(checking: str, kueue: Kueue, kueue_namespace: str,
           request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """Two LocalQueues of the test's namespace: ``checked`` (its ClusterQueue names the
    check) and ``plain`` (Kueue's recipe alone), each on ``nvidia.com/total-gpumem``
    (``@pytest.mark.parametrize("queues", [(MiB, strategy)], indirect=True)``; 40,000 and
    Kueue's default, BestEffortFIFO, by default)."""
    total, strategy = getattr(request, "param", (40000, None))
    quotas = {"nvidia.com/gpu": "8", "nvidia.com/total-gpumem": str(total)}
    made = {"checked": [checking], "plain": []}
    for name, checks in made.items():
        kueue.create_cluster_queue(f"cq-{name}", quotas, flavor=KUEUE_FLAVOR,
                                   admission_checks=checks, queueing_strategy=strategy)
        kueue.create_local_queue(kueue_namespace, name, f"cq-{name}")
    yield {name: name for name in made}
    delete_jobs(kueue.plane, kueue_namespace)  # a queue goes once no workload uses it
    for name in made:
        kueue.delete("localqueues", name, kueue_namespace)
        kueue.delete("clusterqueues", f"cq-{name}")
    # Gone, not only deleting: the next test makes queues of the same names.
    wait_for(lambda: not any(_exists(kueue, "clusterqueues", f"cq-{name}") for name in made),
             "the test's ClusterQueues to be gone", watch=kueue.plane.all_processes())


def _exists(kueue: Kueue, plural: str, name: str) -> bool:
    try:
        kueue.get(plural, name)
    except ApiError as error:
        if error.status == 404:
            return False
        raise
    return True


def job(name: str, queue: str, *, pods: int, gpumem: int) -> dict[str, Any]:
    """A Job of ``pods`` pods of one card with ``gpumem`` MiB each, queued in ``queue``."""
    made = gpu_job(name, queue, gpumem=gpumem)
    made["spec"].update(parallelism=pods, completions=pods)
    return made


def fill(lab: ClusterLab, mib: int, cards: int = 4) -> list[str]:
    """A filler of ``mib`` MiB on each of ``cards`` cards (``spread``: one a card)."""
    names = [f"filler-{i}" for i in range(cards)]
    for name in names:
        pod = lab_pod(name, {"hami.io/gpu-scheduler-policy": "spread"})
        pod["spec"]["containers"][0]["resources"]["limits"] = {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mib)}
        lab.create_manifest(pod)
    cards_used = {lab.wait_placed(name).card for name in names}
    assert len(cards_used) == cards, cards_used
    return names


def bound_pods(plane: ControlPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    return [pod for pod in job_pods(plane, namespace, name) if pod["spec"].get("nodeName")]


def workload_of(kueue: Kueue, namespace: str, job_made: dict[str, Any]) -> dict[str, Any]:
    return wait_for(lambda: next(iter(kueue.workloads(namespace,
                                                      job_uid=job_made["metadata"]["uid"])),
                                 None), f"the Workload of Job {job_made['metadata']['name']}")


def check_state(workload: dict[str, Any]) -> dict[str, Any] | None:
    return kueue_check_state(workload, CHECK)


def wait_check(kueue: Kueue, namespace: str, job_made: dict[str, Any], state: str,
               *needles: str) -> dict[str, Any]:
    return kueue.wait_check(namespace, job_made["metadata"]["uid"], CHECK, state, *needles)


def test_spread_memory_waits_with_the_sentence_and_starts_whole_when_a_card_frees(
        control_plane: ControlPlane, kueue: Kueue, kueue_namespace: str,
        queues: dict[str, str]) -> None:
    lab = ClusterLab(control_plane, kueue_namespace)
    fillers = fill(lab, 9000)

    # Without the check: Kueue admits on quota alone, and the pods stay Pending.
    plain = create_job(control_plane, kueue_namespace, job("plain", "plain", pods=2,
                                                           gpumem=7000))
    kueue.wait_workload(kueue_namespace, plain["metadata"]["uid"], "Admitted")
    wait_for(lambda: len(job_pods(control_plane, kueue_namespace, "plain")) == 2,
             "the job controller to make Job plain's two pods")
    for pod in job_pods(control_plane, kueue_namespace, "plain"):
        lab.wait_event(pod["metadata"]["name"], "FilteringFailed", "CardInsufficientMemory")
    assert bound_pods(control_plane, kueue_namespace, "plain") == []
    delete_job(control_plane, kueue_namespace, "plain")

    # With it: quota reserved, the check Pending with pyhami's sentence, nothing held.
    checked = create_job(control_plane, kueue_namespace, job("checked", "checked", pods=2,
                                                             gpumem=7000))
    workload = wait_check(kueue, kueue_namespace, checked, "Pending",
                          "0 of 2 GPU pods fit now", "asked for 1 card with 7000 MiB",
                          "CardInsufficientMemory")
    assert has_condition(workload, "QuotaReserved")
    assert not has_condition(workload, "Admitted")
    assert read_job(control_plane, kueue_namespace, "checked")["spec"]["suspend"] is True
    assert job_pods(control_plane, kueue_namespace, "checked") == []
    assert control_plane.statusz()["reservations"] == 0

    # A card frees: the workload is admitted and both pods bound, on that card.
    freed = lab.wait_placed(fillers[0]).card
    started = time.monotonic()
    lab.delete(fillers[0])
    pods = wait_for(lambda: (found if len(found := bound_pods(
        control_plane, kueue_namespace, "checked")) == 2 else None),
        "both pods of Job checked bound", interval=0.05, watch=control_plane.all_processes())
    took = time.monotonic() - started
    print(f"\nkueue check: card freed to the job's last pod bound in {took:.2f} s")
    assert took < START_BOUND_S
    cards = {pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"].split(",")[0]
             for pod in pods}
    assert len(cards) == 1 and cards.pop().endswith(f"-{freed}"), pods
    workload = kueue.wait_workload(kueue_namespace, checked["metadata"]["uid"], "Admitted")
    state = check_state(workload)
    assert state is not None and state["state"] == "Ready", state
    assert "pyhami holds the cards of its 2 GPU pods" in state["message"]
    for pod in pods:
        assert pod["metadata"]["annotations"]["pyhami.io/workload"] == \
            workload["metadata"]["name"]


def test_two_workloads_on_cards_for_one_start_one_whole_then_the_other(
        control_plane: ControlPlane, kueue: Kueue, kueue_namespace: str,
        queues: dict[str, str]) -> None:
    lab = ClusterLab(control_plane, kueue_namespace)
    fill(lab, CARD_MIB, cards=3)  # one card free: room for one job of two 7,000 MiB pods
    first = create_job(control_plane, kueue_namespace, job("first", "checked", pods=2,
                                                           gpumem=7000))
    second = create_job(control_plane, kueue_namespace, job("second", "checked", pods=2,
                                                            gpumem=7000))
    wait_for(lambda: len(bound_pods(control_plane, kueue_namespace, "first")) == 2
             or len(bound_pods(control_plane, kueue_namespace, "second")) == 2,
             "one job's two pods bound", watch=control_plane.all_processes())
    running, waiting = (("first", second) if len(bound_pods(
        control_plane, kueue_namespace, "first")) == 2 else ("second", first))
    waiting_name = waiting["metadata"]["name"]
    wait_check(kueue, kueue_namespace, waiting, "Pending", "0 of 2 GPU pods fit now")
    for _ in range(10):  # never a part of the waiting one started
        assert job_pods(control_plane, kueue_namespace, waiting_name) == []
        time.sleep(0.2)
    delete_job(control_plane, kueue_namespace, running)
    wait_for(lambda: len(bound_pods(control_plane, kueue_namespace, waiting_name)) == 2,
             f"Job {waiting_name}'s two pods bound once the other ended",
             watch=control_plane.all_processes())


# StrictFIFO: Kueue v0.17 queues a workload evicted by a check again at once, while those
# BestEffortFIFO parked for want of quota come back a second later (docs/kueue.md).
@pytest.mark.parametrize("queues", [(30000, "StrictFIFO")], indirect=True)
def test_a_workload_that_cannot_fit_gives_its_quota_to_one_that_can(
        control_plane: ControlPlane, kueue: Kueue, kueue_namespace: str,
        queues: dict[str, str]) -> None:
    lab = ClusterLab(control_plane, kueue_namespace)
    fill(lab, 9000)  # 6,360 MiB free on each card
    # 2 x 14,000 MiB: within the 30,000 MiB quota, on no card.
    big = create_job(control_plane, kueue_namespace, job("big", "checked", pods=2,
                                                         gpumem=14000))
    wait_check(kueue, kueue_namespace, big, "Pending", "0 of 2 GPU pods fit now")
    # 5,000 more MiB is over the quota while big holds 28,000: it waits for quota.
    small = create_job(control_plane, kueue_namespace, job("small", "checked", pods=1,
                                                           gpumem=5000))
    small_workload = workload_of(kueue, kueue_namespace, small)
    assert not has_condition(small_workload, "QuotaReserved")
    # After --kueue-retry-after the check says Retry: Kueue evicts big, its quota goes to
    # small, which fits and starts.
    wait_for(lambda: len(bound_pods(control_plane, kueue_namespace, "small")) == 1,
             "Job small bound once big gave its quota back", watch=control_plane.all_processes())
    evicted = workload_of(kueue, kueue_namespace, big)
    retried = check_state(evicted)
    assert retried is not None and (retried.get("retryCount") or 0) >= 1, retried
    assert not has_condition(evicted, "Admitted")
    assert bound_pods(control_plane, kueue_namespace, "big") == []
    found = condition(evicted, "Evicted") or condition(evicted, "Requeued")
    assert found is not None, evicted["status"]


def test_a_job_asking_no_gpu_is_ready_at_once(
        control_plane: ControlPlane, kueue: Kueue, kueue_namespace: str,
        queues: dict[str, str]) -> None:
    made = gpu_job("cpu-only", "checked")
    made["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "0"}, "requests": {"nvidia.com/gpu": "0"}}
    created = create_job(control_plane, kueue_namespace, made)
    workload = kueue.wait_workload(kueue_namespace, created["metadata"]["uid"], "Admitted")
    state = check_state(workload)
    assert state is not None and state["state"] == "Ready"
    assert "no pod asks for a GPU" in state["message"]
    assert control_plane.statusz()["reservations"] == 0
