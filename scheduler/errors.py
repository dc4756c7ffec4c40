"""The scheduler's error root; the tree is drawn in ``common.core.errors``."""

from __future__ import annotations

from common.core.errors import PyhamiError


class SchedulerError(PyhamiError):
    """Raised by the scheduler daemon: the cluster failed, a webhook review or TLS
    material was refused, or the daemon cannot start."""


class StartupError(SchedulerError):
    """A setting found unusable at start (a kubeconfig, the in-cluster configuration, a
    nats-server without JetStream); the CLI prints it on one line and exits 2."""
