"""The end-to-end suite: pyhami beside a real kube-apiserver and kube-scheduler.

Every test here is marked ``e2e`` (``pytest -m e2e`` runs only these, ``-m "not e2e"``
everything else) and ``slow``: it needs the control plane (``-m "not slow"``, the quick
run, leaves the suite out). The control plane starts once per session. Without the
binaries and without Go to build them the suite is skipped with one line saying why,
except under CI (``CI=true``), where it fails instead.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.controlplane import (
    BUILD_TIMEOUT_S,
    binaries_dir,
    build_binaries,
    go_command,
    missing_binaries,
    wait_for,
)
from harness.kueue import HAMI_TRANSFORMATIONS, Kueue
from tests.e2e.controlplane import TEST_NAMESPACE, ControlPlane, running_control_plane
from tests.e2e.kueue_jobs import KUEUE_FLAVOR, KUEUE_NAMESPACE, delete_jobs
from tests.e2e.pods import ClusterLab

HERE = Path(__file__).parent
TEST_TIMEOUT_S = 300


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: end to end on a real kube-apiserver and kube-scheduler (tests/e2e)")


def _needs_build() -> bool:
    try:
        return bool(missing_binaries(binaries_dir()))
    except Exception:
        return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [item for item in items if HERE in Path(str(item.path)).parents]
    if not ours:
        return
    # Building from scratch takes many minutes: then the first test's setup may take that long.
    timeout = TEST_TIMEOUT_S + (BUILD_TIMEOUT_S if _needs_build() and go_command() else 0)
    for item in ours:
        item.add_marker(pytest.mark.e2e)
        item.add_marker(pytest.mark.slow)
        item.add_marker(pytest.mark.timeout(timeout))


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


@functools.cache
def _skip_reason() -> str | None:
    """Why the suite cannot run here, when it may be skipped (never under CI)."""
    bin_dir = binaries_dir()
    missing = missing_binaries(bin_dir)
    if not missing or go_command() is not None or _in_ci():
        return None
    return (f"e2e: no Go toolchain to build {', '.join(missing)} "
            f"(scripts/build-control-plane.sh; expected in {bin_dir})")


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Skipped here rather than in the fixture, so that -ra reports one line for the suite.
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def control_plane_binaries(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the control plane's binaries, built first where they are missing."""
    bin_dir = binaries_dir()
    missing = missing_binaries(bin_dir)
    if missing:
        if go_command() is None:
            pytest.fail(f"e2e: no Go toolchain to build {', '.join(missing)} "
                        f"(scripts/build-control-plane.sh; expected in {bin_dir}); "
                        "CI=true requires the end-to-end suite", pytrace=False)
        try:
            bin_dir = build_binaries(tmp_path_factory.mktemp("build") / "build.log")
        except Exception as error:
            pytest.fail(f"e2e: building the control plane failed: {error}", pytrace=False)
        still = missing_binaries(bin_dir)
        if still:
            pytest.fail(f"e2e: the build left no {', '.join(still)} in {bin_dir}", pytrace=False)
    return bin_dir


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory,
                  control_plane_binaries: Path) -> Iterator[ControlPlane]:
    with running_control_plane(control_plane_binaries,
                               tmp_path_factory.mktemp("control-plane")) as plane:
        yield plane


@pytest.fixture(scope="session")
def kueue(control_plane: ControlPlane) -> Iterator[Kueue]:
    """kube-controller-manager (the job and garbage collector controllers) and Kueue on the
    session's control plane, once, with Kueue's "Using HAMi" resource transformation
    (``HAMI_TRANSFORMATIONS``), its ResourceFlavor ``KUEUE_FLAVOR`` and the namespace
    ``KUEUE_NAMESPACE`` for the tests' Jobs. Kueue's start takes ``kueue.start_s``."""
    runner = Kueue(control_plane,
                   configuration={"resources": {"transformations": HAMI_TRANSFORMATIONS}})
    try:
        runner.start()
        # After Kueue's CRDs: its garbage collector then watches Workloads from the start
        # (it discovers new kinds only every 30 s), so a Job's Workload goes with it.
        control_plane.start_kube_controller_manager()
        runner.create_resource_flavor(KUEUE_FLAVOR)
        control_plane.create_namespace(KUEUE_NAMESPACE)
        yield runner
    finally:
        runner.stop()
        if "kube-controller-manager" in control_plane.processes:
            control_plane.processes["kube-controller-manager"].stop()


@pytest.fixture
def kueue_namespace(kueue: Kueue, control_plane: ControlPlane) -> Iterator[str]:
    """``KUEUE_NAMESPACE``; after the test its Jobs and their pods are deleted and pyhami's
    ledger holds none of them."""
    yield KUEUE_NAMESPACE
    delete_jobs(control_plane, KUEUE_NAMESPACE)

    def ledger_empty() -> bool:
        status = control_plane.statusz()
        return bool(status["pods_bound"] == 0 and status["reservations"] == 0)

    wait_for(ledger_empty, "pyhami's ledger to release every pod of the test's Jobs",
             watch=control_plane.all_processes())


@pytest.fixture
def clean_namespace(control_plane: ControlPlane) -> Iterator[None]:
    """After the test: delete its pods and wait until pyhami's ledger holds none."""
    yield
    pods = f"/api/v1/namespaces/{TEST_NAMESPACE}/pods"
    # No kubelet confirms a graceful deletion: delete at once (kubectl delete --force).
    control_plane.api.delete(pods, gracePeriodSeconds="0")
    wait_for(lambda: not control_plane.api.get(pods)["items"],
             f"the pods of namespace {TEST_NAMESPACE} to be gone")

    def ledger_empty() -> bool:
        status = control_plane.statusz()
        return bool(status["pods_bound"] == 0 and status["reservations"] == 0)

    if control_plane.processes["pyhami-scheduler"].running:
        wait_for(ledger_empty, "pyhami's ledger to release every pod of the test",
                 watch=control_plane.all_processes())


@pytest.fixture
def lab(control_plane: ControlPlane, clean_namespace: None) -> ClusterLab:
    """The suite's one lab: the test's pods in the test namespace, created and read as a
    user would; deleted after the test (``clean_namespace``). It stands in, under tests/e2e,
    for the standalone ``lab`` of tests/conftest.py."""
    return ClusterLab(control_plane)
