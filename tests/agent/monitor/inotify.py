"""A witness of opens: Linux inotify through ctypes, watching one folder for ``IN_OPEN``.

Not a fake: the kernel reports every successful open of an entry of the folder (and of the
folder itself), whoever makes it, so a test can show that code under test never opened a
name, and, by opening a regular file through the same code, that the watch works.
"""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

IN_OPEN = 0x00000020
IN_ISDIR = 0x40000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


class OpenWatch:
    """``IN_OPEN`` events under one folder, read without blocking."""

    def __init__(self, folder: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        watch = libc.inotify_add_watch(self._fd, os.fsencode(folder), IN_OPEN)
        if watch < 0:
            os.close(self._fd)
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {folder}")

    def opened(self) -> list[str]:
        """The names of the folder's entries opened since the last call (the folder's own
        opens, which carry no name, left out), in order."""
        names: list[str] = []
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return names
            at = 0
            while at < len(data):
                _, mask, _, length = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size:at + _EVENT.size + length].split(b"\0", 1)[0]
                at += _EVENT.size + length
                if mask & IN_OPEN and name:
                    names.append(os.fsdecode(name))

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> OpenWatch:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
