"""A fake kubelet for the agent's device plugin: the kubelet's side of the device plugin API.

``FakeKubelet`` is a real gRPC Registration server on ``kubelet.sock`` in a folder of the
test's; on Register it dials the plugin's socket and calls it as the kubelet does (options,
then a ListAndWatch stream; GetPreferredAllocation and Allocate when a test admits a pod).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from pathlib import Path

import grpc

from agent.deviceplugin._v1beta1 import api_pb2, api_pb2_grpc
from agent.deviceplugin.allocation import device_id

# How long the plugin may take to answer (a registration, the next device list).
WAIT_S = 10.0


class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    """The kubelet's side of the device plugin API, as far as these tests need it."""

    def __init__(self, folder: Path, cards: Sequence[str]) -> None:
        self.folder = folder
        self._cards = list(cards)  # the node's card uuids: an admission offers their devices
        self.registrations: asyncio.Queue[api_pb2.RegisterRequest] = asyncio.Queue()
        self.lists: asyncio.Queue[list[api_pb2.Device]] = asyncio.Queue()
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None
        self._watch: asyncio.Task[None] | None = None
        self.options: api_pb2.DevicePluginOptions | None = None
        """What the plugin answered GetDevicePluginOptions, once it registered."""

    async def start(self) -> None:
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.folder / 'kubelet.sock'}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            # The stream ends with an error when the plugin stopped first.
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await self._watch
        if self._channel is not None:
            await self._channel.close()
        if self._server is not None:
            await self._server.stop(0)

    async def restart(self) -> None:
        """As a kubelet start does: its socket made anew, every plugin socket removed."""
        await self.stop()
        for socket in self.folder.glob("*.sock"):
            socket.unlink()
        self.lists = asyncio.Queue()
        await self.start()

    async def Register(self, request: api_pb2.RegisterRequest,
                       context: grpc.aio.ServicerContext) -> api_pb2.Empty:
        self._channel = grpc.aio.insecure_channel(f"unix://{self.folder / request.endpoint}")
        self._watch = asyncio.create_task(self._list_and_watch(self.plugin()))
        await self.registrations.put(request)
        return api_pb2.Empty()

    def plugin(self) -> api_pb2_grpc.DevicePluginStub:
        assert self._channel is not None
        return api_pb2_grpc.DevicePluginStub(self._channel)

    async def _list_and_watch(self, plugin: api_pb2_grpc.DevicePluginStub) -> None:
        self.options = await plugin.GetDevicePluginOptions(api_pb2.Empty())
        async for response in plugin.ListAndWatch(api_pb2.Empty()):
            await self.lists.put(list(response.devices))

    async def next_list(self) -> list[api_pb2.Device]:
        return await asyncio.wait_for(self.lists.get(), WAIT_S)

    async def admit(self, size: int) -> api_pb2.ContainerAllocateResponse:
        """Admit a container asking for ``size`` devices: the plugin's preference where it
        advertises one, else the first devices of distinct cards, then Allocate."""
        plugin = self.plugin()
        devices = [device_id(uuid, i) for uuid in self._cards for i in range(10)]
        if self.options is not None and self.options.get_preferred_allocation_available:
            preferred = await plugin.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(
                container_requests=[api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=devices, allocation_size=size)]))
            chosen = list(preferred.container_responses[0].deviceIDs)
        else:
            chosen = [device_id(uuid, 0) for uuid in self._cards[:size]]
        assert len(chosen) == size
        response = await plugin.Allocate(api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)]))
        return response.container_responses[0]
