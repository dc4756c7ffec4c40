"""Trying again at start while what the daemon needs does not answer yet: JetStream (a
stream electing its leader, a server of the cluster lost or restarting as the daemon
starts) and the cluster's API. Patience has an end on the bus: the start then stops with
a ``StartupError`` in one line."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.aio.client import Client

from common.buckets import BucketReplicasError
from common.messaging import describe_error
from scheduler.cluster import ClusterError
from scheduler.errors import StartupError

logger = logging.getLogger(__name__)

BUS_START_PATIENCE_S = 60.0
"""How long the start asks JetStream again while it does not answer in time (a stream
electing its leader, a server of the cluster lost as the daemon starts) before it stops."""
BUS_START_RETRY_S = 1.0
API_RETRY_S = 2.0
"""How long the start waits before it asks the cluster's API again."""
T = TypeVar("T")


async def while_the_bus_times_out(what: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """``attempt()``'s result, tried again every ``BUS_START_RETRY_S`` while JetStream
    does not answer in time, for at most ``BUS_START_PATIENCE_S``; then ``StartupError``
    in one line. Any other error goes to the caller."""
    deadline = time.monotonic() + BUS_START_PATIENCE_S
    while True:
        try:
            return await attempt()
        except TimeoutError as error:  # nats-py's own TimeoutError is one too
            if time.monotonic() + BUS_START_RETRY_S >= deadline:
                raise StartupError(f"{what} could not be opened: JetStream did not answer "
                                   f"within {BUS_START_PATIENCE_S:g}s "
                                   f"({describe_error(error)})") from None
            logger.warning("%s not opened yet, trying again in %gs: JetStream did not answer "
                           "(%s)", what, BUS_START_RETRY_S, describe_error(error))
        except BucketReplicasError as error:
            if not error.transient:
                raise  # too few servers: the caller says so in one line
            # Servers of the cluster coming back: their peers are known but offline.
            if time.monotonic() + BUS_START_RETRY_S >= deadline:
                raise StartupError(str(error)) from None
            logger.warning("%s not opened yet, trying again in %gs: %s", what,
                           BUS_START_RETRY_S, error)
        await asyncio.sleep(BUS_START_RETRY_S)


def unless_jetstream_is_starting(client: Client, error: Exception) -> None:
    """A JetStream question nobody answered: where the server says it runs JetStream (its
    INFO), JetStream is only not ready (a cluster without a majority yet, a server just
    restarted): raise ``TimeoutError``, which the start asks again on. Else return."""
    info = getattr(client, "_server_info", None) or {}
    if info.get("jetstream"):
        raise TimeoutError(f"JetStream is not ready on its server yet "
                           f"({describe_error(error)})")


async def while_the_api_fails(what: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """``attempt()``'s result, tried again every ``API_RETRY_S`` while the cluster fails
    (``ClusterError``); any other error goes to the caller."""
    while True:
        try:
            return await attempt()
        except ClusterError as error:
            logger.warning("%s not obtained, trying again in %gs: %s", what, API_RETRY_S,
                           error)
            await asyncio.sleep(API_RETRY_S)
