"""``pyhami bench extender``'s load generator (``pyhami.bench.load``): the bytes it sends,
how it reads answers, how it spreads the throughput phase, and its workers driven against
the daemon's own HTTP layer with stand-in verbs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from aiohttp import web

from pyhami.bench.extender import drive, pod, spread
from pyhami.bench.load import (
    AnswerReader,
    BenchError,
    BenchPod,
    Job,
    Phase,
    check,
    filter_body,
    nodes_to_score,
    offered_windows,
    request,
)
from pyhami.natsserver import free_port
from scheduler.web.extender import JSON, TEXT, Answer, BodyVerb
from scheduler.web.fastpath import VerbsServer

NAMES = ["node-a", "node-b", "node-c"]


@pytest.mark.parametrize(("total", "scored"), [
    (3, 3), (99, 99), (100, 100), (200, 100), (1000, 420), (5000, 500), (6000, 300),
    (15000, 750), (100000, 5000),
])
def test_kube_scheduler_scores_its_adaptive_share_of_the_nodes(total: int,
                                                               scored: int) -> None:
    # kube-scheduler's numFeasibleNodesToFind with percentageOfNodesToScore unset:
    # 50 - total/125 percent, at least 5 %, at least 100 nodes.
    assert nodes_to_score(total) == scored


def test_each_filter_is_sent_the_next_window_of_the_rotation() -> None:
    names = [f"n{i}" for i in range(10)]
    windows = [json.loads(window) for window in offered_windows(names, 4)]
    # Starts where the last search stopped, wrapping; the rotation repeats after 5.
    assert windows == [["n0", "n1", "n2", "n3"], ["n4", "n5", "n6", "n7"],
                       ["n8", "n9", "n0", "n1"], ["n2", "n3", "n4", "n5"],
                       ["n6", "n7", "n8", "n9"]]
    assert offered_windows(names, 10) == [json.dumps(names).encode()]
    assert offered_windows(names, 50) == [json.dumps(names).encode()]


@pytest.mark.parametrize("names", [NAMES, [], [f"node-{i:05d}" for i in range(5000)]],
                         ids=["three", "none", "5000"])
def test_the_filter_body_is_what_json_dumps_writes(names: list[str]) -> None:
    manifest = pod("p-1", "bench-07")
    expected = json.dumps({"Pod": manifest, "Nodes": None, "NodeNames": names}).encode()
    assert filter_body(manifest, json.dumps(names).encode()) == expected


def http_answer(status: int, body: bytes, extra: bytes = b"") -> bytes:
    return (f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n".encode() + extra
            + f"content-length: {len(body)}\r\n\r\n".encode() + body)


TWO = http_answer(200, b'{"a":1}') + http_answer(503, b"standby\n", b"Connection: close\r\n")


@pytest.mark.parametrize("cut", [1, 10, len(TWO) // 2, len(TWO) - 1, len(TWO)],
                         ids=["first-byte", "in-the-head", "middle", "last-byte-missing", "whole"])
def test_answers_are_taken_whole_however_the_bytes_arrive(cut: int) -> None:
    reader = AnswerReader()
    taken = []
    for piece in (TWO[:cut], TWO[cut:]):
        reader.feed(piece)
        while (answer := reader.take()) is not None:
            taken.append((answer.status, answer.body))
    assert taken == [(200, b'{"a":1}'), (503, b"standby\n")]


def test_an_answer_without_a_length_is_refused() -> None:
    reader = AnswerReader()
    reader.feed(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nok")
    with pytest.raises(BenchError, match="without a Content-Length"):
        reader.take()


@pytest.mark.parametrize(("status", "body", "message"), [
    pytest.param(503, b"standby: the leader is b\n", "POST /filter answered 503: standby: the "
                 "leader is b", id="503-with-reason"),
    pytest.param(404, b"", "POST /filter answered 404", id="404-empty"),
    pytest.param(500, b"500 Internal Server Error\nmore\n",
                 "POST /filter answered 500: 500 Internal Server Error", id="first-line-only"),
])
def test_an_answer_other_than_2xx_is_one_line_naming_it(status: int, body: bytes,
                                                        message: str) -> None:
    reader = AnswerReader()
    reader.feed(http_answer(status, body))
    answer = reader.take()
    assert answer is not None
    with pytest.raises(BenchError) as raised:
        check("/filter", answer)
    assert str(raised.value) == message


def test_a_request_is_head_and_body_with_its_length() -> None:
    sent = request("127.0.0.1", 8888, "/filter", b'{"x": 1}')
    assert sent == (b"POST /filter HTTP/1.1\r\nHost: 127.0.0.1:8888\r\n"
                    b"Content-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"x\": 1}")


@pytest.mark.parametrize(("pods", "concurrency", "processes", "expected"), [
    pytest.param(6, 16, 4, [([0, 4], 4), ([1, 5], 4), ([2], 4), ([3], 4)], id="even"),
    pytest.param(5, 5, 2, [([0, 2, 4], 3), ([1, 3], 2)], id="uneven-connections"),
    pytest.param(4, 2, 4, [([0, 2], 1), ([1, 3], 1)], id="no-more-workers-than-connections"),
])
def test_the_throughput_phase_is_spread_over_the_workers(
        pods: int, concurrency: int, processes: int,
        expected: list[tuple[list[int], int]]) -> None:
    names = [f"p-{i}" for i in range(pods)]
    assert spread(names, concurrency, processes) == [
        ([f"p-{i}" for i in share], connections) for share, connections in expected]


class Daemon:
    """Stand-in verbs behind the daemon's HTTP layer: /filter offers the second node it
    is sent (or none, or a refusal), /bind records what it is asked."""

    def __init__(self) -> None:
        self.bound: list[tuple[str, str, str]] = []
        self.filtered = 0
        self.filter_answer: Answer | None = None

    async def noop(self, body: bytes) -> Answer:
        return Answer(200, JSON, b'{"NodeNames":["node-a"]}')

    async def filter(self, body: bytes) -> Answer:
        self.filtered += 1
        if self.filter_answer is not None:
            return self.filter_answer
        names = json.loads(body)["NodeNames"]
        return Answer(200, JSON, msgspec.json.encode({"NodeNames": names[1:2],
                                                      "FailedNodes": {}, "Error": ""}))

    async def bind(self, body: bytes) -> Answer:
        args: dict[str, Any] = json.loads(body)
        self.bound.append((args["PodName"], args["PodUID"], args["Node"]))
        return Answer(200, JSON, b'{"Error":""}')


@pytest.fixture
async def daemon() -> AsyncIterator[tuple[Daemon, int]]:
    stand_in = Daemon()
    verbs: dict[str, BodyVerb] = {"/noop": stand_in.noop, "/filter": stand_in.filter,
                                  "/bind": stand_in.bind}
    port = free_port()
    server = await VerbsServer.start(web.Application(), verbs, ("127.0.0.1", port), None)
    yield stand_in, port
    await server.cleanup()


def job(port: int, phase: Phase, pods: range, connections: int = 1) -> Job:
    return Job(host="127.0.0.1", port=port, phase=phase, names=NAMES, connections=connections,
               pods=[BenchPod(pod(f"p-{i}"), f"uid-{i}") for i in pods])


@pytest.mark.parametrize(("shares", "connections"), [
    pytest.param([range(5)], 1, id="one-worker-sequential"),
    pytest.param([range(0, 7), range(7, 12)], 3, id="two-workers-three-connections-each"),
])
async def test_every_pod_is_filtered_then_bound_where_the_filter_said(
        daemon: tuple[Daemon, int], shares: list[range], connections: int) -> None:
    stand_in, port = daemon
    driven = await drive([job(port, "pairs", share, connections) for share in shares])
    pods = [i for share in shares for i in share]
    assert sorted(stand_in.bound) == sorted((f"p-{i}", f"uid-{i}", "node-b") for i in pods)
    assert len(driven.timings.filter) == len(driven.timings.bind) == len(pods)
    assert all(ns > 0 for ns in driven.timings.filter + driven.timings.bind)
    assert driven.timings.noop == []


async def test_the_noop_phase_calls_only_noop(daemon: tuple[Daemon, int]) -> None:
    stand_in, port = daemon
    driven = await drive([job(port, "noop", range(4))])
    assert len(driven.timings.noop) == 4
    assert (stand_in.filtered, stand_in.bound) == (0, [])


@pytest.mark.parametrize(("answer", "message"), [
    pytest.param(Answer(503, TEXT, b"standby: the leader is b\n"),
                 "POST /filter answered 503: standby: the leader is b", id="refused"),
    pytest.param(Answer(200, JSON, b'{"NodeNames":[],"FailedNodes":{"node-a":"full"}}'),
                 "pod p-0 found no node: {'node-a': 'full'}", id="no-node"),
])
async def test_a_failed_filter_stops_the_run_in_one_line(
        daemon: tuple[Daemon, int], answer: Answer, message: str) -> None:
    stand_in, port = daemon
    stand_in.filter_answer = answer
    with pytest.raises(BenchError) as raised:
        await drive([job(port, "pairs", range(3))])
    assert str(raised.value) == message
    assert stand_in.bound == []


async def test_a_refused_connection_is_one_line() -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(BenchError) as raised:
        await drive([job(port, "noop", range(1))])
    assert str(raised.value) == f"cannot connect to 127.0.0.1:{port}: Connection refused"
