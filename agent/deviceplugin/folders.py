"""HAMi-core's folders on the node: each container's, made when it is allocated and
removed once its pod is gone, and the shared lock folder.

HAMi's device plugin makes the folders; HAMi's node monitor removes those of pods the
node no longer runs once they are older than its resync interval (5 minutes). pyhami's
agent does both.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from agent.vendors.nvidia.hamicore import folder_pod

logger = logging.getLogger(__name__)

# Every container's processes, whatever their user, write the cache file and the lock.
OPEN_TO_ALL = 0o777


def make_open_folder(path: Path, *, fresh: bool) -> None:
    """``path`` as a folder every user may write; emptied first when ``fresh`` (a container
    allocated again starts with no stale cache, as HAMi does). Raises ``OSError``."""
    if fresh:
        shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=OPEN_TO_ALL, parents=True, exist_ok=True)
    # mkdir's mode is cut by the umask; the mode must be exactly 0777.
    if stat.S_IMODE(path.stat().st_mode) != OPEN_TO_ALL:
        os.chmod(path, OPEN_TO_ALL)


@dataclass(frozen=True, slots=True)
class Sweep:
    """What one pass over the containers' folders did."""

    kept: int
    removed: tuple[str, ...]
    failed: tuple[str, ...]


class ContainerFolders:
    """Removes the folders of pods that are gone, once older than ``grace``.

    A folder of a pod the node still runs is kept; so is a young folder of an unknown pod
    (its allocation may be under way), and a name that is not ``<uid>_<container>``.
    A folder that cannot be removed is logged and counted, and tried again next time."""

    def __init__(self, root: Path, grace: float,
                 clock: Callable[[], float] = time.time) -> None:
        self._root = root
        self._grace = grace
        self._clock = clock
        self.failures = 0
        """Folders that could not be removed, over the agent's life."""

    def sweep(self, live_pods: Collection[str]) -> Sweep:
        """One pass, ``live_pods`` the uids of the pods the node runs."""
        try:
            entries = list(os.scandir(self._root))
        except FileNotFoundError:
            return Sweep(0, (), ())
        except OSError as error:
            self.failures += 1
            logger.warning("cannot list HAMi-core's container folders in %s: %s",
                           self._root, error.strerror or error)
            return Sweep(0, (), ())
        now = self._clock()
        kept, removed, failed = 0, [], []
        for entry in sorted(entries, key=lambda e: e.name):
            uid = folder_pod(entry.name)
            if uid is None or uid in live_pods or not self._stale(entry, now):
                kept += 1
                continue
            try:
                shutil.rmtree(entry.path)
            except OSError as error:
                self.failures += 1
                failed.append(entry.name)
                logger.warning("cannot remove the HAMi-core folder %s of a pod that is gone "
                               "(%s); trying again next time", entry.path,
                               error.strerror or error)
                continue
            removed.append(entry.name)
            logger.info("removed the HAMi-core folder %s: pod %s is gone", entry.path, uid)
        return Sweep(kept, tuple(removed), tuple(failed))

    def _stale(self, entry: os.DirEntry[str], now: float) -> bool:
        try:
            status = entry.stat(follow_symlinks=False)
        except OSError:
            return False  # gone meanwhile, or unreadable: nothing to remove now
        # Only real folders: a link placed there is never followed out of the root.
        return stat.S_ISDIR(status.st_mode) and now - status.st_mtime >= self._grace
