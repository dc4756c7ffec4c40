"""The kubelet device plugin: a gRPC server on a unix socket in the kubelet's folder,
registered with the kubelet as HAMi's ``resourceCountName`` (``nvidia.com/gpu`` by
default), served again when the kubelet restarts.

The kubelet removes every plugin socket and makes its own ``kubelet.sock`` anew when it
starts; the plugin notices either within one ``watch_interval`` and serves and registers
again. The decisions (which devices, which pod) live in ``agent.deviceplugin.allocation``,
what a container gets with its cards in the vendor's package (``agent.vendors.port``'s
``DevicePluginVendor``, chosen by the command); this module moves them over gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

import grpc
import msgspec

from agent.deviceplugin._v1beta1 import api_pb2, api_pb2_grpc
from agent.deviceplugin.allocation import (
    DEFAULT_RESOURCE_NAME,
    HEALTHY,
    UNHEALTHY,
    ContainerAllocation,
    Device,
    Granted,
    Refused,
    advertised_devices,
    allocate,
    outcome,
    preferred_devices,
)
from agent.deviceplugin.folders import ContainerFolders, make_open_folder
from agent.deviceplugin.outcomes import CONFIRM_INTERVAL_S, OwedOutcomes
from agent.deviceplugin.source import (
    ASK_PATIENCE_S,
    AllocationSource,
    AllocationSourceError,
    HoldingPods,
    LivePods,
)
from agent.mig.manager import InstanceKey, MigManager
from agent.mig.port import MigError
from agent.mig.static import MigDevice, MigStrategy, mig_strategy
from agent.vendors.nvidia.hamicore import (
    CONTAINER_LOCK_DIR,
    CONTAINERS_FOLDER,
    HAMI_DEFAULTS,
    HamiCoreSettings,
)
from agent.vendors.port import ContainerRuntime, DevicePluginVendor
from common.arguments import positive_seconds
from common.core.annotations import AnnotationError
from common.core.mig import MigReservation, MigReservationError, decode_reservations
from common.settings import setting
from common.wire import AllocationOutcome, HoldingPod, MigRuntime, PendingPod, ReportedCard

logger = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_HAMI_CORE_DIR = Path("/usr/local/vgpu")
# HAMi-core's flags and its container folders' sweep are still the plugin's (the one
# import of a vendor's package here, named in the import contract); the rest of what
# NVIDIA gives a container comes through the vendor's ContainerRuntime.
DEFAULT_LOCK_DIR = Path(CONTAINER_LOCK_DIR)
UNLISTED_PATIENCE_S = 10.0
"""How long Allocate asks the daemon again when its answer lists no pod the kubelet's
devices could be for: longer than a standalone daemon that has just taken the lease needs
to read the binds its predecessor's last writes made (``CATCH_UP_AFTER_S``)."""
UNLISTED_PAUSE_S = 0.5
WATCH_INTERVAL_S = 1.0
REGISTER_TIMEOUT_S = 10.0
STOP_GRACE_S = 0.5
MIG_RECONCILE_S = 5.0
"""How often MIG instances no pod references are destroyed (HAMi's reconciler's period)."""


class DeviceFeed:
    """The devices to advertise, following the agent's inventory; ListAndWatch waits on it."""

    def __init__(self, *, numa_topology: bool) -> None:
        self._numa_topology = numa_topology
        self._devices: tuple[Device, ...] = ()
        self._cards: frozenset[str] = frozenset()
        self._version = 0
        self._changed = asyncio.Condition()

    @property
    def cards(self) -> frozenset[str]:
        return self._cards

    @property
    def devices(self) -> tuple[Device, ...]:
        return self._devices

    async def observe(self, cards: Sequence[ReportedCard]) -> None:
        self._cards = frozenset(card.uuid for card in cards)
        await self.show(advertised_devices(cards, numa_topology=self._numa_topology))

    async def show(self, devices: tuple[Device, ...]) -> None:
        """Advertise ``devices`` from now on (a ListAndWatch waiting is woken when they
        changed)."""
        if devices == self._devices and self._version:
            return
        async with self._changed:
            self._devices = devices
            self._version += 1
            self._changed.notify_all()

    async def after(self, version: int) -> tuple[int, tuple[Device, ...]]:
        """The devices once their version is past ``version``."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._version > version)
            return self._version, self._devices


def _device_message(device: Device) -> api_pb2.Device:
    topology = None if device.numa is None else api_pb2.TopologyInfo(
        nodes=[api_pb2.NUMANode(ID=device.numa)])
    return api_pb2.Device(ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY,
                          topology=topology)


def _container_response(allocation: ContainerAllocation) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=allocation.envs,
        mounts=[api_pb2.Mount(container_path=m.container_path, host_path=m.host_path,
                              read_only=m.read_only) for m in allocation.mounts])


async def _abort(context: grpc.aio.ServicerContext, code: Any, message: str) -> NoReturn:
    """Fail the call with ``message``: the kubelet shows it as the pod's admission error."""
    await context.abort(code, message)
    raise AssertionError("grpc.aio's abort raises")  # for the type checker: abort never returns


