"""pyhami commands run as processes of their own, for the tests that kill them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.paths import REPO


def _environment() -> dict[str, str]:
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, [environment.get("PYTHONPATH")])])
    return environment


class Process:
    """One pyhami command as a process of its own; ``kill`` is SIGKILL."""

    def __init__(self, arguments: list[str], log: Path) -> None:
        self.arguments = arguments
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pyhami.cli", *self.arguments], stdout=out,
                stderr=subprocess.STDOUT, env=_environment(), cwd=REPO)

    def send(self, number: signal.Signals) -> None:
        """Send ``number`` (SIGSTOP, SIGCONT, ...) to the running process."""
        assert self.process is not None and self.process.poll() is None
        self.process.send_signal(number)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None
