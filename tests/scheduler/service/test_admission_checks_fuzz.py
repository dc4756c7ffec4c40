"""Fuzz target for the Kueue admission check's door: whatever a Workload the API server
sends holds (pod sets, counts, templates, the check's state), the watch's decoder reads it
or refuses it, and the check then writes one state with a one-line message, holds cards
only for a workload it says Ready, and never holds more than the cards have
(hypothesis). The pod's door too: any ``pyhami.io/workload`` and ``pyhami.io/pod-set``
annotations are read whole or refused in one line."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.core import PodRejected
from common.core.workloads import (
    POD_SET_ANNOTATION,
    WORKLOAD_ANNOTATION,
    CheckState,
    Workload,
    claimed_workload,
)
from tests.fakes.kueue import CHECK, gpu_pod_template
from tests.scheduler.service.test_admission_checks import Lab

pytestmark = pytest.mark.slow  # long fuzzing

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

quantities = st.one_of(st.integers(-5, 2**40), st.sampled_from(
    ["1", "0", "-1", "1.5", "lots", "10Gi", "1e3", "", "4000", "16000"]))
limits = st.dictionaries(st.sampled_from(["nvidia.com/gpu", "nvidia.com/gpumem",
                                          "nvidia.com/gpucores", "nvidia.com/gpumem-percentage",
                                          "cpu"]), quantities, max_size=4)
templates = st.one_of(
    st.builds(lambda cards, memory: gpu_pod_template(cards=cards, memory=memory),
              st.integers(0, 9), st.integers(0, 20000)),
    st.builds(lambda lim: {"spec": {"containers": [{"name": "main",
                                                    "resources": {"limits": lim}}]}}, limits),
    st.sampled_from([{}, {"spec": {}}, {"spec": {"containers": 3}}, {"spec": None}, [],
                     {"spec": {"containers": [{"resources": {"limits": "x"}}]}}]))
pod_set_names = st.one_of(st.sampled_from(["main", "workers", "", "A", "x" * 64, "a b"]),
                          st.text(max_size=10))
pod_sets = st.lists(st.fixed_dictionaries({
    "name": pod_set_names,
    "count": st.one_of(st.integers(-3, 5), st.integers(0, 2**31 - 1)),
    "template": templates}), max_size=4)
states = st.sampled_from(["Pending", "Ready", "Retry", "Rejected", "", "Unknown"])


def workload_json(sets: list[dict[str, Any]], state: str, quota: bool) -> bytes:
    return msgspec.json.encode({
        "metadata": {"name": "w", "namespace": "lab", "uid": "u", "resourceVersion": "1"},
        "spec": {"podSets": sets},
        "status": {"conditions": [{"type": "QuotaReserved",
                                   "status": "True" if quota else "False"}],
                   "admissionChecks": [{"name": CHECK, "state": state, "message": "",
                                        "lastTransitionTime": "2026-12-06T10:00:00Z"}]}})


@FUZZ
@given(sets=pod_sets, state=states, quota=st.booleans())
def test_any_workload_gets_one_state_and_cards_held_only_when_ready(
        sets: list[dict[str, Any]], state: str, quota: bool) -> None:
    try:
        workload = msgspec.json.decode(workload_json(sets, state, quota), type=Workload)
    except msgspec.DecodeError:
        return  # the watch counts and logs it (UnreadableLog); nothing is written
    lab = Lab()
    lab.see(workload)
    asyncio.run(lab.run_pass())
    written = lab.kueue.written
    assert len(written) <= 1
    held = lab.held()
    if written:
        update = written[0][2]
        assert "\n" not in update.message and "Traceback" not in update.message
        assert update.message
        if update.state is not CheckState.READY:
            assert held == {}
    if held:
        # Said Ready now, or Ready already (a daemon that begins to lead holds again the
        # cards of a workload said Ready whose pods have not come).
        assert (written and written[0][2].state is CheckState.READY) or (
            state == "Ready" and quota and not written)
    # Never more than the cards have: every card's booked memory within its size.
    fleet = lab.service.state.fleet
    for node in fleet.nodes():
        for card in node.cards:
            assert fleet.usage(node.name, card.uuid).memory <= card.memory


@FUZZ
@given(workload=st.none() | st.text(max_size=300), pod_set=st.none() | st.text(max_size=80))
def test_any_claim_on_a_pod_is_read_whole_or_refused_in_one_line(
        workload: str | None, pod_set: str | None) -> None:
    annotations = {key: value for key, value in ((WORKLOAD_ANNOTATION, workload),
                                                 (POD_SET_ANNOTATION, pod_set))
                   if value is not None}
    try:
        claim = claimed_workload(annotations)
    except PodRejected as error:
        assert "\n" not in str(error)
        assert "metadata.annotations[" in str(error)
        return
    assert (claim is None) == (not annotations)