def _refused_all(granted: Granted, reason: str) -> Granted | Refused:
    """Nothing of ``granted`` committed: each pod it served failed with ``reason``."""
    failed = {a.pod.uid: outcome(a.pod, reason) for a in granted.allocations}
    return Refused(reason, (*(o for o in granted.outcomes if not o.ok), *failed.values()))


def _with_folders(granted: Granted) -> Granted | Refused:
    """``granted`` once each container's HAMi-core folder is made; refused (the pods
    served failed, nothing committed) when one cannot be."""
    for allocation in granted.allocations:
        if allocation.folder is None:
            continue
        try:
            make_open_folder(Path(allocation.folder), fresh=True)
        except OSError as error:
            return _refused_all(granted, f"cannot make HAMi-core's folder "
                                         f"{allocation.folder} ({error.strerror or error})")
    return granted


class ListingServicer(api_pb2_grpc.DevicePluginServicer):
    """What every resource's servicer does alike: list its feed's devices, and again each
    time they change; nothing before a container starts."""

    def __init__(self, feed: DeviceFeed) -> None:
        self._feed = feed

    async def ListAndWatch(self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
                           ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        version = 0
        while True:
            version, devices = await self._feed.after(version)
            yield api_pb2.ListAndWatchResponse(devices=[_device_message(d) for d in devices])

    async def PreStartContainer(self, request: api_pb2.PreStartContainerRequest,
                                context: grpc.aio.ServicerContext
                                ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


class DevicePluginServicer(ListingServicer):
    """The kubelet's calls; allocations are served one call at a time, in order."""

    def __init__(self, node: str, feed: DeviceFeed, source: AllocationSource,
                 runtime: ContainerRuntime, options: api_pb2.DevicePluginOptions, *,
                 visible_devices_env: str, resource: str = DEFAULT_RESOURCE_NAME,
                 mig: MigManager | None = None) -> None:
        super().__init__(feed)
        self._node = node
        self._resource = resource
        self._options = options
        self._source = source
        self._runtime = runtime
        self._visible_devices_env = visible_devices_env
        self._mig = mig
        # Per pod uid: the MIG instances made for its containers so far, sent with its
        # outcome once every container is served.
        self._made: dict[str, dict[tuple[int, int], MigRuntime]] = {}
        self._mig_started = asyncio.Event()
        self._progress: dict[str, int] = {}
        self._owed = OwedOutcomes()
        self._allocating = asyncio.Lock()

    async def GetDevicePluginOptions(self, request: api_pb2.Empty,
                                     context: grpc.aio.ServicerContext
                                     ) -> api_pb2.DevicePluginOptions:
        return self._options

    async def GetPreferredAllocation(self, request: api_pb2.PreferredAllocationRequest,
                                     context: grpc.aio.ServicerContext
                                     ) -> api_pb2.PreferredAllocationResponse:
        async with self._allocating:
            try:
                pending = await self._source.pending(self._node)
            except AllocationSourceError as error:
                logger.warning("no preference for the kubelet: %s", error)
                pending = []
            responses = [
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=preferred_devices(
                    pending, self._progress, list(c.available_deviceIDs),
                    list(c.must_include_deviceIDs), c.allocation_size))
                for c in request.container_requests]
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: api_pb2.AllocateRequest,
                       context: grpc.aio.ServicerContext) -> api_pb2.AllocateResponse:
        async with self._allocating:
            await self._send_owed()
            asked_at = asyncio.get_running_loop().time()
            try:
                pending = await self._source.pending(self._node)
            except AllocationSourceError as error:
                logger.warning("Allocate refused: %s", error)
                await _abort(context, grpc.StatusCode.UNAVAILABLE, str(error))
            self._reconcile(pending, asked_at)
            requests = [list(c.devices_ids) for c in request.container_requests]
            result = allocate(pending, self._progress, requests, node=self._node,
                              node_cards=self._feed.cards, runtime=self._runtime,
                              resource=self._resource)
            asked_until = asyncio.get_running_loop().time() + UNLISTED_PATIENCE_S
            while _nobody_waits(result) and asyncio.get_running_loop().time() < asked_until:
                # The kubelet asks for a pod the daemon did not list: a daemon that has
                # just taken the lease may not have read its predecessor's last binds yet.
                await asyncio.sleep(UNLISTED_PAUSE_S)
                try:
                    pending = await self._source.pending(self._node)
                except AllocationSourceError:
                    continue
                result = allocate(pending, self._progress, requests, node=self._node,
                                  node_cards=self._feed.cards, runtime=self._runtime,
                                  resource=self._resource)
            if isinstance(result, Granted):
                result = await self._with_instances(result)
            if isinstance(result, Granted):
                result = _with_folders(result)
            self._owe(result.outcomes)
            if isinstance(result, Granted):
                self._progress = result.progress
            await self._send_owed()
        if not isinstance(result, Granted):
            logger.warning("Allocate refused: %s", result.reason)
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, result.reason)
        for allocation in result.allocations:
            logger.info("allocated container #%d of pod %s/%s: %s", allocation.position,
                        allocation.pod.namespace, allocation.pod.name,
                        allocation.envs[self._visible_devices_env])
        return api_pb2.AllocateResponse(
            container_responses=[_container_response(a) for a in result.allocations])

    async def confirm_outcomes(self) -> None:
        """Ask which pods still wait for their cards, and send again each outcome the
        daemon has not written (``agent.deviceplugin.outcomes``); nothing while none waits."""
        if not self._owed.awaiting:
            return
        asked_at = asyncio.get_running_loop().time()
        try:
            pending = await self._source.pending(self._node)
        except AllocationSourceError as error:
            logger.warning("outcomes not confirmed: %s", error)
            return
        async with self._allocating:
            self._reconcile(pending, asked_at)
            await self._send_owed()

    async def mig_ready(self) -> None:
        """The MIG start-up is done: instances may be made."""
        self._mig_started.set()

    async def _with_instances(self, granted: Granted) -> Granted | Refused:
        """``granted`` with the MIG instances of its MIG containers made (all of them, or
        none: ``MigManager.ensure``) and named in the vendor's variable
        (``NVIDIA_VISIBLE_DEVICES``); the
        outcome of a pod now served carries the instances made for it."""
        on_mig = [allocation for allocation in granted.allocations if allocation.on_mig]
        if not on_mig:
            return granted
        if self._mig is None:
            return _refused_all(granted, f"node {self._node} serves no MIG (its operatingmode "
                                         "is not mig), and the pod holds MIG instances")
        keys = [InstanceKey(grant.uuid, grant.instance.profile, grant.instance.placement.start,
                            grant.instance.placement.size)
                for allocation in on_mig for grant in allocation.grants
                if grant.instance is not None]
        # Not before the start-up has reset the idle GPUs and adopted the live instances.
        await self._mig_started.wait()
        try:
            instances = iter(await asyncio.to_thread(self._mig.ensure, keys))
        except MigError as error:
            return _refused_all(granted, f"MIG instances not made: {error}")
        allocations = []
        for allocation in granted.allocations:
            if not allocation.on_mig:
                allocations.append(allocation)
                continue
            made = [next(instances) for _ in allocation.grants]
            allocations.append(replace(allocation, envs={
                self._visible_devices_env: ",".join(i.mig_uuid for i in made)}))
            runtime = self._made.setdefault(allocation.pod.uid, {})
            for device, instance in enumerate(made):
                runtime[(allocation.position, device)] = MigRuntime(
                    container_index=allocation.position, device_index=device,
                    mig_uuid=instance.mig_uuid, gpu_instance_id=instance.gpu_instance_id,
                    compute_instance_id=instance.compute_instance_ids[0])
        outcomes = tuple(
            msgspec.structs.replace(o, mig_instances=tuple(self._made.pop(o.uid).values()))
            if o.ok and o.uid in self._made else o
            for o in granted.outcomes)
        return Granted(tuple(allocations), granted.progress, outcomes)

    def _owe(self, outcomes: Sequence[AllocationOutcome]) -> None:
        for dropped in self._owed.owe(outcomes):
            logger.error("outcome of pod %s/%s given up: more than %d outcomes wait for the "
                         "daemon", dropped.namespace, dropped.name, len(self._owed))

    def _reconcile(self, pending: Sequence[PendingPod], asked_at: float) -> None:
        settled = self._owed.reconcile({pod.uid for pod in pending}, asked_at)
        for resent in settled.again:
            logger.warning("the daemon still lists pod %s/%s as waiting for its cards: "
                           "sending its outcome again", resent.namespace, resent.name)
        for lost in settled.given_up:
            logger.error("outcome of pod %s/%s given up: the daemon has not written it "
                         "since it was first sent", lost.namespace, lost.name)

    async def _send_owed(self) -> None:
        """Send what is owed; what cannot go now goes with the next call or confirmation."""
        for owed in self._owed.due():
            try:
                await self._source.report(owed)
            except AllocationSourceError as error:
                logger.warning("%s; trying again at the next allocation", error)
                return
            self._owed.sent(owed, asyncio.get_running_loop().time())


