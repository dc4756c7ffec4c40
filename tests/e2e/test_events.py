"""pyhami's Events as ``kubectl describe pod`` shows them, on the real control plane:
HAMi's reasons in HAMi's shapes, read from the API server and, for a placed pod, from
``kubectl describe pod`` itself (kubectl built with the control plane).

A placed pod has ``FilteringSucceed`` and ``BindingSucceed`` (Normal). A pod asking for
more cards than the node has is retried by kube-scheduler on its backoff (at most
``--pod-max-in-unschedulable-pods-duration=10s`` apart, the Deployment's flag). Each retry
is refused by pyhami's /filter; the refusals are HAMi's per-reason ``FilteringFailed``
Event and its summary, each one Event whose count rises, the summary going on with what was
asked and what the node has; ``pyhami explain`` prints that same sentence.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.controlplane import wait_for
from tests.e2e.controlplane import NODE, TEST_NAMESPACE, ControlPlane
from tests.e2e.pods import EVENTS, ClusterLab, lab_pod

REASON = "FilteringFailed"
SUMMARY = "no available node, "
CARDS = 4  # the simulated agent's sim:t4x4
RETRIES_S = 120.0  # kube-scheduler's backoff and the 10 s flush, several times over


def too_big(name: str) -> dict[str, Any]:
    pod = lab_pod(name)
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    limits["nvidia.com/gpu"] = str(CARDS + 1)
    return pod


def refusals(lab: ClusterLab, name: str) -> list[dict[str, Any]]:
    """The pod's FilteringFailed summaries (``no available node, ...``)."""
    return [e for e in lab.events(name) if e.get("reason") == REASON
            and str(e.get("message")).startswith(SUMMARY)]


def wait_count(lab: ClusterLab, name: str, at_least: int) -> dict[str, Any]:
    """Until the pod's one FilteringFailed summary counts ``at_least``; fails on a second."""

    def counted() -> dict[str, Any] | None:
        found = refusals(lab, name)
        assert len(found) <= 1, f"{len(found)} {REASON} Events on {name}: {found}"
        return found[0] if found and found[0].get("count", 0) >= at_least else None

    try:
        return wait_for(counted, f"the {REASON} Event of {name} to count {at_least}",
                        RETRIES_S, interval=0.5, watch=lab.plane.all_processes())
    except AssertionError as error:
        raise AssertionError(f"{error}\nevents on {name}: {lab.events(name)}") from None


def explain(plane: ControlPlane, pod: dict[str, Any], tmp_path: Path) -> str:
    manifest = tmp_path / f"{pod['metadata']['name']}.json"
    manifest.write_text(json.dumps(pod))
    done = subprocess.run(
        [sys.executable, "-m", "pyhami.cli", "explain", str(manifest),
         "--daemon", plane.daemon_url, *plane.extender_tls_flags()],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "COLUMNS": "1000"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_repeated_refusals_are_one_event_whose_count_rises(
        lab: ClusterLab, control_plane: ControlPlane, tmp_path: Path) -> None:
    pod = too_big("too-big")
    lab.create_manifest(pod)
    event = wait_count(lab, "too-big", 2)

    sentence = (f"asked for {CARDS + 1} cards with 1000 MiB each; "
                f"{NODE} has {CARDS} cards (NodeInsufficientDevice)")
    assert event["message"] == f"no available node, 1 nodes do not meet: {sentence}"
    # HAMi's Event by reason, written before the summary on each refusal: counted too.
    (by_reason,) = [e for e in lab.events("too-big")
                    if e.get("reason") == REASON and e not in refusals(lab, "too-big")]
    assert by_reason["message"] == f"1 nodes NodeInsufficientDevice({NODE})"
    assert by_reason["count"] >= event["count"]  # written first, one after the other
    uid = lab.read("too-big")["metadata"]["uid"]
    for written in (event, by_reason):
        assert written["type"] == "Warning"
        assert written["source"]["component"] == "pyhami-scheduler"
        assert written["involvedObject"]["uid"] == uid
        assert written["firstTimestamp"] <= written["lastTimestamp"]
    lab.assert_pending("too-big")

    assert f"-> Pending: {sentence}\n" in explain(control_plane, pod, tmp_path)


def test_the_count_goes_on_after_the_event_is_deleted_and_after_a_restart(
        lab: ClusterLab, control_plane: ControlPlane) -> None:
    lab.create_manifest(too_big("still-too-big"))
    first = wait_count(lab, "still-too-big", 2)
    name = first["metadata"]["name"]

    # Gone from the API (as --event-ttl expires it): the next refusal writes it anew,
    # under the same name, its count carried on.
    control_plane.api.delete(f"{EVENTS}/{name}")
    again = wait_count(lab, "still-too-big", first["count"] + 1)
    assert again["metadata"]["name"] == name
    assert again["firstTimestamp"] == first["firstTimestamp"]

    # A new daemon remembers nothing: it finds the Event by its name and counts on.
    assert control_plane.stop_daemon() == 0
    control_plane.start_daemon()
    after = wait_count(lab, "still-too-big", again["count"] + 1)
    assert after["metadata"]["name"] == name
    assert after["firstTimestamp"] == first["firstTimestamp"]


def test_a_placed_pod_has_filtering_succeed_and_binding_succeed_as_hami_writes_them(
        lab: ClusterLab) -> None:
    lab.create_manifest(lab_pod("placed"))
    node = lab.wait_placed("placed").node
    succeed = lab.wait_event("placed", "FilteringSucceed")
    bound = lab.wait_event("placed", "BindingSucceed")

    # HAMi's genSuccessMsg: the one node kube-scheduler sent holds the pod, its score
    # before the pod with two decimals.
    assert re.fullmatch(rf"find fit node\({node}\), 0 nodes not fit, 1 nodes "
                        rf"fit\({node}:\d+\.\d\d\)", succeed["message"]), succeed["message"]
    assert bound["message"] == f"Successfully binding node [{node}] to {TEST_NAMESPACE}/placed"
    uid = lab.read("placed")["metadata"]["uid"]
    for event in (succeed, bound):
        assert event["type"] == "Normal"
        assert event["source"]["component"] == "pyhami-scheduler"
        assert event["involvedObject"]["uid"] == uid
        assert event["count"] == 1
    assert not [e for e in lab.events("placed") if e.get("type") == "Warning"]


def test_kubectl_describe_pod_shows_them(lab: ClusterLab, control_plane: ControlPlane) -> None:
    lab.create_manifest(lab_pod("described"))
    node = lab.wait_placed("described").node
    lab.wait_event("described", "BindingSucceed")
    done = subprocess.run(
        [str(control_plane.bin_dir / "kubectl"), "--kubeconfig",
         str(control_plane.admin_kubeconfig), "describe", "pod", "described",
         "--namespace", TEST_NAMESPACE],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "COLUMNS": "1000"})
    assert done.returncode == 0, done.stderr
    events = done.stdout.split("\nEvents:", 1)[1]
    # Type, Reason, Age, From, Message: as HAMi's scheduler writes them, from pyhami's.
    assert re.search(rf"Normal +FilteringSucceed +\S+ +pyhami-scheduler +find fit "
                     rf"node\({node}\), 0 nodes not fit, 1 nodes fit\({node}:\d+\.\d\d\)",
                     events), events
    assert re.search(rf"Normal +BindingSucceed +\S+ +pyhami-scheduler +Successfully binding "
                     rf"node \[{node}\] to {TEST_NAMESPACE}/described", events), events
