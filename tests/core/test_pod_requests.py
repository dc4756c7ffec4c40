"""What a pod asks for, and malformed pods refused with a named reason."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.core import PodRejected, parse_pod
from common.core.pod import (
    Container,
    PodManifest,
    PodSpec,
    ResourceRequirements,
    whole_quantity,
)
from pyhami.sandbox import DEFAULTS
from tests.builders import T4_MEMORY, fleet_of, indexes, manifest, node, run


def container_request(limits: dict[str, int | str] | None = None,
                      requests: dict[str, int | str] | None = None) -> tuple[int, int, int]:
    """(cards, memory slice on a T4, cores) for one container."""
    pod = PodManifest(spec=PodSpec(containers=[Container(resources=ResourceRequirements(
        limits=dict(limits) if limits else None,
        requests=dict(requests) if requests else None))]))
    request = parse_pod(pod, DEFAULTS).containers[0]
    return request.cards, request.memory_slice(T4_MEMORY), request.cores


class TestResources:
    def test_gpu_count_defaults_to_one_when_memory_or_cores_are_set(self) -> None:
        assert container_request({"nvidia.com/gpumem": 1000}) == (1, 1000, 0)
        assert container_request({"nvidia.com/gpucores": 30})[0] == 1
        assert container_request({"nvidia.com/gpumem-percentage": 50})[0] == 1

    def test_no_gpu_resource_means_no_gpu(self) -> None:
        assert container_request({"cpu": "1"})[0] == 0  # type: ignore[dict-item]

    def test_whole_cards_when_no_memory_is_given_with_their_cores(self) -> None:
        # HAMi's webhook gives a container asking only for cards gpucores=100.
        assert container_request({"nvidia.com/gpu": 2}) == (2, T4_MEMORY, 100)

    def test_percentage_slices_the_card(self) -> None:
        assert container_request({"nvidia.com/gpumem-percentage": 25})[1] == T4_MEMORY // 4

    def test_gpumem_wins_over_percentage(self) -> None:
        limits = {"nvidia.com/gpumem": 3000, "nvidia.com/gpumem-percentage": 50}
        assert container_request(limits)[1] == 3000

    def test_cores_are_capped_at_100(self) -> None:
        assert container_request({"nvidia.com/gpucores": 300})[2] == 100

    def test_limits_win_over_requests_per_resource(self) -> None:
        assert container_request(
            limits={"nvidia.com/gpumem": 2000},
            requests={"nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 20},
        ) == (1, 2000, 20)

    def test_quantities_may_be_strings(self) -> None:
        assert container_request({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "512"}) == (
            2, 512, 0)

    @pytest.mark.parametrize(("written", "value"), [
        ("1k", 1000), ("2k", 2000), ("1Ki", 1024), ("1.5k", 1500), ("4e3", 4000),
        ("1E3", 1000), ("+7", 7), ("8000m", 8), (3000.0, 3000),
    ])
    def test_kubernetes_canonical_quantities_are_read(self, written: str | float,
                                                      value: int) -> None:
        # The API server hands back 1000 as "1k": every form with a whole value is fine.
        assert container_request({"nvidia.com/gpumem": written})[1] == value  # type: ignore[dict-item]


class TestMalformed:
    @pytest.mark.parametrize(
        ("limits", "message"),
        [
            ({"nvidia.com/gpumem": "lots"}, "nvidia.com/gpumem]: 'lots' is not a quantity"),
            ({"nvidia.com/gpumem": "1500m"}, "nvidia.com/gpumem]: '1500m' is not an integer"),
            ({"nvidia.com/gpu": -1}, "nvidia.com/gpu]: -1 is a negative number"),
            ({"nvidia.com/gpucores": "1.5"}, "nvidia.com/gpucores]: '1.5' is not an integer"),
        ],
    )
    def test_bad_resource_names_the_resource(self, limits: dict[str, int | str],
                                             message: str) -> None:
        with pytest.raises(PodRejected, match=r"spec\.containers\[0\]") as raised:
            container_request(limits)
        assert message in str(raised.value)

    @pytest.mark.parametrize(
        ("weights", "message"),
        [
            ("slot=1,core=1", "missing memory"),
            ("slot=1,core=1,memory=1,slot=2", "slot is given more than once"),
            ("slot=-1,core=1,memory=1", "'-1' is not a non-negative integer"),
            ("slot=0,core=0,memory=0", "all zero"),
            ("slots=1,core=1,memory=1", "'slots=1' is not one of"),
            ("garbage", "'garbage' is not one of"),
            ("slot=1000001,core=1,memory=1", "slot='1000001' is above 1,000,000"),
            # Python refuses to convert over 4,300 digits: this crashed the pending loop.
            ("slot=1,core=1,memory=" + "9" * 5000, "memory='99999"),
        ],
    )
    def test_bad_weights_name_the_annotation(self, weights: str, message: str) -> None:
        pod = manifest(annotations={"hami.io/device-scoring-weights": weights})
        decision = run(fleet_of(node("n", 1)), pod)
        assert not decision.scheduled
        assert decision.reason is not None
        assert decision.reason.startswith("hami.io/device-scoring-weights: ")
        assert message in decision.reason

    def test_weights_keys_in_any_order_with_spaces(self) -> None:
        pod = manifest(annotations={"hami.io/device-scoring-weights": " memory=2 , slot=0,core=1"})
        assert run(fleet_of(node("n", 1)), pod).scheduled

    def test_bad_node_policy_is_named(self) -> None:
        pod = manifest(annotations={"hami.io/node-scheduler-policy": "random"})
        decision = run(fleet_of(node("n", 1)), pod)
        assert decision.reason is not None
        assert "hami.io/node-scheduler-policy: 'random'" in decision.reason

    def test_bad_numa_bind_is_named(self) -> None:
        pod = manifest(annotations={"nvidia.com/numa-bind": "yes please"})
        decision = run(fleet_of(node("n", 1)), pod)
        assert decision.reason is not None and "nvidia.com/numa-bind" in decision.reason

    @pytest.mark.parametrize(("written", "message"), [
        ("1e10000000", "'1e10000000' is above 2^53"),
        ("-1e10000000", "is a negative number"),
        ("1e-10000000", "is not an integer"),
        ("9" * 5000, "a quantity of 5000 characters is not accepted"),
        ("9007199254740993", "is above 2^53 (9007199254740992)"),
        ("8Ei", "is above 2^53"),
        (10**1000, "an integer of 3322 bits is above 2^53"),
        (1e308, "1e+308 is above 2^53"),
        (float("inf"), "inf is not a finite number"),
        (float("nan"), "nan is not a finite number"),
    ])
    def test_quantities_take_bounded_work_and_stop_at_2_to_the_53(
            self, written: str | float, message: str) -> None:
        started = time.perf_counter()
        with pytest.raises(PodRejected, match=r"nvidia\.com/gpumem\]") as raised:
            container_request({"nvidia.com/gpumem": written})  # type: ignore[dict-item]
        assert time.perf_counter() - started < 0.05  # "1e10000000" used to take seconds
        assert message in str(raised.value)

    def test_the_largest_quantity_and_a_zero_with_a_huge_exponent_are_read(self) -> None:
        # gpumem stops at 2^31-1 (HAMi's bound); a card count is read up to 2^53.
        assert container_request({"nvidia.com/gpu": 2**53})[0] == 2**53
        assert container_request({"nvidia.com/gpucores": "0e99999999"})[2] == 0

    @given(digits=st.integers(0, 10**30), point=st.integers(0, 30),
           exponent=st.integers(-300, 300), negative=st.booleans())
    def test_quantities_with_exponents_match_exact_arithmetic(
            self, digits: int, point: int, exponent: int, negative: bool) -> None:
        text = str(digits).rjust(point + 1, "0")
        number = f"{'-' if negative else ''}{text[:len(text) - point]}.{text[len(text) - point:]}"
        exact = Fraction(number) * Fraction(10) ** exponent
        accepted = exact.denominator == 1 and 0 <= exact <= 2**53
        try:
            value = container_request({"nvidia.com/gpu": f"{number}e{exponent}"})[0]
        except PodRejected:
            assert not accepted
        else:
            assert accepted and value == exact

    def test_a_malformed_pod_books_nothing(self) -> None:
        fleet = fleet_of(node("n", 1))
        run(fleet, manifest(gpumem="lots"))
        assert fleet.allocations() == {}


class TestPassThrough:
    def test_a_pod_without_gpu_resources_is_not_placed_by_pyhami(self) -> None:
        decision = run(fleet_of(node("n", 1)), manifest(gpus=None, gpumem=None))
        assert decision.scheduled
        assert decision.node is None
        assert decision.cards == ()

    def test_explicit_zero_gpus_wants_no_gpu(self) -> None:
        decision = run(fleet_of(node("n", 1)), manifest(gpus=0, gpumem=1000))
        assert decision.node is None

    def test_a_percentage_pod_gets_its_slice_of_each_card(self) -> None:
        fleet = fleet_of(node("n", 2))
        pod = manifest(containers=[{"nvidia.com/gpu": 2, "nvidia.com/gpumem-percentage": 10}])
        decision = run(fleet, pod)
        assert indexes(decision) == [[0, 1]]
        assert [c.memory for c in decision.cards[0]] == [T4_MEMORY // 10] * 2


@given(value=st.one_of(st.integers(-2**54, 2**54), st.integers(0, 10**17).map(str),
                       st.text("0123456789", min_size=1, max_size=20)),
       signed=st.booleans())
def test_integers_and_digit_strings_are_read_as_exact_arithmetic_reads_them(
        value: int | str, signed: bool) -> None:
    # The forms read without Fraction (the usual ones) give what the exact reading gives.
    exact = Fraction(value)
    accepted = (-2**53 if signed else 0) <= exact <= 2**53
    try:
        read = whole_quantity(value, "q", signed=signed)
    except PodRejected:
        assert not accepted
    else:
        assert accepted and read == exact and type(read) is int
