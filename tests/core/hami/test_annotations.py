"""HAMi's tests of what a pod's annotations ask (``cases/annotations.yaml``).

A card check (``checkType``, ``CheckType``, ``CheckUUID``) is a one-card node put to
``decide``: HAMi's "kept" is the pod placed there, its "not kept" the card refused as
``CardTypeMismatch`` or ``CardUuidMismatch``. ``assertNuma``, the scoring weights and
the GPU policy are read by ``parse_pod`` (``numa_bind``, ``weights``, ``chain``), and
``PolicyContains`` is whether the chain ``parse_pod`` reads names the policy.

A malformed scoring weights annotation is refused by both; HAMi's sentence (the
substring its test looks for) is kept as data, and pyhami's own refusal is held to name
the annotation: the two word the same faults differently.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from common.core import PodRejected, parse_pod
from common.core.pod import PodRequest
from common.core.policy import WEIGHTS_ANNOTATION, parse_default_chain, parse_weights
from pyhami.sandbox import DEFAULTS
from tests.builders import fleet_of, manifest, node, run
from tests.core.hami.tables import Row, cases

MISMATCHES = ("1/1 CardTypeMismatch", "1/1 CardUuidMismatch")


def card_kept(given: dict[str, Any]) -> bool | str:
    """Whether the pod is placed on the one card; a card refused otherwise than as a
    type or uuid mismatch gives its reason."""
    decision = run(fleet_of(node("n", 1, **given["card"])),
                   manifest(annotations=given["annotations"]))
    if decision.scheduled:
        return True
    assert decision.failed_nodes is not None
    reason = decision.failed_nodes["n"]
    return False if reason in MISMATCHES else reason


def read(given: dict[str, Any]) -> PodRequest:
    """The pod's request, under the cluster default policy ``given["default"]`` if set."""
    defaults = DEFAULTS
    if "default" in given:
        defaults = replace(DEFAULTS, gpu_policy=parse_default_chain(given["default"]))
    pod = manifest(annotations=given["annotations"])
    if given["annotations"] is None:
        pod.metadata.annotations = None
    return parse_pod(pod, defaults)


def numa_bind(given: dict[str, Any]) -> bool | dict[str, str]:
    try:
        return read(given).numa_bind
    except PodRejected as error:
        return {"refused": str(error)}


def weights_by_pod(given: dict[str, Any]) -> dict[str, Any]:
    try:
        weights = read(given).weights
    except PodRejected:
        return {"error": True}
    return {"slot": weights.slot, "core": weights.core, "memory": weights.memory}


def weights_parsed(value: str) -> dict[str, Any]:
    try:
        weights = parse_weights(value)
    except PodRejected as error:
        return {"refused": str(error)}
    return {"slot": weights.slot, "core": weights.core, "memory": weights.memory}


def policy_contains(policy: str, target: str) -> bool:
    chain = read({"annotations": {"hami.io/gpu-scheduler-policy": policy}}).chain
    return target in [*(flt.value for flt in chain.filters),
                      *(key.value for key in chain.sort_keys)]


@cases("annotations")
def test_hami_case(row: Row) -> None:
    given, expected = row.given, row.expected
    if "card" in given:
        assert card_kept(given) == expected
    elif row.test == "TestAssertNuma":
        assert numa_bind(given) == expected
    elif row.test == "TestGetDeviceScoringWeightsByPod":
        assert weights_by_pod(given) == expected
    elif row.test == "TestParseDeviceScoringWeights":
        answer = weights_parsed(given["value"])
        if "error" in expected:
            assert answer["refused"].startswith(f"{WEIGHTS_ANNOTATION}: ")
        else:
            assert answer == expected
    elif row.test == "TestGetGPUSchedulerPolicyByPod":
        assert str(read(given).chain) == expected
    else:
        assert policy_contains(given["policy"], given["target"]) is expected
