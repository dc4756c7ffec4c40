"""A real Kubernetes control plane on this machine: etcd and kube-apiserver as processes.

What the end-to-end suite (tests/e2e) and ``scripts/bench-cluster`` share: where the
binaries of ``scripts/build-control-plane.sh`` are, child processes stopped with their
whole group, a small REST client of the API server, kubeconfigs, kube-apiserver with token
authentication and RBAC, kube-controller-manager for batch Jobs (Kueue, on top, is
``harness/kueue.py``), the manifests of ``k8s/`` and the shipped kube-scheduler
configuration. Both need a checkout of the repository (``k8s/``, ``charts/`` and the build
script are not part of the installed package), and so does this module: it lives in the
repository's harness, never in the wheel.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import quote, urlencode

import yaml

from common.core.errors import PyhamiError
from pyhami.bench.loopback import direct_opener, http_get
from pyhami.natsserver import free_port

REPO = Path(__file__).resolve().parents[1]
K8S_DIR = REPO / "k8s"
CHART = REPO / "charts" / "pyhami"
BUILD_SCRIPT = REPO / "scripts" / "build-control-plane.sh"
SCHEDULER_CONFIG_MAP = K8S_DIR / "scheduler-config.yaml"
SCHEDULER_CONFIG_KEY = "config.yaml"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubelet",
            "kubectl", "fake-cri", "helm", "kueue")

SYSTEM_NAMESPACE = "pyhami-system"
SCHEDULER_SERVICE_ACCOUNT = "pyhami-scheduler"
SCHEDULER_NAME = "pyhami-scheduler"
# k8s/'s values, with the extender over HTTPS and kube-scheduler as its only caller.
EXTENDER_TLS_VALUES = ("scheduler.extender.tls.enabled=true",
                       "scheduler.extender.tls.secretName=pyhami-extender-tls",
                       "scheduler.extender.tls.clientSecretName=pyhami-kube-scheduler-tls")

# What a batch Job needs of kube-controller-manager (start_kube_controller_manager).
KUBE_CONTROLLER_MANAGER_CONTROLLERS = ("job", "garbagecollector")

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


def missing_binaries(directory: Path, names: Sequence[str] = BINARIES) -> list[str]:
    return [name for name in names if not os.access(directory / name, os.X_OK)]


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


def render_chart(bin_dir: Path, values: Sequence[str] = (), *,
                 show_only: str | None = None) -> list[dict[str, Any]]:
    """The chart's objects as ``k8s/``'s release and values render them, with ``values``
    (``KEY=VALUE``, as ``--set`` takes them) over those; ``show_only``: one template."""
    command = [str(bin_dir / "helm"), "template", "pyhami", str(CHART),
               "--namespace", SYSTEM_NAMESPACE, "--kube-version", versions(bin_dir)[0],
               "--values", str(CHART / "ci" / "k8s-values.yaml")]
    if show_only is not None:
        command += ["--show-only", show_only]
    for value in values:
        command += ["--set", value]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed:\n{done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def chart_scheduler_config(bin_dir: Path, values: Sequence[str] = ()) -> str:
    """The KubeSchedulerConfiguration text the chart renders for ``k8s/``'s release and
    values with ``EXTENDER_TLS_VALUES``, and ``values`` over those."""
    (config_map,) = render_chart(bin_dir, (*EXTENDER_TLS_VALUES, *values),
                                 show_only="templates/scheduler-config.yaml")
    text: str = config_map["data"][SCHEDULER_CONFIG_KEY]
    return text


def render_scheduler_config(text: str, *, extender_url: str, kubeconfig: str, ca_file: Path,
                            cert_file: Path, key_file: Path) -> dict[str, Any]:
    """The chart's configuration with only the extender URL, the files of its tlsConfig
    (the daemon's CA, kube-scheduler's certificate and key) and the kubeconfig path set."""
    rendered: dict[str, Any] = yaml.safe_load(text)
    rendered["clientConnection"]["kubeconfig"] = kubeconfig
    (extender,) = rendered["extenders"]
    extender["urlPrefix"] = extender_url
    extender["tlsConfig"].update(caFile=str(ca_file), certFile=str(cert_file),
                                 keyFile=str(key_file))
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


class ApiError(PyhamiError):
    """An answer of the API server with an error status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status


