"""The local nats-server the tests and benchmarks start: ports that another process may
take between being chosen and being listened on."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from pyhami.natsserver import LocalNatsCluster, LocalNatsServer, NatsServerError, free_port


def _ephemeral_range() -> range:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return range(int(low), int(high) + 1)


def test_chosen_ports_are_outside_the_range_the_kernel_gives_outgoing_connections() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert not [port for port in ports if port in _ephemeral_range()]


def test_a_chosen_port_taken_before_the_first_start_is_replaced() -> None:
    server = LocalNatsServer()
    taken = server.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        server.start()
        try:
            assert server.port != taken
            assert server.url.endswith(f":{server.port}")
        finally:
            server.kill()


def test_a_given_port_taken_is_refused_with_the_servers_own_reason() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(NatsServerError, match="address already in use"):
            LocalNatsServer(port=port).start()


@pytest.mark.slow  # a cluster of three nats-servers
def test_a_cluster_whose_port_is_taken_before_it_first_starts_forms_on_new_ports(
        tmp_path: Path) -> None:
    cluster = LocalNatsCluster(tmp_path)
    arguments = cluster.servers[1].extra_args
    route = arguments[arguments.index("--cluster") + 1]
    taken = int(route.rpartition(":")[2])
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        cluster.start()
        try:
            assert len(cluster.running()) == 3
            assert route not in cluster.servers[1].extra_args
            assert cluster.meta_leader() is not None
        finally:
            cluster.stop()
