"""How NVIDIA's cards reach a container through the kubelet's device plugin: the
variables and mounts Allocate gives (``NVIDIA_VISIBLE_DEVICES``, HAMi-core's limits and
library), and HAMi-core found and prepared on the node. The choice of pod and cards is
the device plugin's (``agent.deviceplugin.allocation``); this module says what a container
given them gets."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.deviceplugin.folders import make_open_folder
from agent.mig.static import is_mig_device
from agent.vendors.nvidia.hamicore import (
    CONTAINER_LIBRARY,
    CONTAINER_LOCK_DIR,
    CONTAINER_PRELOAD,
    CONTAINER_VGPU_DIR,
    CONTAINERS_FOLDER,
    HAMI_DEFAULTS,
    SHARED_CACHE_DIR,
    HamiCoreSettings,
    UnsafeFolderName,
    container_folder,
)
from agent.vendors.port import ContainerRefused, ContainerSetup, Mount
from common.core.annotations import CardGrant
from common.core.vendors import NVIDIA
from common.wire import PendingPod

logger = logging.getLogger(__name__)

VISIBLE_DEVICES_ENV = NVIDIA.visible_devices_env


@dataclass(frozen=True, slots=True)
class HamiCore:
    """HAMi-core installed on the node: the host paths the containers mount, and what
    HAMi's device configuration tells the containers."""

    library: str
    """``libvgpu.so.<version>`` where the node has it, else ``libvgpu.so``."""
    preload: str
    containers: str
    """The folder holding one folder per container, ``<pod uid>_<container name>``."""
    lock: str
    settings: HamiCoreSettings = HAMI_DEFAULTS


class MixedCards(ContainerRefused):
    """A container given MIG instances and shared cards at once: no node serves both."""


def new_cache_id() -> str:
    """A fresh name for a container's cache file, as HAMi names it (a random UUID)."""
    return str(uuid.uuid4())


class NvidiaContainers:
    """NVIDIA's ``ContainerRuntime``: the cards named in ``NVIDIA_VISIBLE_DEVICES``; a
    shared card's slice held by HAMi-core where the node has it (its limits in the
    variables, its library and folders mounted), announced only without it; a static MIG
    device handed over whole; a MIG instance named once the plugin has made it."""

    def __init__(self, hami_core: HamiCore | None,
                 cache_id: Callable[[], str] = new_cache_id) -> None:
        self._hami_core = hami_core
        self._cache_id = cache_id

    @property
    def slices_enforced(self) -> bool:
        return self._hami_core is not None

    def setup(self, pod: PendingPod, position: int,
              grants: tuple[CardGrant, ...]) -> ContainerSetup:
        """Raises ``UnsafeFolderName`` when, with HAMi-core, the pod's uid or the container's
        name cannot name its host folder (or the daemon sent no name for it), and
        ``MixedCards`` for a container given both MIG instances and shared cards."""
        mig = [grant.instance is not None for grant in grants]
        if any(mig):
            if not all(mig):
                raise MixedCards(f"container #{position} is given both MIG instances "
                                 "and shared cards")
            # The instances' UUIDs are known once they are made: the plugin names them.
            return ContainerSetup({})
        envs = {VISIBLE_DEVICES_ENV: ",".join(grant.uuid for grant in grants)}
        if all(is_mig_device(grant.uuid) for grant in grants):
            # Static MIG devices, each whole: the hardware isolates them, HAMi-core has no
            # part.
            return ContainerSetup(envs)
        envs.update({f"CUDA_DEVICE_MEMORY_LIMIT_{i}": f"{grant.memory}m"
                     for i, grant in enumerate(grants)})
        envs["CUDA_DEVICE_SM_LIMIT"] = str(grants[0].cores)
        hami_core = self._hami_core
        if hami_core is None:
            envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{SHARED_CACHE_DIR}/{pod.uid}.cache"
            return ContainerSetup(envs)
        if position >= len(pod.containers):
            raise UnsafeFolderName(f"the daemon sent no name for container #{position}"
                                   " (a daemon older than the agent): its HAMi-core folder "
                                   "cannot be named")
        container = pod.containers[position]
        folder = f"{hami_core.containers}/{container_folder(pod.uid, container.name)}"
        settings = hami_core.settings
        envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{CONTAINER_VGPU_DIR}/{self._cache_id()}.cache"
        if settings.oversubscribed:
            envs["CUDA_OVERSUBSCRIBE"] = "true"
        if settings.lib_cuda_log_level:
            envs["LIBCUDA_LOG_LEVEL"] = settings.lib_cuda_log_level
        if settings.disable_core_limit:
            envs["GPU_CORE_UTILIZATION_POLICY"] = "disable"
        # HAMi's order. The library's mount lies inside the folder's: runtimes mount a
        # parent before its children (containerd sorts by depth), so the library shows over
        # the folder.
        mounts = [Mount(CONTAINER_LIBRARY, hami_core.library),
                  Mount(CONTAINER_VGPU_DIR, folder, read_only=False),
                  Mount(CONTAINER_LOCK_DIR, hami_core.lock, read_only=False)]
        if not container.control_disabled:
            mounts.append(Mount(CONTAINER_PRELOAD, hami_core.preload))
        return ContainerSetup(envs, tuple(mounts), folder)


def library_path(directory: Path, version: str) -> Path:
    """``libvgpu.so.<version>`` where the node has it (HAMi's image installs it so), else
    the plain ``libvgpu.so``."""
    versioned = directory / f"libvgpu.so.{version}"
    return versioned if version and versioned.is_file() else directory / "libvgpu.so"


def hami_core(directory: Path, settings: HamiCoreSettings = HAMI_DEFAULTS,
              lock_dir: Path = Path(CONTAINER_LOCK_DIR)) -> HamiCore | None:
    """HAMi-core's host paths when ``directory`` holds libvgpu.so, writing the
    ld.so.preload that loads it and making the lock folder; None (logged) when memory
    slices cannot be enforced."""
    library = library_path(directory, settings.libvgpu_version)
    preload = directory / "ld.so.preload"
    if not library.is_file():
        logger.warning("no HAMi-core on this node (%s is missing): containers get their "
                       "cards and limits in their environment, but memory slices are not "
                       "enforced", library)
        return None
    content = CONTAINER_LIBRARY + "\n"
    try:
        if not preload.is_file() or preload.read_text() != content:
            preload.write_text(content)
        make_open_folder(lock_dir, fresh=False)
    except OSError as error:
        logger.warning("cannot prepare HAMi-core's files (%s: %s): memory slices are not "
                       "enforced on this node", error.filename, error.strerror or error)
        return None
    logger.info("HAMi-core found at %s: containers preload it", library)
    return HamiCore(library=str(library), preload=str(preload),
                    containers=str(directory / CONTAINERS_FOLDER), lock=str(lock_dir),
                    settings=settings)
