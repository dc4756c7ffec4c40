"""The containers' HAMi-core folders on the node, read at each scan, and the feedback loop
run over what was read: HAMi's ``ContainerLister`` and ``Observe``, bounded.

Each folder ``<pod uid>_<container>`` under the containers folder holds one container's
cache file. A scan lists the folders, picks each one's cache file by HAMi's rule and reads
it (``agent.monitor.cache``); ``feedback`` then writes the priority loop's decisions back
(``agent.monitor.feedback``). Both block on the file system: the agent calls them in a
worker thread, every 5 s as HAMi does.

Unlike HAMi, which maps a folder's file once and keeps that mapping for as long as the
folder's name is listed (so a folder the device plugin recreated is read from the old,
unlinked file), every scan reads each file again by its path.

A cache file is written by the container it belongs to, so it speaks only for the cards
that container was given (``Allocation``, from the daemon's list of the pods holding
cards): the cards it names beyond them are counted as lies and logged, never acted on
(HAMi v2.10 acts on any uuid in the file, so a container naming its neighbour's card can
pause the neighbour's kernels). A container whose cards are not known speaks for none.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.monitor.cache import (
    UUID_LABEL_BYTES,
    Reason,
    Refused,
    Region,
    open_folder,
    read_cache_file,
)
from agent.monitor.feedback import PAUSED, Control, decide, read_control, write_control
from agent.monitor.model import ContainerUsage
from agent.vendors.nvidia.hamicore import folder_pod
from common.arguments import positive_seconds
from common.messaging import RateLimitedLog
from common.settings import setting
from common.wire import HoldingPod

logger = logging.getLogger(__name__)

DEFAULT_CONTAINERS_DIR = Path("/usr/local/vgpu/containers")
"""The device plugin's ``--hami-core-dir`` default and its ``containers`` folder: where
HAMi's device plugin makes the folders and its monitor (``$HOOK_PATH/containers``) reads
them."""
MAX_LISTED = 65_536
"""Entries of the containers folder looked at per scan; beyond, ``listing_truncated``."""
MAX_FOLDER_ENTRIES = 64
"""Entries of one container's folder looked at; HAMi-core makes one file there."""
MAX_FOLDERS_LIMIT = 65_536
LIBRARY_MARK = "libvgpu.so"
CACHE_SUFFIX = ".cache"

# Reasons that are the normal course of things: counted, never logged.
QUIET: frozenset[Reason] = frozenset({"not_a_folder", "no_cache_file", "pod_not_live"})


def folder_limit(text: str) -> int:
    """``--cache-folders``: 1 to 65536."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= value <= MAX_FOLDERS_LIMIT:
        raise argparse.ArgumentTypeError(f"{text!r} must be from 1 to {MAX_FOLDERS_LIMIT}")
    return value


@dataclass(frozen=True)
class CacheSettings:
    """Where HAMi-core's cache files are and how much one scan reads."""

    containers_dir: Path = setting(
        DEFAULT_CONTAINERS_DIR, parse=Path, metavar="DIR",
        help="the containers' HAMi-core folders, <pod uid>_<container>, each holding its "
             "cache file (default: {default})")
    cache_folders: int = setting(
        4096, parse=folder_limit, metavar="N",
        help="read at most N containers' cache files per scan; the others are read at the "
             "next scans, in turn (default: {default})")
    cache_scan_time: float = setting(
        2.0, parse=positive_seconds, metavar="SECONDS",
        help="stop reading cache files once a scan has taken this long; the folders left "
             "are read first at the next scan (default: {default})")


@dataclass(frozen=True, slots=True)
class Allocation:
    """What one container was given: the cards its cache file may speak for."""

    pod: str
    """``namespace/name``, for the log."""
    cards: frozenset[str]
    """The uuids of the cards the container was given (the device plugin's Allocate puts
    them in its environment, from the pod's allocation annotation)."""


Allocations = Mapping[tuple[str, str], Allocation]
"""By (pod uid, container name), the key of a container's folder."""


