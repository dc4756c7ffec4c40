"""Events counted as client-go's recorder counts them: an Event with the same source,
object, type, reason and message is patched (``count`` + 1, ``lastTimestamp``) rather than
created again."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import msgspec

from scheduler.cluster.kube import _client
from scheduler.cluster.kube._requests import ObjectEvent, recurrence_patch
from scheduler.cluster.kube._transport import (
    API_FAILURES,
    CONFLICT,
    NOT_FOUND,
    ApiTransport,
    answered_with,
)
from scheduler.cluster.kube._wire import StoredEvent

EVENT_CACHE_SIZE = 4096  # Events whose count is remembered, as many as client-go's correlator


@dataclass(frozen=True, slots=True)
class EventSeries:
    """What the API holds of an Event this daemon wrote: how often, since when."""

    count: int
    first: str


class SeriesCache:
    """The Events written lately, least recently used first; at most ``size`` of them."""

    def __init__(self, size: int = EVENT_CACHE_SIZE) -> None:
        self._size = size
        self._series: OrderedDict[str, EventSeries] = OrderedDict()

    def get(self, key: str) -> EventSeries | None:
        series = self._series.get(key)
        if series is not None:
            self._series.move_to_end(key)
        return series

    def put(self, key: str, series: EventSeries) -> None:
        self._series[key] = series
        self._series.move_to_end(key)
        if len(self._series) > self._size:
            self._series.popitem(last=False)

    def __len__(self) -> int:
        return len(self._series)


async def write_event(api: ApiTransport, event: ObjectEvent, known: EventSeries | None,
                      now: str, *, instance: str) -> EventSeries:
    """Write the Event at ``now``, or count one more of the series ``known``.
    Answers the series as the API server holds it now."""
    if known is not None:
        count = known.count + 1
        try:
            await _client.patch_event(api, event.namespace, event.name,
                                recurrence_patch(count, now))
            return EventSeries(count, known.first)
        except API_FAILURES as error:
            if not answered_with(error, NOT_FOUND):
                raise
        # Gone (the API server's --event-ttl, or deleted): written anew, its count and
        # first time carried on, as client-go does.
        await _client.create_event(api, event.namespace, event.body(
            instance=instance, count=count, first=known.first, last=now))
        return EventSeries(count, known.first)
    try:
        await _client.create_event(api, event.namespace, event.body(
            instance=instance, count=1, first=now, last=now))
        return EventSeries(1, now)
    except API_FAILURES as error:
        if not answered_with(error, CONFLICT):
            raise
    # Written before this daemon remembered it (a restart, or a series the cache let go):
    # count on from what the API server holds.
    held = msgspec.json.decode(await _client.read_event(api, event.namespace, event.name),
                               type=StoredEvent)
    count = held.count + 1
    await _client.patch_event(api, event.namespace, event.name, recurrence_patch(count, now))
    return EventSeries(count, held.first_timestamp or now)
