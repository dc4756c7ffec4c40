"""The ``hami.io/gpu-scheduler-policy`` chain, node policy and scoring weights."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from common.core.annotations import comma_list
from common.core.errors import InvalidInput, SettingsError
from common.core.names import shown


class PodRejected(InvalidInput):
    """The pod itself is malformed; the message names the annotation or resource."""


class SortKey(Enum):
    BINPACK = "binpack"
    SPREAD = "spread"
    NUMA = "numa"


class Filter(Enum):
    MUTEX = "mutex"
    TOPOLOGY_AWARE = "topology-aware"


class NodePolicy(Enum):
    BINPACK = "binpack"
    SPREAD = "spread"


_KNOWN: dict[str, SortKey | Filter] = {
    **{key.value: key for key in SortKey},
    **{flt.value: flt for flt in Filter},
}


@dataclass(frozen=True, slots=True)
class Chain:
    """A parsed policy chain: filters (unordered) and sort keys in the order written."""

    filters: frozenset[Filter]
    sort_keys: tuple[SortKey, ...]

    @property
    def mutex(self) -> bool:
        return Filter.MUTEX in self.filters

    @property
    def topology_aware(self) -> bool:
        return Filter.TOPOLOGY_AWARE in self.filters

    @property
    def ranking(self) -> tuple[SortKey, ...]:
        """The keys cards are ranked by: a chain without sort keys ranks by spread."""
        return self.sort_keys or (SortKey.SPREAD,)

    def __str__(self) -> str:
        names = [flt.value for flt in Filter if flt in self.filters]
        return ",".join(names + [key.value for key in self.sort_keys])


@dataclass(frozen=True, slots=True)
class ParsedChain:
    chain: Chain
    ignored: tuple[str, ...]


def parse_chain(text: str, default: Chain) -> ParsedChain:
    """Parse a comma-separated chain; unknown names are returned as ``ignored``.

    With no known name left the ``default`` chain applies.
    """
    filters: set[Filter] = set()
    sort_keys: list[SortKey] = []
    ignored: list[str] = []
    seen: set[str] = set()
    for entry in comma_list(text):
        name = entry.lower()
        if name in seen:
            continue
        seen.add(name)
        known = _KNOWN.get(name)
        if known is None:
            ignored.append(entry)
        elif isinstance(known, Filter):
            filters.add(known)
        else:
            sort_keys.append(known)
    if not filters and not sort_keys:
        return ParsedChain(default, tuple(ignored))
    return ParsedChain(Chain(frozenset(filters), tuple(sort_keys)), tuple(ignored))


def parse_default_chain(text: str) -> Chain:
    """A cluster default chain must hold only known names."""
    parsed = parse_chain(text, Chain(frozenset(), ()))
    if parsed.ignored or not (parsed.chain.filters or parsed.chain.sort_keys):
        bad = ", ".join(parsed.ignored) or repr(text)
        raise SettingsError(
            f"gpu scheduler policy {text!r}: unknown or missing policy name ({bad})")
    return parsed.chain


def parse_node_policy(text: str, source: str) -> NodePolicy:
    try:
        return NodePolicy(text.strip().lower())
    except ValueError:
        raise PodRejected(
            f"{source}: {text!r} is not a node policy (expected binpack or spread)"
        ) from None


@dataclass(frozen=True, slots=True)
class Weights:
    slot: int = 1
    core: int = 1
    memory: int = 1


WEIGHTS_ANNOTATION = "hami.io/device-scoring-weights"
# Scores stay exact to their 6 decimal places far beyond this; a bound also keeps the
# parse cheap (Python refuses to convert integers of over 4,300 digits).
WEIGHT_MAX = 1_000_000


def parse_weights(text: str) -> Weights:
    """Parse ``slot=A,core=B,memory=C``: each key once, non-negative integers, not all zero."""
    values: dict[str, int] = {}
    for raw in text.split(","):
        entry = raw.strip()
        key, sep, value = entry.partition("=")
        key = key.strip().lower()
        value = value.strip()
        if not sep or key not in ("slot", "core", "memory"):
            raise PodRejected(
                f"{WEIGHTS_ANNOTATION}: {entry!r} is not one of slot=N, core=N, memory=N"
            )
        if key in values:
            raise PodRejected(f"{WEIGHTS_ANNOTATION}: {key} is given more than once")
        if not value.isascii() or not value.isdigit():
            raise PodRejected(
                f"{WEIGHTS_ANNOTATION}: {key}={shown(value)} is not a non-negative integer"
            )
        if len(value) > len(str(WEIGHT_MAX)) or int(value) > WEIGHT_MAX:
            raise PodRejected(
                f"{WEIGHTS_ANNOTATION}: {key}={shown(value)} is above {WEIGHT_MAX:,}"
            )
        values[key] = int(value)
    missing = [key for key in ("slot", "core", "memory") if key not in values]
    if missing:
        raise PodRejected(f"{WEIGHTS_ANNOTATION}: missing {', '.join(missing)}")
    if not any(values.values()):
        raise PodRejected(f"{WEIGHTS_ANNOTATION}: the weights are all zero")
    return Weights(values["slot"], values["core"], values["memory"])
