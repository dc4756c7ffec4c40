"""A real control plane on this machine for the end-to-end suite.

etcd, kube-apiserver (token authentication, RBAC), kube-scheduler with the chart's
configuration (``k8s/``'s, with the extender's mutual TLS on), three clustered
nats-servers, one simulated ``pyhami agent`` and the ``pyhami scheduler`` daemon, each a
process of its own on free loopback ports. kube-scheduler calls the daemon over HTTPS with
its client certificate, the only caller the daemon answers there. There is no
kube-controller-manager until a test asks for the ``kueue`` fixture (conftest.py): it
starts Kueue and kube-controller-manager's job and garbage collector controllers for the
rest of the session. The GPU node of the suite is created through the API and its pods
are bound, never run; a test may add a real kubelet (``start_kubelet``) against a fake CRI
runtime, which registers a node of its own and runs its pods in the runtime's memory.

The binaries come from ``scripts/build-control-plane.sh`` (a cache outside the
repository, keyed by version).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from common.certificates import write_bundle
from harness.controlplane import (
    START_TIMEOUT_S,
    SYSTEM_NAMESPACE,
    ApiError,
    ApiServerPlane,
    KubeApi,
    Process,
    chart_scheduler_config,
    create_ready_node,
    render_scheduler_config,
    wait_for,
    write_kubeconfig,
)
from pyhami.bench.loopback import direct_opener, http_get
from pyhami.natsserver import free_port, nats_server_binary
from tests.certs import ClientFiles, ServerFiles, server_files

LEASE_NAME = "pyhami-scheduler"
# The session's scheduler pod: the names of its two processes.
DAEMON = "pyhami-scheduler"
KUBE_SCHEDULER = "kube-scheduler"
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
NATS_SERVERS = 3
"""The session's NATS is a cluster of three, as the chart's is by default (issue 29)."""
AGENT_TOKEN_AUDIENCE = "pyhami-nats"
TEST_NAMESPACE = "pyhami-e2e"


# The extender's certificates ------------------------------------------------------------


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


def http_post_json(url: str, body: object, *, context: ssl.SSLContext | None = None,
                   timeout: float = 10.0) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with direct_opener(context).open(request, timeout=timeout) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode(errors="replace")



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



# The control plane ------------------------------------------------------------------------


@dataclass
class ControlPlane(ApiServerPlane):
    nats_url: str = ""
    """Every server's client URL, comma-separated, as ``--nats`` takes them."""
    nats_ports: list[int] = field(default_factory=list)
    """Each server's client port."""
    nats_monitor_ports: list[int] = field(default_factory=list)
    scheduler_port: int = 0
    daemon_port: int = 0
    metrics_port: int = 0
    webhook_port: int = 0
    # The webhook's serving certificate, for 127.0.0.1: no Service routes here.
    webhook_tls: ServerFiles | None = None
    extender_tls: ExtenderPki | None = None
    # The chart's kube-scheduler configuration (EXTENDER_TLS_VALUES), as helm rendered it.
    chart_config: str = ""
    scheduler_config: dict[str, Any] = field(default_factory=dict)
    # The token the API server knows the kubelet's node identity by (tokens.csv).
    kubelet_token: str = ""

    # Start and stop ---------------------------------------------------------------------

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

    def start(self) -> None:
        self.start_etcd()
        self.kubelet_token = os.urandom(16).hex()
        self.start_apiserver(f'{self.kubelet_token},{KUBELET_USER},{KUBELET_USER},"system:nodes"')
        self._prepare_cluster()
        # The daemon makes the NATS credentials (a Secret) the server's configuration includes.
        self._launch_daemon()
        self._start_nats()
        self.start_agent()
        self._wait_daemon_ready()
        self.start_kube_scheduler()

    def stop(self) -> None:
        super().stop()
        self._unmount_kubelet_root()

    def _prepare_cluster(self) -> None:
        """The manifests of k8s/, the test namespace, the GPU node, the ServiceAccount token."""
        self.install_manifests()
        self.create_namespace(TEST_NAMESPACE)
        self.create_gpu_node()
        self.issue_scheduler_kubeconfig()

    def create_gpu_node(self) -> None:
        # What a kubelet and the device plugin would report: 4 cards split 10 ways.
        create_ready_node(self.api, NODE, {"cpu": "16", "memory": "64Gi", "pods": "110",
                                           "nvidia.com/gpu": "40"}, labels={"gpu": "on"})

    def nats_flags(self) -> list[str]:
        """How a daemon reaches this NATS: as pyhami-daemon, with the Secret's password."""
        return ["--nats", self.nats_url, "--nats-auth-secret", NATS_AUTH_SECRET]

    def nats_auth(self) -> dict[str, str]:
        """The Secret the daemon made: issuer key, passwords, server configuration."""
        secret = self.api.get(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/secrets/{NATS_AUTH_SECRET}")
        return {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}

    @property
    def nats_urls(self) -> list[str]:
        return self.nats_url.split(",")

    def _start_nats(self) -> None:
        """Three nats-servers routed into one cluster, each including the auth callout's
        configuration from the daemon's Secret, as the chart's StatefulSet runs them."""
        auth = wait_for(self.nats_auth, f"the daemon's Secret {NATS_AUTH_SECRET}",
                        START_TIMEOUT_S, watch=[self.processes[DAEMON]])
        directory = self.data / "nats"
        directory.mkdir(exist_ok=True)
        (directory / "auth.conf").write_text(auth["auth.conf"])
        routes = [free_port() for _ in self.nats_ports]
        self.nats_monitor_ports = [free_port() for _ in self.nats_ports]
        for index, port in enumerate(self.nats_ports):
            others = ", ".join(f"nats-route://127.0.0.1:{route}"
                               for other, route in enumerate(routes) if other != index)
            config = directory / f"nats-{index}.conf"
            config.write_text(
                'include "auth.conf"\n'
                f"server_name: e2e-nats-{index}\n"
                f"cluster {{\n  name: pyhami-e2e\n  listen: 127.0.0.1:{routes[index]}\n"
                f"  routes: [{others}]\n}}\n")
            self.run(f"nats-server-{index}", [
                str(nats_server_binary()), "-a", "127.0.0.1", "-p", str(port),
                "-m", str(self.nats_monitor_ports[index]), "-c", str(config)])
        self.wait_nats_formed()

    def wait_nats_formed(self) -> None:
        """Until every running server is routed to every other running one."""
        running = [index for index in range(len(self.nats_ports))
                   if self.processes[f"nats-server-{index}"].running]

        def formed() -> bool:
            return all(self._nats_monitor(index, "routez").get("num_routes", 0)
                       >= len(running) - 1 for index in running)

        wait_for(formed, "the nats-servers to route to each other", START_TIMEOUT_S,
                 watch=[self.processes[f"nats-server-{index}"] for index in running])

    def _nats_monitor(self, index: int, page: str) -> dict[str, Any]:
        try:
            status, body = http_get(
                f"http://127.0.0.1:{self.nats_monitor_ports[index]}/{page}")
        except OSError:  # started, not yet listening
            return {}
        if status != 200:
            return {}
        answer: dict[str, Any] = json.loads(body)
        return answer

    def nats_server_of(self, client_name: str) -> int | None:
        """The index of the server a client named ``client_name`` is connected to now."""
        for index in range(len(self.nats_ports)):
            if not self.processes[f"nats-server-{index}"].running:
                continue
            connections = self._nats_monitor(index, "connz?limit=1024").get("connections")
            if any(c.get("name") == client_name for c in connections or ()):
                return index
        return None

    def nats_logs(self) -> str:
        """What the servers logged, one after the other."""
        return "".join(self.processes[f"nats-server-{index}"].log.read_text()
                       for index in range(len(self.nats_ports)))

    def kill_nats(self, index: int) -> None:
        """SIGKILL one server of the cluster, as a lost machine."""
        self.processes[f"nats-server-{index}"].kill()

    def restart_nats(self, index: int) -> None:
        """Start a killed server again on its ports; returns once the cluster formed."""
        self.processes[f"nats-server-{index}"].start()
        self.wait_nats_formed()

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
        self.run("agent", [*self.pyhami_command(), "agent", "--node", NODE,
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
            self.nats_ports = [free_port() for _ in range(NATS_SERVERS)]
            self.nats_url = ",".join(f"nats://127.0.0.1:{port}" for port in self.nats_ports)
            self.extender_tls = ExtenderPki.make(self.data / "extender-tls")
        self.launch_daemon(DAEMON, self.daemon_ports)

    def launch_daemon(self, name: str, ports: DaemonPorts, *flags: str) -> Process:
        """A ``pyhami scheduler`` as the session's daemon runs, on ``ports``, with ``flags``
        added: the same ServiceAccount, NATS credentials Secret, extender and webhook
        certificates."""
        assert self.webhook_tls is not None, "the session's daemon was never started"
        pki = self.extender_pki
        return self.run(name, [
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

    def restart_scheduler(self, *daemon_flags: str, nodes: int,
                          scheduler_config: dict[str, Any] | None = None) -> None:
        """The session's daemon with ``daemon_flags`` added and kube-scheduler with
        ``scheduler_config`` (the session's when None), on the same ports; waits until the
        daemon knows ``nodes`` nodes and leads."""
        self.processes[KUBE_SCHEDULER].stop()  # releases the Lease on its way out
        self.processes[DAEMON].stop()
        ports = self.daemon_ports
        daemon = self.launch_daemon(DAEMON, ports, *daemon_flags)
        wait_for(lambda: http_get(f"{ports.metrics_url}/readyz")[0] == 200
                 and self.statusz()["nodes"] == nodes,
                 f"{DAEMON} /readyz and its {nodes} nodes", START_TIMEOUT_S, watch=[daemon])
        self.start_kube_scheduler(scheduler_config)
        wait_for(lambda: (self.statusz().get("leadership") or {}).get("role") == "leader",
                 f"{DAEMON} to lead", watch=self.all_processes())

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

    def start_kube_scheduler(self, config: dict[str, Any] | None = None) -> None:
        """The session's kube-scheduler, for the session's daemon, with the session's
        configuration or ``config``; waits until it holds the lease (its identity is this
        machine's host name)."""
        if not self.chart_config:
            self.chart_config = chart_scheduler_config(self.bin_dir)
            self.scheduler_config = self.rendered_scheduler_config(self.chart_config)
        self.scheduler_port = free_port()
        scheduler = self.launch_kube_scheduler(KUBE_SCHEDULER, config or self.scheduler_config,
                                               self.scheduler_port)
        mine = f"{socket.gethostname()}_"
        wait_for(lambda: self.lease_holder().startswith(mine),
                 f"kube-scheduler to take the lease {SYSTEM_NAMESPACE}/{LEASE_NAME} "
                 f"as {mine}...", START_TIMEOUT_S, interval=0.5, watch=[scheduler])

    def rendered_scheduler_config(self, chart_config: str) -> dict[str, Any]:
        """The chart's kube-scheduler configuration text ``chart_config`` as the session's
        kube-scheduler runs it: calling the session's daemon with its certificate."""
        return render_scheduler_config(
            chart_config, extender_url=self.daemon_url,
            kubeconfig=str(self.scheduler_kubeconfig), ca_file=self.extender_pki.server.ca,
            cert_file=self.extender_pki.kube_scheduler.cert,
            key_file=self.extender_pki.kube_scheduler.key)

    def kube_scheduler_config(self, daemon_url: str) -> dict[str, Any]:
        """The session's kube-scheduler configuration with another daemon as its extender."""
        config = copy.deepcopy(self.scheduler_config)
        (extender,) = config["extenders"]
        extender["urlPrefix"] = daemon_url
        return config

    def launch_kube_scheduler(self, name: str, config: dict[str, Any], port: int, *,
                              hostname: str | None = None,
                              prefix: Sequence[str] = ()) -> Process:
        """kube-scheduler with ``config`` and the Deployment's flags, serving on ``port``;
        waits for its /healthz. With ``hostname`` it runs in a UTS namespace of its own under
        that host name, which is the identity it takes the lease by, as in its own pod."""
        if hostname is not None:
            prefix = [*in_uts_namespace(hostname), *prefix]
        return super().launch_kube_scheduler(name, config, port, prefix=prefix)

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

    def created_containers(self, pod: str) -> list[dict[str, Any]]:
        """The CreateContainer requests the fake runtime received for pod ``pod``."""
        return [request for request in self.recorded_containers()
                if request["sandboxConfig"]["metadata"]["name"] == pod]

    def created_container(self, pod: str) -> dict[str, Any]:
        """The one CreateContainer request for pod ``pod``, once the runtime has it: the
        device plugin's Allocate (and the annotations it writes) comes before it."""
        def created() -> dict[str, Any] | None:
            found = self.created_containers(pod)
            assert len(found) <= 1, f"{len(found)} containers created for {pod}"
            return found[0] if found else None
        return wait_for(created, f"the runtime's CreateContainer for pod {pod}")

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
        kubelet = self.run("kubelet", [
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

    def retire_kubelet(self, agent: Process, forgotten_within: float) -> None:
        """Stop the kubelet's node and its agent, delete the Node, and wait until the daemon
        has forgotten it (``forgotten_within``: its cordon refresh, a few times): the next
        tests see one node again."""
        agent.stop()
        self.stop_kubelet()
        with contextlib.suppress(ApiError):
            self.api.delete(f"/api/v1/nodes/{KUBELET_NODE}")
        wait_for(lambda: self.statusz()["nodes"] == 1, f"the daemon forgetting {KUBELET_NODE}",
                 timeout=forgotten_within)

    def allocatable_gpus(self) -> int | None:
        """The kubelet's Node's allocatable ``nvidia.com/gpu``, None until it has any."""
        node = self.api.get(f"/api/v1/nodes/{KUBELET_NODE}")
        value = node["status"].get("allocatable", {}).get("nvidia.com/gpu")
        return int(value) if value is not None else None

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
        runtime = self.run("fake-cri", [
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
