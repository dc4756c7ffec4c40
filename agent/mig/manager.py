"""The node's MIG instances: exactly those its pods reserved, made at Allocate, adopted at
start-up, destroyed once no active pod references them.

A reservation (``hami.io/vgpu-mig-allocations``) names a GPU, a profile and a placement;
the instance made for it is known by that key (``InstanceKey``), so making it again is a
no-op and a pod served twice gets the same instance. The manager only ever destroys
instances it made or adopted, and only when told which keys active pods still reference:
a caller that cannot tell (the daemon does not answer, an annotation does not read) does
not reconcile at all ("fail closed"), as HAMi's reconciler skips a cycle on any error.

Every method may block on NVML; they are serialised by a lock and run in worker threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.mig.port import LiveInstance, MigDevices, MigError
from agent.mig.tables import GpuInstanceProfileInfo
from common.core.mig import MigPlacement, MigReservation

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, order=True)
class InstanceKey:
    """One reservation's instance: the GPU (its UUID), the profile and the placement."""

    gpu: str
    profile: str
    start: int
    size: int

    @classmethod
    def of(cls, reservation: MigReservation) -> InstanceKey:
        return cls(reservation.gpu_uuid, reservation.profile, reservation.placement.start,
                   reservation.placement.size)

    @property
    def placement(self) -> MigPlacement:
        return MigPlacement(self.start, self.size)

    def text(self) -> str:
        return f"{self.profile} at slice {self.start} on {self.gpu}"


@dataclass(frozen=True, slots=True)
class StartUp:
    """What the start-up did: the GPUs reset into MIG mode, the instances adopted, and the
    one-line reasons for what it left alone."""

    reset: tuple[str, ...]
    adopted: tuple[InstanceKey, ...]
    problems: tuple[str, ...]


