"""A real control plane on this machine for the end-to-end suite.

etcd, kube-apiserver (token authentication, RBAC), kube-scheduler with the chart's
configuration (``k8s/``'s, with the extender's mutual TLS on), nats-server, one simulated
``pyhami agent`` and the ``pyhami scheduler`` daemon, each a process of its own on free
loopback ports. kube-scheduler calls the daemon over HTTPS with its client certificate,
the only caller the daemon answers there. There is no kube-controller-manager. The GPU
node of the suite is created through the API and its pods are bound, never run; a test may
add a real kubelet (``start_kubelet``) against a fake CRI runtime, which registers a node of
its own and runs its pods in the runtime's memory.

The binaries come from ``scripts/build-control-plane.sh`` (a cache outside the
repository, keyed by version).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import yaml

from common.certificates import write_bundle
from common.natsserver import free_port, nats_server_binary
from tests.certs import ClientFiles, ServerFiles, server_files

REPO = Path(__file__).resolve().parents[2]
K8S_DIR = REPO / "k8s"
CHART = REPO / "charts" / "pyhami"
BUILD_SCRIPT = REPO / "scripts" / "build-control-plane.sh"
SCHEDULER_CONFIG_MAP = K8S_DIR / "scheduler-config.yaml"
SCHEDULER_CONFIG_KEY = "config.yaml"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kubelet", "fake-cri", "helm")

SYSTEM_NAMESPACE = "pyhami-system"
SCHEDULER_SERVICE_ACCOUNT = "pyhami-scheduler"
SCHEDULER_NAME = "pyhami-scheduler"
LEASE_NAME = "pyhami-scheduler"
# The session's scheduler pod: the names of its two processes.
DAEMON = "pyhami-scheduler"
KUBE_SCHEDULER = "kube-scheduler"
# k8s/'s values, with the extender over HTTPS and kube-scheduler as its only caller.
EXTENDER_TLS_VALUES = ("scheduler.extender.tls.enabled=true",
                       "scheduler.extender.tls.secretName=pyhami-extender-tls",
                       "scheduler.extender.tls.clientSecretName=pyhami-kube-scheduler-tls")
NODE = "gpu-node-1"
# The node a real kubelet registers (start_kubelet), as a user system:node:<name> in group
# system:nodes with the ClusterRole system:node (the API server's Node authorizer is off).
KUBELET_NODE = "gpu-node-2"
KUBELET_USER = f"system:node:{KUBELET_NODE}"
KUBELET_ROLE_BINDING = "pyhami-e2e-kubelet"
# Where the kubelet serves the device plugin Registration (kubelet.sock) and looks for the
# plugins' sockets: fixed in the kubelet (v1beta1.DevicePluginPath), whatever its --root-dir.
# It empties the folder when it starts.
KUBELET_DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
AGENT_SERVICE_ACCOUNT = "pyhami-agent"
NATS_AUTH_SECRET = "pyhami-nats-auth"
AGENT_TOKEN_AUDIENCE = "pyhami-nats"
TEST_NAMESPACE = "pyhami-e2e"

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0
WAIT_S = 60.0
BUILD_TIMEOUT_S = 3600.0

T = TypeVar("T")


# The binaries ---------------------------------------------------------------------------


def go_command() -> str | None:
    """The go command the build script would use, if any."""
    found = shutil.which("go")
    if found:
        return found
    fallback = Path("/usr/local/go/bin/go")
    return str(fallback) if os.access(fallback, os.X_OK) else None


def binaries_dir() -> Path:
    """Where the build script puts (or has put) the binaries."""
    forced = os.environ.get("PYHAMI_CONTROL_PLANE_DIR")
    if forced:
        return Path(forced)
    printed = subprocess.run(["bash", str(BUILD_SCRIPT), "--print"], check=True,
                             capture_output=True, text=True, timeout=30).stdout
    return Path(printed.strip().splitlines()[-1])


def missing_binaries(directory: Path) -> list[str]:
    return [name for name in BINARIES if not os.access(directory / name, os.X_OK)]


def build_binaries(log: Path) -> Path:
    """Run the build script (minutes from scratch); raises ``RuntimeError`` when it fails."""
    env = dict(os.environ)
    go = go_command()
    if go is not None:
        env["GO"] = go
    with log.open("wb") as out:
        done = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=out, stderr=subprocess.STDOUT,
                              env=env, timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/build-control-plane.sh failed (exit {done.returncode}):\n"
                           f"{tail(log, 40)}")
    return binaries_dir()


def versions(directory: Path) -> tuple[str, str]:
    """(Kubernetes, etcd) versions the build script recorded beside the binaries."""
    lines = (directory / "VERSIONS").read_text().split()
    return lines[0], lines[1]


# The shipped scheduler configuration ---------------------------------------------------


def shipped_scheduler_config() -> str:
    """The KubeSchedulerConfiguration text inside the ConfigMap in ``k8s/``."""
    config_map = yaml.safe_load(SCHEDULER_CONFIG_MAP.read_text())
    text: str = config_map["data"][SCHEDULER_CONFIG_KEY]
    return text


def chart_scheduler_config(bin_dir: Path) -> str:
    """The KubeSchedulerConfiguration text the chart renders for ``k8s/``'s release and
    values with ``EXTENDER_TLS_VALUES``."""
    command = [str(bin_dir / "helm"), "template", "pyhami", str(CHART),
               "--namespace", SYSTEM_NAMESPACE, "--kube-version", versions(bin_dir)[0],
               "--values", str(CHART / "ci" / "k8s-values.yaml"),
               "--show-only", "templates/scheduler-config.yaml"]
    for value in EXTENDER_TLS_VALUES:
        command += ["--set", value]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed:\n{done.stderr}")
    text: str = yaml.safe_load(done.stdout)["data"][SCHEDULER_CONFIG_KEY]
    return text


@dataclass(frozen=True)
class ExtenderPki:
    """The extender's mutual TLS in the suite: the daemon's certificate for 127.0.0.1 and
    the CA that signed it, the CA of its callers and kube-scheduler's certificate."""

    server: ServerFiles
    client_ca: Path
    kube_scheduler: ClientFiles

    @classmethod
    def make(cls, directory: Path) -> ExtenderPki:
        """As a user makes them: ``pyhami certs init`` (one CA signs the daemon's and
        kube-scheduler's certificates)."""
        bundle = write_bundle(directory, dns=("localhost",), ips=("127.0.0.1",), days=1)
        return cls(ServerFiles(bundle.ca, bundle.extender, bundle.extender_key), bundle.ca,
                   ClientFiles(bundle.kube_scheduler, bundle.kube_scheduler_key))

    def client_context(self, certificate: ClientFiles | None) -> ssl.SSLContext:
        """A client trusting the daemon's CA, presenting ``certificate`` if any."""
        context = ssl.create_default_context(cafile=str(self.server.ca))
        if certificate is not None:
            context.load_cert_chain(str(certificate.cert), str(certificate.key))
        return context


