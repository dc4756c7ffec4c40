"""The device plugin's decisions without gRPC: which pod a container request serves, what
the container gets, and every refusal."""

from __future__ import annotations

import msgspec
import pytest

from agent.deviceplugin.allocation import (
    Granted,
    Refused,
    advertised_devices,
    allocate,
    card_of,
    device_id,
    preferred_devices,
)
from agent.vendors.nvidia.containers import HamiCore, NvidiaContainers
from agent.vendors.nvidia.hamicore import HamiCoreSettings
from agent.vendors.nvidia.simulated import profile_cards
from common.core.annotations import CardGrant, encode_devices
from common.wire import AllocationOutcome, PendingContainer, PendingPod

NODE = "gpu-node-1"
CARDS = [card.uuid for card in profile_cards("t4x4", NODE)]
A, B, C, D = CARDS
HAMI = HamiCore(library="/usr/local/vgpu/libvgpu.so", preload="/usr/local/vgpu/ld.so.preload",
                containers="/usr/local/vgpu/containers", lock="/tmp/vgpulock")
CACHE_ID = "5f0c7a9e-0000-4000-8000-000000000001"


def pod(name: str, containers: list[list[CardGrant]], bind_time: int,
        devices: str | None = None,
        named: tuple[PendingContainer, ...] | None = None) -> PendingPod:
    names = tuple(PendingContainer(name=f"c{position}") for position in range(len(containers)))
    return PendingPod(namespace="lab", name=name, uid=f"uid-{name}", bind_time=bind_time,
                      devices=encode_devices(containers) if devices is None else devices,
                      containers=names if named is None else named)


def grant(uuid: str, memory: int = 3000, cores: int = 30) -> CardGrant:
    return CardGrant(uuid, memory, cores)


def run(pending: list[PendingPod], progress: dict[str, int],
        *requests: list[str]) -> Granted | Refused:
    return allocate(pending, progress, list(requests), node=NODE, node_cards=CARDS,
                    runtime=NvidiaContainers(HAMI, lambda: CACHE_ID))


def granted(result: Granted | Refused) -> Granted:
    assert isinstance(result, Granted), result
    return result


def refused(result: Granted | Refused) -> Refused:
    assert isinstance(result, Refused), result
    return result


LIBRARY_MOUNT = ("/usr/local/vgpu/libvgpu.so", HAMI.library, True)
FOLDER_MOUNT = ("/usr/local/vgpu", "/usr/local/vgpu/containers/uid-one_c0", False)
LOCK_MOUNT = ("/tmp/vgpulock", "/tmp/vgpulock", False)
PRELOAD_MOUNT = ("/etc/ld.so.preload", HAMI.preload, True)


def test_a_container_gets_its_cards_limits_and_hami_core_mounts() -> None:
    one = pod("one", [[grant(A, 3000, 30), grant(B, 4000, 40)]], bind_time=100)
    result = granted(run([one], {}, [device_id(A, 0), device_id(B, 3)]))
    (allocation,) = result.allocations
    assert allocation.envs == {
        "NVIDIA_VISIBLE_DEVICES": f"{A},{B}",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "4000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"/usr/local/vgpu/{CACHE_ID}.cache",
        "LIBCUDA_LOG_LEVEL": "1",
    }
    assert [(m.container_path, m.host_path, m.read_only) for m in allocation.mounts] == [
        LIBRARY_MOUNT, FOLDER_MOUNT, LOCK_MOUNT, PRELOAD_MOUNT]
    assert allocation.folder == "/usr/local/vgpu/containers/uid-one_c0"
    assert result.outcomes == (AllocationOutcome(namespace="lab", name="one", uid="uid-one",
                                                 ok=True),)


HAMI_ENVS = ("CUDA_OVERSUBSCRIBE", "LIBCUDA_LOG_LEVEL", "GPU_CORE_UTILIZATION_POLICY")