class KubeApi:
    """A minimal typed REST client for the API server: JSON in, JSON out."""

    def __init__(self, server: str, token: str, ca_file: Path) -> None:
        self.server = server
        self.token = token
        self.ca_file = ca_file
        self._opener = direct_opener(ssl.create_default_context(cafile=str(ca_file)))
        self._resources: dict[tuple[str, str], tuple[str, bool]] = {}

    def _request(self, method: str, path: str, body: object, query: dict[str, str] | None,
                 content_type: str) -> urllib.request.Request:
        url = f"{self.server}{path}" + (f"?{urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body).encode()
        return urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": content_type,
            "Accept": "application/json"})

    def send(self, method: str, path: str, body: object = None, *,
             query: dict[str, str] | None = None,
             content_type: str = "application/json") -> bytes:
        """The raw answer; raises ``ApiError`` for an error status."""
        with self.open(method, path, body, query=query, content_type=content_type,
                       timeout=30) as response:
            return bytes(response.read())

    @contextlib.contextmanager
    def open(self, method: str, path: str, body: object = None, *,
             query: dict[str, str] | None = None, content_type: str = "application/json",
             timeout: float | None = None) -> Iterator[IO[bytes]]:
        """The answer as a stream (a watch); raises ``ApiError`` for an error status."""
        request = self._request(method, path, body, query, content_type)
        try:
            response = self._opener.open(request, timeout=timeout)
        except urllib.error.HTTPError as error:
            raise ApiError(method, path, error.code,
                           error.read().decode(errors="replace")) from None
        with response:
            yield response

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


