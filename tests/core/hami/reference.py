"""A second, plain reading of a pod's NVIDIA request, written from HAMi v2.10.0's Go
source and Kubernetes' ``resource.Quantity`` (k8s.io/apimachinery v0.36,
``pkg/api/resource``), independently of pyhami's parser (``common.core.pod``).

It answers, for each container of a pod, what HAMi's scheduler would ask a card for after
its webhook saw the pod: ``None`` (no GPU request, or a request dropped), else the
figures of ``ContainerDeviceRequest`` and ``Fit``'s reading of them against a card. It
also says whether HAMi's webhook refuses the pod, and with what sentence.

Quantities are read as HAMi meets them in a cluster: parsed by the API server, stored in
their canonical form, parsed again by HAMi (``ParseQuantity(q.String())``). Each step
names the Go function it follows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_INT32 = 2**31 - 1


def int64(value: int) -> int:
    """Go's two's complement wrap of an integer into int64."""
    return (value - INT64_MIN) % 2**64 + INT64_MIN


def int32(value: int) -> int:
    """Go's ``int32(n)`` conversion: the low 32 bits, signed."""
    return (value + 2**31) % 2**32 - 2**31


def go_div(a: int, b: int) -> int:
    """Go's integer division, truncated toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def go_mod(a: int, b: int) -> int:
    """Go's ``%``: the sign of the dividend."""
    return a - go_div(a, b) * b


# ------------------------------------------------- k8s.io/apimachinery/pkg/api/resource

DECIMAL_SI = "DecimalSI"
DECIMAL_EXPONENT = "DecimalExponent"
BINARY_SI = "BinarySI"

# suffix.go: newSuffixer's tables (base 10 and base 2).
_DEC_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12,
                 "P": 15, "E": 18}
_DEC_BY_EXPONENT = {exponent: suffix for suffix, exponent in _DEC_SUFFIXES.items()}
_BIN_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_BIN_BY_EXPONENT = {exponent: suffix for suffix, exponent in _BIN_SUFFIXES.items()}
_NANO = -9


@dataclass(frozen=True, slots=True)
class Quantity:
    """A parsed ``resource.Quantity``: an ``int64Amount`` (value x 10^scale) or, with
    ``dec``, an ``inf.Dec`` (value x 10^-scale, inf's convention)."""

    value: int
    scale: int
    dec: bool
    fmt: str
    text: str | None = None
    """``q.s``: the text kept when it was parsed in canonical form (MarshalJSON reuses it)."""

    @property
    def exact(self) -> Fraction:
        if self.dec:
            return Fraction(self.value) / Fraction(10) ** self.scale
        return Fraction(self.value) * Fraction(10) ** self.scale

    def as_int64(self) -> int | None:
        """``Quantity.AsInt64``: None for an ``inf.Dec`` and where ``int64Amount.AsInt64``
        says not ok (a negative scale, an overflow)."""
        if self.dec:
            return None
        if self.scale == 0:
            return self.value
        if self.scale < 0:
            return None
        result, ok = _positive_scale(self.value, self.scale)
        return result if ok else None

    def go_value(self) -> int:
        """``Quantity.Value`` (``ScaledValue(0)``): rounded away from zero for an
        ``int64Amount``; ``scaledValue``'s truncate-then-add-one for an ``inf.Dec``;
        wrapped or 0 where Go overflows."""
        if not self.dec:
            if self.scale < 0:  # int64Amount.AsScaledInt64 -> negativeScaleInt64
                return _negative_scale(self.value, -self.scale)[0]
            return _positive_scale(self.value, self.scale)[0]
        return _scaled_value(self.value, self.scale)


def _multiply_scale(a: int, b: int) -> tuple[int, bool]:
    """``int64MultiplyScale`` (and its 10, 100, 1000 forms): the wrapped product, and
    whether it did not overflow."""
    if a in (0, 1):
        return a * b, True
    if a == INT64_MIN:
        return 0, False
    product = int64(a * b)
    return product, go_div(product, b) == a


