"""The deployable files agree with each other and with pyhami's own command line.

docker-compose.yml cannot run here (no container engine), and k8s/ is exercised for real
by the end-to-end suite; these checks run everywhere.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from harness.controlplane import SCHEDULER_CONFIG_MAP, manifests, shipped_scheduler_config
from pyhami.cli import build_parser
from scheduler.cluster import SCHEDULER_NAME
from tests.paths import REPO

COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
K8S = REPO / "k8s"
GPU_RESOURCES = {"nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage",
                 "nvidia.com/gpucores", "nvidia.com/priority"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding",
                  "MutatingWebhookConfiguration", "FlowSchema"}


def parse_pyhami(command: list[str], where: str) -> argparse.Namespace:
    assert command and command[0] == "pyhami", f"{where}: command {command} is not pyhami"
    try:
        return build_parser({}).parse_args(command[1:])
    except SystemExit as error:
        raise AssertionError(f"{where}: pyhami refuses {command} (exit {error.code})") from None


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


# docker-compose.yml ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return document


def pyhami_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: service for name, service in compose["services"].items()
            if name != "nats"}


def test_compose_has_nats_the_daemon_three_agents_and_the_demo(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"certificates", "credentials", "nats", "scheduler",
                                        "agent-t4", "agent-a100", "agent-h100", "demo"}


def test_compose_nats_runs_jetstream(compose: dict[str, Any]) -> None:
    command = compose["services"]["nats"]["command"]
    assert "--jetstream" in command or "-js" in command, command


def test_every_pyhami_service_is_built_from_the_dockerfile(compose: dict[str, Any]) -> None:
    for name, service in pyhami_services(compose).items():
        assert service.get("build") == ".", f"service {name} is not built by ./Dockerfile"


def test_every_compose_command_parses(compose: dict[str, Any]) -> None:
    parsed = {name: parse_pyhami(service["command"], f"compose service {name}")
              for name, service in pyhami_services(compose).items()}
    assert parsed["scheduler"].command == "scheduler" and parsed["scheduler"].standalone, (
        "the compose scheduler must be pyhami scheduler --standalone")
    assert parsed["demo"].command == "demo"
    agents = {name: args for name, args in parsed.items() if name.startswith("agent-")}
    assert all(args.command == "agent" for args in agents.values()), agents
    profiles = {args.inventory.value for args in agents.values()}
    assert profiles == {"t4x4", "a100x8-nvswitch", "h100x8-islands"}, (
        f"the simulated agents run the profiles {profiles}")
    nodes = [args.node for args in agents.values()]
    assert len(set(nodes)) == len(nodes) == 3, f"agents share node names: {nodes}"


def test_the_compose_demo_drives_the_stack(compose: dict[str, Any]) -> None:
    services = compose["services"]
    demo = parse_pyhami(services["demo"]["command"], "compose service demo")
    scheduler = parse_pyhami(services["scheduler"]["command"], "compose service scheduler")
    url = urlsplit(demo.daemon)
    assert (url.hostname, url.port) == ("scheduler", scheduler.listen[1]), (
        f"the demo drives {demo.daemon}, the daemon listens on scheduler:{scheduler.listen[1]}")
    t4 = parse_pyhami(services["agent-t4"]["command"], "compose service agent-t4")
    assert demo.lab_node == t4.node and t4.inventory.value == "t4x4", (
        "the lab runs on the four-T4 node")
    assert {"scheduler", "agent-t4"} <= set(services["demo"]["depends_on"])


def test_compose_urls_and_ports_agree(compose: dict[str, Any]) -> None:
    nats = compose["services"]["nats"]
    command = nats["command"]
    nats_port = int(command[command.index("--port") + 1]) if "--port" in command else 4222
    for name, service in pyhami_services(compose).items():
        args = parse_pyhami(service["command"], f"compose service {name}")
        if args.command in ("demo", "certs", "nats-auth"):
            continue  # the demo speaks to the daemon only; the others make credentials
        url = urlsplit(args.nats)
        assert (url.hostname, url.port or 4222) == ("nats", nats_port), (
            f"service {name} connects to {args.nats}, NATS listens on nats:{nats_port}")
        assert "nats" in service.get("depends_on", []), f"service {name} starts before NATS"
    scheduler = compose["services"]["scheduler"]
    args = parse_pyhami(scheduler["command"], "compose service scheduler")
    published = {int(str(mapping).rpartition(":")[2]) for mapping in scheduler["ports"]}
    assert {args.listen[1], args.metrics[1]} <= published, (
        f"scheduler listens on {args.listen} and {args.metrics}, publishes {published}")
    assert args.listen[0] == "0.0.0.0", "the daemon in a container must listen on all addresses"


def published_ports(service: dict[str, Any]) -> list[tuple[str, int]]:
    """The (host address, host port) of each port a compose service publishes, in the short
    ("[ADDRESS:]PORT:TARGET") or the long ({host_ip, published, target}) form."""
    published = []
    for mapping in service.get("ports", []):
        if isinstance(mapping, dict):
            published.append((str(mapping.get("host_ip", "")), int(mapping["published"])))
            continue
        parts = str(mapping).split(":")
        assert len(parts) in {2, 3}, f"port {mapping!r} publishes on every address"
        address = parts[0] if len(parts) == 3 else ""
        published.append((address, int(parts[-2])))
    return published


def test_compose_publishes_only_the_daemon_and_only_on_loopback(compose: dict[str, Any]) -> None:
    published = {name: published_ports(service)
                 for name, service in compose["services"].items() if service.get("ports")}
    assert set(published) == {"scheduler"}, f"services publishing ports: {sorted(published)}"
    for name, ports in published.items():
        for address, port in ports:
            where = address or "every address"
            assert address == "127.0.0.1", f"{name} publishes {port} on {where}"


def test_compose_makes_the_credentials_every_part_uses(compose: dict[str, Any]) -> None:
    """The one-shot steps write what NATS, the daemon and each agent read, at the paths
    they read it from; every NATS client verifies the server, every agent has its token."""
    services = compose["services"]
    certs = parse_pyhami(services["certificates"]["command"], "compose certificates")
    auth = parse_pyhami(services["credentials"]["command"], "compose credentials")
    assert certs.keep_existing and auth.keep_existing, "a restart would replace credentials"
    assert "nats" in certs.dns, "the NATS certificate does not name the host clients dial"
    assert Path(auth.tls) == certs.dir
    nats_command = services["nats"]["command"]
    assert nats_command[nats_command.index("--config") + 1] == f"{auth.directory}/nats.conf"
    assert services["nats"]["depends_on"]["credentials"]["condition"] == (
        "service_completed_successfully")
    assert services["credentials"]["depends_on"]["certificates"]["condition"] == (
        "service_completed_successfully")
    ca = str(certs.dir / "ca.pem")
    scheduler = parse_pyhami(services["scheduler"]["command"], "compose scheduler")
    assert scheduler.nats_auth_dir == auth.directory and scheduler.nats_ca == ca
    agents = {name: parse_pyhami(service["command"], f"compose service {name}")
              for name, service in services.items() if name.startswith("agent-")}
    assert sorted(args.node for args in agents.values()) == sorted(auth.agents)
    for name, args in agents.items():
        assert args.nats_token_file == f"{auth.directory}/{args.node}.token", name
        assert args.nats_ca == ca, name
    for args in (scheduler, *agents.values()):
        assert urlsplit(args.nats).scheme == "tls", f"{args.command} speaks to NATS in clear"


# Dockerfile ---------------------------------------------------------------------------------


def test_dockerfile_installs_the_wheel_that_build_dist_makes() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM (\S+)", text, re.M)
    assert stages and all(image.startswith("python:3.11-slim") for image in stages), stages
    assert "RUN scripts/build-dist.sh /dist" in text, "the image does not build with build-dist.sh"
    assert re.search(r"^RUN pip install /dist/pyhami-\*\.whl\b", text, re.M), (
        "the final stage does not install the built wheel")
    assert not re.search(r"pip install \.(\s|$)", text), "the image installs the source tree"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    copied = set(re.findall(r"^COPY (\S+) ", text, re.M))
    for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        package = pattern.rstrip("*")
        assert package in copied, f"the Dockerfile does not copy the package {package}"
    assert "pyproject.toml" in text


# k8s/ ----------------------------------------------------------------------------------------


def test_every_k8s_document_parses_and_names_itself() -> None:
    files = sorted(K8S.glob("*.yaml"))
    assert files, "k8s/ holds no manifests"
    for path in files:
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        assert documents, f"{path.name} is empty"
        for doc in documents:
            where = f"{path.name}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
            assert isinstance(doc.get("apiVersion"), str) and doc["apiVersion"], where
            assert isinstance(doc.get("kind"), str) and doc["kind"], where
            assert doc.get("metadata", {}).get("name"), where
            if doc["kind"] not in CLUSTER_SCOPED and doc["kind"] != "RoleBinding":
                assert doc["metadata"].get("namespace") == "pyhami-system", where


def _objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in manifests()}


def test_the_e2e_suite_uses_the_configmaps_scheduler_config() -> None:
    config_map = yaml.safe_load(SCHEDULER_CONFIG_MAP.read_text())
    assert config_map["kind"] == "ConfigMap"
    assert shipped_scheduler_config() == config_map["data"]["config.yaml"]
    deployment = _objects()[("Deployment", "pyhami-scheduler")]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == config_map["metadata"]["name"]


def test_scheduler_config_hands_gpu_resources_to_the_extender() -> None:
    config = yaml.safe_load(shipped_scheduler_config())
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == [SCHEDULER_NAME]
    (extender,) = config["extenders"]
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"],
            extender["preemptVerb"]) == ("filter", "prioritize", "bind", "preempt")
    assert extender["nodeCacheCapable"] is True and extender["enableHTTPS"] is False
    assert extender["httpTimeout"] and extender["weight"] >= 1
    managed = {r["name"]: r["ignoredByScheduler"] for r in extender["managedResources"]}
    assert managed == dict.fromkeys(GPU_RESOURCES, True), (
        f"managedResources {managed}: every nvidia.com resource, ignoredByScheduler")
    assert config["leaderElection"]["resourceName"] == SCHEDULER_NAME


def test_the_daemons_follow_the_lease_kube_scheduler_elects_on() -> None:
    election = yaml.safe_load(shipped_scheduler_config())["leaderElection"]
    deployment = _objects()[("Deployment", "pyhami-scheduler")]
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    command = containers["extender"]["command"]
    parse_pyhami(command, "Deployment pyhami-scheduler")
    lease = f"{election['resourceNamespace']}/{election['resourceName']}"
    assert f"--leader-lease={lease}" in command


def test_k8s_runs_two_scheduler_pods_that_a_drain_moves_one_at_a_time() -> None:
    objects = _objects()
    deployment = objects[("Deployment", "pyhami-scheduler")]
    budget = objects[("PodDisruptionBudget", "pyhami-scheduler")]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0,
                                                               "maxSurge": 1}
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    assert budget["spec"]["maxUnavailable"] == 1, "0 would block every node drain"
    pod = deployment["spec"]["template"]
    (preferred,) = pod["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    term = preferred["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_k8s_leader_election_runs_kubernetes_default_timings() -> None:
    election = yaml.safe_load(shipped_scheduler_config())["leaderElection"]
    assert (election["leaseDuration"], election["renewDeadline"], election["retryPeriod"]) == (
        "15s", "10s", "2s")


def test_scheduler_pod_wires_kube_scheduler_to_the_extender() -> None:
    config = yaml.safe_load(shipped_scheduler_config())
    deployment = _objects()[("Deployment", "pyhami-scheduler")]
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    args = parse_pyhami(containers["extender"]["command"], "Deployment pyhami-scheduler")
    assert args.command == "scheduler" and args.in_cluster
    url = urlsplit(config["extenders"][0]["urlPrefix"])
    assert url.hostname == "127.0.0.1" and url.port == args.listen[1], (
        f"kube-scheduler calls {url.geturl()}, the extender listens on {args.listen}")
    assert url.path.rstrip("/") == args.url_prefix.rstrip("/")
    ports = {p["containerPort"] for p in containers["extender"]["ports"]}
    assert args.metrics[1] in ports
    scheduler_command = containers["kube-scheduler"]["command"]
    mount = containers["kube-scheduler"]["volumeMounts"][0]["mountPath"]
    assert f"--config={mount}/config.yaml" in scheduler_command


def _nats_service_url() -> tuple[str, int]:
    service = _objects()[("Service", "pyhami-nats")]
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "client")
    return f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc", port


def _nats_server_hosts() -> list[str]:
    """Each NATS server pod's stable DNS name, through the StatefulSet's headless Service."""
    statefulset = _objects()[("StatefulSet", "pyhami-nats")]
    name, namespace = statefulset["metadata"]["name"], statefulset["metadata"]["namespace"]
    headless = statefulset["spec"]["serviceName"]
    return [f"{name}-{index}.{headless}.{namespace}.svc"
            for index in range(statefulset["spec"]["replicas"])]


def test_k8s_pyhami_commands_parse_and_reach_every_nats_server() -> None:
    _, port = _nats_service_url()
    hosts = _nats_server_hosts()
    objects = _objects()
    pod_specs = {
        "Deployment pyhami-scheduler": objects[("Deployment", "pyhami-scheduler")],
        "DaemonSet pyhami-agent": objects[("DaemonSet", "pyhami-agent")],
    }
    for where, workload in pod_specs.items():
        for container in workload["spec"]["template"]["spec"]["containers"]:
            if container["command"][0] != "pyhami":
                continue
            args = parse_pyhami(container["command"], where)
            urls = [urlsplit(url) for url in args.nats.split(",")]
            assert [(url.hostname, url.port) for url in urls] == [(host, port) for host in hosts], (
                f"{where} connects to {args.nats}")


def test_k8s_nats_is_a_cluster_of_three_routed_by_pod_name() -> None:
    objects = _objects()
    statefulset = objects[("StatefulSet", "pyhami-nats")]
    conf = objects[("ConfigMap", "pyhami-nats-config")]["data"]["nats.conf"]
    assert statefulset["spec"]["replicas"] == 3
    routes = re.search(r"routes: \[(.*?)\]", conf, re.DOTALL)
    assert routes, conf
    assert routes[1].split() == [f"nats://{host}:6222" for host in _nats_server_hosts()]
    assert "listen: 0.0.0.0:6222" in conf and "server_name: $POD_NAME" in conf
    # Every server admits clients by the daemon's auth callout.
    assert 'include "auth/auth.conf"' in conf
    headless = objects[("Service", statefulset["spec"]["serviceName"])]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    budget = objects[("PodDisruptionBudget", "pyhami-nats")]["spec"]
    assert budget == {"maxUnavailable": 1, "selector": statefulset["spec"]["selector"]}
    pod = statefulset["spec"]["template"]
    (preferred,) = pod["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= pod[
        "metadata"]["labels"].items()


def test_agent_daemonset_reads_its_node_name_and_the_cards() -> None:
    daemonset = _objects()[("DaemonSet", "pyhami-agent")]
    spec = daemonset["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    args = parse_pyhami(container["command"], "DaemonSet pyhami-agent")
    assert args.command == "agent" and args.inventory.kind == "nvml" and args.node is None
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert spec["nodeSelector"], "the agent must run on GPU nodes only"


def test_nats_statefulset_runs_jetstream_behind_its_service() -> None:
    objects = _objects()
    statefulset = objects[("StatefulSet", "pyhami-nats")]
    conf = objects[("ConfigMap", "pyhami-nats-config")]["data"]["nats.conf"]
    assert "jetstream" in conf
    assert statefulset["spec"]["serviceName"] in {name for kind, name in objects
                                                 if kind == "Service"}
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    service = objects[("Service", "pyhami-nats")]
    assert service["spec"]["selector"].items() <= labels.items()
    _, port = _nats_service_url()
    assert f"port: {port}" in conf


def test_rbac_binds_the_service_accounts_the_workloads_use() -> None:
    objects = _objects()
    accounts = {name for kind, name in objects if kind == "ServiceAccount"}
    for kind, name in (("Deployment", "pyhami-scheduler"), ("DaemonSet", "pyhami-agent")):
        used = objects[(kind, name)]["spec"]["template"]["spec"]["serviceAccountName"]
        assert used in accounts, f"{kind} {name} runs as {used}, which k8s/ does not create"
    bound = {subject["name"] for (kind, _), doc in objects.items()
             if kind in {"ClusterRoleBinding", "RoleBinding"} for subject in doc["subjects"]}
    assert bound == {"pyhami-scheduler"}, f"bindings name {bound}"
    roles = {doc["roleRef"]["name"] for (kind, _), doc in objects.items()
             if kind in {"ClusterRoleBinding", "RoleBinding"}}
    assert {"system:kube-scheduler", "system:volume-scheduler",
            "extension-apiserver-authentication-reader"} <= roles


# charts/pyhami (rendered and created for real by tests/e2e/test_chart.py) -----------------

CHART = REPO / "charts" / "pyhami"
# Maps whose keys are the user's own (labels, selectors), not the chart's settings.
FREE_FORM_VALUES = {"nodeSelector", "labels", "annotations", "podAnnotations", "affinity",
                    "namespaceSelector", "podSelector"}
GENERATED = "# Generated by scripts/render-k8s.sh from the Helm chart charts/pyhami"


def _chart_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def test_the_chart_and_the_package_share_one_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["name"] == "pyhami" and chart["apiVersion"] == "v2"
    assert chart["version"] == chart["appVersion"] == project["version"]


def _unknown_keys(given: dict[str, Any], known: dict[str, Any], where: str) -> list[str]:
    unknown = []
    for key, value in given.items():
        path = f"{where}{key}"
        if key not in known:
            unknown.append(path)
        elif key not in FREE_FORM_VALUES and isinstance(value, dict) and value:
            if not isinstance(known[key], dict):
                unknown.append(f"{path} (not a map in values.yaml)")
            else:
                unknown.extend(_unknown_keys(value, known[key], f"{path}."))
    return unknown


@pytest.mark.parametrize("name", ["k8s-values.yaml", "custom-values.yaml"])
def test_every_value_the_value_sets_give_is_a_chart_value(name: str) -> None:
    given = yaml.safe_load((CHART / "ci" / name).read_text()) or {}
    unknown = _unknown_keys(given, _chart_values(), "")
    assert not unknown, f"ci/{name} sets values the chart does not have: {unknown}"


def test_k8s_is_generated_from_the_chart_but_the_namespace() -> None:
    for path in sorted(K8S.glob("*.yaml")):
        generated = path.read_text().startswith(GENERATED)
        assert generated is (path.name != "namespace.yaml"), (
            f"k8s/{path.name}: every file but namespace.yaml comes from scripts/render-k8s.sh")


def test_the_chart_renders_for_the_kubernetes_the_suite_tests() -> None:
    build = (REPO / "scripts" / "build-control-plane.sh").read_text()
    tested = re.search(r'K8S_VERSION="\$\{PYHAMI_K8S_VERSION:-(v[0-9.]+)\}"', build)
    assert tested, "build-control-plane.sh names no default Kubernetes version"
    render = (REPO / "scripts" / "render-k8s.sh").read_text()
    assert f"--kube-version {tested[1]}" in render
    assert _chart_values()["scheduler"]["kubeScheduler"]["image"]["tag"] == tested[1]


def _value_paths(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Every key of values.yaml down to its leaves (a map with no keys is a leaf)."""
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in FREE_FORM_VALUES:
            yield from _value_paths(value, f"{path}.")
        else:
            yield path


def _readme_value_keys() -> set[str]:
    """The keys the chart README's values table lists: a row's first cell names full keys
    and `.sibling`s of the key before them."""
    listed: set[str] = set()
    for line in (CHART / "README.md").read_text().splitlines():
        if not line.startswith("| `"):
            continue
        parent = ""
        for key in re.findall(r"`([^`]+)`", line.split("|")[1]):
            if key.startswith(".") and parent:
                listed.add(parent + key)
            else:
                listed.add(key)
                parent = key.rpartition(".")[0]
    return listed


def test_the_chart_readme_lists_every_value() -> None:
    listed = _readme_value_keys()

    def covered(path: str) -> bool:  # the key, or a map above it, has its row
        parts = path.split(".")
        return any(".".join(parts[:end]) in listed for end in range(1, len(parts) + 1))

    missing = [path for path in _value_paths(_chart_values()) if not covered(path)]
    assert not missing, f"charts/pyhami/README.md's values table lacks {missing}"
