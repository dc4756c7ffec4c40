"""``/api/resourcequotas``' reading of a body under the daemon's device configuration:
the GPU limits are the configured names' keys, checked as the daemon will apply them."""

from __future__ import annotations

import json

import pytest

from common.core.deviceconfig import DeviceConfig
from common.core.vendors import ResourceNames
from scheduler.web.quotas import QuotaBodyError, read_quota

CUSTOM = DeviceConfig(resources=ResourceNames(
    count="example.com/vgpu", memory="example.com/vmem",
    memory_percentage="example.com/vmem-share", cores="example.com/vcores",
    priority="example.com/vprio"))


def body(hard: dict[str, object]) -> bytes:
    return json.dumps({"apiVersion": "v1", "kind": "ResourceQuota",
                       "metadata": {"name": "gpu-quota", "namespace": "team-a"},
                       "spec": {"hard": hard}}).encode()


@pytest.mark.parametrize(("device", "hard", "message"), [
    pytest.param(DeviceConfig(), {"limits.nvidia.com/gpumem": "1.5"},
                 "ResourceQuota team-a/gpu-quota: spec.hard[limits.nvidia.com/gpumem]: "
                 "'1.5' is not an integer", id="defaults"),
    pytest.param(CUSTOM, {"limits.example.com/vmem": "1.5"},
                 "ResourceQuota team-a/gpu-quota: spec.hard[limits.example.com/vmem]: "
                 "'1.5' is not an integer", id="configured-memory-key"),
    pytest.param(CUSTOM, {"limits.example.com/vcores": -3},
                 "ResourceQuota team-a/gpu-quota: spec.hard[limits.example.com/vcores]: "
                 "-3 is a negative number", id="configured-cores-key"),
    pytest.param(CUSTOM, {"limits.example.com/vmem": 2**64},
                 "ResourceQuota team-a/gpu-quota: spec.hard[limits.example.com/vmem]: ",
                 id="configured-key-beyond-any-integer"),
])
def test_a_limit_under_the_configured_names_is_checked_at_the_door(
        device: DeviceConfig, hard: dict[str, object], message: str) -> None:
    with pytest.raises(QuotaBodyError) as refused:
        read_quota(body(hard), device=device)
    assert str(refused.value).startswith(message)


def test_the_default_keys_are_not_gpu_limits_under_other_names() -> None:
    """Under other names HAMi's default keys are Kubernetes' own business: stored as
    given, unchecked, as the daemon leaves them unapplied."""
    stored = read_quota(body({"limits.nvidia.com/gpumem": "1.5"}), device=CUSTOM)
    assert json.loads(stored.given)["spec"]["hard"] == {"limits.nvidia.com/gpumem": "1.5"}