def _positive_scale(base: int, scale: int) -> tuple[int, bool]:
    """``positiveScaleInt64``: base x 10^scale, and whether it fits int64."""
    if scale == 0:
        return base, True
    if scale in (1, 2, 3, 6, 9):
        return _multiply_scale(base, 10**scale)
    value = base
    for _ in range(scale):
        if value == 0:
            break
        value, ok = _multiply_scale(value, 10)
        if not ok:
            return 0, False
    return value, True


def _negative_scale(base: int, scale: int) -> tuple[int, bool]:
    """``negativeScaleInt64``: base / 10^scale rounded away from zero, and whether exact."""
    value = base
    fraction = False
    for _ in range(scale):
        if not fraction and go_mod(value, 10) != 0:
            fraction = True
        value = go_div(value, 10)
        if value == 0:
            if fraction:
                return (1 if base > 0 else -1), False
            return 0, True
    if fraction:
        value = value + 1 if base > 0 else value - 1
    return value, not fraction


def _big_int64(value: int) -> int:
    """``big.Int.Int64``: the low 64 bits of the magnitude, then the sign."""
    low = int64(abs(value) % 2**64)
    return int64(-low) if value < 0 else low


def _scaled_value(unscaled: int, scale: int) -> int:
    """``scaledValue(unscaled, scale, 0)`` of quantity.go."""
    if scale == 0:
        return _big_int64(unscaled)
    if scale < 0:
        return int64(_big_int64(unscaled) * 10**-scale)
    if unscaled < INT64_MAX and scale < 19:
        divide = 10**scale
        small = _big_int64(unscaled)
        result, mod = go_div(small, divide), go_mod(small, divide)
        return int64(result + 1) if mod != 0 else result
    result, remainder = divmod(unscaled, 10**scale)  # big.Int.DivMod: Euclidean
    return int64(_big_int64(result) + 1) if remainder != 0 else _big_int64(result)


def _parse_quantity_string(text: str) -> tuple[bool, str, str, str, str] | None:
    """``parseQuantityString``: (positive, value, num, denom, suffix), None on error."""
    positive = True
    pos = 0
    end = len(text)
    if pos < end and text[0] in "+-":
        positive = text[0] != "-"
        pos += 1
    while pos < end and text[pos] == "0":  # strip leading zeros
        pos += 1
    if pos >= end:
        return positive, "0", "0", "", ""
    start = pos
    while pos < end and text[pos].isdigit() and text[pos].isascii():
        pos += 1
    num = text[start:pos] or "0"
    if pos >= end:
        return positive, text, num, "", ""
    denom = ""
    if text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in "0123456789":
            pos += 1
        denom = text[start:pos]
        if pos >= end:
            return positive, text, num, denom, ""
    value = text[:pos]
    suffix_start = pos
    while pos < end and text[pos] in "eEinumkKMGTP":
        pos += 1
    if pos >= end:
        return positive, value, num, denom, text[suffix_start:]
    if text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in "0123456789":
        pos += 1
    if pos >= end:
        return positive, value, num, denom, text[suffix_start:]
    return None  # ErrFormatWrong


def _interpret(suffix: str) -> tuple[int, int, str] | None:
    """``suffixHandler.interpret``: (base, exponent, format)."""
    if suffix in _DEC_SUFFIXES:
        return 10, _DEC_SUFFIXES[suffix], DECIMAL_SI
    if suffix in _BIN_SUFFIXES:
        return 2, _BIN_SUFFIXES[suffix], BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE" and re.fullmatch(r"[+-]?[0-9]+", suffix[1:]):
        parsed = int(suffix[1:])
        if INT64_MIN <= parsed <= INT64_MAX:  # strconv.ParseInt(..., 64)
            return 10, int32(parsed), DECIMAL_EXPONENT
    return None


_DECIMAL_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)")