def ready_node(name: str, resources: dict[str, str],
               labels: dict[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Node object as the API first stores it, and the status a kubelet (and its device
    plugin) would report for it: ``resources`` as capacity and allocatable, Ready."""
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})}}}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "no kubelet: set through the API",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}]}}
    return node, status


def create_ready_node(api: KubeApi, name: str, resources: dict[str, str],
                      labels: dict[str, str] | None = None) -> None:
    """Create ``ready_node``'s Node, without taints, its status reported."""
    node, status = ready_node(name, resources, labels)
    api.create("/api/v1/nodes", node)
    # The NodeNotReady taint the API server puts on a new node is lifted by the node
    # lifecycle controller once the kubelet reports Ready; none runs here.
    api.merge_patch(f"/api/v1/nodes/{quote(name)}", {"spec": {"taints": None}})
    api.merge_patch(f"/api/v1/nodes/{quote(name)}/status", status)


# Processes ------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: be killed when the parent process dies, even by SIGKILL."""
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
            # preexec_fn only calls prctl: safe although the parent process has threads.
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


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def insecure_context() -> ssl.SSLContext:
    """For kube-scheduler's own self-signed serving certificate (its /healthz)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


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


# etcd and kube-apiserver ------------------------------------------------------------------


@dataclass
class ApiServerPlane:
    """etcd and kube-apiserver (token authentication, RBAC) on free loopback ports, as
    processes of their own; the other processes of a plane are started through ``run``."""

    bin_dir: Path
    logs: Path
    data: Path
    processes: dict[str, Process] = field(default_factory=dict)
    etcd_url: str = ""
    api_port: int = 0
    admin_kubeconfig: Path = Path()
    scheduler_kubeconfig: Path = Path()
    kube: KubeApi | None = None
    created: list[dict[str, Any]] = field(default_factory=list)
    # The scheduler pod's ServiceAccount token (kube-scheduler and the daemon use it).
    scheduler_token: str = ""

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def ca_file(self) -> Path:
        return self.data / "apiserver-certs" / "apiserver.crt"

    @property
    def api(self) -> KubeApi:
        """The API as the cluster's administrator (system:masters)."""
        assert self.kube is not None, "the API server is not started"
        return self.kube

    def stop(self) -> None:
        """Every process, newest first; always safe to call."""
        for name in reversed(list(self.processes)):
            self.processes[name].stop()

    def process(self, name: str) -> Process:
        return self.processes[name]

    def all_processes(self) -> list[Process]:
        return [p for p in self.processes.values() if p.popen is not None]

    def run(self, name: str, command: list[str], env: dict[str, str] | None = None) -> Process:
        process = Process(name, command, self.logs / f"{name}.log", env=env).start()
        self.processes[name] = process
        return process

    def start_etcd(self) -> None:
        client_port, peer_port = free_port(), free_port()
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self.etcd_url = client_url
        etcd = self.run("etcd", [
            str(self.bin_dir / "etcd"), "--name", "e2e",
            "--data-dir", str(self.data / "etcd"),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"e2e={peer_url}", "--initial-cluster-state", "new",
            "--log-level", "warn", "--unsafe-no-fsync",
        ])
        wait_for(lambda: http_get(f"{client_url}/health")[0] == 200, "etcd /health",
                 START_TIMEOUT_S, watch=[etcd])

    def start_apiserver(self, *token_lines: str) -> None:
        """kube-apiserver on etcd, knowing an administrator's token (system:masters) and
        the lines of tokens.csv in ``token_lines``; waits until it is ready."""
        certs = self.data / "apiserver-certs"
        certs.mkdir()
        key, public = self.data / "sa.key", self.data / "sa.pub"
        openssl("genrsa", "-out", str(key), "2048")
        openssl("rsa", "-in", str(key), "-pubout", "-out", str(public))
        # A client CA (also for the front proxy's request headers, as kubeadm sets them up):
        # the API server publishes both in kube-system/extension-apiserver-authentication,
        # which kube-scheduler reads to authenticate its own callers (its RBAC allows it).
        client_ca = self.data / "client-ca.crt"
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                "-subj", "/CN=pyhami-e2e-client-ca", "-keyout", str(self.data / "client-ca.key"),
                "-out", str(client_ca))
        admin_token = os.urandom(16).hex()
        tokens = self.data / "tokens.csv"
        tokens.write_text("".join(f"{line}\n" for line in (
            f'{admin_token},e2e-admin,e2e-admin,"system:masters"', *token_lines)))
        tokens.chmod(0o600)
        self.api_port = free_port()
        apiserver = self.run("kube-apiserver", [
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
            # Kubernetes' own pod groups (spec.schedulingGroup, scheduling.k8s.io/v1alpha2
            # PodGroups), which pyhami reads (docs/scheduler.md, "Groups").
            "--feature-gates=GenericWorkload=true",
            "--runtime-config=scheduling.k8s.io/v1alpha2=true",
            # Webhooks (Kueue's, harness/kueue.py) are called at an endpoint of their
            # Service's EndpointSlices: no Service network here routes a ClusterIP.
            "--enable-aggregator-routing=true",
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

    def install_manifests(self) -> None:
        """Every object of ``k8s/``, once the bootstrap roles they bind to exist."""
        # The bootstrap RBAC roles kube-scheduler is bound to come from a post-start hook.
        wait_for(lambda: self.api.get(
                     "/apis/rbac.authorization.k8s.io/v1/clusterroles/system:kube-scheduler"),
                 "the bootstrap ClusterRole system:kube-scheduler", START_TIMEOUT_S)
        self.created = self.apply_manifests()

    def apply_manifests(self) -> list[dict[str, Any]]:
        """Create every object of ``k8s/`` for real; returns them as the API stored them."""
        stored = []
        for doc in manifests():
            path = self.api.path(doc["apiVersion"], doc["kind"], doc["metadata"].get("namespace"))
            stored.append(self.api.create(path, doc))
        return stored

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        """A namespace with its "default" ServiceAccount, which the admission plugin gives
        every pod (no kube-controller-manager makes it here)."""
        self.api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": name,
                                                            "labels": dict(labels or {})}})
        self.api.create(f"/api/v1/namespaces/{name}/serviceaccounts",
                        {"apiVersion": "v1", "kind": "ServiceAccount",
                         "metadata": {"name": "default"}})

    def issue_scheduler_kubeconfig(self) -> None:
        """A token of the scheduler pod's ServiceAccount (of ``k8s/``) in a kubeconfig."""
        request = self.api.create(
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

    def start_kube_controller_manager(
            self, controllers: Sequence[str] = KUBE_CONTROLLER_MANAGER_CONTROLLERS,
            name: str = "kube-controller-manager") -> Process:
        """kube-controller-manager running only ``controllers`` (by default what a batch Job
        needs: the job controller makes its pods and completes it, the garbage collector
        deletes its pods with it), as the administrator; waits for its /healthz."""
        port = free_port()
        kcm = self.run(name, [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={self.admin_kubeconfig}",
            f"--authentication-kubeconfig={self.admin_kubeconfig}",
            f"--authorization-kubeconfig={self.admin_kubeconfig}",
            f"--controllers={','.join(controllers)}",
            "--use-service-account-credentials=false", "--leader-elect=false",
            f"--secure-port={port}", "--bind-address=127.0.0.1",
            f"--cert-dir={self.data / name}", "--v=1",
        ])
        wait_for(lambda: http_get(f"https://127.0.0.1:{port}/healthz",
                                  context=insecure_context())[0] == 200,
                 f"{name} /healthz", START_TIMEOUT_S, interval=0.5, watch=[kcm])
        return kcm

    def launch_kube_scheduler(self, name: str, config: dict[str, Any], port: int, *,
                              prefix: Sequence[str] = ()) -> Process:
        """kube-scheduler with ``config`` and the Deployment's flags, serving on ``port``
        (run under the command ``prefix`` if any); waits for its /healthz."""
        config_file = self.data / f"{name}-config.yaml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        # The Deployment's flags; then what the pod network would give: its own port.
        command = [
            *prefix, str(self.bin_dir / "kube-scheduler"), f"--config={config_file}",
            *shipped_kube_scheduler_flags(),
            f"--secure-port={port}", "--bind-address=127.0.0.1",
            f"--authentication-kubeconfig={self.scheduler_kubeconfig}",
            f"--authorization-kubeconfig={self.scheduler_kubeconfig}",
        ]
        scheduler = self.run(name, command)
        wait_for(lambda: http_get(f"https://127.0.0.1:{port}/healthz",
                                  context=insecure_context())[0] == 200,
                 f"{name} /healthz", START_TIMEOUT_S, watch=[scheduler])
        return scheduler
