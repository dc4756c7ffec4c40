"""A /proc tree written by a test (the node monitor reads each process's pod from
``<proc root>/<pid>/cgroup``): what a process's cgroup file says, or that it cannot be
read."""

from __future__ import annotations

from pathlib import Path

# A container's id below its pod's cgroup (any runtime's; the pod is what is read).
CONTAINER_ID = "3f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b0a1f2e3d4c5b6a7f8e9d0c1b2a3f4e"


def write_cgroup(root: Path, pid: int, content: str | bytes) -> None:
    """Process ``pid``'s cgroup file in the tree at ``root``, saying ``content``."""
    folder = root / str(pid)
    folder.mkdir(parents=True, exist_ok=True)
    data = content.encode() if isinstance(content, str) else content
    (folder / "cgroup").write_bytes(data)


def unreadable_cgroup(root: Path, pid: int) -> None:
    """Process ``pid``'s cgroup file exists but cannot be read (a folder in its place:
    reading it fails whoever the test runs as, root included)."""
    (root / str(pid) / "cgroup").mkdir(parents=True)


def pod_cgroup(uid: str) -> str:
    """A cgroup v2 file placing a process in a container of pod ``uid`` (cgroupfs driver)."""
    return f"0::/kubepods/burstable/pod{uid}/{CONTAINER_ID}\n"


HOST_CGROUP = "0::/system.slice/nvidia-persistenced.service\n"
"""A cgroup v2 file of a host process: no pod."""
