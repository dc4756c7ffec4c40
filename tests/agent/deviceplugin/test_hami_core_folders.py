"""HAMi-core on the node: the library preferred, the folders made for containers, and the
folders of pods that are gone removed after the grace, as HAMi's monitor does."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from agent.deviceplugin.folders import ContainerFolders, Sweep
from agent.deviceplugin.plugin import DevicePlugin, PluginSettings
from agent.vendors.nvidia.containers import hami_core
from agent.vendors.nvidia.hamicore import HamiCoreSettings, folder_pod
from agent.vendors.nvidia.plugin import DEVICE_PLUGIN
from common.core.pod import Container, EnvVar, control_disabled
from tests.fakes.clock import Clock
from tests.fakes.live_pods import LivePodsByHand

LIVE = "0b6f9a52-6f4e-4c1e-9d2a-000000000001"
GONE = "0b6f9a52-6f4e-4c1e-9d2a-000000000002"
GRACE = 300.0


@pytest.mark.parametrize(("installed", "version", "expected"), [
    (("libvgpu.so",), "v2.10.0", "libvgpu.so"),
    (("libvgpu.so", "libvgpu.so.v2.10.0"), "v2.10.0", "libvgpu.so.v2.10.0"),
    (("libvgpu.so.v2.10.0",), "v2.10.0", "libvgpu.so.v2.10.0"),
    (("libvgpu.so", "libvgpu.so.v2.10.0"), "v2.9.0", "libvgpu.so"),
    (("libvgpu.so", "libvgpu.so.v2.9.0"), "v2.9.0", "libvgpu.so.v2.9.0"),
    (("libvgpu.so", "libvgpu.so.v2.10.0"), "", "libvgpu.so"),
], ids=["plain-only", "versioned-preferred", "versioned-only", "other-version-ignored",
        "version-setting-changed", "empty-version-plain"])
def test_the_versioned_library_is_preferred(tmp_path: Path, installed: tuple[str, ...],
                                            version: str, expected: str) -> None:
    vgpu = tmp_path / "vgpu"
    vgpu.mkdir()
    for name in installed:
        (vgpu / name).write_bytes(b"\x7fELF")
    found = hami_core(vgpu, HamiCoreSettings(libvgpu_version=version), tmp_path / "lock")
    assert found is not None
    assert found.library == str(vgpu / expected)
    assert found.containers == str(vgpu / "containers")
    assert stat.S_IMODE((tmp_path / "lock").stat().st_mode) == 0o777


def test_without_any_library_slices_are_not_enforced(tmp_path: Path) -> None:
    assert hami_core(tmp_path, HamiCoreSettings(), tmp_path / "lock") is None
    assert not (tmp_path / "lock").exists()


@pytest.mark.parametrize(("env", "disabled"), [
    ([], False),
    ([EnvVar("CUDA_DISABLE_CONTROL", "true")], True),
    *[([EnvVar("CUDA_DISABLE_CONTROL", text)], True)
      for text in ("1", "t", "T", "TRUE", "True")],
    *[([EnvVar("CUDA_DISABLE_CONTROL", text)], False)
      for text in ("false", "0", "yes", "on", "tRUE", "")],
    ([EnvVar("CUDA_DISABLE_CONTROL", "false"), EnvVar("CUDA_DISABLE_CONTROL", "1")], True),
    ([EnvVar("cuda_disable_control", "true")], False),
], ids=["absent", "true", "1", "t", "T", "TRUE", "True", "false", "0", "yes", "on",
        "mixed-case", "empty-or-valueFrom", "one-true-occurrence", "name-case-matters"])
def test_cuda_disable_control_reads_as_go_parsebool(env: list[EnvVar], disabled: bool) -> None:
    assert control_disabled(Container(name="c", env=env)) is disabled


def folder(root: Path, name: str, age: float, now: float) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "a.cache").write_bytes(b"x")  # before the time is set: it moves the folder's
    os.utime(path, (now - age, now - age))
    return path


NOW = 1_000_000.0


@pytest.mark.parametrize(("name", "age", "removed"), [
    (f"{LIVE}_main", GRACE * 10, False),
    (f"{GONE}_main", GRACE + 1, True),
    (f"{GONE}_main", GRACE - 1, False),
    ("no-separator", GRACE * 10, False),
    ("..._main", GRACE * 10, False),
], ids=["live-pod-kept", "gone-pod-after-grace-removed", "gone-pod-within-grace-kept",
        "not-a-container-folder-kept", "unsafe-uid-kept"])
def test_a_sweep_removes_only_folders_of_gone_pods_past_the_grace(
        tmp_path: Path, name: str, age: float, removed: bool) -> None:
    path = folder(tmp_path, name, age, NOW)
    sweep = ContainerFolders(tmp_path, GRACE, Clock(NOW)).sweep({LIVE})
    assert path.exists() is not removed
    assert sweep.removed == ((name,) if removed else ())


def test_a_link_in_the_folder_is_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    root = tmp_path / "containers"
    root.mkdir()
    (root / f"{GONE}_main").symlink_to(outside)
    os.utime(root / f"{GONE}_main", (NOW - GRACE * 2,) * 2, follow_symlinks=False)
    sweep = ContainerFolders(root, GRACE, Clock(NOW)).sweep(set())
    assert (outside / "keep").exists() and sweep.removed == ()


def test_no_containers_folder_is_nothing_to_sweep(tmp_path: Path) -> None:
    assert ContainerFolders(tmp_path / "absent", GRACE).sweep(set()) == Sweep(0, (), ())


def test_a_folder_that_cannot_be_removed_is_logged_counted_and_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    stuck = folder(tmp_path, f"{GONE}_stuck", GRACE * 2, NOW)
    other = folder(tmp_path, f"{GONE}_other", GRACE * 2, NOW)
    real_rmtree = shutil.rmtree

    def refuse_stuck(path: str) -> None:
        if path == str(stuck):
            raise PermissionError(13, "Permission denied", path)
        real_rmtree(path)

    monkeypatch.setattr("agent.deviceplugin.folders.shutil.rmtree", refuse_stuck)
    folders = ContainerFolders(tmp_path, GRACE, Clock(NOW))
    with caplog.at_level(logging.WARNING):
        first = folders.sweep(set())
        second = folders.sweep(set())
    assert (first.failed, first.removed) == ((stuck.name,), (other.name,))
    assert second.failed == (stuck.name,)
    assert folders.failures == 2
    assert stuck.exists() and not other.exists()
    assert f"cannot remove the HAMi-core folder {stuck}" in caplog.text
    assert "Permission denied" in caplog.text


def test_folder_names_give_their_pod() -> None:
    assert folder_pod(f"{LIVE}_main") == LIVE
    assert folder_pod(f"{LIVE}_main_x") is None  # '_' is not in a container name
    assert folder_pod("nounderscore") is None


async def test_the_agent_sweeps_periodically_and_not_while_pods_are_unknown(
        tmp_path: Path) -> None:
    vgpu = tmp_path / "vgpu"
    containers = vgpu / "containers"
    now = time.time()
    live = folder(containers, f"{LIVE}_main", 3600, now)
    gone = folder(containers, f"{GONE}_main", 3600, now)
    settings = PluginSettings(vendor=DEVICE_PLUGIN, kubelet_dir=tmp_path, hami_core_dir=vgpu,
                              folder_grace=60.0, folder_sweep_interval=0.05,
                              lock_dir=tmp_path / "lock")
    plugin = DevicePlugin("gpu-node-1", settings, source=None)  # type: ignore[arg-type]
    pods = LivePodsByHand(LIVE)
    pods.unreachable = True
    sweeping = asyncio.create_task(plugin.sweep_folders(pods))
    try:
        while pods.asked < 2:
            await asyncio.sleep(0.01)
        assert gone.exists()  # no answer: nothing removed
        pods.unreachable = False
        for _ in range(200):
            if not gone.exists():
                break
            await asyncio.sleep(0.01)
    finally:
        sweeping.cancel()
    assert live.exists() and not gone.exists()
