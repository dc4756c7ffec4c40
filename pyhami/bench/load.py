"""The load generator of ``pyhami bench extender``: kube-scheduler's /filter and /bind,
and the no-op floor, played over raw HTTP/1.1 sockets from processes of their own.

aiohttp's client in the bench's own process cost more than the daemon's HTTP layer it
was to measure: its no-op floor (0.43 ms at 5,000 names) was mostly the client. Here each
request is its head and body written at once on a kept-alive connection with
``TCP_NODELAY``, and its answer read by its Content-Length; the clock is
``perf_counter_ns`` around that exchange alone. The sequential phases run in one process
of their own; the throughput phase spreads its connections over several, so that no
client process shares the event loop of another connection's answers.

A worker is started as ``python -m pyhami.bench.load``: it reads its ``Job`` (one JSON
line) from stdin, connects, prints ``ready``, waits for a ``go`` line, runs, and prints
its ``Timings`` as one JSON line; on failure it prints one line to stderr and exits 1.
The module imports little, so that a worker starts in a fraction of a second.
"""

from __future__ import annotations

import json
import selectors
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Any, Literal

import msgspec

from common.core.errors import PyhamiError

Phase = Literal["noop", "pairs"]

READ_SIZE = 1 << 18
"""Bytes asked of the socket at a time: a /filter answer refusing 5,000 nodes fits."""


class BenchError(PyhamiError):
    """The bench cannot go on: the message is one line for the user."""


class BenchPod(msgspec.Struct, array_like=True):
    """A pod the daemon knows (submitted through its pod API): the manifest /filter sends
    and the uid /bind names."""

    manifest: dict[str, Any]
    uid: str


MIN_FEASIBLE_NODES = 100
"""kube-scheduler's ``minFeasibleNodesToFind``: below this many nodes it scores them all."""
MIN_FEASIBLE_PERCENTAGE = 5
"""kube-scheduler's ``minFeasibleNodesPercentageToFind``."""
BASE_PERCENTAGE = 50
"""kube-scheduler's ``basePercentageOfNodesToScore``: the adaptive share starts there and
falls by one point per 125 nodes."""