def parse_quantity(text: str) -> Quantity | None:
    """``resource.ParseQuantity``; None where it answers an error."""
    if not text:
        return None
    if text == "0":
        return Quantity(0, 0, False, DECIMAL_SI, text)
    parsed = _parse_quantity_string(text)
    if parsed is None:
        return None
    positive, value, num, denom, suffix = parsed
    interpreted = _interpret(suffix)
    if interpreted is None:
        return None
    base, exponent, fmt = interpreted
    mantissa = 1
    if fmt in (DECIMAL_EXPONENT, DECIMAL_SI):
        scale = exponent
        precision = 18 - (len(num) + len(denom))  # maxInt64Factors
    elif exponent >= 0 and not denom:
        scale = 0
        mantissa = 1 << exponent
        precision = 15 - len(num) - exponent * 3 // 10 - 1
    else:
        scale = 0
        precision = -1
    if precision >= 0:
        scale = int32(scale - len(denom))
        if scale >= _NANO:
            shifted = num + denom
            number = int(shifted)
            result = number * mantissa
            if number in (0, 1) or mantissa == 1 or INT64_MIN < result <= INT64_MAX:
                if not positive:
                    result = -result
                if fmt == BINARY_SI:
                    canonical = exponent % 10 == 0 and number & 0x07 != 0
                else:
                    canonical = (scale % 3 == 0 and not shifted.endswith("000")
                                 and shifted[0] != "0")
                return Quantity(result, scale, False, fmt, text if canonical else None)
    # The inf.Dec path.
    if _DECIMAL_TEXT.fullmatch(value) is None:
        return None  # inf.Dec.SetString refuses it: ErrNumeric
    sign = -1 if value.startswith("-") else 1
    digits = value.lstrip("+-")
    whole, _, fraction = digits.partition(".")
    unscaled = int(whole + fraction or "0")
    dec_scale = len(fraction)
    if base == 10:
        dec_scale -= exponent
    else:
        unscaled <<= exponent
    if unscaled != 0:  # amount.Round(amount, Nano.infScale(), inf.RoundUp) on |amount|
        if dec_scale <= 9:
            unscaled *= 10 ** (9 - dec_scale)
        else:
            unscaled = -(-unscaled // 10 ** (dec_scale - 9))
        dec_scale = 9
    magnitude = Fraction(unscaled) / Fraction(10) ** dec_scale
    if fmt == BINARY_SI and magnitude > INT64_MAX:  # maxAllowed
        unscaled, dec_scale = INT64_MAX, 0
    if fmt == BINARY_SI and 0 < magnitude < 1:
        fmt = DECIMAL_SI
    return Quantity(sign * unscaled, dec_scale, True, fmt)


def _canonical_decimal(q: Quantity) -> tuple[str, int]:
    """``AsCanonicalBytes`` of either amount (an ``int64Amount`` whose scaling overflows
    takes the ``inf.Dec`` path, so both are exact): mantissa text, exponent a multiple
    of 3."""
    amount, exponent = (q.value, -q.scale) if q.dec else (q.value, q.scale)
    while amount % 10 == 0:  # removeInt64Factors / removeBigIntFactors (amount is not 0)
        amount //= 10
        exponent += 1
    while go_mod(exponent, 3) != 0:
        amount *= 10
        exponent -= 1
    return str(amount), exponent


def canonical_text(q: Quantity) -> str:
    """``Quantity.MarshalJSON``: the kept text, else ``CanonicalizeBytes``."""
    if q.text is not None:
        return q.text
    exact = q.exact
    if exact == 0:
        return "0"
    fmt = q.fmt
    if fmt == BINARY_SI and (-1024 < exact < 1024 or exact.denominator != 1):
        fmt = DECIMAL_SI
    if fmt != BINARY_SI:
        number, exponent = _canonical_decimal(q)
        if fmt == DECIMAL_SI:
            return number + _DEC_BY_EXPONENT.get(exponent, "")
        return number + (f"e{exponent}" if exponent else "")
    amount, times = int(exact), 0  # AsCanonicalBase1024Bytes
    while abs(amount) >= 1024 and abs(amount) % 1024 == 0:
        amount //= 1024
        times += 1
    return str(amount) + _BIN_BY_EXPONENT.get(times * 10, "")


RawQuantity = str | int


def stored_quantity(raw: RawQuantity) -> Quantity | None:
    """The quantity HAMi reads for ``raw`` as written in a manifest: parsed by the API
    server (``UnmarshalJSON`` -> ``ParseQuantity``), handed on in canonical text and
    parsed again. None: the API server refuses the text."""
    first = parse_quantity(str(raw).strip())
    if first is None:
        return None
    return parse_quantity(canonical_text(first))


# -------------------------------------------------------- HAMi v2.10.0 (the NVIDIA device)


@dataclass(frozen=True, slots=True)
class Config:
    """The ``NvidiaConfig`` keys read here (HAMi's chart defaults)."""

    count: str = "nvidia.com/gpu"
    memory: str = "nvidia.com/gpumem"
    memory_percentage: str = "nvidia.com/gpumem-percentage"
    cores: str = "nvidia.com/gpucores"
    default_memory: int = 0
    default_cores: int = 0
    default_gpu_num: int = 1
    memory_factor: int = 1


Table = Mapping[str, Quantity]


@dataclass(frozen=True, slots=True)
class Resources:
    """A container's ``resources`` as HAMi holds them (``corev1.ResourceList``s)."""

    name: str
    limits: dict[str, Quantity]
    requests: dict[str, Quantity]


def _resource_value(ctr: Resources, name: str) -> int | None:
    """``resourceValue``: ``Value()`` from the limits, else the requests."""
    for table in (ctr.limits, ctr.requests):
        if name in table:
            return table[name].go_value()
    return None


def _resource_present(ctr: Resources, name: str) -> bool:
    """``resourcePresent``: in the limits or the requests."""
    return name in ctr.limits or name in ctr.requests


def validate_memory_percentage(ctr: Resources, config: Config) -> str | None:
    """``validateMemoryPercentage``: the webhook's error for a share outside 0..100."""
    pct = _resource_value(ctr, config.memory_percentage)
    if pct is not None and (pct < 0 or pct > 100):
        return (f"invalid {config.memory_percentage} value {pct} in container {ctr.name}: "
                "must be an integer between 0 and 100")
    return None


def mutate_container_resource(ctr: Resources, config: Config) -> None:
    """``mutateContainerResource``: a count of ``DefaultGPUNum`` into the limits when the
    limits (only) name cores, memory or a share but no count."""
    if config.count in ctr.limits:
        return
    named = any(name in ctr.limits
                for name in (config.cores, config.memory, config.memory_percentage))
    if named and config.default_gpu_num > 0:
        ctr.limits[config.count] = Quantity(config.default_gpu_num, 0, False, BINARY_SI)


def default_exclusive_core_if_needed(ctr: Resources, config: Config) -> None:
    """``defaultExclusiveCoreIfNeeded``: ``cores: 100`` into the limits for a container
    with a count (limits or requests), no cores, and a share of exactly 100 (``Value()``)
    or, without a share, no memory."""
    if not _resource_present(ctr, config.count) or _resource_present(ctr, config.cores):
        return
    pct = _resource_value(ctr, config.memory_percentage)
    # A share of exactly 100, else no memory figure (ResourceMemoryName is set here).
    exclusive = pct == 100 if pct is not None else _resource_value(ctr, config.memory) is None
    if exclusive:
        ctr.limits[config.cores] = Quantity(100, 0, False, DECIMAL_SI)


def _lookup(ctr: Resources, name: str) -> Quantity | None:
    """``ctr.Resources.Limits[name]``, else ``ctr.Resources.Requests[name]``."""
    if name in ctr.limits:
        return ctr.limits[name]
    return ctr.requests.get(name)


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """``device.ContainerDeviceRequest`` (int32 fields)."""

    nums: int
    memreq: int
    mem_percentagereq: int
    coresreq: int


def generate_resource_requests(ctr: Resources, config: Config) -> DeviceRequest | None:
    """``GenerateResourceRequests``; None for the empty request it returns."""
    count = _lookup(ctr, config.count)
    if count is None:
        return None
    n = count.as_int64()
    if n is None:
        return None
    memnum = 0
    mem = _lookup(ctr, config.memory)
    if mem is not None:
        memnums = mem.as_int64()
        factor = max(config.memory_factor, 1)
        if memnums is None or memnums < 0 or memnums > go_div(MAX_INT32, factor):
            return None  # "not a plain integer within the int32 range": dropped
        memnum = memnums * factor
    mempnum = 101
    pct = _lookup(ctr, config.memory_percentage)
    if pct is not None:
        mempnums = pct.as_int64()
        if mempnums is not None:
            mempnums = min(mempnums, 100)
            mempnum = int32(mempnums) if mempnums > 0 else 101
    if mempnum == 101 and memnum == 0:
        if config.default_memory != 0:
            memnum = config.default_memory
        else:
            mempnum = 100
    corenum = config.default_cores
    core = _lookup(ctr, config.cores)
    if core is not None:
        corenums = core.as_int64()
        if corenums is not None:
            corenum = int32(corenums)
    return DeviceRequest(nums=int32(n), memreq=int32(memnum),
                         mem_percentagereq=int32(mempnum), coresreq=int32(corenum))


@dataclass(frozen=True, slots=True)
class Reading:
    """A container's request as ``Fit`` reads it against a card of ``card_memory`` MiB."""

    nums: int
    memreq: int | None
    """``Memreq`` when above 0."""
    percentage: int | None
    """``MemPercentagereq`` unless the sentinel 101."""
    cores: int
    """``Coresreq``, above 100 read as 100."""
    memory: int
    """The MiB ``Fit`` asks of the card."""


def fit_reading(request: DeviceRequest, card_memory: int) -> Reading:
    """``Fit``'s clamp of ``Coresreq`` and its memory: ``Memreq`` when above 0, else
    (share not 101, ``Memreq`` 0) ``Totalmem * MemPercentagereq / 100`` in int32."""
    cores = min(request.coresreq, 100)
    memory = 0
    if request.memreq > 0:
        memory = request.memreq
    if request.mem_percentagereq != 101 and request.memreq == 0:
        memory = go_div(int32(card_memory * request.mem_percentagereq), 100)
    return Reading(nums=request.nums,
                   memreq=request.memreq if request.memreq > 0 else None,
                   percentage=(request.mem_percentagereq
                               if request.mem_percentagereq != 101 else None),
                   cores=cores, memory=memory)


@dataclass(frozen=True, slots=True)
class RawContainer:
    """A container as written: its name and its raw limits and requests."""

    name: str
    limits: Mapping[str, RawQuantity] | None = None
    requests: Mapping[str, RawQuantity] | None = None


@dataclass(frozen=True, slots=True)
class PodReading:
    """HAMi's answer for a pod."""

    refusal: str | None
    """The webhook's error (``MutateAdmission``'s first), or None."""
    refusals: tuple[str | None, ...]
    """``validateMemoryPercentage`` of each container, init containers first."""
    containers: tuple[Reading | None, ...]
    """Each container's reading, init containers first (``Resourcereqs``' order); None:
    no GPU request (``Nums`` not above 0, or the request dropped)."""
    stored: bool
    """False: the API server refuses a quantity's text, the pod never exists."""


def _stored(container: RawContainer) -> Resources | None:
    tables: list[dict[str, Quantity]] = []
    for raw in (container.limits, container.requests):
        table: dict[str, Quantity] = {}
        for name, value in (raw or {}).items():
            quantity = stored_quantity(value)
            if quantity is None:
                return None
            table[name] = quantity
        tables.append(table)
    return Resources(container.name, tables[0], tables[1])


def read_pod(init_containers: Sequence[RawContainer], containers: Sequence[RawContainer],
             config: Config, card_memory: int) -> PodReading:
    """HAMi's webhook (``MutateAdmission`` per container, init containers first), then
    ``Resourcereqs`` -> ``GenerateResourceRequests`` (kept when ``Nums > 0``), then
    ``Fit``. The webhook's defaults are applied to every container, even past a refusal
    (a pod read as pyhami reads one it decides on)."""
    everything = [*init_containers, *containers]
    stored = [_stored(c) for c in everything]
    held = [r for r in stored if r is not None]
    if len(held) != len(stored):
        return PodReading(None, (), (), stored=False)
    refusals = tuple(validate_memory_percentage(ctr, config) for ctr in held)
    readings: list[Reading | None] = []
    for ctr in held:
        mutate_container_resource(ctr, config)
        default_exclusive_core_if_needed(ctr, config)
        request = generate_resource_requests(ctr, config)
        readings.append(fit_reading(request, card_memory)
                        if request is not None and request.nums > 0 else None)
    refusal = next((r for r in refusals if r is not None), None)
    return PodReading(refusal, refusals, tuple(readings), stored=True)