@pytest.mark.parametrize(("settings", "expected"), [
    (HamiCoreSettings(), {"LIBCUDA_LOG_LEVEL": "1"}),
    (HamiCoreSettings(lib_cuda_log_level="4"), {"LIBCUDA_LOG_LEVEL": "4"}),
    (HamiCoreSettings(lib_cuda_log_level=""), {}),
    (HamiCoreSettings(disable_core_limit=True),
     {"LIBCUDA_LOG_LEVEL": "1", "GPU_CORE_UTILIZATION_POLICY": "disable"}),
    (HamiCoreSettings(device_memory_scaling=1.0), {"LIBCUDA_LOG_LEVEL": "1"}),
    (HamiCoreSettings(device_memory_scaling=0.5), {"LIBCUDA_LOG_LEVEL": "1"}),
    (HamiCoreSettings(device_memory_scaling=1.5),
     {"LIBCUDA_LOG_LEVEL": "1", "CUDA_OVERSUBSCRIBE": "true"}),
    (HamiCoreSettings(libvgpu_version="v2.9.0", lib_cuda_log_level="0",
                      disable_core_limit=True, device_memory_scaling=2.0),
     {"LIBCUDA_LOG_LEVEL": "0", "GPU_CORE_UTILIZATION_POLICY": "disable",
      "CUDA_OVERSUBSCRIBE": "true"}),
], ids=["hami-defaults", "log-level-4", "log-level-empty-unset", "disable-core-limit",
        "memory-scaling-1", "memory-scaling-below-1", "memory-scaling-above-1",
        "every-setting-changed"])
def test_hami_core_settings_reach_the_environment(settings: HamiCoreSettings,
                                                  expected: dict[str, str]) -> None:
    hami = HamiCore(library=HAMI.library, preload=HAMI.preload, containers=HAMI.containers,
                    lock=HAMI.lock, settings=settings)
    one = pod("one", [[grant(A)]], bind_time=100)
    result = granted(allocate([one], {}, [[device_id(A, 0)]], node=NODE, node_cards=CARDS,
                              runtime=NvidiaContainers(hami, lambda: CACHE_ID)))
    envs = result.allocations[0].envs
    assert {key: envs[key] for key in HAMI_ENVS if key in envs} == expected
    assert envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == f"/usr/local/vgpu/{CACHE_ID}.cache"


def test_each_container_gets_a_fresh_cache_file() -> None:
    one = pod("one", [[grant(A)], [grant(B)]], bind_time=100)
    result = granted(allocate([one], {}, [[device_id(A, 0)], [device_id(B, 0)]], node=NODE,
                              node_cards=CARDS, runtime=NvidiaContainers(HAMI)))
    caches = [a.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] for a in result.allocations]
    assert len(set(caches)) == 2
    assert [a.folder for a in result.allocations] == [
        "/usr/local/vgpu/containers/uid-one_c0", "/usr/local/vgpu/containers/uid-one_c1"]


@pytest.mark.parametrize(("env_disables", "preload_mounted"), [
    (False, True),
    (True, False),
], ids=["control-on", "cuda-disable-control-true"])
def test_cuda_disable_control_skips_only_the_preload(env_disables: bool,
                                                    preload_mounted: bool) -> None:
    one = pod("one", [[grant(A)]], bind_time=100,
              named=(PendingContainer(name="c0", control_disabled=env_disables),))
    (allocation,) = granted(run([one], {}, [device_id(A, 0)])).allocations
    mounts = [(m.container_path, m.host_path, m.read_only) for m in allocation.mounts]
    assert mounts == [LIBRARY_MOUNT, FOLDER_MOUNT, LOCK_MOUNT,
                      *([PRELOAD_MOUNT] if preload_mounted else [])]


@pytest.mark.parametrize(("uid", "container", "refused_for"), [
    ("../etc", "c0", "pod uid '../etc'"),
    ("uid/one", "c0", "pod uid 'uid/one'"),
    ("..", "c0", "pod uid '..'"),
    ("uid_one", "c0", "pod uid 'uid_one'"),
    ("", "c0", "pod uid ''"),
    ("uid-one", "../x", "container name: '../x'"),
    ("uid-one", "a/b", "container name: 'a/b'"),
    ("uid-one", "..", "container name: '..'"),
    ("uid-one", "", "container name: must not be empty"),
    ("uid-one", "c" * 64, "container name: 'cccc"),
], ids=["uid-dotdot-path", "uid-slash", "uid-dotdot", "uid-underscore", "uid-empty",
        "name-dotdot-path", "name-slash", "name-dotdot", "name-empty", "name-too-long"])
def test_names_that_cannot_name_a_host_folder_are_refused(uid: str, container: str,
                                                          refused_for: str) -> None:
    one = msgspec.structs.replace(pod("one", [[grant(A)]], bind_time=100), uid=uid,
                                  containers=(PendingContainer(name=container),))
    result = refused(run([one], {}, [device_id(A, 0)]))
    assert result.reason.startswith(f"pod lab/one: {refused_for}")
    assert "cannot name a host folder" in result.reason
    assert [o.ok for o in result.outcomes] == [False]