class MigManager:
    """The instances this node made or adopted for its pods' reservations."""

    def __init__(self, devices: MigDevices,
                 profiles: Mapping[str, Mapping[str, GpuInstanceProfileInfo]]) -> None:
        """``profiles``: per GPU UUID, the allowed profiles by name with NVML's figures
        (what the card registered); a GPU not in it is not the manager's."""
        self._devices = devices
        self._profiles = profiles
        self._index: dict[str, int] = {}
        self._held: dict[InstanceKey, LiveInstance] = {}
        self._lock = threading.Lock()

    def open(self) -> None:
        """Learn the GPUs' NVML indexes; raises ``MigError``."""
        count = self._devices.gpu_count()
        self._index = {self._devices.gpu_uuid(gpu): gpu for gpu in range(count)}

    def gpus(self) -> list[str]:
        """The UUIDs of the GPUs the manager serves."""
        return sorted(self._profiles)

    def held(self) -> dict[InstanceKey, LiveInstance]:
        with self._lock:
            return dict(self._held)

    # Start-up ---------------------------------------------------------------------------

    def start_up(self, reservations: Iterable[MigReservation],
                 busy_gpus: Collection[str] = ()) -> StartUp:
        """Prepare the node's MIG GPUs, as HAMi's agent does when it starts.

        A GPU no active pod's reservation names and that runs no process (``busy_gpus``
        and NVML's process lists; a GPU whose processes cannot be read counts as busy) is
        put in MIG mode and emptied of instances. A GPU in use keeps its instances; those
        a reservation with a full runtime identity matches (GPU instance id, placement,
        MIG UUID, compute instance id) are adopted, the others left alone. A GPU whose MIG
        mode change waits for a reset is left alone, with one line saying so."""
        live = [r for r in reservations if r.gpu_uuid in self._profiles]
        in_use = set(busy_gpus) | {r.gpu_uuid for r in live}
        reset: list[str] = []
        adopted: list[InstanceKey] = []
        problems: list[str] = []
        with self._lock:
            for uuid in sorted(self._profiles):
                gpu = self._index.get(uuid)
                if gpu is None:
                    problems.append(f"GPU {uuid}: NVML does not list it")
                    continue
                try:
                    mode = self._devices.mig_mode(gpu)
                    if mode.changing:
                        problems.append(f"GPU {uuid}: a MIG mode change waits for a GPU "
                                        "reset; it is left as it is")
                        continue
                    if uuid not in in_use and not self._devices.busy(gpu):
                        if self._reset(gpu, uuid, mode.current, problems):
                            reset.append(uuid)
                        continue
                    adopted.extend(self._adopt(gpu, uuid, live, problems))
                except MigError as error:
                    problems.append(f"GPU {uuid}: {error}")
        for problem in problems:
            logger.warning("MIG start-up: %s", problem)
        return StartUp(tuple(reset), tuple(adopted), tuple(problems))

    def _reset(self, gpu: int, uuid: str, enabled: bool, problems: list[str]) -> bool:
        if not enabled:
            mode = self._devices.enable_mig(gpu)
            if not mode.current:
                problems.append(f"GPU {uuid}: MIG mode is enabled after a GPU reset only; "
                                "reset the GPU (nvidia-smi -r) to use it")
                return False
        for instance in self._devices.instances(gpu):
            self._devices.destroy(gpu, instance.gpu_instance_id)
        return True

    def _adopt(self, gpu: int, uuid: str, reservations: Sequence[MigReservation],
               problems: list[str]) -> list[InstanceKey]:
        instances = {i.gpu_instance_id: i for i in self._devices.instances(gpu)}
        adopted = []
        for reservation in reservations:
            if reservation.gpu_uuid != uuid:
                continue
            key = InstanceKey.of(reservation)
            instance = (instances.get(reservation.gpu_instance_id)
                        if reservation.live and reservation.gpu_instance_id is not None
                        else None)
            if (instance is None or instance.placement != key.placement
                    or instance.mig_uuid != reservation.mig_uuid
                    or reservation.compute_instance_id not in instance.compute_instance_ids
                    or self._profile_id(key) != instance.profile_id):
                problems.append(f"the annotated MIG allocation {key.text()} is not live")
                continue
            self._held[key] = instance
            adopted.append(key)
        return adopted

    # Allocate ---------------------------------------------------------------------------

    def ensure(self, keys: Sequence[InstanceKey]) -> list[LiveInstance]:
        """The instance of each key, made where it is not held yet; all or none: when one
        cannot be made, those this call made are destroyed again and ``MigError`` says why.
        A placement NVML does not offer for the profile is refused before any is made."""
        with self._lock:
            for key in keys:
                self._check(key)
            made: list[InstanceKey] = []
            instances = []
            try:
                for key in keys:
                    held = self._held.get(key)
                    if held is None:
                        held = self._devices.create(self._gpu(key), self._profile_id(key),
                                                    key.placement)
                        self._held[key] = held
                        made.append(key)
                    instances.append(held)
            except MigError:
                self._roll_back(made)
                raise
            return instances

    def _check(self, key: InstanceKey) -> None:
        profile = self._profiles.get(key.gpu, {}).get(key.profile)
        if profile is None:
            raise MigError(f"GPU {key.gpu} offers no MIG profile {key.profile!r}: the "
                           "scheduler reserved one this node does not allow")
        if (key.start, key.size) not in profile.placements:
            raise MigError(f"the scheduler selected invalid placement {key.start}+{key.size} "
                           f"for profile {key.profile} on GPU {key.gpu}")
        if key.gpu not in self._index:
            raise MigError(f"GPU {key.gpu}: NVML does not list it")

    def _roll_back(self, made: Sequence[InstanceKey]) -> None:
        for key in reversed(made):
            instance = self._held.pop(key)
            try:
                self._devices.destroy(self._gpu(key), instance.gpu_instance_id)
            except MigError as error:
                # Left held: the next reconcile destroys it once nothing references it.
                self._held[key] = instance
                logger.error("MIG instance %s made for a failed Allocate not destroyed: %s",
                             key.text(), error)

    def _gpu(self, key: InstanceKey) -> int:
        return self._index[key.gpu]

    def _profile_id(self, key: InstanceKey) -> int:
        return self._profiles[key.gpu][key.profile].id

    # Release ----------------------------------------------------------------------------

    def reconcile(self, referenced: Collection[InstanceKey],
                  among: Collection[InstanceKey] | None = None) -> list[InstanceKey]:
        """Destroy every held instance no active pod references; the keys destroyed. One
        that NVML refuses to destroy (a process still runs in it) stays held, tried again
        next time. ``among``: only these held instances are judged (those held before the
        references were read: one made since, for a pod bound since, is not in them)."""
        destroyed = []
        with self._lock:
            candidates = set(self._held) if among is None else set(self._held) & set(among)
            for key in sorted(candidates - set(referenced)):
                instance = self._held[key]
                try:
                    self._devices.destroy(self._gpu(key), instance.gpu_instance_id)
                except MigError as error:
                    logger.warning("MIG instance %s not destroyed yet: %s", key.text(), error)
                    continue
                del self._held[key]
                destroyed.append(key)
                logger.info("MIG instance %s destroyed: no active pod references it",
                            key.text())
        return destroyed