@dataclass(frozen=True)
class PluginSettings:
    """Where the device plugin meets the kubelet and finds HAMi-core on the node."""

    kubelet_dir: Path = setting(
        DEFAULT_KUBELET_DIR, parse=Path, metavar="DIR",
        help="the kubelet's device plugin folder, holding kubelet.sock (default: {default})")
    hami_core_dir: Path = setting(
        DEFAULT_HAMI_CORE_DIR, parse=Path, metavar="DIR",
        help="where HAMi-core's libvgpu.so is installed on the node; without it memory "
             "slices are not enforced (default: {default})")
    folder_grace: float = setting(
        300.0, parse=positive_seconds, metavar="SECONDS",
        help="remove a container's HAMi-core folder once its pod is gone and the folder is "
             "this old, as HAMi's monitor does after its resync interval (default: {default})")
    folder_sweep_interval: float = setting(
        60.0, parse=positive_seconds, metavar="SECONDS",
        help="look for the HAMi-core folders of pods that are gone this often "
             "(default: {default})")
    allocate_patience: float = setting(
        ASK_PATIENCE_S, parse=positive_seconds, metavar="SECONDS",
        help="how long Allocate asks the daemon again while NATS or the daemon does not "
             "answer (a NATS server lost, the daemon restarting) before refusing the "
             "container; the kubelet gives Allocate no deadline and holds the node's pod "
             "admissions meanwhile (default: {default})")
    mig_strategy: MigStrategy = setting(
        "none", parse=mig_strategy, metavar="none|single|mixed",
        help="GPUs an operator cut into MIG devices beforehand (not a node in MIG mode, whose "
             "instances pyhami makes): single serves each MIG device as a whole card under "
             "the node's resource; mixed serves each profile as a resource of its own, "
             "nvidia.com/mig-<profile>, which pyhami does not schedule (default: {default})")
    hami_core: HamiCoreSettings = HAMI_DEFAULTS
    """HAMi's device configuration for HAMi-core (no flags: HAMi's device-config.yaml)."""
    resource_name: str = DEFAULT_RESOURCE_NAME
    """The resource registered with the kubelet: HAMi's ``resourceCountName``."""
    preferred_allocation: bool = False
    """Whether the kubelet is told to ask ``GetPreferredAllocation`` first: the node's
    ``enablegetpreferredallocation``, off by default as in HAMi."""
    numa_topology: bool = False
    """Whether each device names its card's NUMA node to the kubelet (its topology
    manager): the node's ``enablenumatopology``, off by default as in HAMi."""
    lock_dir: Path = DEFAULT_LOCK_DIR
    """The host's lock folder HAMi-core shares across containers (tests move it)."""
    watch_interval: float = WATCH_INTERVAL_S
    """How often the kubelet's socket and the plugin's own are looked at (tests shorten it)."""
    vendor: DevicePluginVendor = field(kw_only=True)
    """The cards' vendor: its socket, its variable, what a container gets (no flag: the
    command chooses it, ``agent.cli``)."""


