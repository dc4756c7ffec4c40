"""A setting the daemon cannot start with prints one clear line and exits 2, with no
traceback: outside a cluster with --in-cluster, an unusable kubeconfig, --standalone
against a nats-server without JetStream."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyhami.natsserver import LocalNatsServer, free_port

pytestmark = pytest.mark.slow  # each test starts the daemon's process to see it refuse

KUBECONFIG_WITHOUT_CONTEXT = """\
apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: admin
  user: {token: secret}
contexts:
- name: lab
  context: {cluster: lab, user: admin}
"""


def scheduler(*args: str) -> subprocess.CompletedProcess[str]:
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith(("PYHAMI_", "KUBERNETES_"))}
    return subprocess.run(
        [sys.executable, "-m", "pyhami.cli", "scheduler", *args,
         "--listen", f"127.0.0.1:{free_port()}", "--metrics", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60, check=False, env=environment)


def one_clear_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    # Log lines of the shutdown may come before it; the error is one line, the last.
    errors = [line for line in done.stderr.splitlines() if line.startswith("pyhami scheduler:")]
    assert len(errors) == 1, done.stderr
    assert done.stderr.splitlines()[-1] == errors[0]
    return errors[0]


def test_in_cluster_outside_a_cluster() -> None:
    line = one_clear_line(scheduler("--in-cluster", "--nats", f"nats://127.0.0.1:{free_port()}"))
    assert line.startswith("pyhami scheduler: --in-cluster: cannot load the in-cluster "
                           "configuration: ")
    assert line.endswith("elsewhere use --kubeconfig)")


def test_a_kubeconfig_without_current_context(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG_WITHOUT_CONTEXT)
    line = one_clear_line(scheduler("--kubeconfig", str(kubeconfig),
                                    "--nats", f"nats://127.0.0.1:{free_port()}"))
    assert line.startswith(f"pyhami scheduler: --kubeconfig: cannot load kubeconfig {kubeconfig}")
    assert "current-context" in line


@pytest.mark.parametrize("text", ["clusters: [", "just a string", ""])
def test_a_kubeconfig_that_is_no_kubeconfig(tmp_path: Path, text: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(text)
    line = one_clear_line(scheduler("--kubeconfig", str(kubeconfig),
                                    "--nats", f"nats://127.0.0.1:{free_port()}"))
    assert line.startswith(f"pyhami scheduler: --kubeconfig: cannot load kubeconfig {kubeconfig}")


def test_standalone_against_a_nats_server_without_jetstream(
        nats_server: LocalNatsServer) -> None:
    line = one_clear_line(scheduler("--standalone", "--nats", nats_server.url))
    assert line == (f"pyhami scheduler: --standalone keeps pods in JetStream, which the "
                    f"nats-server at 127.0.0.1:{nats_server.port} does not offer: start "
                    "nats-server with -js (and -sd DIR to keep the pods on disk)")


def test_a_node_retention_not_longer_than_the_node_timeout() -> None:
    line = one_clear_line(scheduler("--standalone", "--nats", f"nats://127.0.0.1:{free_port()}",
                                    "--node-timeout", "60", "--node-retention", "30"))
    assert line.startswith("pyhami scheduler: --node-retention (30s) must be longer than")


@pytest.mark.parametrize("flag", ["--nats-grace", "--node-retention"])
@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_a_new_duration_flag_that_is_no_positive_number(flag: str, value: str) -> None:
    done = scheduler("--standalone", "--nats", f"nats://127.0.0.1:{free_port()}", flag, value)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert f"argument {flag}: " in done.stderr


@pytest.mark.parametrize(("flags", "named"), [
    (["--lease-ttl", "2", "--lease-renew-deadline", "3"],
     "--lease-renew-deadline (3s) must be shorter than --lease-ttl (2s)"),
    (["--lease-renew-period", "3"],
     "--lease-renew-period (3s) must be shorter than --lease-renew-deadline (2.5s)"),
    (["--identity", "two words"], "--identity: 'two words' must be 1 to 253 printable"),
    (["--leader-lease", "pyhami-system/x"], "--leader-lease follows kube-scheduler's Lease"),
])
def test_lease_settings_that_cannot_keep_one_decider(flags: list[str], named: str) -> None:
    line = one_clear_line(scheduler("--standalone", "--nats",
                                    f"nats://127.0.0.1:{free_port()}", *flags))
    assert named in line


def test_a_leader_lease_that_names_no_lease(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG_WITHOUT_CONTEXT)
    line = one_clear_line(scheduler("--kubeconfig", str(kubeconfig), "--nats",
                                    f"nats://127.0.0.1:{free_port()}",
                                    "--leader-lease", "Not_A/namespace"))
    assert "--leader-lease namespace" in line
    assert line.endswith("(expected NAMESPACE/NAME, or none)")


def test_daemons_with_different_lease_ttls_refuse_to_share_a_bucket(
        jetstream_server: LocalNatsServer) -> None:
    first = subprocess.Popen(
        [sys.executable, "-m", "pyhami.cli", "scheduler", "--standalone", "--nats",
         jetstream_server.url, "--listen", f"127.0.0.1:{free_port()}", "--metrics",
         f"127.0.0.1:{free_port()}", "--resync-wait", "0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert first.stdout is not None
        for line in first.stdout:  # the bucket exists once the first daemon is ready
            if "ready on" in line:
                break
        second = scheduler("--standalone", "--nats", jetstream_server.url, "--lease-ttl", "6",
                           "--lease-renew-deadline", "5")
    finally:
        first.terminate()
        first.wait(timeout=20)
    line = one_clear_line(second)
    assert ("the lease bucket pyhami-leader expires entries after 4s but --lease-ttl is 6s"
            in line)


@pytest.mark.parametrize(("mode", "value", "named"), [
    ("--standalone", "2", "argument --bucket-replicas: '2' must be 1, 3 or 5"),
    ("--standalone", "7", "argument --bucket-replicas: '7' must be 1, 3 or 5"),
    ("--standalone", "0", "argument --bucket-replicas: '0' must be 1, 3 or 5"),
    ("--standalone", "three", "argument --bucket-replicas: 'three' is not a whole number"),
    ("--in-cluster", "3", "--bucket-replicas: only --standalone keeps buckets in NATS"),
], ids=["even", "above-5", "zero", "not-a-number", "not-standalone"])
def test_a_bucket_replica_count_that_cannot_be_used(mode: str, value: str, named: str) -> None:
    done = scheduler(mode, "--nats", f"nats://127.0.0.1:{free_port()}",
                     "--bucket-replicas", value)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert named in done.stderr


def test_three_bucket_replicas_on_a_single_server_are_refused_in_one_line(
        jetstream_server: LocalNatsServer) -> None:
    line = one_clear_line(scheduler("--standalone", "--nats", jetstream_server.url,
                                    "--bucket-replicas", "3", "--resync-wait", "0.1"))
    assert line.startswith("pyhami scheduler: --bucket-replicas 3: the NATS servers cannot "
                           "keep bucket pyhami-pods on 3 servers: ")
    assert "not supported in non-clustered mode" in line


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_fifo_or_a_device_as_the_device_config_is_refused_not_waited_on(
        tmp_path: Path, special: str) -> None:
    """Refused by what it is before a byte is read: a FIFO nobody writes to would hang the
    start, a device may never end (the subprocess's timeout fails a regression)."""
    path = Path(special)
    if special == "fifo":
        path = tmp_path / "device-config.yaml"
        os.mkfifo(path)
    kind = "a FIFO" if special == "fifo" else "a character device"
    line = one_clear_line(scheduler("--standalone", "--nats", f"nats://127.0.0.1:{free_port()}",
                                    "--device-config", str(path)))
    assert line == f"pyhami scheduler: --device-config {path}: is {kind}, not a regular file"
