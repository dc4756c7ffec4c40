"""docker-compose.cluster.yml, the compose stack on a NATS cluster of three (issue 29):
read as compose would, every command parsed by pyhami's own parser, and the configurations
its credentials step writes made for real, so the names, ports and URLs agree (no container
engine here: docker-compose.yml's checks, tests/cli/test_deploy_files.py, do the same)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.cli.test_deploy_files import parse_pyhami, published_ports
from tests.paths import REPO

CLUSTER_COMPOSE = REPO / "docker-compose.cluster.yml"
NATS_SERVICES = ("nats-1", "nats-2", "nats-3")
SECRETS = "/var/lib/pyhami"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(CLUSTER_COMPOSE.read_text())
    return document


def clients(compose: dict[str, Any]) -> dict[str, Any]:
    """The services that connect to NATS, their commands parsed."""
    parsed = {name: parse_pyhami(service["command"], f"compose service {name}")
              for name, service in compose["services"].items()
              if name not in NATS_SERVICES}
    return {name: args for name, args in parsed.items()
            if args.command in ("scheduler", "agent")}


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_three_nats_servers_each_with_its_configuration_and_its_own_disk(
        compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"certificates", "credentials", *NATS_SERVICES, "scheduler",
                             "agent-t4", "agent-a100", "agent-h100", "demo"}
    disks = set()
    for index, name in enumerate(NATS_SERVICES, start=1):
        command = services[name]["command"]
        assert option(command, "--config") == f"{SECRETS}/nats-{index}.conf", command
        assert "--jetstream" in command, command
        (disk,) = [volume for volume in services[name]["volumes"]
                   if volume.endswith(":" + option(command, "--store_dir"))]
        disks.add(disk.partition(":")[0])
        assert services[name]["depends_on"]["credentials"]["condition"] == (
            "service_completed_successfully")
    assert len(disks) == 3 and disks <= set(compose["volumes"]), disks


def test_the_credentials_step_writes_the_three_servers_routed_by_their_service_names(
        compose: dict[str, Any]) -> None:
    services = compose["services"]
    credentials = parse_pyhami(services["credentials"]["command"], "credentials")
    assert (credentials.command, credentials.cluster) == ("nats-auth", 3)
    assert [host for host, _ in credentials.routes] == list(NATS_SERVICES)
    certificates = parse_pyhami(services["certificates"]["command"], "certificates")
    # Each server's certificate must carry the name the clients dial.
    assert set(NATS_SERVICES) <= set(certificates.dns), certificates.dns


def test_the_written_configurations_name_each_server_its_route_and_the_other_two(
        compose: dict[str, Any], tmp_path: Path) -> None:
    """The compose's credentials command, run here into a folder: nats-1.conf ... nats-3.conf
    listen for routes where the others dial them."""
    services = compose["services"]
    certs = parse_pyhami(services["certificates"]["command"], "certificates")
    command = services["credentials"]["command"]
    folder = tmp_path / "secrets"
    subprocess.run([sys.executable, "-m", "pyhami.cli", "certs", "init", str(folder / "certs"),
                    "--dns", ",".join(certs.dns)], check=True, capture_output=True)
    arguments = [str(folder) if part == SECRETS else
                 str(folder / "certs") if part == f"{SECRETS}/certs" else part
                 for part in command[1:]]
    subprocess.run([sys.executable, "-m", "pyhami.cli", *arguments], check=True,
                   capture_output=True)
    routes = parse_pyhami(command, "credentials").routes
    names = set()
    for index, name in enumerate(NATS_SERVICES, start=1):
        text = (folder / f"nats-{index}.conf").read_text()
        host, port = routes[index - 1]
        assert f'listen: "{host}:{port}"' in text, text
        dialled = set(re.findall(r"nats-route://[^@]+@([^:\"]+):(\d+)", text))
        assert dialled == {(other, str(port)) for other in NATS_SERVICES if other != name}
        names.update(re.findall(r"server_name: \"?([\w-]+)", text))
        assert "auth_callout" in text  # every server admits agents the same way
    assert len(names) == 3, names  # JetStream's peers are told apart by name


def test_every_client_is_given_all_three_servers(compose: dict[str, Any]) -> None:
    services = compose["services"]
    found = clients(compose)
    assert set(found) == {"scheduler", "agent-t4", "agent-a100", "agent-h100"}
    ports = {name: int(option(services[name]["command"], "--port")) for name in NATS_SERVICES}
    for name, args in found.items():
        urls = [urlsplit(url) for url in args.nats.split(",")]
        assert {(url.hostname, url.port) for url in urls} == set(ports.items()), (
            f"service {name} connects to {args.nats}")
        assert all(url.scheme == "tls" for url in urls), args.nats
        assert set(NATS_SERVICES) <= set(services[name]["depends_on"]), (
            f"service {name} may start before a NATS server")


def test_the_daemon_keeps_its_buckets_on_all_three_and_publishes_only_on_loopback(
        compose: dict[str, Any]) -> None:
    services = compose["services"]
    scheduler = parse_pyhami(services["scheduler"]["command"], "compose service scheduler")
    assert scheduler.standalone and scheduler.bucket_replicas == 3
    demo = parse_pyhami(services["demo"]["command"], "compose service demo")
    assert urlsplit(demo.daemon).port == scheduler.listen[1]
    published = {name: published_ports(service)
                 for name, service in services.items() if service.get("ports")}
    assert set(published) == {"scheduler"}
    assert all(address == "127.0.0.1" for address, _ in published["scheduler"])
