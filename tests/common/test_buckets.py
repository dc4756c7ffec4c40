"""The daemon's buckets on as many NATS servers as asked (``common.buckets``), on real
nats-servers: made with the replicas, an older bucket raised to them in place, a cluster
too small for them refused in one line."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.js.errors import APIError

from common.buckets import (
    BucketReplicasError,
    _refused,
    default_replicas,
    open_key_value,
    replica_count,
)
from pyhami.natsserver import LocalNatsCluster, LocalNatsServer


@pytest.fixture
async def cluster_client(nats_cluster: LocalNatsCluster) -> AsyncIterator[Client]:
    client = await nats.connect(servers=nats_cluster.urls)
    yield client
    await client.close()


@pytest.mark.parametrize(("text", "count"), [("1", 1), ("3", 3), ("5", 5)],
                         ids=["one", "three", "five"])
def test_an_odd_replica_count_up_to_5_is_taken(text: str, count: int) -> None:
    assert replica_count(text) == count


@pytest.mark.parametrize("text", ["0", "2", "4", "6", "-1", "3.0", "many"],
                         ids=["zero", "two", "four", "six", "negative", "fraction", "word"])
def test_any_other_replica_count_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
        replica_count(text)


@pytest.mark.parametrize(("servers", "replicas"), [
    (["nats://a:4222"], 1),
    (["nats://a:4222", "nats://b:4222"], 3),
    (["nats://a:4222", "nats://b:4222", "nats://c:4222"], 3),
], ids=["one-url", "two-urls", "three-urls"])
def test_the_default_follows_the_number_of_urls(servers: list[str], replicas: int) -> None:
    assert default_replicas(servers) == replicas


@pytest.mark.slow  # a cluster of three nats-servers
async def test_a_missing_bucket_is_made_on_three_servers(cluster_client: Client) -> None:
    bucket = await open_key_value(cluster_client.jetstream(), "made", replicas=3, ttl=4.0)
    status = await bucket.status()
    assert status.stream_info.config.num_replicas == 3
    assert status.ttl == pytest.approx(4.0)
    assert status.stream_info.cluster is not None
    assert len(status.stream_info.cluster.replicas or []) == 2  # beside its leader


@pytest.mark.slow  # a cluster of three nats-servers
async def test_an_older_single_replica_bucket_is_raised_to_three_keeping_its_entries(
        cluster_client: Client, caplog: pytest.LogCaptureFixture) -> None:
    js = cluster_client.jetstream()
    old = await js.create_key_value(bucket="older", history=1)
    await old.put("pod", b"kept")
    bucket = await open_key_value(js, "older", replicas=3)
    assert (await bucket.status()).stream_info.config.num_replicas == 3
    assert (await bucket.get("pod")).value == b"kept"
    assert "NATS bucket older had 1 replica: raised to 3" in caplog.text


@pytest.mark.slow  # a cluster of three nats-servers
async def test_a_bucket_with_more_replicas_keeps_them(cluster_client: Client) -> None:
    js = cluster_client.jetstream()
    await js.create_key_value(bucket="more", history=1, replicas=3)
    bucket = await open_key_value(js, "more", replicas=1)
    assert (await bucket.status()).stream_info.config.num_replicas == 3


@pytest.mark.slow  # a cluster of three nats-servers
async def test_five_replicas_on_a_cluster_of_three_are_refused_in_one_line(
        cluster_client: Client) -> None:
    with pytest.raises(BucketReplicasError) as refused:
        await open_key_value(cluster_client.jetstream(), "too-many", replicas=5)
    assert str(refused.value) == (
        "--bucket-replicas 5: the NATS servers cannot keep bucket too-many on 5 servers: "
        "no suitable peers for placement; give as many servers in one cluster, or "
        "--bucket-replicas 1 for a single server")


@pytest.mark.slow  # a cluster of three nats-servers
async def test_too_few_servers_is_not_a_passing_refusal(cluster_client: Client) -> None:
    with pytest.raises(BucketReplicasError) as refused:
        await open_key_value(cluster_client.jetstream(), "too-many", replicas=5)
    assert not refused.value.transient


@pytest.mark.parametrize(("description", "transient"), [
    # nats-server's words when the cluster knows the servers but some are down now (seen
    # in CI as servers came back after a loss of majority): the daemon waits for them.
    ("no suitable peers for placement, peer offline", True),
    ("no suitable peers for placement", False),
    ("insufficient resources", False),
])
def test_a_refusal_is_passing_when_a_known_server_is_offline(description: str,
                                                              transient: bool) -> None:
    error = APIError(code=500, err_code=10005, description=description)
    assert _refused("b", 3, error).transient is transient


async def test_raising_a_single_server_bucket_to_three_is_refused_naming_what_it_has(
        jetstream_server: LocalNatsServer) -> None:
    client = await nats.connect(servers=[jetstream_server.url])
    try:
        js = client.jetstream()
        await js.create_key_value(bucket="alone", history=1)
        with pytest.raises(BucketReplicasError, match="keep bucket alone on 3 servers "
                                                      r"\(it has 1\): "):
            await open_key_value(js, "alone", replicas=3)
    finally:
        await client.close()
