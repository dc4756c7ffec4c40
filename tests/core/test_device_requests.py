"""Requests read under HAMi's device configuration (``Defaults.device``): the configured
resource names, ``defaultMemory``, ``defaultCores``, ``defaultGPUNum``, the exclusive
default, ``memoryFactor`` on requests and quota limits, and the requests HAMi would
drop silently refused with their reason."""

from __future__ import annotations

from dataclasses import replace

import pytest

from common.core import PodRejected, parse_pod
from common.core.admission import AdmittedContainer, AdmittedPod, AdmittedPodSpec, admit
from common.core.deviceconfig import DeviceConfig
from common.core.pod import (
    DEFAULT_DEVICE,
    Container,
    ObjectMeta,
    PodManifest,
    PodSpec,
    ResourceRequirements,
)
from common.core.quota import QuotaSpec, ResourceQuotaManifest, admission_denial, parse_quota
from common.core.vendors import ResourceNames
from tests.builders import fleet_of, manifest, node, run, under

CUSTOM_NAMES = ResourceNames(count="example.com/vgpu", memory="example.com/vmem",
                             memory_percentage="example.com/vmem-pct",
                             cores="example.com/vcores", priority="example.com/vprio")
CUSTOM = DeviceConfig(resources=CUSTOM_NAMES, default_memory=2000, default_cores=30,
                      default_gpu_num=2, memory_factor=1024)
"""Every key this part reads changed from HAMi's chart default."""


def read(limits: dict[str, int | str], device: DeviceConfig = DEFAULT_DEVICE,
         ) -> tuple[int, int | None, int, int]:
    """(cards, MiB or None, memory percent, cores) for one container named ``c``."""
    pod = PodManifest(spec=PodSpec(containers=[Container(
        name="c", resources=ResourceRequirements(limits=dict(limits)))]))
    request = parse_pod(pod, under(device)).containers[0]
    return request.cards, request.memory_mib, request.memory_percent, request.cores


@pytest.mark.parametrize(("device", "limits", "expected"), [
    # HAMi's chart defaults: defaultGPUNum 1, defaultCores 0, defaultMemory 0 (whole card).
    (DeviceConfig(), {"nvidia.com/gpumem": 1000}, (1, 1000, 100, 0)),
    (DeviceConfig(), {"nvidia.com/gpucores": 30}, (1, None, 100, 30)),
    (DeviceConfig(), {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50},
     (1, None, 50, 0)),
    (DeviceConfig(), {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000}, (2, 1000, 100, 0)),
    # Every key changed: names, defaultGPUNum 2, memoryFactor 1024, defaultCores 30,
    # defaultMemory 2000.
    (CUSTOM, {"example.com/vmem": 3}, (2, 3072, 100, 30)),
    (CUSTOM, {"example.com/vcores": 20}, (2, 2000, 100, 20)),
    (CUSTOM, {"example.com/vgpu": 1, "example.com/vmem-pct": 50}, (1, None, 50, 30)),
    (CUSTOM, {"example.com/vgpu": 1, "example.com/vmem": 0}, (1, 2000, 100, 30)),
    # The default names mean nothing under custom ones.
    (CUSTOM, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, (0, None, 100, 0)),
    # defaultGPUNum 0: a container naming memory but no count is no GPU container.
    (replace(CUSTOM, default_gpu_num=0), {"example.com/vmem": 3}, (0, None, 100, 0)),
], ids=["default-memory-only-gets-one-card", "default-cores-only",
        "default-percentage-with-default-cores", "default-gpumem-as-written",
        "custom-gpunum-factor-cores", "custom-default-memory",
        "custom-percentage-wins-over-default-memory", "custom-gpumem-0-takes-default-memory",
        "custom-ignores-default-names", "custom-gpunum-0-no-gpu"])
def test_each_key_shapes_the_request(device: DeviceConfig, limits: dict[str, int | str],
                                     expected: tuple[int, int | None, int, int]) -> None:
    assert read(limits, device) == expected


@pytest.mark.parametrize(("device", "limits", "cores"), [
    (DeviceConfig(), {"nvidia.com/gpu": 1}, 100),
    (DeviceConfig(), {"nvidia.com/gpumem-percentage": 100}, 100),
    (DeviceConfig(), {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 100,
                      "nvidia.com/gpumem": 1000}, 100),
    (DeviceConfig(), {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 99}, 0),
    (DeviceConfig(), {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 15360}, 0),
    (DeviceConfig(), {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 0}, 0),
    (CUSTOM, {"example.com/vgpu": 1}, 100),
    (CUSTOM, {"example.com/vgpu": 1, "example.com/vmem": 1}, 30),
], ids=["count-only", "percentage-100-count-defaulted", "percentage-100-beats-gpumem",
        "percentage-99", "gpumem-given", "cores-0-written", "custom-count-only-over-default-cores",
        "custom-gpumem-given-default-cores"])