def render_scheduler_config(text: str, *, extender_url: str, kubeconfig: str,
                            tls: ExtenderPki) -> dict[str, Any]:
    """The chart's configuration with only the extender URL, its certificate files and
    the kubeconfig path set."""
    rendered: dict[str, Any] = yaml.safe_load(text)
    rendered["clientConnection"]["kubeconfig"] = kubeconfig
    (extender,) = rendered["extenders"]
    extender["urlPrefix"] = extender_url
    extender["tlsConfig"].update(caFile=str(tls.server.ca), certFile=str(tls.kube_scheduler.cert),
                                 keyFile=str(tls.kube_scheduler.key))
    return rendered


def shipped_kube_scheduler_flags() -> list[str]:
    """The flags the scheduler Deployment gives kube-scheduler, but its --config."""
    for doc in manifests():
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == SCHEDULER_NAME:
            for container in doc["spec"]["template"]["spec"]["containers"]:
                if container["name"] == "kube-scheduler":
                    command: list[str] = container["command"]
                    return [flag for flag in command[1:] if not flag.startswith("--config=")]
    raise LookupError(f"k8s/ has no Deployment {SCHEDULER_NAME} with a kube-scheduler")


def manifests() -> list[dict[str, Any]]:
    """Every object in ``k8s/``, the Namespace first."""
    documents: list[dict[str, Any]] = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        documents.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return sorted(documents, key=lambda doc: doc["kind"] != "Namespace")


# The API, as kubectl speaks it --------------------------------------------------------------