def _identity(path: Path) -> tuple[int, int, int] | None:
    """What tells one socket file from the next made at the same path."""
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_dev, status.st_ino, status.st_ctime_ns


class DevicePlugin:
    """Serves and registers for as long as ``run`` runs; ``observe`` feeds the inventory."""

    def __init__(self, node: str, settings: PluginSettings, source: AllocationSource,
                 mig: MigManager | None = None) -> None:
        """``mig``: the node's dynamic MIG instances (a node in MIG mode). The static MIG
        profiles' resources (``--mig-strategy mixed``) come with ``observe_mig_devices``."""
        self._node = node
        self._settings = settings
        self._source = source
        self._mig = mig
        self._mig_servicers: dict[str, tuple[str, MigPassThroughServicer]] = {}
        self._group: asyncio.TaskGroup | None = None
        self._feed = DeviceFeed(numa_topology=settings.numa_topology)
        self._vendor = settings.vendor
        self._runtime = settings.vendor.open_runtime(settings)
        self._options = api_pb2.DevicePluginOptions(
            get_preferred_allocation_available=settings.preferred_allocation)
        self._servicer = DevicePluginServicer(
            node, self._feed, source, self._runtime, self._options,
            visible_devices_env=settings.vendor.visible_devices_env,
            resource=settings.resource_name, mig=mig)
        self.folders = ContainerFolders(settings.hami_core_dir / CONTAINERS_FOLDER,
                                        settings.folder_grace)
        """HAMi-core's container folders, swept by ``sweep_folders``."""
        self.registrations = 0
        """Times the kubelet accepted the registration (once per kubelet start)."""

    @property
    def serves_mig(self) -> bool:
        """Whether the node is in MIG mode: its pods' instances are made here."""
        return self._mig is not None

    @property
    def slices_enforced(self) -> bool:
        """Whether the node enforces the slices (NVIDIA: HAMi-core is on it; looked at once,
        at start)."""
        return self._runtime.slices_enforced

    @property
    def socket(self) -> Path:
        return self._settings.kubelet_dir / self._vendor.socket

    @property
    def kubelet_socket(self) -> Path:
        return self._settings.kubelet_dir / KUBELET_SOCKET

    async def observe(self, cards: Sequence[ReportedCard]) -> None:
        await self._feed.observe(cards)

    async def run(self) -> None:
        """Serve, register, and start again whenever the kubelet does; until cancelled. With
        ``--mig-strategy mixed``, each MIG profile's resource is served beside the node's
        own, on a socket of its own."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._keep_registered(_Endpoint(
                self._vendor.socket, self._settings.resource_name, self._servicer,
                self._options)))
            for suffix in sorted(self._mig_servicers):
                self._serve_mig_resource(group, suffix)
            self._group = group
        self._group = None

    def _serve_mig_resource(self, group: asyncio.TaskGroup, suffix: str) -> None:
        resource, servicer = self._mig_servicers[suffix]
        group.create_task(self._keep_registered(
            _Endpoint(f"pyhami-{suffix}.sock", resource, servicer, _PLAIN)))

    async def _keep_registered(self, endpoint: _Endpoint) -> None:
        socket = self._settings.kubelet_dir / endpoint.socket
        while True:
            kubelet = await self._kubelet_up()
            server = await self._serve(endpoint.servicer, socket)
            try:
                served = _identity(socket)
                if await self._register(kubelet, endpoint):
                    while (_identity(self.kubelet_socket) == kubelet
                           and _identity(socket) == served):
                        await asyncio.sleep(self._settings.watch_interval)
                    logger.info("the kubelet restarted (%s or %s changed): serving and "
                                "registering again", self.kubelet_socket, socket)
            finally:
                await server.stop(STOP_GRACE_S)
                if _identity(socket) == served:  # ours, not one a new start made
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(socket)

    async def observe_mig_devices(self, devices: Sequence[MigDevice]) -> None:
        """The static MIG devices the inventory found now (``--mig-strategy mixed``): each
        profile's resource lists its devices, one first seen is served from now on (a
        profile no longer found keeps its resource, with no device)."""
        prefix = self._settings.resource_name.partition("/")[0]
        for suffix in sorted({device.resource_suffix for device in devices}):
            if suffix not in self._mig_servicers:
                resource = f"{prefix}/{suffix}"
                self._mig_servicers[suffix] = (resource, MigPassThroughServicer(
                    resource, self._vendor.visible_devices_env))
                if self._group is not None:
                    self._serve_mig_resource(self._group, suffix)
        for suffix, (_, servicer) in self._mig_servicers.items():
            await servicer.observe([d for d in devices if d.resource_suffix == suffix])

    async def sweep_folders(self, live: LivePods) -> None:
        """Every ``folder_sweep_interval``, remove HAMi-core's folders of pods that are
        gone; a round whose live pods cannot be learned removes nothing. Until cancelled."""
        while True:
            await asyncio.sleep(self._settings.folder_sweep_interval)
            try:
                uids = await live.live_pods(self._node)
            except AllocationSourceError as error:
                logger.warning("HAMi-core's container folders not swept: %s", error)
                continue
            await asyncio.to_thread(self.folders.sweep, uids)

    async def keep_mig_instances(self, holding: HoldingPods) -> None:
        """The node's MIG instances, HAMi's way: at start, the idle GPUs reset into MIG mode
        and the live instances the pods' reservations account for adopted (every GPU kept
        as it is when the pods cannot be learned); then, every ``MIG_RECONCILE_S``, each
        instance no pod holding cards references destroyed. A round whose pods or
        reservations cannot be read destroys nothing. Until cancelled (only for a node in
        MIG mode)."""
        assert self._mig is not None, "keep_mig_instances runs on a node in MIG mode"
        mig = self._mig
        try:
            pods = await holding.holding_pods(self._node)
            reservations = [r for pod in pods for r in _reservations(pod)]
            busy: Collection[str] = ()
        except (AllocationSourceError, AnnotationError) as error:
            logger.warning("MIG start-up keeps every GPU as it is: the pods holding cards "
                           "are unknown (%s)", error)
            reservations, busy = [], await asyncio.to_thread(mig.gpus)
        await asyncio.to_thread(mig.open)
        started = await asyncio.to_thread(mig.start_up, reservations, busy)
        logger.info("MIG start-up: %d GPUs reset into MIG mode, %d instances adopted",
                    len(started.reset), len(started.adopted))
        await self._servicer.mig_ready()
        while True:
            await asyncio.sleep(MIG_RECONCILE_S)
            # Judged: the instances held before the pods are asked for. One an Allocate
            # makes meanwhile is for a pod the answer may not list yet.
            held_before = set(mig.held())
            try:
                pods = await holding.holding_pods(self._node)
                referenced = {InstanceKey.of(r) for pod in pods for r in _reservations(pod)}
            except (AllocationSourceError, AnnotationError) as error:
                logger.warning("MIG instances not reconciled this round: %s", error)
                continue
            await asyncio.to_thread(mig.reconcile, referenced, held_before)

    async def confirm_outcomes(self) -> None:
        """Every ``CONFIRM_INTERVAL_S`` while outcomes wait to be confirmed, send again
        those the daemon has not written. Until cancelled."""
        while True:
            await asyncio.sleep(CONFIRM_INTERVAL_S)
            await self._servicer.confirm_outcomes()

    async def _kubelet_up(self) -> tuple[int, int, int]:
        waited = False
        while (kubelet := _identity(self.kubelet_socket)) is None:
            if not waited:
                logger.info("waiting for the kubelet's socket %s", self.kubelet_socket)
                waited = True
            await asyncio.sleep(self._settings.watch_interval)
        return kubelet

    async def _serve(self, servicer: api_pb2_grpc.DevicePluginServicer,
                     socket: Path) -> grpc.aio.Server:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket)
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)
        server.add_insecure_port(f"unix://{socket}")
        await server.start()
        return server

    async def _register(self, kubelet: tuple[int, int, int], endpoint: _Endpoint) -> bool:
        """Register until the kubelet accepts; False when its socket changed meanwhile."""
        resource = endpoint.resource
        request = api_pb2.RegisterRequest(
            version=API_VERSION, endpoint=endpoint.socket, resource_name=resource,
            options=endpoint.options)
        while _identity(self.kubelet_socket) == kubelet:
            try:
                async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                    await api_pb2_grpc.RegistrationStub(channel).Register(
                        request, timeout=REGISTER_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                logger.warning("registering %s with the kubelet at %s failed (%s: %s); "
                               "trying again", resource, self.kubelet_socket,
                               error.code().name, error.details())
                await asyncio.sleep(self._settings.watch_interval)
                continue
            if endpoint.socket == self._vendor.socket:
                self.registrations += 1
            logger.info("registered %s with the kubelet at %s (socket %s)", resource,
                        self.kubelet_socket, endpoint.socket)
            return True
        return False


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """One resource the plugin registers: its socket in the kubelet's folder, its servicer."""

    socket: str
    resource: str
    servicer: api_pb2_grpc.DevicePluginServicer
    options: api_pb2.DevicePluginOptions


