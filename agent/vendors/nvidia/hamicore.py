"""HAMi-core's contract with the device plugin: its settings, and the names of the per
container folders on the node. Pure: no I/O.

HAMi's device plugin gives each container a host folder,
``<hook>/vgpu/containers/<pod uid>_<container name>``, mounted at ``/usr/local/vgpu``,
where HAMi-core keeps its shared cache file; HAMi's node monitor reads those folders and
removes the ones of pods that are gone. pyhami keeps the same layout so HAMi's tools find
it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.vendors.port import ContainerRefused
from common.core.deviceconfig import NodeDeviceConfig
from common.core.errors import InvalidInput
from common.core.names import InvalidName, check_label, shown

HAMI_VERSION = "v2.10.0"
"""The HAMi release pyhami follows; its device plugin image ships ``libvgpu.so.v2.10.0``."""
CONTAINERS_FOLDER = "containers"
"""The folder, in HAMi-core's host folder, holding one folder per container."""
# Where HAMi-core's library appears in a container: the path HAMi uses, so images and
# tools made for HAMi find it.
CONTAINER_VGPU_DIR = "/usr/local/vgpu"
CONTAINER_LIBRARY = f"{CONTAINER_VGPU_DIR}/libvgpu.so"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
CONTAINER_LOCK_DIR = "/tmp/vgpulock"
"""HAMi-core flocks ``lock`` in it to serialise its processes across containers."""
SHARED_CACHE_DIR = "/tmp/vgpu"
"""Where the cache file goes without HAMi-core: nothing reads it then."""

# A Kubernetes uid is a UUID; standalone uids are too. No '_' (HAMi's monitor splits the
# folder name at the first '_'), no '/', and a leading letter or digit rules out '.' and '..'.
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,127}")


@dataclass(frozen=True)
class HamiCoreSettings:
    """What HAMi's device configuration says about HAMi-core, with HAMi's defaults.

    Built whole at start-up; the reader of HAMi's ``device-config.yaml`` fills it from
    the ``nvidia:`` keys named below."""

    libvgpu_version: str = HAMI_VERSION
    """The version suffix of the library preferred on the node: ``libvgpu.so.<version>``,
    as HAMi's image installs it, over a plain ``libvgpu.so``."""
    lib_cuda_log_level: str = "1"
    """``libCudaLogLevel``: the container's ``LIBCUDA_LOG_LEVEL`` (0 errors, 1 warnings,
    3 infos, 4 debugs); empty sets no variable (HAMi-core then logs at 2)."""
    disable_core_limit: bool = False
    """``disableCoreLimit``: containers get ``GPU_CORE_UTILIZATION_POLICY=disable``, so
    HAMi-core does not hold them to their core share."""
    device_memory_scaling: float = 1.0
    """``deviceMemoryScaling``: above 1 the node's memory is over-committed and containers
    get ``CUDA_OVERSUBSCRIBE=true``."""

    @property
    def oversubscribed(self) -> bool:
        return self.device_memory_scaling > 1


HAMI_DEFAULTS = HamiCoreSettings()
"""HAMi's chart defaults: what a node gets without a device configuration."""


def hami_core_settings(config: NodeDeviceConfig) -> HamiCoreSettings:
    """What ``config``, the node's device configuration, tells HAMi-core: its
    ``libCudaLogLevel`` and ``deviceMemoryScaling`` (the node's entry over the global
    ones) and the global ``disableCoreLimit``."""
    return HamiCoreSettings(lib_cuda_log_level=config.settings.libcuda_log_level,
                            disable_core_limit=config.device.disable_core_limit,
                            device_memory_scaling=config.settings.device_memory_scaling)


class UnsafeFolderName(InvalidInput, ContainerRefused):
    """A pod uid or container name that cannot name a host folder; the text says which."""


def container_folder(pod_uid: str, container: str) -> str:
    """The name of the container's HAMi-core folder, ``<pod uid>_<container>``; raises
    ``UnsafeFolderName`` for names that could leave the containers' folder."""
    if _UID.fullmatch(pod_uid) is None:
        raise UnsafeFolderName(f"pod uid {shown(pod_uid)} cannot name a host folder: "
                               "letters, digits, '-' and '.', starting with a letter or "
                               "digit, at most 128 characters")
    try:
        check_label("container name", container)
    except InvalidName as error:
        raise UnsafeFolderName(f"{error}: it cannot name a host folder") from None
    return f"{pod_uid}_{container}"


def folder_pod(folder: str) -> str | None:
    """The pod uid a container folder's name starts with; None for a name that is not
    ``<uid>_<container>`` (left alone, as HAMi's monitor leaves it)."""
    uid, separator, container = folder.partition("_")
    if not separator:
        return None
    try:
        container_folder(uid, container)
    except UnsafeFolderName:
        return None
    return uid