def nodes_to_score(total: int) -> int:
    """How many feasible nodes kube-scheduler looks for in a cluster of ``total`` nodes
    with ``percentageOfNodesToScore`` left at its default (adaptive), which is how many
    node names an extender's /filter is sent when every node is feasible: all of them up
    to 100 nodes, else ``50 - total/125`` percent (at least 5 %, at least 100 nodes):
    420 of 1,000, 500 of 5,000, 750 of 15,000."""
    if total < MIN_FEASIBLE_NODES:
        return total
    percentage = max(BASE_PERCENTAGE - total // 125, MIN_FEASIBLE_PERCENTAGE)
    return max(total * percentage // 100, MIN_FEASIBLE_NODES)


def offered_windows(names: Sequence[str], share: int) -> list[bytes]:
    """The NodeNames kube-scheduler sends one /filter after another, each already encoded:
    ``share`` names from where the last search stopped (it starts each cycle at the node
    after the last one it looked at), until the rotation repeats."""
    total = len(names)
    if share >= total:
        return [json.dumps(list(names)).encode()]
    windows = []
    start = 0
    while True:
        window = [names[(start + i) % total] for i in range(share)]
        windows.append(json.dumps(window).encode())
        start = (start + share) % total
        if start == 0:
            return windows


class OfferedNames:
    """The NodeNames of one /filter after another (``offered_windows``), in turn."""

    def __init__(self, names: Sequence[str], share: int) -> None:
        self._windows = offered_windows(names, share)
        self._sent = 0

    def next(self) -> bytes:
        window = self._windows[self._sent % len(self._windows)]
        self._sent += 1
        return window


class Job(msgspec.Struct):
    """What one worker process does: ``phase`` for each of ``pods``, in turn, over
    ``connections`` kept-alive connections to ``host:port`` (each takes the next pod
    when its last is done), with ``share`` of ``names`` as each /filter's NodeNames, in
    kube-scheduler's rotation (``offered_windows``; every name when ``share`` is 0)."""

    host: str
    port: int
    phase: Phase
    names: list[str]
    pods: list[BenchPod]
    connections: int = 1
    share: int = 0


class Timings(msgspec.Struct):
    """Each exchange's time in nanoseconds, by verb, in the order they ended."""

    noop: list[int] = msgspec.field(default_factory=list)
    filter: list[int] = msgspec.field(default_factory=list)
    bind: list[int] = msgspec.field(default_factory=list)


class FilterAnswer(msgspec.Struct, rename="pascal"):
    node_names: list[str] | None = None
    failed_nodes: dict[str, str] | None = None
    error: str = ""


class BindAnswer(msgspec.Struct, rename="pascal"):
    error: str = ""


_filter_answer = msgspec.json.Decoder(FilterAnswer)
_bind_answer = msgspec.json.Decoder(BindAnswer)


def filter_body(manifest: dict[str, Any], names_json: bytes) -> bytes:
    """ExtenderArgs as ``json.dumps`` writes them, with NodeNames already encoded (the same
    bytes for every pod): both clients of the bench send exactly these bytes."""
    return b"".join((b'{"Pod": ', json.dumps(manifest).encode(),
                     b', "Nodes": null, "NodeNames": ', names_json, b"}"))


def bind_body(manifest: dict[str, Any], uid: str, node: str) -> bytes:
    metadata = manifest["metadata"]
    return json.dumps({"PodName": metadata["name"], "PodNamespace": metadata["namespace"],
                       "PodUID": uid, "Node": node}).encode()


def request(host: str, port: int, path: str, body: bytes) -> bytes:
    """One POST as kube-scheduler's Go client sends it, head and body together."""
    return b"".join((
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode(), body))


class Answer(msgspec.Struct):
    status: int
    body: bytes


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise BenchError(f"an answer without a Content-Length: {head[:200]!r}")


class AnswerReader:
    """Answers taken from the bytes a connection received, one at a time, by their
    Content-Length (the daemon's extender verbs always send one)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def take(self) -> Answer | None:
        """The next whole answer, or None until more bytes come."""
        buffer = self._buffer
        head_end = buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return None
        head = bytes(buffer[:head_end])
        end = head_end + 4 + _content_length(head)
        if len(buffer) < end:
            return None
        status_line = head.split(b"\r\n", 1)[0].split(b" ")
        if len(status_line) < 2 or not status_line[1].isdigit():
            raise BenchError(f"not an HTTP answer: {head[:200]!r}")
        answer = Answer(int(status_line[1]), bytes(buffer[head_end + 4:end]))
        del buffer[:end]
        return answer


def check(path: str, answer: Answer) -> bytes:
    """The answer's body, or ``BenchError`` naming a status other than 2xx."""
    if not 200 <= answer.status < 300:
        text = answer.body.decode(errors="replace").strip().splitlines()
        raise BenchError(f"POST {path} answered {answer.status}"
                        + (f": {text[0][:200]}" if text else ""))
    return answer.body


def connect(host: str, port: int) -> socket.socket:
    try:
        stream = socket.create_connection((host, port), timeout=60.0)
    except OSError as error:
        raise BenchError(f"cannot connect to {host}:{port}: "
                        f"{error.strerror or error}") from None
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return stream


class Connection:
    """One kept-alive connection and the exchange under way on it."""

    def __init__(self, stream: socket.socket) -> None:
        self.stream = stream
        self.reader = AnswerReader()
        self.path = ""
        self.started_ns = 0

    def send(self, path: str, data: bytes) -> None:
        self.path = path
        self.started_ns = time.perf_counter_ns()
        self.stream.sendall(data)

    def receive(self) -> None:
        try:
            data = self.stream.recv(READ_SIZE)
        except OSError as error:
            raise BenchError(f"POST {self.path}: {error.strerror or error}") from None
        if not data:
            raise BenchError(f"POST {self.path}: the server closed the connection "
                            "before answering")
        self.reader.feed(data)

    def wait(self) -> tuple[int, bytes]:
        """Block until the answer comes: its time in nanoseconds and its body."""
        while (answer := self.reader.take()) is None:
            self.receive()
        return time.perf_counter_ns() - self.started_ns, check(self.path, answer)


Flow = Generator[tuple[str, bytes], bytes, None]
"""One pod's exchanges: each request yielded as (path, request bytes), its answer's body
sent back in; a failure raised as ``BenchError``."""


class Flows:
    """The exchanges of a job's phase, pod by pod, with the times they took."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.timings = Timings()
        self._offered = OfferedNames(job.names, job.share or len(job.names))
        self._by_path = {"/noop": self.timings.noop, "/filter": self.timings.filter,
                         "/bind": self.timings.bind}

    def _post(self, path: str, body: bytes) -> tuple[str, bytes]:
        return path, request(self.job.host, self.job.port, path, body)

    def flow(self, pod: BenchPod) -> Flow:
        body = filter_body(pod.manifest, self._offered.next())
        if self.job.phase == "noop":
            yield self._post("/noop", body)
            return
        answer = _filter_answer.decode((yield self._post("/filter", body)))
        name = pod.manifest["metadata"]["name"]
        if answer.error or not answer.node_names:
            raise BenchError(f"pod {name} found no node: {answer.error or answer.failed_nodes}")
        bound = _bind_answer.decode(
            (yield self._post("/bind", bind_body(pod.manifest, pod.uid, answer.node_names[0]))))
        if bound.error:
            raise BenchError(f"bind {name}: {bound.error}")

    def record(self, path: str, elapsed_ns: int) -> None:
        self._by_path[path].append(elapsed_ns)


def _advance(flow: Flow, connection: Connection, body: bytes | None) -> bool:
    """Send the flow's next request on ``connection`` (its first with ``body`` None, else
    the one after the answer ``body``); False once the flow is done."""
    try:
        # A generator not yet started takes None as next() would.
        path, data = flow.send(body)  # type: ignore[arg-type]
    except StopIteration:
        return False
    connection.send(path, data)
    return True


def run_sequential(job: Job, stream: socket.socket) -> Timings:
    """One connection, one exchange at a time, blocking on each answer."""
    flows = Flows(job)
    connection = Connection(stream)
    for pod in job.pods:
        flow = flows.flow(pod)
        going = _advance(flow, connection, None)
        while going:
            elapsed, body = connection.wait()
            flows.record(connection.path, elapsed)
            going = _advance(flow, connection, body)
    return flows.timings


def run_concurrent(job: Job, streams: list[socket.socket]) -> Timings:
    """Several connections, each with one pod's exchanges in flight, the next pod taken
    as one finishes; the answers waited for together (``selectors``)."""
    flows = Flows(job)
    waiting = deque(job.pods)
    selector = selectors.DefaultSelector()
    active: dict[int, tuple[Connection, Flow]] = {}

    def start_next(connection: Connection) -> None:
        while waiting:
            flow = flows.flow(waiting.popleft())
            if _advance(flow, connection, None):
                active[connection.stream.fileno()] = (connection, flow)
                return
        active.pop(connection.stream.fileno(), None)
        selector.unregister(connection.stream)

    for stream in streams:
        selector.register(stream, selectors.EVENT_READ)
        start_next(Connection(stream))
    while active:
        for key, _ in selector.select():
            connection, flow = active[key.fd]
            connection.receive()
            while (answer := connection.reader.take()) is not None:
                flows.record(connection.path, time.perf_counter_ns() - connection.started_ns)
                if not _advance(flow, connection, check(connection.path, answer)):
                    start_next(connection)
                    break
    selector.close()
    return flows.timings


def work(job: Job, ready: Callable[[], None]) -> Timings:
    """Connect, call ``ready`` (which returns when the run is to start), run the job."""
    streams = [connect(job.host, job.port) for _ in range(job.connections)]
    try:
        ready()
        if job.connections == 1:
            return run_sequential(job, streams[0])
        return run_concurrent(job, streams)
    finally:
        for stream in streams:
            stream.close()


def main() -> int:
    stdin = sys.stdin.buffer

    def ready() -> None:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        if stdin.readline().strip() != b"go":
            raise BenchError("the bench stopped before the run started")

    try:
        job = msgspec.json.decode(stdin.readline(), type=Job)
        timings = work(job, ready)
    except BenchError as error:
        print(error, file=sys.stderr)
        return 1
    sys.stdout.buffer.write(msgspec.json.encode(timings) + b"\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