_PLAIN = api_pb2.DevicePluginOptions()


class MigPassThroughServicer(ListingServicer):
    """One static MIG profile's resource (``nvidia.com/mig-<profile>``, ``--mig-strategy
    mixed``): its devices as the inventory finds them, and HAMi's pass-through Allocate:
    the devices the kubelet chose, each one of this resource's, named in
    ``NVIDIA_VISIBLE_DEVICES``; no pod looked up, nothing written. The kubelet counts the
    resource; pyhami does not schedule it."""

    def __init__(self, resource: str, visible_devices_env: str) -> None:
        super().__init__(DeviceFeed(numa_topology=False))
        self._resource = resource
        self._visible_devices_env = visible_devices_env

    async def observe(self, devices: Sequence[MigDevice]) -> None:
        await self._feed.show(tuple(Device(device.uuid, True, None) for device in devices))

    async def GetDevicePluginOptions(self, request: api_pb2.Empty,
                                     context: grpc.aio.ServicerContext
                                     ) -> api_pb2.DevicePluginOptions:
        return _PLAIN

    async def GetPreferredAllocation(self, request: api_pb2.PreferredAllocationRequest,
                                     context: grpc.aio.ServicerContext
                                     ) -> api_pb2.PreferredAllocationResponse:
        return api_pb2.PreferredAllocationResponse(container_responses=[
            api_pb2.ContainerPreferredAllocationResponse(deviceIDs=list(dict.fromkeys(
                [*c.must_include_deviceIDs, *c.available_deviceIDs]))[:c.allocation_size])
            for c in request.container_requests])

    async def Allocate(self, request: api_pb2.AllocateRequest,
                       context: grpc.aio.ServicerContext) -> api_pb2.AllocateResponse:
        known = {device.id for device in self._feed.devices}
        responses = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            unknown = next((device for device in ids if device not in known), None)
            if unknown is not None or not ids:
                reason = (f"invalid allocation request for {self._resource}: unknown device "
                          f"{unknown}" if unknown is not None
                          else f"an allocation request for {self._resource} names no device")
                logger.warning("Allocate refused: %s", reason)
                await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, reason)
            responses.append(api_pb2.ContainerAllocateResponse(
                envs={self._visible_devices_env: ",".join(ids)}))
            logger.info("allocated %s %s (pass-through)", self._resource, ",".join(ids))
        return api_pb2.AllocateResponse(container_responses=responses)


def _reservations(pod: HoldingPod) -> tuple[MigReservation, ...]:
    """The pod's MIG reservations; raises ``AnnotationError`` naming the pod."""
    try:
        return decode_reservations(pod.mig_allocations)
    except MigReservationError as error:
        raise AnnotationError(f"pod {pod.namespace}/{pod.name}: {error}") from None


def _nobody_waits(result: Granted | Refused) -> bool:
    """A refusal because no pod listed waits for cards at all (not a malformed one)."""
    return isinstance(result, Refused) and not result.outcomes