def test_the_exclusive_default_gives_whole_cards_their_cores(
        device: DeviceConfig, limits: dict[str, int | str], cores: int) -> None:
    assert read(limits, device)[3] == cores


@pytest.mark.parametrize(("device", "limits", "message"), [
    (DeviceConfig(), {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "4Gi"},
     "spec.containers[0].resources.limits[nvidia.com/gpumem]: '4Gi' is 4294967296 MiB, above "
     "2147483647 (2^31-1): gpumem is MiB as a plain integer, such as 4096; HAMi would drop "
     "container c's GPU request without a word"),
    (DeviceConfig(), {"nvidia.com/gpumem": "1.5"},
     "spec.containers[0].resources.limits[nvidia.com/gpumem]: '1.5' is not an integer; HAMi "
     "would drop container c's GPU request without a word"),
    (DeviceConfig(), {"nvidia.com/gpumem": -1},
     "spec.containers[0].resources.limits[nvidia.com/gpumem]: -1 is a negative number; HAMi "
     "would drop container c's GPU request without a word"),
    (CUSTOM, {"example.com/vmem": 2097152},
     "spec.containers[0].resources.limits[example.com/vmem]: 2097152 is 2097152 MiB, above "
     "2097151 (2^31-1 / memoryFactor 1024): gpumem is MiB as a plain integer, such as 4096; "
     "HAMi would drop container c's GPU request without a word"),
], ids=["gpumem-4Gi", "gpumem-fraction", "gpumem-negative", "gpumem-over-int32-by-factor"])
def test_requests_hami_drops_or_refuses_are_refused_with_the_reason(
        device: DeviceConfig, limits: dict[str, int | str], message: str) -> None:
    with pytest.raises(PodRejected) as raised:
        read(limits, device)
    assert str(raised.value) == message


def adjusted(limits: dict[str, int | str], device: DeviceConfig = DEFAULT_DEVICE,
             ) -> tuple[str, ...]:
    pod = PodManifest(spec=PodSpec(containers=[Container(
        name="c", resources=ResourceRequirements(limits=dict(limits)))]))
    return parse_pod(pod, under(device)).adjusted


LIMITS = "spec.containers[0].resources.limits"


@pytest.mark.parametrize(("device", "limits", "expected", "warning"), [
    # HAMi's scheduler clamps a share above 100 (its webhook refuses it: pyhami's too).
    (DeviceConfig(), {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 101},
     (1, None, 100, 0),
     f"{LIMITS}[nvidia.com/gpumem-percentage]: 101 is above 100: read as 100 (HAMi's "
     "scheduler clamps it)"),
    (CUSTOM, {"example.com/vmem-pct": 250}, (2, None, 100, 30),
     f"{LIMITS}[example.com/vmem-pct]: 250 is above 100: read as 100 (HAMi's scheduler "
     "clamps it)"),
    # A share not above 0 is ignored: defaultMemory, else the whole card.
    (DeviceConfig(), {"nvidia.com/gpumem-percentage": -1}, (1, None, 100, 0),
     f"{LIMITS}[nvidia.com/gpumem-percentage]: -1 is not above 0: ignored, the default "
     "memory applies (as HAMi's scheduler reads it)"),
    (CUSTOM, {"example.com/vgpu": 1, "example.com/vmem-pct": 0}, (1, 2000, 100, 30),
     f"{LIMITS}[example.com/vmem-pct]: 0 is not above 0: ignored, the default memory "
     "applies (as HAMi's scheduler reads it)"),
    # gpumem 0 is no figure: the share wins, else the default.
    (DeviceConfig(), {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 0,
                      "nvidia.com/gpumem-percentage": 40}, (1, None, 40, 0),
     f"{LIMITS}[nvidia.com/gpumem]: 0 is read as unset: the share applies (as HAMi's "
     "scheduler reads it)"),
    (DeviceConfig(), {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 0}, (1, None, 100, 0),
     f"{LIMITS}[nvidia.com/gpumem]: 0 is read as unset: the default memory applies (as "
     "HAMi's scheduler reads it)"),
    # Cores above 100 are clamped by HAMi's Fit.
    (DeviceConfig(), {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150}, (1, None, 100, 100),
     f"{LIMITS}[nvidia.com/gpucores]: 150 is above 100: read as 100 (HAMi's scheduler "
     "clamps it)"),
], ids=["percentage-101", "custom-percentage-250", "percentage-negative",
        "custom-percentage-0-default-memory", "gpumem-0-share-wins", "gpumem-0-whole-card",
        "cores-150"])
def test_figures_hami_reads_otherwise_are_read_so_with_a_warning(
        device: DeviceConfig, limits: dict[str, int | str],
        expected: tuple[int, int | None, int, int], warning: str) -> None:
    assert read(limits, device) == expected
    assert adjusted(limits, device) == (warning,)


