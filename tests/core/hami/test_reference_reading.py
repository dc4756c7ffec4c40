"""pyhami's reading of a pod's request against a second, plain reading written from HAMi
v2.10.0's Go source (``tests/core/hami/reference.py``).

Random pods (one to three containers, up to two init containers, each naming the count,
``gpumem``, the share and the cores in its limits and/or requests, with figures that are
absent, zero, negative, above 100, huge, fractional or suffixed) under several device
configurations are read by both. Every disagreement must be one the migration guide
documents (``known_difference``); any other fails the test.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.core import PodRejected, parse_pod
from common.core.admission import invalid_share
from common.core.deviceconfig import DeviceConfig
from common.core.pod import (
    Container,
    ContainerRequest,
    PodManifest,
    PodSpec,
    ResourceRequirements,
)
from pyhami.sandbox import DEFAULTS
from tests.core.hami.reference import (
    MAX_INT32,
    Config,
    DeviceRequest,
    PodReading,
    Quantity,
    RawContainer,
    RawQuantity,
    Reading,
    Resources,
    fit_reading,
    generate_resource_requests,
    parse_quantity,
    read_pod,
    stored_quantity,
)

DOCS = Path(__file__).parents[3] / "docs"

# Each id: the document and a phrase of it that documents the difference. An id whose
# phrase is not found there is undocumented: the property fails naming it.
DIFFERENCES: dict[str, tuple[str, str]] = {
    "gpumem-dropped-refused": (
        "migrating-from-hami.md", "**A `gpumem` HAMi would drop is refused.**"),
    "whole-non-negative-figures": (
        "migrating-from-hami.md",
        "**The card count and the cores must be whole non-negative numbers**"),
    "above-2^53": (
        "decision-core.md", "Values above 2^53 (where JSON numbers stop being exact)"),
    "requests-read-as-limits": ("migrating-from-hami.md", "`requests-read-as-limits`"),
    "figures-above-int32": ("migrating-from-hami.md", "`figures-above-int32`"),
    "kubernetes-rounds-to-whole": (
        "migrating-from-hami.md", "`kubernetes-rounds-to-whole`"),
}


@functools.cache
def documented(difference: str) -> bool:
    document, phrase = DIFFERENCES[difference]
    return phrase in (DOCS / document).read_text(encoding="utf-8")


COUNT = "nvidia.com/gpu"
MEMORY = "nvidia.com/gpumem"
SHARE = "nvidia.com/gpumem-percentage"
CORES = "nvidia.com/gpucores"
RESOURCES = (COUNT, MEMORY, SHARE, CORES)
QUANTITY_MAX = 2**53

PLAIN: tuple[RawQuantity, ...] = (
    0, 1, 2, 3, 30, 50, 99, 100, 101, 150, 1000, 4096,
    "0", "1", "2", "30", "50", "100", "150", "1000", "4096", "1k", "2e3", "1e2", "1000m",
)
"""Figures the API server takes for an extended resource."""
ODD: tuple[RawQuantity, ...] = (
    -1, -5, 2**31 - 1, 2**31, 2**32 + 1, 2**53, 2**53 + 1, 2**63 - 1, 2**63,
    "-1", "1.5", "500m", "0.5", "-0.5", "99.5", "100.5", "0.9999999999",
    "4Gi", "1Mi", "1Ki", "1Ti", "1Pi", "2147483648", "9007199254740993",
    "9223372036854775808", "1e30",
)
"""Negative, fractional, huge or suffixed figures."""


@dataclass(frozen=True, slots=True)
class Case:
    """One random pod and device configuration."""

    init_containers: tuple[RawContainer, ...]
    containers: tuple[RawContainer, ...]
    device: DeviceConfig
    card_memory: int


def figures() -> st.SearchStrategy[RawQuantity]:
    """A figure: one in eight odd."""
    return st.integers(0, 7).flatmap(
        lambda odd: st.sampled_from(ODD if odd == 0 else PLAIN))


@st.composite
def raw_containers(draw: st.DrawFn, name: str) -> RawContainer:
    limits: dict[str, RawQuantity] = {}
    requests: dict[str, RawQuantity] = {}
    for resource in RESOURCES:
        where = draw(st.sampled_from(
            ("absent", "absent", "limits", "limits", "both", "requests", "differ")))
        value = draw(figures())
        if where in ("limits", "both", "differ"):
            limits[resource] = value
        if where in ("requests", "both"):
            requests[resource] = value
        if where == "differ":
            requests[resource] = draw(figures())
    return RawContainer(name, limits or None, requests or None)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    count = draw(st.integers(1, 3))
    inits = draw(st.integers(0, 2))
    device = DeviceConfig(default_gpu_num=draw(st.sampled_from((0, 1, 2))),
                          default_memory=draw(st.sampled_from((0, 2000))),
                          default_cores=draw(st.sampled_from((0, 30))),
                          memory_factor=draw(st.sampled_from((1, 2))))
    return Case(
        init_containers=tuple(draw(raw_containers(f"init{i}")) for i in range(inits)),
        containers=tuple(draw(raw_containers(f"c{i}")) for i in range(count)),
        device=device,
        card_memory=draw(st.sampled_from((16384, 24576, 81920))),
    )


def config_of(device: DeviceConfig) -> Config:
    names = device.resources
    return Config(count=names.count, memory=names.memory,
                  memory_percentage=names.memory_percentage, cores=names.cores,
                  default_memory=device.default_memory, default_cores=device.default_cores,
                  default_gpu_num=device.default_gpu_num, memory_factor=device.memory_factor)


def manifest_of(case: Case) -> PodManifest:
    def container(raw: RawContainer) -> Container:
        return Container(name=raw.name, resources=ResourceRequirements(
            limits=dict(raw.limits) if raw.limits else None,
            requests=dict(raw.requests) if raw.requests else None))
    return PodManifest(spec=PodSpec(
        containers=[container(c) for c in case.containers],
        init_containers=[container(c) for c in case.init_containers] or None))


def pyhami_reading(request: ContainerRequest, card_memory: int,
                   ) -> tuple[int, int | None, int, int, int] | None:
    if request.cards == 0:
        return None
    return (request.cards, request.memory_mib, request.memory_percent, request.cores,
            request.memory_slice(card_memory))


def reference_reading(reading: Reading | None) -> tuple[int, int | None, int, int, int] | None:
    """HAMi's reading in pyhami's terms: no share (the sentinel 101) is 100 percent."""
    if reading is None:
        return None
    return (reading.nums, reading.memreq,
            100 if reading.percentage is None else reading.percentage,
            reading.cores, reading.memory)


_WRITTEN = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?"
                      r"(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?")
_SCALES: dict[str, Fraction] = {
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18), "Ki": Fraction(2**10),
    "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60)}


def _exact(raw: RawQuantity) -> Fraction | None:
    """A figure's value as written, unrounded (pyhami reads the text as written, the
    API server rounds it up to 10^-9)."""
    if isinstance(raw, int):
        return Fraction(raw)
    match = _WRITTEN.fullmatch(raw.strip())
    if match is None or not (match[2] or match[3]):
        return None
    sign, whole, fraction, suffix = match.groups()
    value = Fraction(int(whole or "0"))
    if fraction:
        value += Fraction(int(fraction), 10 ** len(fraction))
    if suffix and suffix[0] in "eE" and len(suffix) > 1:
        value *= Fraction(10) ** int(suffix[1:])
    elif suffix:
        value *= _SCALES[suffix]
    return -value if sign == "-" else value


def _read(raw: RawContainer, resource: str) -> RawQuantity | None:
    """A figure from the limits, else the requests, as written."""
    for table in (raw.limits or {}, raw.requests or {}):
        if resource in table:
            return table[resource]
    return None


_PLACE = re.compile(r"spec\.(initContainers|containers)\[(\d+)\]\.resources\.(limits|requests)"
                    r"\[([^\]]+)\]")


def _refusal_difference(case: Case, message: str) -> str | None:
    """Why pyhami refuses a pod HAMi reads: the figure its sentence names, judged here."""
    place = _PLACE.search(message)
    if place is None:
        return None
    field, index, table_name, resource = place.groups()
    containers = case.init_containers if field == "initContainers" else case.containers
    raw = containers[int(index)]
    table = (raw.limits if table_name == "limits" else raw.requests) or {}
    written = table[resource]
    exact = _exact(written)
    stored = stored_quantity(written)
    if exact is None or stored is None:
        return None
    if abs(exact) > QUANTITY_MAX and "above 2^53" in message:
        return "above-2^53"
    kube = stored.exact
    if resource == MEMORY and "HAMi would drop" in message:
        as_int = stored.as_int64()
        factor = max(case.device.memory_factor, 1)
        if as_int is None or as_int < 0 or as_int > MAX_INT32 // factor:
            return "gpumem-dropped-refused"
        if exact.denominator != 1 and kube.denominator == 1 and "not an integer" in message:
            return "kubernetes-rounds-to-whole"
        return None
    if resource in (COUNT, SHARE, CORES):
        if kube.denominator != 1 or (kube < 0 and resource != SHARE):
            return "whole-non-negative-figures"
        if exact.denominator != 1 and "not an integer" in message:
            return "kubernetes-rounds-to-whole"
    return None


def _figures_read(raw: RawContainer) -> list[Fraction]:
    values = [_exact(v) for v in (_read(raw, r) for r in RESOURCES) if v is not None]
    return [v for v in values if v is not None]


def _reading_difference(raw: RawContainer, case: Case, ours: object) -> str | None:
    """Why pyhami reads an accepted container otherwise than HAMi."""
    config = config_of(case.device)
    # HAMi's webhook defaults the count from the limits only: read with the requests'
    # figures in the limits too, does HAMi then agree?
    merged = RawContainer(raw.name, {**(raw.requests or {}), **(raw.limits or {})} or None,
                          raw.requests)
    if merged != raw:
        again = read_pod((), (merged,), config, case.card_memory)
        if reference_reading(again.containers[0]) == ours:
            return "requests-read-as-limits"
    # A count or cores above 2^31-1 HAMi wraps in int32 (``int32(n)``), or reads as
    # unset when Kubernetes holds it as an inf.Dec (AsInt64 refuses it: 1Pi); a share
    # held so is unset too (its webhook refuses it; a pod it never saw is read so).
    read = ours if isinstance(ours, tuple) else None
    for resource in (COUNT, CORES, SHARE):
        figure = _read(raw, resource)
        stored = None if figure is None else stored_quantity(figure)
        if stored is None or stored.exact <= MAX_INT32 or read is None:
            continue
        as_written = {COUNT: read[0] == stored.exact, CORES: read[3] == 100,
                      SHARE: stored.as_int64() is None and read[2] == 100}
        if as_written[resource]:
            return "figures-above-int32"
    return None


def _share_difference(raw: RawContainer) -> str | None:
    """Why pyhami's webhook answers a share otherwise than HAMi's."""
    figure = _read(raw, SHARE)
    if figure is None:
        return None
    exact, stored = _exact(figure), stored_quantity(figure)
    if exact is None or stored is None:
        return None
    if abs(exact) > QUANTITY_MAX:
        return "above-2^53"
    if stored.exact.denominator != 1:
        return "whole-non-negative-figures"
    return None


EXAMPLES = {"pods": 0, "refused": 0, "compared": 0}


def known_difference(case: Case, reference: PodReading, ours: object) -> str | None:
    """The documented reason pyhami answers otherwise than HAMi for ``case``, or None.

    ``ours`` is pyhami's answer: a ``PodRejected``, or ``("container", index, reading)``
    for a container read otherwise, or ``("share", index, sentence)`` for the webhook's
    sentence on a container's share."""
    if isinstance(ours, PodRejected):
        return _refusal_difference(case, str(ours))
    raws = [*case.init_containers, *case.containers]
    assert isinstance(ours, tuple)
    kind, index, answer = ours
    if kind == "share":
        return _share_difference(raws[index])
    return _reading_difference(raws[index], case, answer)


