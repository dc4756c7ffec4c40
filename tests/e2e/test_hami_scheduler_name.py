"""Pods naming HAMi's scheduler, ``schedulerName: hami-scheduler``, bound by pyhami on the
real control plane when the chart runs it under that name (``schedulerName=hami-scheduler``).

``hami/default_use.yaml`` is HAMi v2.10.0's own example pod,
``examples/nvidia/default_use.yaml`` (github.com/Project-HAMi/HAMi at
4707fb02c91c545bc7343ce26dba4c32919f9a3e, Apache-2.0), byte for byte (its digest is
pinned below). Like every NVIDIA example of HAMi's it names no scheduler: HAMi's webhook
writes ``schedulerName: hami-scheduler`` into it at creation, so that is the pod a HAMi
cluster holds (``kubectl get pod -o yaml`` shows it), and the one a user writes where
HAMi's webhook is off. The test creates it so, in the suite's namespace (as ``kubectl -n``
would), with no webhook in the way: under the chart's default name it waits, as it would
for any scheduler nobody runs; after the daemon and kube-scheduler restart as the chart
renders them with ``schedulerName=hami-scheduler`` (kube-scheduler's profile, the daemon's
``--scheduler-name``) the same pod, left waiting, is bound, its schedulerName untouched and
its Events from ``hami-scheduler``, as HAMi's are.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import yaml

from harness.controlplane import chart_scheduler_config, wait_for
from tests.e2e.controlplane import LEASE_NAME, NODE, SYSTEM_NAMESPACE, ControlPlane
from tests.e2e.pods import HAMI_EXAMPLE, ClusterLab

HAMI_EXAMPLE_SHA256 = "38d1437c530a6d763f7e593c2c9e1a16fa1f609a7644e83c9b164c8086f30159"
HAMI_NAME = "hami-scheduler"
# Long enough for kube-scheduler and the daemon to have placed a pod they serve (the
# suite's pods are bound well within a second).
WAITING_S = 3.0


def hamis_pod() -> dict[str, Any]:
    """HAMi's example as a HAMi cluster holds it: with the name HAMi's webhook writes."""
    manifest: dict[str, Any] = yaml.safe_load(HAMI_EXAMPLE.read_text())
    manifest["spec"]["schedulerName"] = HAMI_NAME
    return manifest


def test_hamis_example_is_as_hami_ships_it() -> None:
    assert hashlib.sha256(HAMI_EXAMPLE.read_bytes()).hexdigest() == HAMI_EXAMPLE_SHA256
    example = yaml.safe_load(HAMI_EXAMPLE.read_text())
    assert "schedulerName" not in example["spec"]
    assert example["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}


def test_a_pod_naming_hamis_scheduler_waits_under_pyhamis_name_and_is_bound_under_hamis(
        lab: ClusterLab, control_plane: ControlPlane) -> None:
    pod = hamis_pod()
    name = pod["metadata"]["name"]
    lab.create_manifest(pod)
    time.sleep(WAITING_S)
    lab.assert_pending(name)  # the chart's default serves pyhami-scheduler only

    # The move, HAMi gone (none runs here): pyhami under HAMi's name, as the chart renders it.
    config = control_plane.rendered_scheduler_config(
        chart_scheduler_config(control_plane.bin_dir, [f"schedulerName={HAMI_NAME}"]))
    assert [profile["schedulerName"] for profile in config["profiles"]] == [HAMI_NAME]
    # As the chart renders the daemon: its Lease is kube-scheduler's, named after the
    # release, whatever name the pods ask for.
    control_plane.restart_scheduler("--scheduler-name", HAMI_NAME,
                                    "--leader-lease", f"{SYSTEM_NAMESPACE}/{LEASE_NAME}",
                                    nodes=1, scheduler_config=config)
    try:
        placed = lab.wait_placed(name)
        assert placed.node == NODE
        assert placed.card >= 0  # one container, one card
        # 3000 MiB and 30 % of the card's cores, in HAMi's allocation annotation.
        assert placed.allocated.split(":")[0].split(",")[2:] == ["3000", "30"], placed.allocated
        assert lab.read(name)["spec"]["schedulerName"] == HAMI_NAME
        uid = lab.read(name)["metadata"]["uid"]
        # This pod's, by its uid: an earlier test may have created one of the same name.
        event = wait_for(lambda: next((e for e in lab.events(name)
                                       if e.get("reason") == "BindingSucceed"
                                       and e["involvedObject"].get("uid") == uid), None),
                         f"the BindingSucceed Event of {name}", watch=lab.plane.all_processes())
        assert event["source"]["component"] == HAMI_NAME
    finally:
        control_plane.restart_scheduler(nodes=1)
