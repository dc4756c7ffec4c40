"""``pyhami bench extender``'s no-op floor (``pyhami.bench.floor``): the daemon's listener
and /filter's decoding with no decision, in a process of the bench's own; the daemon
itself serves no /noop and has no switch for it."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from pyhami.bench.loopback import direct_opener
from pyhami.cli import build_parser
from pyhami.natsserver import free_port

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "bench"},
       "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}


@pytest.fixture(scope="module")
def floor() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "pyhami.bench.floor", str(port)],
                               stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == b"ready"
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()


def post(url: str, body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with direct_opener().open(request, timeout=10) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), bytes(error.read())


def test_noop_decodes_as_filter_does_and_answers_the_first_node(floor: str) -> None:
    body = json.dumps({"Pod": POD, "NodeNames": ["node-a", "node-b"]}).encode()
    status, answer = post(f"{floor}/noop", body)
    assert status == 200
    assert json.loads(answer)["NodeNames"] == ["node-a"]


@pytest.mark.parametrize("body", [
    b"{", json.dumps({"Pod": {**POD, "metadata": {"name": "Not A Name!"}},
                      "NodeNames": ["node-a"]}).encode()],
    ids=["not-json", "bad-pod-name"])
def test_a_body_filter_would_refuse_is_refused(floor: str, body: bytes) -> None:
    status, answer = post(f"{floor}/noop", body)
    assert status == 400
    assert answer.startswith(b"malformed ExtenderArgs: ")


def test_the_floor_serves_no_other_verb(floor: str) -> None:
    assert post(f"{floor}/filter", b"{}")[0] == 404


def test_the_daemon_has_no_benchmark_switch() -> None:
    scheduler = next(action for action in build_parser({}, only="scheduler")._actions
                     if action.dest == "command").choices["scheduler"]
    flags = {flag for action in scheduler._actions for flag in action.option_strings}
    assert "--listen" in flags
    assert not any("noop" in flag for flag in flags)