def check(case: Case) -> None:
    EXAMPLES["pods"] += 1
    config = config_of(case.device)
    reference = read_pod(case.init_containers, case.containers, config, case.card_memory)
    assert reference.stored, "the generator writes only quantities the API server takes"
    manifest = manifest_of(case)
    raws = [*case.init_containers, *case.containers]
    disagreements: list[tuple[object, str | None]] = []
    for index, container in enumerate(
            [*(manifest.spec.init_containers or ()), *manifest.spec.containers]):
        sentence = invalid_share(container, case.device)
        if sentence != reference.refusals[index]:
            shared: object = ("share", index, sentence)
            disagreements.append((shared, known_difference(case, reference, shared)))
    try:
        request = parse_pod(manifest, replace(DEFAULTS, device=case.device))
    except PodRejected as error:
        EXAMPLES["refused"] += 1
        disagreements.append((error, known_difference(case, reference, error)))
    else:
        EXAMPLES["compared"] += 1
        for index, ours in enumerate(request.containers):
            mine = pyhami_reading(ours, case.card_memory)
            if mine != reference_reading(reference.containers[index]):
                read: object = ("container", index, mine)
                disagreements.append((read, known_difference(case, reference, read)))
    for answer, difference in disagreements:
        where = ""
        if isinstance(answer, tuple):
            where = f" {raws[answer[1]]}"
        assert difference is not None, (
            f"undocumented disagreement{where}: pyhami {answer!r}, HAMi {reference}")
        assert documented(difference), (
            f"difference {difference!r} is not documented ({DIFFERENCES[difference]}):"
            f"{where} pyhami {answer!r}, HAMi {reference}")