class ApiError(Exception):
    """An answer of the API server with an error status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status


class KubeApi:
    """A minimal typed REST client for the API server: JSON in, JSON out."""

    def __init__(self, server: str, token: str, ca_file: Path) -> None:
        self.server = server
        self._token = token
        self._opener = _opener(ssl.create_default_context(cafile=str(ca_file)))
        self._resources: dict[tuple[str, str], tuple[str, bool]] = {}

    def send(self, method: str, path: str, body: object = None, *,
             query: dict[str, str] | None = None,
             content_type: str = "application/json") -> bytes:
        """The raw answer; raises ``ApiError`` for an error status."""
        url = f"{self.server}{path}" + (f"?{urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Bearer {self._token}", "Content-Type": content_type,
            "Accept": "application/json"})
        try:
            with self._opener.open(request, timeout=30) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as error:
            raise ApiError(method, path, error.code,
                           error.read().decode(errors="replace")) from None

    def request(self, method: str, path: str, body: object = None, *,
                query: dict[str, str] | None = None,
                content_type: str = "application/json") -> dict[str, Any]:
        answer = self.send(method, path, body, query=query, content_type=content_type)
        document: dict[str, Any] = json.loads(answer or b"{}")
        return document

    def get(self, path: str, **query: str) -> dict[str, Any]:
        return self.request("GET", path, query=query or None)

    def create(self, path: str, body: object) -> dict[str, Any]:
        return self.request("POST", path, body)

    def merge_patch(self, path: str, body: object) -> dict[str, Any]:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, **query: str) -> dict[str, Any]:
        return self.request("DELETE", path, query=query or None)

    def path(self, api_version: str, kind: str, namespace: str | None = None,
             name: str | None = None) -> str:
        """The REST path of a kind (and an object of it), found by discovery like kubectl."""
        key = (api_version, kind)
        if key not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            for resource in self.get(base)["resources"]:
                if "/" not in resource["name"]:
                    self._resources[(api_version, resource["kind"])] = (
                        resource["name"], bool(resource["namespaced"]))
        plural, namespaced = self._resources[key]
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        where = f"/namespaces/{quote(namespace)}" if namespaced and namespace else ""
        return f"{base}{where}/{plural}" + (f"/{quote(name)}" if name else "")

    def namespaced(self, api_version: str, kind: str) -> bool:
        self.path(api_version, kind)
        return self._resources[(api_version, kind)][1]


def allowed(api: KubeApi, user: str, verb: str, resource: str, *,
            group: str = "", namespace: str | None = None, name: str | None = None,
            subresource: str | None = None) -> bool:
    """Whether the ServiceAccount ``user`` may do this, as a SubjectAccessReview answers."""
    namespace_of_user = user.split(":")[2]
    review = api.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user,
                 "groups": ["system:serviceaccounts",
                            f"system:serviceaccounts:{namespace_of_user}",
                            "system:authenticated"],
                 "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                        "namespace": namespace, "name": name,
                                        "subresource": subresource}}})
    return bool(review["status"].get("allowed"))


# Processes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DaemonPorts:
    """Where one ``pyhami scheduler`` listens: its extender (mutual TLS), its metrics and
    probes, its webhook."""

    extender: int
    metrics: int
    webhook: int

    @classmethod
    def free(cls) -> DaemonPorts:
        return cls(free_port(), free_port(), free_port())

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.extender}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics}"


def in_uts_namespace(hostname: str) -> list[str]:
    """The prefix that runs a command in a UTS namespace of its own under ``hostname`` (as
    root); raises ``RuntimeError`` when this machine does not allow it."""
    probe = subprocess.run(["unshare", "--uts", "hostname", hostname], capture_output=True,
                           text=True, timeout=30, check=False)
    if probe.returncode != 0:
        raise RuntimeError(f"unshare --uts cannot run a process under the host name "
                           f"{hostname} here (it needs root, or CAP_SYS_ADMIN): "
                           f"{probe.stderr.strip()}")
    # The shell names the host, then becomes the command: one process, in its own group.
    return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: be killed when the test process dies, even by SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path} unreadable)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Process:
    """One child process in a session of its own, its output in ``log``."""

    name: str
    command: list[str]
    log: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        with self.log.open("ab") as out:
            out.write(f"--- {' '.join(self.command)}\n".encode())
            out.flush()
            # preexec_fn only calls prctl: safe although the test process has threads.
            self.popen = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, start_new_session=True,
                preexec_fn=_die_with_parent)  # noqa: PLW1509
        return self

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check_running(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            raise AssertionError(f"{self.name} exited with code {self.popen.returncode}; "
                                 f"its log ({self.log}) ends:\n{tail(self.log)}")

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``; the whole process group."""
        popen, self.popen = self.popen, None
        if popen is None:
            return None
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGTERM)
            try:
                popen.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait(STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError):  # anything it left in its group
            os.killpg(popen.pid, signal.SIGKILL)
        return popen.returncode

    def kill(self) -> None:
        """SIGKILL to the whole process group at once: no chance to clean up, as when its
        node dies. Not running afterwards, so no wait watches it any more."""
        popen, self.popen = self.popen, None
        assert popen is not None and popen.poll() is None, f"{self.name} is not running"
        os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(STOP_TIMEOUT_S)

    def describe(self) -> str:
        return f"{self.name} log ({self.log}) ends:\n{tail(self.log)}"


def wait_for(check: Callable[[], T | None], what: str, timeout: float = WAIT_S,
              interval: float = 0.2, watch: Sequence[Process] = ()) -> T:
    """Poll ``check`` until it returns something other than None/False; bounded."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        for process in watch:
            process.check_running()
        try:
            value = check()
        except (ApiError, OSError, urllib.error.URLError, ValueError) as error:
            value, last_error = None, error
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            logs = "\n".join(p.describe() for p in watch)
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{detail}"
                                 + (f"\n{logs}" if logs else ""))
        time.sleep(interval)


def _opener(context: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """Straight to the loopback address, whatever proxy the environment names."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


