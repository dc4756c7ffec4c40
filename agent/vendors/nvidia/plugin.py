"""NVIDIA's part of the kubelet's device plugin (``agent.vendors.port.DevicePluginVendor``):
its socket, ``NVIDIA_VISIBLE_DEVICES``, and HAMi-core found on the node."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.vendors.nvidia.containers import VISIBLE_DEVICES_ENV, NvidiaContainers, hami_core
from agent.vendors.port import ContainerRuntime

if TYPE_CHECKING:
    from agent.deviceplugin.plugin import PluginSettings

PLUGIN_SOCKET = "pyhami-nvidia-gpu.sock"


class NvidiaDevicePlugin:
    """NVIDIA's ``DevicePluginVendor``."""

    socket = PLUGIN_SOCKET
    visible_devices_env = VISIBLE_DEVICES_ENV

    def open_runtime(self, settings: PluginSettings) -> ContainerRuntime:
        """HAMi-core where ``--hami-core-dir`` holds it (its files prepared), else cards
        without enforced slices."""
        return NvidiaContainers(hami_core(settings.hami_core_dir, settings.hami_core,
                                          settings.lock_dir))


DEVICE_PLUGIN = NvidiaDevicePlugin()