@settings(max_examples=2000, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def _every_case_read_as_hami_reads_it(case: Case) -> None:
    check(case)


@pytest.mark.slow  # 2,000 generated requests
def test_pyhami_reads_requests_as_hami_does(capsys: pytest.CaptureFixture[str]) -> None:
    """The property, then the count of pods it judged (quoted in the docs)."""
    EXAMPLES.update(pods=0, refused=0, compared=0)
    _every_case_read_as_hami_reads_it()
    with capsys.disabled():
        print(f"\nreference reading: {dict(EXAMPLES)}")
    assert EXAMPLES["pods"] >= 1000


@pytest.mark.parametrize("difference", sorted(DIFFERENCES))
def test_every_difference_is_documented(difference: str) -> None:
    assert documented(difference)


# ------------------------------------- the reference itself, on HAMi's own test figures

NVIDIA = Config()


def _request(limits: Mapping[str, RawQuantity] | None = None,
             requests: Mapping[str, RawQuantity] | None = None,
             config: Config = NVIDIA) -> DeviceRequest | None:
    """``GenerateResourceRequests`` alone, on quantities as ``MustParse`` makes them."""
    def table(raw: Mapping[str, RawQuantity] | None) -> dict[str, Quantity]:
        out = {}
        for name, value in (raw or {}).items():
            quantity = parse_quantity(str(value))
            assert quantity is not None
            out[name] = quantity
        return out
    return generate_resource_requests(
        Resources("c", table(limits), table(requests)), config)


def _want(nums: int, memreq: int, pct: int, cores: int) -> DeviceRequest:
    return DeviceRequest(nums=nums, memreq=memreq, mem_percentagereq=pct, coresreq=cores)


# TestGenerateResourceRequests (pkg/device/nvidia/device_test.go), by case name.
@pytest.mark.parametrize(("limits", "requests", "want"), [
    pytest.param({COUNT: 1}, None, _want(1, 0, 100, 0),
                 id="gpu count only — defaults to 100% memory"),
    pytest.param({COUNT: 2, MEMORY: 4096}, None, _want(2, 4096, 101, 0),
                 id="gpu count + explicit memory"),
    pytest.param({COUNT: 1, SHARE: 50}, None, _want(1, 0, 50, 0),
                 id="gpu count + memory percentage"),
    pytest.param({COUNT: 1, SHARE: 150}, None, _want(1, 0, 100, 0),
                 id="gpu count + memory percentage above 100 — clamped to 100"),
    pytest.param({COUNT: 1, SHARE: 2**32 + 50}, None, _want(1, 0, 100, 0),
                 id="gpu count + memory percentage beyond int32 range — clamped to 100"),
    pytest.param({COUNT: 1, SHARE: 101}, None, _want(1, 0, 100, 0),
                 id="gpu count + memory percentage equal to sentinel 101 — clamped to 100"),
    pytest.param({COUNT: 1, CORES: 50}, None, _want(1, 0, 100, 50),
                 id="gpu count + explicit cores"),
    pytest.param({}, None, None, id="no gpu resource — returns empty request"),
    pytest.param(None, {COUNT: 1}, _want(1, 0, 100, 0),
                 id="gpu in Requests (not Limits) — falls back to Requests"),
    pytest.param({COUNT: 1, SHARE: 0}, None, _want(1, 0, 100, 0),
                 id="gpu count + memory percentage of 0 — treated as unset"),
    pytest.param(None, {COUNT: 1, SHARE: 0}, _want(1, 0, 100, 0),
                 id="memory percentage of 0 in Requests — treated as unset"),
    pytest.param({COUNT: 1, SHARE: -1}, None, _want(1, 0, 100, 0),
                 id="negative memory percentage — treated as unset"),
    pytest.param({COUNT: 1, MEMORY: 2000, SHARE: 0}, None, _want(1, 2000, 101, 0),
                 id="memory percentage of 0 + explicit memory — explicit memory wins"),
    pytest.param({COUNT: 1, MEMORY: "16Gi"}, None, None,
                 id="byte-scale memory quantity that overflows int32 is rejected"),
    pytest.param({COUNT: 1, MEMORY: "16.0Gi"}, None, None,
                 id="decimal-form memory request is rejected, not treated as zero"),
])
def test_reference_matches_hami_s_generate_resource_requests(
        limits: dict[str, RawQuantity] | None, requests: dict[str, RawQuantity] | None,
        want: DeviceRequest | None) -> None:
    assert _request(limits, requests) == want


def test_reference_matches_hami_s_memory_factor_and_default_memory() -> None:
    # TestGenerateResourceRequests_MemoryFactor
    factor = Config(memory_factor=2)
    request = _request({COUNT: 1, MEMORY: 1024}, config=factor)
    assert request is not None and request.memreq == 2048
    assert _request({COUNT: 1, MEMORY: "1Gi"}, config=factor) is None
    # TestGenerateResourceRequests_DefaultMemory
    default = Config(default_memory=512)
    for limits in ({COUNT: 1}, {COUNT: 1, SHARE: 0}, {COUNT: 1, MEMORY: 0}):
        assert _request(limits, config=default) == _want(1, 512, 101, 0)
    # TestZeroMemoryPercentageIsAccountedAsWholeCard: Fit books the whole card.
    request = _request({COUNT: 1, SHARE: 0})
    assert request is not None and fit_reading(request, 11264).memory == 11264


def test_reference_webhook_defaults_and_refusal() -> None:
    # defaultExclusiveCoreIfNeeded, mutateContainerResource, validateMemoryPercentage.
    pod = read_pod((), (RawContainer("c", {MEMORY: 1000, SHARE: 100}),), NVIDIA, 16384)
    assert pod.refusal is None and pod.containers == (Reading(1, 1000, 100, 100, 1000),)
    pod = read_pod((), (RawContainer("c", {SHARE: 150}),), NVIDIA, 16384)
    assert pod.refusal == ("invalid nvidia.com/gpumem-percentage value 150 in container c: "
                           "must be an integer between 0 and 100")
    pod = read_pod((), (RawContainer("c", None, {MEMORY: 1000}),), NVIDIA, 16384)
    assert pod.containers == (None,)  # no count in the limits: the webhook adds none


@pytest.mark.parametrize(("text", "as_int64", "value"), [
    # Checked against k8s.io/apimachinery v0.36.3 (ParseQuantity(q.String())).
    ("1.5", None, 2), ("500m", None, 1), ("1k", 1000, 1000), ("4Gi", 2**32, 2**32),
    ("2e3", 2000, 2000), ("1000m", 1, 1), ("0.9999999999", 1, 1), ("1Pi", None, 2**50),
    ("1Ti", 2**40, 2**40), ("-0.5", None, -1), ("99.5", None, 100),
    ("9223372036854775807", None, 2**63 - 1), ("1000E", 1, 1),
    ("18446744073709551716", None, 100),
])
def test_reference_quantities(text: str, as_int64: int | None, value: int) -> None:
    quantity = stored_quantity(text)
    assert quantity is not None
    assert (quantity.as_int64(), quantity.go_value()) == (as_int64, value)
