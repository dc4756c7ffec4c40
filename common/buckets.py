"""JetStream key-value buckets kept on as many servers as asked: made with that replica
count when missing, raised to it when an older bucket has fewer, and refused in one line
when the NATS cluster has too few servers to hold it.

A bucket on one server (R1) is lost with that server's disk and unreachable while it is
down; on three (R3) it survives the loss of any one. nats-server changes the replica
count of an existing stream in place (``update_stream``), so an R1 bucket made by an
older pyhami is raised without copying anything by hand.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from nats.js.client import JetStreamContext
from nats.js.errors import APIError, BucketNotFoundError
from nats.js.kv import KeyValue

from common.core.errors import ExternalFailure

logger = logging.getLogger(__name__)

MAX_REPLICAS = 5
"""JetStream's own bound on a stream's replicas."""

CLUSTERED_REPLICAS = 3
"""What a list of several servers gets by default: survives the loss of any one."""

# The JetStream API's error codes for a replica count the servers cannot place.
_NO_SUITABLE_PEERS = 10005
_INSUFFICIENT_RESOURCES = 10023
_REPLICAS_NOT_CLUSTERED = 10074
_PLACEMENT_REFUSED = frozenset({_NO_SUITABLE_PEERS, _INSUFFICIENT_RESOURCES,
                                _REPLICAS_NOT_CLUSTERED})
_PEER_OFFLINE = "peer offline"
"""What nats-server adds to "no suitable peers for placement" when the cluster has the
servers but some are down at the moment."""
# Another daemon made the bucket between our look and our create.
_NAME_IN_USE = 10058


class BucketReplicasError(ExternalFailure):
    """The NATS servers cannot hold a bucket with the replica count asked."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient
        """The servers are there but some are offline now (restarting, partitioned): the
        same request may succeed once they are back, unlike too few servers."""


def replica_count(text: str) -> int:
    """``--bucket-replicas``: an odd whole number from 1 to ``MAX_REPLICAS``.

    Even counts are refused: JetStream's groups need a majority, so R2 survives no more
    losses than R1 and R4 no more than R3, while each costs a server more."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= count <= MAX_REPLICAS or count % 2 == 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} must be 1, 3 or 5 (an even count survives no more server losses than "
            "the odd one below it)")
    return count


def default_replicas(servers: Sequence[str]) -> int:
    """1 for a single server URL, 3 for several.

    The URLs are the servers a client was told of, not necessarily the whole cluster; two
    URLs most often name two of three servers. A cluster that really has fewer servers
    than 3 is refused at start (``open_key_value``), and ``--bucket-replicas 1`` says so."""
    return 1 if len(servers) <= 1 else CLUSTERED_REPLICAS


async def open_key_value(js: JetStreamContext, name: str, *, replicas: int,
                         ttl: float | None = None) -> KeyValue:
    """The bucket ``name`` on ``replicas`` servers: made when missing (history 1, entries
    expiring after ``ttl`` seconds if given), raised to ``replicas`` when it has fewer.

    Raises ``BucketReplicasError`` in one line when the servers cannot place that many
    replicas (a single server, or a cluster smaller than ``replicas``)."""
    try:
        bucket = await js.key_value(name)
    except BucketNotFoundError:
        try:
            await js.create_key_value(bucket=name, history=1, ttl=ttl, replicas=replicas)
        except APIError as error:
            if error.err_code in _PLACEMENT_REFUSED:
                raise _refused(name, replicas, error) from None
            if error.err_code != _NAME_IN_USE:
                raise
        bucket = await js.key_value(name)
    await _raise_replicas(js, bucket, name, replicas)
    return bucket


async def _raise_replicas(js: JetStreamContext, bucket: KeyValue, name: str,
                          replicas: int) -> None:
    """An existing bucket with fewer replicas than asked is given them (in place); one with
    more keeps them (another daemon may have asked for more), said in one line."""
    config = (await bucket.status()).stream_info.config
    current = config.num_replicas or 1
    if current == replicas:
        return
    if current > replicas:
        logger.info("NATS bucket %s keeps its %d replicas (--bucket-replicas is %d)",
                    name, current, replicas)
        return
    config.num_replicas = replicas
    try:
        await js.update_stream(config)
    except APIError as error:
        if error.err_code in _PLACEMENT_REFUSED:
            raise _refused(name, replicas, error, current=current) from None
        raise
    logger.warning("NATS bucket %s had %d replica%s: raised to %d", name, current,
                   "" if current == 1 else "s", replicas)


def _refused(name: str, replicas: int, error: APIError,
             current: int | None = None) -> BucketReplicasError:
    had = "" if current is None else f" (it has {current})"
    reason = " ".join((error.description or f"JetStream error {error.err_code}").split())
    return BucketReplicasError(
        f"--bucket-replicas {replicas}: the NATS servers cannot keep bucket {name} on "
        f"{replicas} servers{had}: {reason}; give as many servers in one cluster, or "
        f"--bucket-replicas 1 for a single server",
        # nats-server names why no peer was suitable; "peer offline" is a peer it knows.
        transient=_PEER_OFFLINE in reason)