def test_figures_read_as_written_warn_of_nothing() -> None:
    assert adjusted({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 100,
                     "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 100}) == ()


def test_the_largest_gpumem_under_the_factor_is_read_scaled() -> None:
    assert read({"example.com/vmem": 2097151}, CUSTOM)[1] == 2097151 * 1024


def test_a_refused_gpumem_is_the_decision_s_reason() -> None:
    # What the Event and `explain` show (the pod used to wait for 4 GiB MiB forever).
    decision = run(fleet_of(node("n", 1)), manifest(gpumem="4Gi"))
    assert not decision.scheduled
    assert decision.reason is not None and decision.reason.endswith(
        "HAMi would drop container c0's GPU request without a word")


def custom_pod(limits: dict[str, int | str]) -> PodManifest:
    return PodManifest(metadata=ObjectMeta(name="p", namespace="team"), spec=PodSpec(
        containers=[Container(name="c", resources=ResourceRequirements(limits=dict(limits)))]))


def custom_quota(hard: dict[str, int | str]) -> ResourceQuotaManifest:
    return ResourceQuotaManifest(metadata=ObjectMeta(name="gpu", namespace="team"),
                                 spec=QuotaSpec(hard=dict(hard)))


class TestCustomNamesEndToEnd:
    def test_a_pod_asking_with_custom_names_is_placed_with_scaled_memory(self) -> None:
        pod = custom_pod({"example.com/vgpu": 1, "example.com/vmem": 4,
                          "example.com/vcores": 25})
        decision = run(fleet_of(node("n", 2)), pod, under(CUSTOM))
        assert decision.scheduled and decision.allocation is not None
        (grant,), = decision.allocation.containers
        assert (grant.memory, grant.cores) == (4096, 25)

    def test_a_pod_asking_with_default_names_asks_for_nothing_under_custom_ones(self) -> None:
        decision = run(fleet_of(node("n", 1)), manifest(), under(CUSTOM))
        assert decision.scheduled and not decision.asks_for_gpu

    def test_a_default_request_fills_a_card_exclusively(self) -> None:
        decision = run(fleet_of(node("n", 1)), custom_pod({"example.com/vgpu": 1}),
                       under(CUSTOM))
        assert decision.allocation is not None
        (grant,), = decision.allocation.containers
        assert (grant.memory, grant.cores) == (2000, 100)

    @pytest.mark.parametrize(("device", "hard", "memory", "cores"), [
        (DeviceConfig(), {"limits.nvidia.com/gpumem": 4, "limits.nvidia.com/gpucores": 50},
         4, 50),
        (CUSTOM, {"limits.example.com/vmem": 4, "limits.example.com/vcores": 50}, 4096, 50),
        (CUSTOM, {"limits.nvidia.com/gpumem": 4, "limits.nvidia.com/gpucores": 50},
         None, None),
    ], ids=["default-names", "custom-names-memory-times-factor", "default-keys-ignored"])
    def test_quota_keys_follow_the_names_and_memory_the_factor(
            self, device: DeviceConfig, hard: dict[str, int | str], memory: int | None,
            cores: int | None) -> None:
        quota = parse_quota(custom_quota(hard), device)
        assert (quota.memory, quota.cores) == (memory, cores)

    @pytest.mark.parametrize(("asked", "sentence"), [
        (4, None),
        (5, "team would use 5120 of 4096 MiB example.com/vmem under ResourceQuota gpu "
            "(asked 5120)"),
    ], ids=["fits-scaled", "one-gib-over"])
    def test_the_quota_judges_scaled_requests_under_custom_names(
            self, asked: int, sentence: str | None) -> None:
        fleet = fleet_of(node("n", 1))
        fleet.quotas.set_quota(parse_quota(custom_quota({"limits.example.com/vmem": 4}),
                                           CUSTOM))
        pod = parse_pod(custom_pod({"example.com/vgpu": 1, "example.com/vmem": asked}),
                        under(CUSTOM))
        refusal = admission_denial(fleet.quotas, pod)
        assert (None if refusal is None else refusal.text()) == sentence

    @pytest.mark.parametrize(("names", "resource", "redirect"), [
        (ResourceNames(), "nvidia.com/gpucores", True),
        (CUSTOM_NAMES, "example.com/vcores", True),
        (CUSTOM_NAMES, "nvidia.com/gpu", False),
        (CUSTOM_NAMES, "example.com/vprio", False),
    ], ids=["default", "custom", "default-name-under-custom", "priority-alone"])
    def test_the_webhook_rule_reads_the_configured_names(
            self, names: ResourceNames, resource: str, redirect: bool) -> None:
        pod = AdmittedPod(spec=AdmittedPodSpec(containers=[AdmittedContainer(
            name="c", resources=ResourceRequirements(limits={resource: 1}))]))
        assert admit(pod, "pyhami-scheduler", DeviceConfig(resources=names)).redirect is redirect
        manifest_ = custom_pod({resource: 1})
        assert manifest_.asks_for_gpu(names) is redirect

