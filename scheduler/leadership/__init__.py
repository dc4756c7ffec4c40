"""Who decides when several daemons run: the ``Leadership`` port, chosen at start-up.

- ``AlwaysLeader``: one daemon, always the leader (the tests' in-process daemons, the demo).
- ``FollowedLease`` (Kubernetes): kube-scheduler elects the leader among the scheduler
  pods and calls only the extender beside it; the daemon reads kube-scheduler's Lease to
  know whether it is that extender. Every daemon keeps its ledger from its pod watch and
  answers every verb, so a standby answers correctly the moment its kube-scheduler wins;
  only the leader answers the device plugins and asks kube-scheduler to retry pods.
- ``NatsLease`` (standalone): the daemons elect one among themselves with a JetStream
  key-value entry that expires ``ttl`` seconds after it was last written. Only the holder
  decides and writes; the others answer 503 saying who holds it. The holder stops
  deciding ``renew_deadline`` seconds after sending its last renewal that succeeded:
  the entry cannot expire sooner than ``ttl`` after that send, so across a partition the
  old holder has stopped before anyone else can hold the lease (docs/ha.md).

``Takeover`` is what a daemon does as it begins to lead and as it stops (the hooks the
leaderships call), given the service's handlers as small ports.
"""

from __future__ import annotations

from scheduler.leadership.followed import FollowedLease, LeaseReader
from scheduler.leadership.lease import (
    LEASE_BUCKET,
    LEASE_KEY,
    LeaseSettingsError,
    NatsLease,
    TakeOverFailed,
    check_lease_timing,
)
from scheduler.leadership.port import AlwaysLeader, Hook, Leadership, Role
from scheduler.leadership.takeover import Takeover

__all__ = [
    "LEASE_BUCKET",
    "LEASE_KEY",
    "AlwaysLeader",
    "FollowedLease",
    "Hook",
    "Leadership",
    "LeaseReader",
    "LeaseSettingsError",
    "NatsLease",
    "Role",
    "TakeOverFailed",
    "Takeover",
    "check_lease_timing",
]