def http_get(url: str, *, context: ssl.SSLContext | None = None,
             timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with _opener(context).open(url, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), bytes(error.read())


def http_post_json(url: str, body: object, *, context: ssl.SSLContext | None = None,
                   timeout: float = 10.0) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with _opener(context).open(request, timeout=timeout) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode(errors="replace")


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def recorded_env(request: dict[str, Any]) -> dict[str, str]:
    """The environment of a CreateContainer request the fake runtime recorded (a CRI
    KeyValue's value is bytes, which protojson writes in base64)."""
    return {pair["key"]: base64.b64decode(pair.get("value", "")).decode()
            for pair in request["config"].get("envs", [])}


def serving_unix(path: Path) -> bool:
    """Whether something accepts connections on the unix socket ``path``."""
    if not path.is_socket():
        return False
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False  # left by a process that is gone
    return True


def _mounted(path: Path) -> bool:
    """Whether something is mounted on ``path``, a bind mount of its own folder included
    (which ``os.path.ismount`` does not see)."""
    with open("/proc/self/mountinfo") as mounts:
        return any(line.split()[4] == str(path) for line in mounts)


def write_kubeconfig(path: Path, *, server: str, ca_file: Path, user: str, token: str) -> Path:
    document = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server,
                                                  "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(document))
    path.chmod(0o600)
    return path


# The control plane ------------------------------------------------------------------------


@dataclass
class ControlPlane:
    bin_dir: Path
    logs: Path
    data: Path
    processes: dict[str, Process] = field(default_factory=dict)
    nats_url: str = ""
    etcd_url: str = ""
    api_port: int = 0
    scheduler_port: int = 0
    daemon_port: int = 0
    metrics_port: int = 0
    webhook_port: int = 0
    # The webhook's serving certificate, for 127.0.0.1: no Service routes here.
    webhook_tls: ServerFiles | None = None
    extender_tls: ExtenderPki | None = None
    # The chart's kube-scheduler configuration (EXTENDER_TLS_VALUES), as helm rendered it.
    chart_config: str = ""
    admin_kubeconfig: Path = Path()
    scheduler_kubeconfig: Path = Path()
    scheduler_config: dict[str, Any] = field(default_factory=dict)
    kube: KubeApi | None = None
    created: list[dict[str, Any]] = field(default_factory=list)
    # The token the API server knows the kubelet's node identity by (tokens.csv).
    kubelet_token: str = ""
    # The scheduler pod's ServiceAccount token (kube-scheduler and the daemon use it).
    scheduler_token: str = ""

    # Start and stop ---------------------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def daemon_url(self) -> str:
        return f"https://127.0.0.1:{self.daemon_port}"

    @property
    def extender_pki(self) -> ExtenderPki:
        assert self.extender_tls is not None, "the daemon is not started"
        return self.extender_tls

    @property
    def as_kube_scheduler(self) -> ssl.SSLContext:
        """A client of the extender as kube-scheduler is: with its certificate."""
        return self.extender_pki.client_context(self.extender_pki.kube_scheduler)

    def extender_tls_flags(self) -> list[str]:
        """``pyhami explain``'s flags to call the daemon as kube-scheduler does."""
        pki = self.extender_pki
        return ["--daemon-ca", str(pki.server.ca), "--daemon-cert",
                str(pki.kube_scheduler.cert), "--daemon-key", str(pki.kube_scheduler.key)]

    def post_extender(self, path: str, body: object) -> tuple[int, Any]:
        """POST to the daemon's extender as kube-scheduler would."""
        return http_post_json(f"{self.daemon_url}{path}", body, context=self.as_kube_scheduler)

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}/webhook"

    @property
    def ca_file(self) -> Path:
        return self.data / "apiserver-certs" / "apiserver.crt"

    @property
    def api(self) -> KubeApi:
        """The API as the cluster's administrator (system:masters)."""
        assert self.kube is not None, "the API server is not started"
        return self.kube

    def start(self) -> None:
        self._start_etcd()
        self._start_apiserver()
        self._prepare_cluster()
        # The daemon makes the NATS credentials (a Secret) the server's configuration includes.
        self._launch_daemon()
        self._start_nats()
        self.start_agent()
        self._wait_daemon_ready()
        self.start_kube_scheduler()

    def stop(self) -> None:
        """Every process, newest first; always safe to call."""
        for name in reversed(list(self.processes)):
            self.processes[name].stop()
        self._unmount_kubelet_root()

    def process(self, name: str) -> Process:
        return self.processes[name]

    def all_processes(self) -> list[Process]:
        return [p for p in self.processes.values() if p.popen is not None]

    def _run(self, name: str, command: list[str], env: dict[str, str] | None = None) -> Process:
        process = Process(name, command, self.logs / f"{name}.log", env=env).start()
        self.processes[name] = process
        return process

    def _start_etcd(self) -> None:
        client_port, peer_port = free_port(), free_port()
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self.etcd_url = client_url
        etcd = self._run("etcd", [
            str(self.bin_dir / "etcd"), "--name", "e2e",
            "--data-dir", str(self.data / "etcd"),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"e2e={peer_url}", "--initial-cluster-state", "new",
            "--log-level", "warn", "--unsafe-no-fsync",
        ])
        wait_for(lambda: http_get(f"{client_url}/health")[0] == 200, "etcd /health",
                 START_TIMEOUT_S, watch=[etcd])

    def _start_apiserver(self) -> None:
        certs = self.data / "apiserver-certs"
        certs.mkdir()
        key, public = self.data / "sa.key", self.data / "sa.pub"
        _openssl("genrsa", "-out", str(key), "2048")
        _openssl("rsa", "-in", str(key), "-pubout", "-out", str(public))
        # A client CA (also for the front proxy's request headers, as kubeadm sets them up):
        # the API server publishes both in kube-system/extension-apiserver-authentication,
        # which kube-scheduler reads to authenticate its own callers (its RBAC allows it).
        client_ca = self.data / "client-ca.crt"
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                 "-subj", "/CN=pyhami-e2e-client-ca", "-keyout", str(self.data / "client-ca.key"),
                 "-out", str(client_ca))
        admin_token = os.urandom(16).hex()
        tokens = self.data / "tokens.csv"
        self.kubelet_token = os.urandom(16).hex()
        tokens.write_text(f'{admin_token},e2e-admin,e2e-admin,"system:masters"\n'
                          f'{self.kubelet_token},{KUBELET_USER},{KUBELET_USER},"system:nodes"\n')
        tokens.chmod(0o600)
        self.api_port = free_port()
        apiserver = self._run("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            f"--secure-port={self.api_port}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # The Endpoints of the kubernetes Service may not be a loopback address.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={certs}",
            f"--token-auth-file={tokens}",
            f"--client-ca-file={client_ca}",
            f"--requestheader-client-ca-file={client_ca}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--authorization-mode=RBAC",
            "--service-cluster-ip-range=10.96.0.0/24",
            f"--service-account-key-file={public}",
            f"--service-account-signing-key-file={key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--v=1",
        ])
        self.admin_kubeconfig = write_kubeconfig(
            self.data / "admin.kubeconfig", server=self.server, ca_file=self.ca_file,
            user="e2e-admin", token=admin_token)

        def ready() -> bool:
            if not self.ca_file.exists():
                return False
            self.kube = KubeApi(self.server, admin_token, self.ca_file)
            return self.kube.send("GET", "/readyz") == b"ok"  # ApiError until it is ready

        wait_for(ready, "kube-apiserver /readyz", START_TIMEOUT_S, interval=0.5,
                 watch=[apiserver])

    def _prepare_cluster(self) -> None:
        """The manifests of k8s/, the test namespace, the GPU node, the ServiceAccount token."""
        api = self.api
        # The bootstrap RBAC roles kube-scheduler is bound to come from a post-start hook.
        wait_for(lambda: api.get(
                     "/apis/rbac.authorization.k8s.io/v1/clusterroles/system:kube-scheduler"),
                 "the bootstrap ClusterRole system:kube-scheduler", START_TIMEOUT_S)
        self.created = self.apply_manifests()
        api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": TEST_NAMESPACE}})
        # No kube-controller-manager: the "default" ServiceAccount the admission plugin gives
        # every pod is created by hand.
        api.create(f"/api/v1/namespaces/{TEST_NAMESPACE}/serviceaccounts",
                   {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
        self.create_gpu_node()
        request = api.create(
            f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/serviceaccounts/"
            f"{SCHEDULER_SERVICE_ACCOUNT}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": 4 * 3600}})
        token: str = request["status"]["token"]
        self.scheduler_token = token
        self.scheduler_kubeconfig = write_kubeconfig(
            self.data / "pyhami-scheduler.kubeconfig", server=self.server, ca_file=self.ca_file,
            user=f"system:serviceaccount:{SYSTEM_NAMESPACE}:{SCHEDULER_SERVICE_ACCOUNT}",
            token=token)

    def apply_manifests(self) -> list[dict[str, Any]]:
        """Create every object of ``k8s/`` for real; returns them as the API stored them."""
        stored = []
        for doc in manifests():
            path = self.api.path(doc["apiVersion"], doc["kind"], doc["metadata"].get("namespace"))
            stored.append(self.api.create(path, doc))
        return stored

    def create_gpu_node(self) -> None:
        self.api.create("/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "labels": {
                "kubernetes.io/hostname": NODE, "kubernetes.io/os": "linux", "gpu": "on"}}})
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # What a kubelet and the device plugin would report: 4 cards split 10 ways.
        resources = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "40"}
        # The NodeNotReady taint the API server puts on a new node is lifted by the node
        # lifecycle controller once the kubelet reports Ready; here the suite lifts it.
        self.api.merge_patch(f"/api/v1/nodes/{NODE}", {"spec": {"taints": None}})
        self.api.merge_patch(f"/api/v1/nodes/{NODE}/status", {"status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "no kubelet: set by the end-to-end suite",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
        }})

    def nats_flags(self) -> list[str]:
        """How a daemon reaches this NATS: as pyhami-daemon, with the Secret's password."""
        return ["--nats", self.nats_url, "--nats-auth-secret", NATS_AUTH_SECRET]

    def nats_auth(self) -> dict[str, str]:
        """The Secret the daemon made: issuer key, passwords, server configuration."""
        secret = self.api.get(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/secrets/{NATS_AUTH_SECRET}")
        return {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}

    def _start_nats(self) -> None:
        auth = wait_for(self.nats_auth, f"the daemon's Secret {NATS_AUTH_SECRET}",
                        START_TIMEOUT_S, watch=[self.processes[DAEMON]])
        directory = self.data / "nats"
        directory.mkdir(exist_ok=True)
        (directory / "auth.conf").write_text(auth["auth.conf"])
        (directory / "nats.conf").write_text('include "auth.conf"\n')
        port = int(self.nats_url.rsplit(":", 1)[1])
        nats = self._run("nats-server", [str(nats_server_binary()), "-a", "127.0.0.1",
                                         "-p", str(port), "-c", str(directory / "nats.conf")])

        def listening() -> bool:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True

        wait_for(listening, "nats-server to listen", START_TIMEOUT_S, watch=[nats])

    def pyhami_command(self) -> list[str]:
        beside = Path(sys.executable).parent / "pyhami"
        return [str(beside)] if beside.exists() else [sys.executable, "-m", "pyhami.cli"]

    def agent_token(self, node: str, *, pod: str | None = None,
                    audience: str = AGENT_TOKEN_AUDIENCE,
                    service_account: str = AGENT_SERVICE_ACCOUNT, bound: bool = True) -> Path:
        """A token the API server issues for the agent's ServiceAccount, bound to a pod on
        ``node`` (created here, as the DaemonSet would): the node is in its claims."""
        pod = pod or f"pyhami-agent-{node}"
        token_path = (f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/serviceaccounts/"
                      f"{service_account}/token")
        path = self.data / f"{pod}-{service_account}-{audience}-{bound}.token"
        if not bound:
            request = self.api.create(token_path, {
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": [audience], "expirationSeconds": 3600}})
            path.write_text(request["status"]["token"])
            return path
        pods = f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods"
        try:
            stored = self.api.get(f"{pods}/{pod}")
        except ApiError:
            stored = self.api.create(pods, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
                "spec": {"serviceAccountName": service_account, "nodeName": node,
                         "automountServiceAccountToken": False,
                         "containers": [{"name": "agent", "image": "pyhami:e2e"}]}})
        request = self.api.create(
            token_path,
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"audiences": [audience], "expirationSeconds": 3600,
                      "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod,
                                         "uid": stored["metadata"]["uid"]}}})
        path.write_text(request["status"]["token"])
        return path

    def start_agent(self) -> None:
        self._run("agent", [*self.pyhami_command(), "agent", "--node", NODE,
                            "--nats", self.nats_url, "--inventory", "sim:t4x4",
                            "--nats-token-file", str(self.agent_token(NODE))])

    def start_daemon(self) -> None:
        """``pyhami scheduler`` with the scheduler's ServiceAccount, serving the webhook too
        (called only once a test registers it); waits until it is ready."""
        self._launch_daemon()
        self._wait_daemon_ready()

    def _launch_daemon(self) -> None:
        if not self.daemon_port:
            self.daemon_port, self.metrics_port = free_port(), free_port()
            self.webhook_port = free_port()
            self.webhook_tls = server_files(self.data / "webhook-tls")
            self.nats_url = f"nats://127.0.0.1:{free_port()}"
            self.extender_tls = ExtenderPki.make(self.data / "extender-tls")
        self.launch_daemon(DAEMON, self.daemon_ports)

    def launch_daemon(self, name: str, ports: DaemonPorts, *flags: str) -> Process:
        """A ``pyhami scheduler`` as the session's daemon runs, on ``ports``, with ``flags``
        added: the same ServiceAccount, NATS credentials Secret, extender and webhook
        certificates."""
        assert self.webhook_tls is not None, "the session's daemon was never started"
        pki = self.extender_pki
        return self._run(name, [
            *self.pyhami_command(), "scheduler", "--kubeconfig", str(self.scheduler_kubeconfig),
            *self.nats_flags(), "--namespace", SYSTEM_NAMESPACE,
            "--listen", f"127.0.0.1:{ports.extender}",
            "--metrics", f"127.0.0.1:{ports.metrics}", "--resync-wait", "1",
            "--extender-cert-file", str(pki.server.cert),
            "--extender-key-file", str(pki.server.key),
            "--extender-client-ca-file", str(pki.client_ca),
            "--webhook-listen", f"127.0.0.1:{ports.webhook}",
            "--tls-cert-file", str(self.webhook_tls.cert),
            "--tls-private-key-file", str(self.webhook_tls.key), *flags])

    @property
    def daemon_ports(self) -> DaemonPorts:
        """The session's daemon's."""
        return DaemonPorts(self.daemon_port, self.metrics_port, self.webhook_port)

    def _wait_daemon_ready(self) -> None:
        self.wait_daemon_ready(DAEMON, self.daemon_ports)

    def wait_daemon_ready(self, name: str, ports: DaemonPorts) -> None:
        """Until the daemon ``name`` answers /readyz and counts the agent's node."""
        def ready() -> bool:
            # As the kubelet probes it: on the metrics port, without a client certificate.
            if http_get(f"{ports.metrics_url}/readyz")[0] != 200:
                return False
            return bool(self.statusz(ports)["nodes"] == 1)

        wait_for(ready, f"{name} /readyz and the agent's inventory", START_TIMEOUT_S,
                 watch=[self.processes[name], self.processes["agent"]])

    def stop_daemon(self) -> int | None:
        return self.processes[DAEMON].stop()

    def statusz(self, ports: DaemonPorts | None = None) -> dict[str, Any]:
        """A daemon's /statusz (the session's by default), asked as kube-scheduler."""
        return self.extender_json("/statusz", ports)

    def ledgerz(self, ports: DaemonPorts | None = None) -> dict[str, Any]:
        """A daemon's /ledgerz (the session's by default), asked as kube-scheduler."""
        return self.extender_json("/ledgerz", ports)

    def extender_json(self, path: str, ports: DaemonPorts | None = None) -> dict[str, Any]:
        url = (ports or self.daemon_ports).url
        status, body = http_get(f"{url}{path}", context=self.as_kube_scheduler)
        if status != 200:
            raise ValueError(f"{path} answered {status}")
        document: dict[str, Any] = json.loads(body)
        return document

    def start_kube_scheduler(self) -> None:
        """The session's kube-scheduler, for the session's daemon; waits until it holds the
        lease (its identity is this machine's host name)."""
        if not self.chart_config:
            self.chart_config = chart_scheduler_config(self.bin_dir)
            self.scheduler_config = render_scheduler_config(
                self.chart_config, extender_url=self.daemon_url,
                kubeconfig=str(self.scheduler_kubeconfig), tls=self.extender_pki)
        self.scheduler_port = free_port()
        scheduler = self.launch_kube_scheduler(KUBE_SCHEDULER, self.scheduler_config,
                                               self.scheduler_port)
        mine = f"{socket.gethostname()}_"
        wait_for(lambda: self.lease_holder().startswith(mine),
                 f"kube-scheduler to take the lease {SYSTEM_NAMESPACE}/{LEASE_NAME} "
                 f"as {mine}...", START_TIMEOUT_S, interval=0.5, watch=[scheduler])

    def kube_scheduler_config(self, daemon_url: str) -> dict[str, Any]:
        """The session's kube-scheduler configuration with another daemon as its extender."""
        config = copy.deepcopy(self.scheduler_config)
        (extender,) = config["extenders"]
        extender["urlPrefix"] = daemon_url
        return config

    def launch_kube_scheduler(self, name: str, config: dict[str, Any], port: int, *,
                              hostname: str | None = None) -> Process:
        """kube-scheduler with ``config`` and the Deployment's flags, serving on ``port``;
        waits for its /healthz. With ``hostname`` it runs in a UTS namespace of its own under
        that host name, which is the identity it takes the lease by, as in its own pod."""
        config_file = self.data / f"{name}-config.yaml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        # The Deployment's flags; then what the pod network would give: its own port.
        command = [
            str(self.bin_dir / "kube-scheduler"), f"--config={config_file}",
            *shipped_kube_scheduler_flags(),
            f"--secure-port={port}", "--bind-address=127.0.0.1",
            f"--authentication-kubeconfig={self.scheduler_kubeconfig}",
            f"--authorization-kubeconfig={self.scheduler_kubeconfig}",
        ]
        if hostname is not None:
            command = [*in_uts_namespace(hostname), *command]
        scheduler = self._run(name, command)
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # kube-scheduler's own self-signed serving cert
        wait_for(lambda: http_get(f"https://127.0.0.1:{port}/healthz",
                                  context=insecure)[0] == 200,
                 f"{name} /healthz", START_TIMEOUT_S, watch=[scheduler])
        return scheduler

    def lease(self) -> dict[str, Any]:
        """kube-scheduler's leader-election Lease."""
        return self.api.get(f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/"
                            f"leases/{LEASE_NAME}")

    def lease_holder(self) -> str:
        """``<host name>_<uuid>`` of the kube-scheduler leading; empty when released."""
        holder: str = self.lease()["spec"].get("holderIdentity") or ""
        return holder

    # The kubelet ----------------------------------------------------------------------------

    @property
    def kubelet_root(self) -> Path:
        """The kubelet's --root-dir."""
        return self.data / "kubelet"

    @property
    def kubelet_device_plugins(self) -> Path:
        """Where the kubelet serves kubelet.sock and looks for device plugins' sockets: what
        ``pyhami agent --device-plugin --kubelet-dir`` takes."""
        return KUBELET_DEVICE_PLUGINS

    @property
    def kubelet_registration(self) -> Path:
        """The kubelet's device plugin Registration socket."""
        return KUBELET_DEVICE_PLUGINS / "kubelet.sock"

    @property
    def cri_socket(self) -> Path:
        return self.data / "fake-cri" / "cri.sock"

    @property
    def cri_record(self) -> Path:
        """Every CreateContainer request the fake runtime received, one JSON object a line
        (protojson of runtime.v1.CreateContainerRequest; ``recorded_env`` reads its
        environment)."""
        return self.data / "fake-cri" / "containers.jsonl"

    def recorded_containers(self) -> list[dict[str, Any]]:
        """The CreateContainer requests the fake runtime received, oldest first."""
        if not self.cri_record.exists():
            return []
        return [json.loads(line) for line in self.cri_record.read_text().splitlines() if line]

    def start_kubelet(self) -> None:
        """A real kubelet registering ``KUBELET_NODE``, against the fake CRI runtime (started
        first unless it runs); returns once the Node is Ready. Called again after
        ``stop_kubelet``, it reuses its root dir, as a restarted kubelet does."""
        self._refuse_foreign_kubelet()
        self._grant_kubelet()
        if "fake-cri" not in self.processes or not self.processes["fake-cri"].running:
            self._start_fake_cri()
        kubeconfig = write_kubeconfig(
            self.data / "kubelet.kubeconfig", server=self.server, ca_file=self.ca_file,
            user=KUBELET_USER, token=self.kubelet_token)
        config = self.data / "kubelet-config.yaml"
        config.write_text(yaml.safe_dump(self._kubelet_config(), sort_keys=False))
        kubelet = self._run("kubelet", [
            str(self.bin_dir / "kubelet"), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.kubelet_root}", f"--cert-dir={self.kubelet_root / 'pki'}",
            f"--hostname-override={KUBELET_NODE}", "--v=2"])
        # A restarted kubelet finds its Node Ready already: its socket says it is up.
        wait_for(lambda: self._kubelet_node_ready() and serving_unix(self.kubelet_registration),
                 f"the kubelet's Node {KUBELET_NODE} Ready and {self.kubelet_registration}",
                 START_TIMEOUT_S, interval=0.5, watch=[kubelet, self.processes["fake-cri"]])
        # The node lifecycle controller lifts the taints of a Ready node; none runs here.
        self.api.merge_patch(f"/api/v1/nodes/{KUBELET_NODE}", {"spec": {"taints": None}})

    def stop_kubelet(self, *, runtime: bool = True) -> None:
        """Stop the kubelet, and the fake runtime too unless ``runtime`` is False (what a
        kubelet restart leaves running). The Node stays in the API."""
        names = ["kubelet", "fake-cri"] if runtime else ["kubelet"]
        for name in names:
            if name in self.processes:
                self.processes[name].stop()
        self._unmount_kubelet_root()

    def _unmount_kubelet_root(self) -> None:
        """The kubelet bind-mounts its root dir onto itself (to make it rshared); a stopped
        kubelet leaves that mount, which would keep the folder from being removed."""
        while _mounted(self.kubelet_root):
            subprocess.run(["umount", str(self.kubelet_root)], check=True, capture_output=True,
                           timeout=30)

    def _refuse_foreign_kubelet(self) -> None:
        """The kubelet empties ``KUBELET_DEVICE_PLUGINS`` when it starts: never while another
        kubelet of this machine serves there."""
        if self.processes.get("kubelet") is not None and self.processes["kubelet"].running:
            raise RuntimeError("the suite's kubelet is already running")
        if serving_unix(self.kubelet_registration):
            raise RuntimeError(f"a kubelet already serves {self.kubelet_registration} on "
                               "this machine; the suite's kubelet would empty that folder")

    def _grant_kubelet(self) -> None:
        """What the Node authorizer grants a kubelet, here through RBAC: ClusterRole
        system:node."""
        with contextlib.suppress(ApiError):  # already made by an earlier start
            self.api.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": KUBELET_ROLE_BINDING},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "system:node"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                              "name": KUBELET_USER}]})

    def _start_fake_cri(self) -> None:
        self.cri_socket.parent.mkdir(parents=True, exist_ok=True)
        self.cri_socket.unlink(missing_ok=True)
        runtime = self._run("fake-cri", [
            str(self.bin_dir / "fake-cri"), f"--endpoint=unix://{self.cri_socket}",
            f"--record={self.cri_record}"])
        wait_for(self.cri_socket.exists, "the fake CRI runtime's socket", START_TIMEOUT_S,
                 watch=[runtime])

    def _kubelet_config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": f"unix://{self.cri_socket}",
            "address": "127.0.0.1", "port": free_port(), "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": free_port(),
            # No cgroups of its own: the fake runtime runs nothing for them to limit.
            "cgroupsPerQOS": False, "enforceNodeAllocatable": [], "cgroupDriver": "cgroupfs",
            "failSwapOn": False, "failCgroupV1": False,
            "podLogsDir": str(self.kubelet_root / "pod-logs"),
            "volumePluginDir": str(self.kubelet_root / "volume-plugins"),
            # Its HTTPS API (logs, exec) is not used; nobody but the suite reaches it.
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
        }

    def _kubelet_node_ready(self) -> bool:
        try:
            node = self.api.get(f"/api/v1/nodes/{KUBELET_NODE}")
        except ApiError:
            return False
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in node.get("status", {}).get("conditions", []))


@contextlib.contextmanager
def running_control_plane(bin_dir: Path, logs: Path) -> Iterator[ControlPlane]:
    """A started control plane; every process is stopped on the way out, also on failure."""
    with tempfile.TemporaryDirectory(prefix="pyhami-e2e-") as data:
        plane = ControlPlane(bin_dir=bin_dir, logs=logs, data=Path(data))
        try:
            plane.start()
            yield plane
        finally:
            plane.stop()