def allocations_of(pods: Iterable[HoldingPod]) -> dict[tuple[str, str], Allocation]:
    """Each container's cards, from the daemon's list of the pods holding cards on the node
    (init containers included: HAMi-core runs in them too). Pure."""
    return {(pod.uid, container.name): Allocation(f"{pod.namespace}/{pod.name}",
                                                  frozenset(container.cards))
            for pod in pods for container in pod.containers}


def vouch(names: Sequence[bytes], given: Collection[str]
          ) -> tuple[tuple[str, ...], tuple[bytes, ...]]:
    """Of the uuids a cache file names (``Region.card_uuids``): those of cards the
    container was ``given``, in order (a card named twice is counted twice, as HAMi's
    census counts it), and the others, each once: lies, never acted on. Pure."""
    held, lies = [], []
    for name in names:
        try:
            card = name.decode("utf-8")
        except UnicodeDecodeError:
            card = None
        if card is not None and card in given:
            held.append(card)
        elif name not in lies:
            lies.append(name)
    return tuple(held), tuple(lies)


@dataclass(frozen=True, slots=True)
class ContainerCache:
    """One container's cache file as a scan read it."""

    folder: str
    pod_uid: str
    container: str
    region: Region
    """The file's figures and what the feedback loop needs to write into it."""
    allocation: Allocation | None = None
    """What the container was given; None where it is not known: the file then speaks for
    no card (no usage, no feedback, its own file left as it is)."""

    @property
    def cards(self) -> tuple[str, ...]:
        """The cards the file names that the container was given: what the feedback loop
        counts and decides on."""
        if self.allocation is None:
            return ()
        return vouch(self.region.card_uuids, self.allocation.cards)[0]

    @property
    def lies(self) -> tuple[bytes, ...]:
        """The uuids the file names that the container was not given."""
        if self.allocation is None:
            return ()
        return vouch(self.region.card_uuids, self.allocation.cards)[1]

    @property
    def usage(self) -> ContainerUsage:
        """The container's figures on the cards it was given (none when not known)."""
        given = frozenset() if self.allocation is None else self.allocation.cards
        return self.region.usage(self.pod_uid, self.container, given)


@dataclass(frozen=True, slots=True)
class CacheScan:
    """What one scan read, and what it skipped and why."""

    containers: tuple[ContainerCache, ...]
    skipped: Mapping[Reason, int]
    """This scan's skips by reason (a folder, a file, or one card of a file)."""
    listed: int
    """Folders listed in the containers folder."""
    seconds: float
    lies: int = 0
    """Uuids named by cache files whose containers were not given those cards."""

    @property
    def usage(self) -> list[ContainerUsage]:
        """The usage of the containers whose cards are known, on those cards only."""
        return [cache.usage for cache in self.containers if cache.allocation is not None]


@dataclass(frozen=True, slots=True)
class FeedbackResult:
    """What one round of the feedback loop wrote."""

    written: tuple[str, ...]
    """The folders whose file was written."""
    paused: tuple[str, ...]
    """The folders whose containers are paused after this round (``recent_kernel`` -1)."""
    skipped: Mapping[Reason, int] = field(default_factory=dict)