def test_a_pod_without_container_names_is_refused_with_hami_core_only() -> None:
    one = pod("one", [[grant(A)]], bind_time=100, named=())
    assert "sent no name for container #0" in refused(run([one], {}, [device_id(A, 0)])).reason
    served = granted(allocate([one], {}, [[device_id(A, 0)]], node=NODE, node_cards=CARDS,
                              runtime=NvidiaContainers(None)))
    assert served.allocations[0].folder is None


def test_without_hami_core_the_container_gets_the_environment_only() -> None:
    one = pod("one", [[grant(A)]], bind_time=100)
    result = granted(allocate([one], {}, [[device_id(A, 0)]], node=NODE, node_cards=CARDS,
                              runtime=NvidiaContainers(None)))
    assert result.allocations[0].mounts == ()
    assert result.allocations[0].folder is None
    assert result.allocations[0].envs == {
        "NVIDIA_VISIBLE_DEVICES": A, "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/vgpu/uid-one.cache"}


def test_two_pods_back_to_back_are_served_in_bind_order() -> None:
    # The kubelet chose devices without a preference: only the counts tell the pods apart.
    first = pod("first", [[grant(A)]], bind_time=100)
    second = pod("second", [[grant(B)]], bind_time=101)
    pending = [second, first]  # whatever order the list comes in
    one = granted(run(pending, {}, [device_id(C, 0)]))
    assert one.allocations[0].pod == first
    assert [o.name for o in one.outcomes] == ["first"]
    # The daemon may still list the first pod until it handled the outcome: not served twice.
    two = granted(run(pending, one.progress, [device_id(C, 1)]))
    assert two.allocations[0].pod == second
    assert two.allocations[0].envs["NVIDIA_VISIBLE_DEVICES"] == B


def test_the_devices_the_kubelet_chose_pick_their_pod_over_an_older_one() -> None:
    first = pod("first", [[grant(A)]], bind_time=100)
    second = pod("second", [[grant(B)]], bind_time=101)
    result = granted(run([first, second], {}, [device_id(B, 4)]))
    assert result.allocations[0].pod == second
    assert result.progress == {"uid-second": 1}


def test_init_containers_first_and_containers_without_cards_skipped() -> None:
    # Annotation order: init container (A), an app container without GPU, app container (B, C).
    layered = pod("layered", [[grant(A, 1000, 10)], [], [grant(B), grant(C)]], bind_time=100)
    init = granted(run([layered], {}, [device_id(A, 0)]))
    assert init.allocations[0].position == 0
    assert init.outcomes == ()  # the pod has a container left
    app = granted(run([layered], init.progress, [device_id(B, 0), device_id(C, 0)]))
    assert app.allocations[0].position == 2
    assert app.allocations[0].envs["NVIDIA_VISIBLE_DEVICES"] == f"{B},{C}"
    assert [o.ok for o in app.outcomes] == [True]


def test_one_call_for_several_containers_serves_them_in_order() -> None:
    two = pod("two", [[grant(A)], [grant(B)]], bind_time=100)
    result = granted(run([two], {}, [device_id(A, 0)], [device_id(B, 0)]))
    assert [a.position for a in result.allocations] == [0, 1]
    assert [o.ok for o in result.outcomes] == [True]


def test_a_count_the_kubelet_disagrees_with_is_refused_naming_both() -> None:
    one = pod("one", [[grant(A), grant(B)]], bind_time=100)
    result = refused(run([one], {}, [device_id(A, 0)]))
    assert "2 card(s)" in result.reason
    assert "asks for 1 device(s)" in result.reason
    assert "lab/one" in result.reason
    assert [(o.name, o.ok, o.reason) for o in result.outcomes] == [
        ("one", False, result.reason)]


def test_a_card_of_another_node_is_refused_naming_the_card() -> None:
    stranger = "GPU-gpu-node-2-0"
    one = pod("one", [[grant(stranger)]], bind_time=100)
    result = refused(run([one], {}, [device_id(A, 0)]))
    assert stranger in result.reason
    assert NODE in result.reason
    assert [o.ok for o in result.outcomes] == [False]


def test_a_malformed_annotation_fails_its_pod_and_serves_nothing() -> None:
    broken = pod("broken", [], bind_time=100, devices=f"{A},NVIDIA,lots,30:;")
    result = refused(run([broken], {}, [device_id(A, 0)]))
    assert "lab/broken" in result.reason
    assert "lots" in result.reason
    assert [(o.name, o.ok) for o in result.outcomes] == [("broken", False)]


def test_a_malformed_annotation_does_not_stop_another_pod() -> None:
    broken = pod("broken", [], bind_time=100, devices="no semicolon")
    fine = pod("fine", [[grant(A)]], bind_time=101)
    result = granted(run([broken, fine], {}, [device_id(A, 0)]))
    assert result.allocations[0].pod == fine
    assert [(o.name, o.ok) for o in result.outcomes] == [("broken", False), ("fine", True)]


