"""The suite's daemon serves its extender with mutual TLS, as the chart's values
``scheduler.extender.tls`` configure it: kube-scheduler, presenting its certificate, places
pods (every lab test goes through it), while a caller without that certificate gets no
answer at all. The kubelet's probes are answered on the metrics port, without one.
"""

from __future__ import annotations

import http.client
from pathlib import Path

import pytest

from pyhami.bench.loopback import http_get
from tests.certs import certificate_authority, client_files
from tests.e2e.controlplane import NODE, ControlPlane, http_post_json
from tests.e2e.pods import ClusterLab, lab_pod


def filter_args(name: str) -> dict[str, object]:
    """A pod asking for no GPU: answered with every node, nothing reserved."""
    pod = lab_pod(name)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "100m"}}
    return {"Pod": pod, "NodeNames": [NODE]}


def test_kube_scheduler_places_a_pod_through_the_mutual_tls_extender(lab: ClusterLab) -> None:
    placement = lab.place("over-tls")
    assert placement.node == NODE
    extender = lab.plane.statusz()["extender"]
    assert extender["tls"] == "mutual", extender
    assert extender["listen"] == f"127.0.0.1:{lab.plane.daemon_port}"


def test_a_caller_without_kube_schedulers_certificate_gets_no_answer(
        control_plane: ControlPlane, tmp_path: Path) -> None:
    pki = control_plane.extender_pki
    stranger = client_files(tmp_path, certificate_authority(tmp_path, "other-ca"), "stranger")
    https = f"{control_plane.daemon_url}/filter"
    plain = https.replace("https://", "http://")
    callers = {"plain HTTP": (plain, None),
               "HTTPS without a certificate": (https, pki.client_context(None)),
               "HTTPS with another CA's certificate": (https, pki.client_context(stranger))}
    for who, (url, context) in callers.items():
        with pytest.raises((OSError, http.client.HTTPException)):
            answer = http_post_json(url, filter_args("intruder"), context=context)
            pytest.fail(f"{who} was answered: {answer}")
    status, answer = control_plane.post_extender("/filter", filter_args("intruder"))
    assert status == 200 and answer["NodeNames"] == [NODE], answer


def test_the_probes_are_answered_on_the_metrics_port(control_plane: ControlPlane) -> None:
    metrics = f"http://127.0.0.1:{control_plane.metrics_port}"
    assert http_get(f"{metrics}/healthz") == (200, b"ok\n")
    assert http_get(f"{metrics}/readyz") == (200, b"ready\n")