class ContainerCaches:
    """HAMi-core's cache files under one containers folder: ``scan`` reads them,
    ``feedback`` runs the priority loop over a scan. Not thread-safe: one worker thread
    calls both, one after the other."""

    def __init__(self, settings: CacheSettings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._root = settings.containers_dir
        self._max_folders = settings.cache_folders
        self._budget = settings.cache_scan_time
        self._clock = clock
        self._log = RateLimitedLog(clock, logger)
        self._skipped: Counter[Reason] = Counter()
        self._lies = 0
        # The last folder read by a scan that could not read them all: the next starts
        # after it, so every folder is read in turn however many there are.
        self._cursor: str | None = None

    @property
    def skipped(self) -> Mapping[Reason, int]:
        """Skips by reason over the agent's life (scans and feedback rounds)."""
        return dict(self._skipped)

    @property
    def lies(self) -> int:
        """Uuids of cards not given to their container, named by cache files, over the
        agent's life (counted again at every scan that reads them)."""
        return self._lies

    def scan(self, live_pods: Collection[str] | None = None,
             allocations: Allocations | None = None) -> CacheScan:
        """Read the cache file of every container folder, within the bounds; ``live_pods``
        (the uids of the pods the node runs), when given, leaves the others unread, as
        HAMi's monitor does not load the folders of pods it does not know.

        ``allocations`` (``allocations_of`` the daemon's list) says which cards each
        container was given: its file speaks for those only, the others it names are lies
        (counted, logged); a container not in it speaks for none (``no_allocation``)."""
        started = self._clock()
        skipped: Counter[Reason] = Counter()
        names = self._list(skipped)
        wanted = []
        for name in names:
            uid, separator, container = name.partition("_")
            if not (separator and uid and container):
                self._skip(skipped, Refused("no_separator", f"{self._root / name}: "
                                                            "not <pod uid>_<container>"))
            elif folder_pod(name) is None:
                self._skip(skipped, Refused("bad_name", f"{self._root / name}: not a pod "
                                                        "uid and a container name"))
            elif live_pods is not None and uid not in live_pods:
                self._skip(skipped, Refused("pod_not_live", f"{self._root / name}"))
            else:
                wanted.append((name, uid, container))
        turn = self._in_turn(wanted)
        chosen = turn[:self._max_folders]
        self._count_left(skipped, "over_limit", len(turn) - len(chosen))
        containers, last, lies = [], None, 0
        for place, (name, uid, container) in enumerate(chosen):
            # At least one folder a scan, however long the listing took: none starves.
            if place > 0 and self._clock() - started > self._budget:
                self._count_left(skipped, "over_time", len(chosen) - place)
                break
            last = name
            read = self._read_folder(self._root / name)
            if isinstance(read, Refused):
                self._skip(skipped, read)
                continue
            if read.bad_uuids:
                self._skip(skipped, Refused("bad_uuid", f"{read.path}: a card's uuid is "
                                                        "not UTF-8"), read.bad_uuids)
            allocation = None if allocations is None else allocations.get((uid, container))
            cache = ContainerCache(name, uid, container, read, allocation)
            if allocation is None:
                self._skip(skipped, Refused("no_allocation", f"{read.path}: the cards of "
                                            f"container {container} of pod {uid} are not "
                                            "known: the file speaks for none"))
            elif cache.lies:
                lies += len(cache.lies)
                self._lied(cache, allocation)
            containers.append(cache)
        complete = skipped["over_limit"] == 0 and skipped["over_time"] == 0
        self._cursor = None if complete else last
        self._lies += lies
        return CacheScan(tuple(containers), dict(skipped), len(names),
                         self._clock() - started, lies)

    def feedback(self, scan: CacheScan) -> FeedbackResult:
        """One round of HAMi's priority loop over the containers ``scan`` read: each
        file's fields read again just before deciding, each write made only if the file
        is still the one read."""
        skipped: Counter[Reason] = Counter()
        read: list[tuple[ContainerCache, Control]] = []
        for cache in scan.containers:
            if cache.allocation is None:
                continue  # its cards are not known: neither counted nor written
            control = read_control(cache.region, cache.cards)
            if isinstance(control, Refused):
                self._skip(skipped, control)
                continue
            read.append((cache, control))
        written, paused = [], []
        decisions = decide([control for _, control in read])
        for (cache, control), writes in zip(read, decisions, strict=True):
            if writes.needed:
                refused = write_control(cache.region, writes)
                if refused is not None:
                    self._skip(skipped, refused)
                    continue
                written.append(cache.folder)
            recent = control.recent_kernel if writes.recent_kernel is None \
                else writes.recent_kernel
            if recent == PAUSED:
                paused.append(cache.folder)
        return FeedbackResult(tuple(written), tuple(paused), dict(skipped))

    def _list(self, skipped: Counter[Reason]) -> list[str]:
        """The folders' names, sorted; at most ``MAX_LISTED`` entries looked at."""
        names = []
        try:
            with os.scandir(self._root) as entries:
                for seen, entry in enumerate(entries):
                    if seen >= MAX_LISTED:
                        self._skip(skipped, Refused("listing_truncated", f"{self._root}: "
                                                    f"more than {MAX_LISTED} entries"))
                        break
                    if entry.is_dir(follow_symlinks=False):
                        names.append(entry.name)
                    else:
                        self._skip(skipped, Refused("not_a_folder", entry.path))
        except FileNotFoundError:
            return []  # no container has been allocated HAMi-core on this node yet
        except OSError as error:
            self._skip(skipped, Refused("unreadable", f"{self._root}: "
                                                      f"{error.strerror or error}"))
        return sorted(names)

    def _in_turn(self, wanted: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
        """``wanted`` starting after the last folder the previous scan read."""
        if self._cursor is None:
            return wanted
        after = [item for item in wanted if item[0] > self._cursor]
        return after + wanted[:len(wanted) - len(after)]

    def _lied(self, cache: ContainerCache, allocation: Allocation) -> None:
        """One line a minute at most for all the lying files, naming the pod."""
        named = ", ".join(repr(lie[:UUID_LABEL_BYTES]) for lie in cache.lies[:3])
        more = f" and {len(cache.lies) - 3} more" if len(cache.lies) > 3 else ""
        self._log.warning("cache_lie", "HAMi-core cache file of pod %s (%s), container %s, "
                          "names cards the container was not given, ignored: %s%s",
                          allocation.pod, cache.pod_uid, cache.container, named, more)

    def _read_folder(self, folder: Path) -> Region | Refused:
        cache_file = _cache_file(folder)
        if isinstance(cache_file, Refused):
            return cache_file
        return read_cache_file(cache_file)

    def _count_left(self, skipped: Counter[Reason], reason: Reason, left: int) -> None:
        if left > 0:
            self._skip(skipped, Refused(reason, f"{left} folders under {self._root} left "
                                                "for the next scan"), left)

    def _skip(self, skipped: Counter[Reason], refused: Refused, count: int = 1) -> None:
        skipped[refused.reason] += count
        self._skipped[refused.reason] += count
        if refused.reason not in QUIET:
            self._log.warning(refused.reason, "HAMi-core cache skipped (%s): %s",
                              refused.reason, refused.detail)


def _cache_file(folder: Path) -> Path | Refused:
    """The folder's cache file by HAMi's rule: more than 2 names holding ``libvgpu.so`` or
    ending in ``.cache`` is refused ("cache num not matched"); the first ``.cache`` in name
    order that is not the library is the one."""
    matched = []
    # Listed through a descriptor of the folder itself, opened without following a link.
    fd = open_folder(folder)
    if isinstance(fd, Refused):
        return fd
    try:
        with os.scandir(fd) as entries:
            for seen, entry in enumerate(entries):
                if seen >= MAX_FOLDER_ENTRIES:
                    return Refused("too_many_entries", f"{folder}: more than "
                                                       f"{MAX_FOLDER_ENTRIES} entries")
                if LIBRARY_MARK in entry.name or entry.name.endswith(CACHE_SUFFIX):
                    matched.append(entry.name)
                    if len(matched) > 2:
                        return Refused("too_many_files", f"{folder}: cache num not matched")
    except OSError as error:
        return Refused("unreadable", f"{folder}: {error.strerror or error}")
    finally:
        os.close(fd)
    caches = sorted(name for name in matched
                    if LIBRARY_MARK not in name and name.endswith(CACHE_SUFFIX))
    if not caches:
        return Refused("no_cache_file", f"{folder}: no cache file yet")
    return folder / caches[0]
