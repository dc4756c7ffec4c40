"""The Kueue workloads whose cards the admission check holds: which placeholder a pod
claims, what a workload's end or its time releases, and the pods seen bound."""

from __future__ import annotations

import msgspec
import pytest

from common.core import PodManifest, parse_pod
from common.core.workloads import workload_members
from pyhami.sandbox import DEFAULTS
from scheduler.state import HeldWorkloads
from tests.fakes.kueue import gpu_pod_template, workload

TRAIN = workload("train", ("workers", 2, gpu_pod_template(memory=4000)),
                 ("ps", 1, gpu_pod_template(memory=2000)))


def held() -> HeldWorkloads:
    workloads = HeldWorkloads()
    workloads.hold("lab/train", "uid-train", workload_members(TRAIN, DEFAULTS), until=60.0)
    return workloads


def pod(name: str, memory: int) -> PodManifest:
    template = gpu_pod_template(memory=memory)
    return msgspec.convert({**template, "metadata": {"name": name, "namespace": "lab"}},
                           PodManifest)


@pytest.mark.parametrize(("pod_set", "memory", "claimed"), [
    ("workers", 4000, "lab/train[workers#0]"),
    ("ps", 2000, "lab/train[ps#0]"),
    ("workers", 2000, None),  # asks otherwise than its pod set: placed alone
    ("chief", 4000, None),  # no such pod set
], ids=["worker", "ps", "other-request", "other-pod-set"])
def test_a_pod_claims_a_placeholder_of_its_pod_set_that_asks_what_it_asks(
        pod_set: str, memory: int, claimed: str | None) -> None:
    workloads = held()
    request = parse_pod(pod("train-x", memory), DEFAULTS)
    assert workloads.claim("lab/train", pod_set, request) == claimed


def test_a_claim_is_kept_and_each_placeholder_claimed_once() -> None:
    workloads = held()
    first = parse_pod(pod("train-0", 4000), DEFAULTS)
    second = parse_pod(pod("train-1", 4000), DEFAULTS)
    third = parse_pod(pod("train-2", 4000), DEFAULTS)
    assert workloads.claim("lab/train", "workers", first) == "lab/train[workers#0]"
    assert workloads.claim("lab/train", "workers", first) == "lab/train[workers#0]"
    assert workloads.claim("lab/train", "workers", second) == "lab/train[workers#1]"
    assert workloads.claim("lab/train", "workers", third) is None
    assert workloads.waiting("lab/train") == ["lab/train[ps#0]"]
    assert workloads.claim("lab/other", "workers", third) is None


def test_its_time_releases_what_is_unclaimed_and_keeps_it_known() -> None:
    workloads = held()
    workloads.claim("lab/train", "workers", parse_pod(pod("train-0", 4000), DEFAULTS))
    assert workloads.expire(59.0) == []
    assert workloads.expire(60.0) == ["lab/train[workers#1]", "lab/train[ps#0]"]
    assert workloads.held("lab/train")  # not placed again
    assert workloads.expire(61.0) == []
    assert workloads.let_go("lab/train") == []
    assert not workloads.held("lab/train")


def test_a_standby_lets_every_workload_go() -> None:
    workloads = held()
    assert len(workloads.let_go_all()) == 3
    assert len(workloads) == 0


def test_bound_pods_are_counted_by_pod_set_until_they_end() -> None:
    workloads = HeldWorkloads()
    notes = {"pyhami.io/workload": "train", "pyhami.io/pod-set": "workers"}
    workloads.note_bound("lab", "lab/train-0", notes)
    workloads.note_bound("lab", "lab/train-1", notes)
    workloads.note_bound("lab", "lab/lone", {})
    assert workloads.bound_in("lab/train") == {"workers": 2}
    workloads.pod_gone("lab/train-0")
    assert workloads.bound_in("lab/train") == {"workers": 1}