def test_no_pending_pod_is_refused_and_reports_nobody() -> None:
    result = refused(run([], {}, [device_id(A, 0)]))
    assert result.reason.startswith(f"no pod bound to node {NODE} waits for 1 device(s)")
    assert result.outcomes == ()


@pytest.mark.parametrize(("resource", "pending", "reason"), [
    pytest.param(None, [], f"no pod bound to node {NODE} waits for 1 device(s) of "
                 "nvidia.com/gpu", id="nobody-default-name"),
    pytest.param("example.com/vgpu", [], f"no pod bound to node {NODE} waits for 1 "
                 "device(s) of example.com/vgpu", id="nobody-configured-name"),
    pytest.param("example.com/vgpu", [pod("one", [[grant(A), grant(B)]], bind_time=100)],
                 "pod lab/one: its container #0 was given 2 card(s) but the kubelet asks "
                 "for 1 device(s) of example.com/vgpu", id="mismatch-configured-name"),
])
def test_a_refusal_names_the_registered_resource(resource: str | None,
                                                 pending: list[PendingPod],
                                                 reason: str) -> None:
    """The resource the plugin registered (HAMi's resourceCountName), HAMi's default
    unless the device configuration names another."""
    named = {} if resource is None else {"resource": resource}
    result = refused(allocate(pending, {}, [[device_id(A, 0)]], node=NODE, node_cards=CARDS,
                              runtime=NvidiaContainers(HAMI, lambda: CACHE_ID), **named))
    assert result.reason == reason


def test_a_refused_call_serves_none_of_its_containers() -> None:
    one = pod("one", [[grant(A)], [grant(B), grant(C)]], bind_time=100)
    result = refused(run([one], {}, [device_id(A, 0)], [device_id(B, 0)]))
    assert "container #1 was given 2 card(s)" in result.reason
    assert [(o.name, o.ok) for o in result.outcomes] == [("one", False)]


def test_a_served_pod_is_never_served_again() -> None:
    one = pod("one", [[grant(A)]], bind_time=100)
    result = refused(run([one], {"uid-one": 1}, [device_id(A, 0)]))
    assert result.reason.startswith("no pod bound")


def test_progress_of_pods_no_longer_pending_is_forgotten() -> None:
    one = pod("one", [[grant(A)]], bind_time=100)
    result = granted(run([one], {"uid-gone": 1}, [device_id(A, 0)]))
    assert result.progress == {"uid-one": 1}


def test_devices_are_count_per_card_with_health_and_numa() -> None:
    cards = profile_cards("a100x8-nvswitch", NODE)
    cards[5] = msgspec.structs.replace(cards[5], health=False)
    devices = advertised_devices(cards, numa_topology=True)
    assert len(devices) == sum(card.count for card in cards)
    assert {card_of(d.id) for d in devices} == {card.uuid for card in cards}
    assert {d.numa for d in devices if card_of(d.id) == cards[7].uuid} == {1}
    assert {d.healthy for d in devices if card_of(d.id) == cards[5].uuid} == {False}
    assert all(d.healthy for d in devices if card_of(d.id) != cards[5].uuid)


def test_unknown_numa_gives_no_topology() -> None:
    card = profile_cards("t4x4", NODE)[0]
    unknown = msgspec.structs.replace(card, numa=-1)
    assert {d.numa for d in advertised_devices([unknown], numa_topology=True)} == {None}


def test_numa_nodes_are_told_only_when_the_config_enables_them() -> None:
    cards = profile_cards("a100x8-nvswitch", NODE)
    assert {d.numa for d in advertised_devices(cards, numa_topology=False)} == {None}
    assert {d.numa for d in advertised_devices(cards, numa_topology=True)} == {0, 1}


def test_the_preference_is_one_device_of_each_chosen_card() -> None:
    one = pod("one", [[grant(B), grant(D)]], bind_time=100)
    available = [device_id(uuid, i) for uuid in CARDS for i in range(3)]
    chosen = preferred_devices([one], {}, available, [], 2)
    assert sorted(card_of(d) for d in chosen) == [B, D]


def test_without_a_matching_pod_the_preference_is_distinct_cards() -> None:
    available = [device_id(uuid, i) for uuid in (A, B) for i in range(3)]
    chosen = preferred_devices([], {}, available, [device_id(A, 2)], 2)
    assert chosen[0] == device_id(A, 2)
    assert card_of(chosen[1]) == B
