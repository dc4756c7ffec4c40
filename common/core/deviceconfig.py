"""HAMi's device configuration, read as HAMi v2.10 reads it: the ``nvidia:`` section of
``device-config.yaml`` (the ``hami-scheduler-device`` ConfigMap) and the device plugin's
per-node ``config.json`` (``nodeconfig``), from documents already loaded as plain values.

Pure: the files are read at the edge (``common.deviceconfig``); this module turns their
contents into frozen objects, or refuses them whole with one line naming the file, the
key and the value. A key that is absent takes the value HAMi's chart renders, so that a
pyhami started without the files behaves as it did before they could be given.

What is not read (other vendors' sections, keys HAMi v2.10 dropped or never had) is not
refused: the parse result names it, and the edge logs it once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Generic, TypedDict, TypeVar

from common.core.errors import InvalidInput
from common.core.model import CARD_COUNT_MAX, CARD_MEMORY_MAX_MIB, CARDS_PER_NODE_MAX
from common.core.names import SUBDOMAIN_MAX, shown
from common.core.vendors import NVIDIA, ResourceNames, Vendor

T = TypeVar("T")

NODECONFIG_KEY = "nodeconfig"

INT32_MAX = 2**31 - 1
SCALING_MAX = 100.0
"""The largest memory or core over-commit factor taken: HAMi sets none, but a card
registered as a hundred of itself is a typo, and more would overflow the registered
figures (``int32(MiB x s)``, ``int32(100 x s)``)."""
MEMORY_FACTOR_MAX = 2**20
"""``memoryFactor`` multiplies a ``gpumem`` request: 1024 lets pods ask in GiB; a
factor of a MiB's bytes is the most that could mean anything."""
LIST_MAX = 256
"""Entries in any list of these files (allowlist items, models, profiles, node entries,
filtered UUIDs): HAMi's chart ships nine allowlist items."""
TEXT_MAX = 256
"""Characters of a free-text value (a GPU model name, a MIG profile, a card's UUID)."""
LOG_LEVELS = ("", "0", "1", "2", "3", "4")
"""HAMi-core's ``LIBCUDA_LOG_LEVEL``: 0 errors ... 4 debug; empty: the variable unset."""
CORE_POLICIES = ("", "default", "force", "disable")
OPERATING_MODES = ("hami-core", "mig")
MIG_STRATEGIES = ("none", "single", "mixed")


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""A key named as written in a message; any other is quoted."""


class DeviceConfigError(InvalidInput):
    """A device configuration that cannot be used; one line naming the file, the key and
    the value."""


# ---------------------------------------------------------------------------- the model


@dataclass(frozen=True, slots=True)
class NodeSettings:
    """The settings a node's ``nodeconfig`` entry may replace (HAMi's
    ``NodeDefaultConfig``): what the agent registers and gives containers."""

    device_split_count: int = 10
    """``deviceSplitCount``: pods one card may hold at once."""
    device_memory_scaling: float = 1.0
    """``deviceMemoryScaling``: registered memory = physical memory x this."""
    device_core_scaling: float = 1.0
    """``deviceCoreScaling``: registered cores = 100 x this."""
    preconfigured_device_memory: int = 0
    """``preConfiguredDeviceMemory``: MiB to register where NVML has no memory figure;
    0: none."""
    libcuda_log_level: str = "1"
    """``libCudaLogLevel``: containers' ``LIBCUDA_LOG_LEVEL``; empty: not set."""
    enable_numa_topology: bool = False
    """``enableNumaTopology``: advertise the cards' NUMA nodes to the kubelet."""


@dataclass(frozen=True, slots=True)
class MigProfiles:
    """One ``migProfileAllowlist`` item: the MIG profiles allowed on GPUs whose NVML name
    contains one of ``models``."""

    models: tuple[str, ...]
    profiles: tuple[str, ...]


CHART_MIG_PROFILE_ALLOWLIST = (
    MigProfiles(("A30",), ("1g.6gb", "2g.12gb", "4g.24gb")),
    MigProfiles(("A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"),
                ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb")),
    MigProfiles(("A100-SXM4-80GB", "A100-80GB-PCIe", "A100-PCIE-80GB"),
                ("1g.10gb", "2g.20gb", "3g.40gb", "7g.79gb")),
    MigProfiles(("H100-PCIE-80GB", "H100-SXM5-80GB"),
                ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb")),
    MigProfiles(("H100-PCIE-94GB", "H100-SXM5-94GB"),
                ("1g.12gb", "2g.24gb", "3g.47gb", "7g.94gb")),
    MigProfiles(("H20", "H100 on GH200"), ("1g.12gb", "2g.24gb", "3g.48gb", "7g.96gb")),
    MigProfiles(("H200 NVL", "H200-SXM5"), ("1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb")),
    MigProfiles(("B200",), ("1g.23gb", "2g.45gb", "3g.90gb", "7g.180gb")),
    MigProfiles(("RTX PRO 6000 Blackwell Server Edition",), ("1g.24gb", "2g.48gb", "4g.96gb")),
)
"""The allowlist HAMi's chart renders by default."""


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    """The ``nvidia:`` section of HAMi's ``device-config.yaml``; every field defaults to
    the value HAMi's chart renders."""

    resources: ResourceNames = field(default_factory=ResourceNames)
    overwrite_env: bool = False
    """``overwriteEnv``: containers asking for no card get ``NVIDIA_VISIBLE_DEVICES=none``."""
    default_memory: int = 0
    """``defaultMemory``: MiB for a container that names neither memory nor a share;
    0: the whole card."""
    default_cores: int = 0
    """``defaultCores``: cores for a container that names none."""
    default_gpu_num: int = 1
    """``defaultGPUNum``: cards for a container naming memory or cores but no count;
    0: such a container asks for no card."""
    memory_factor: int = 1
    """``memoryFactor``: a memory request is multiplied by this."""
    node: NodeSettings = field(default_factory=NodeSettings)
    """The node defaults a ``nodeconfig`` entry may replace."""
    gpu_core_policy: str = "default"
    """``gpuCorePolicy``: ``GPU_CORE_UTILIZATION_POLICY`` for every container, unless
    ``default`` (or empty)."""
    disable_core_limit: bool = False
    """``disableCoreLimit``: containers get ``GPU_CORE_UTILIZATION_POLICY=disable``."""
    runtime_class_name: str = ""
    """``runtimeClassName``: given to a GPU pod that names none; empty: none given."""
    mig_profile_allowlist: tuple[MigProfiles, ...] = CHART_MIG_PROFILE_ALLOWLIST
    """``migProfileAllowlist``."""


@dataclass(frozen=True, slots=True)
class FilterDevices:
    """Cards a node keeps out of pyhami: neither advertised to the kubelet nor reported."""

    uuids: tuple[str, ...] = ()
    indexes: tuple[int, ...] = ()

    def excludes(self, uuid: str, index: int) -> bool:
        return uuid in self.uuids or index in self.indexes


@dataclass(frozen=True, slots=True)
class NodeEntry:
    """One ``nodeconfig`` entry as written: ``None`` where the entry leaves a setting to
    the global value."""

    name: str
    operating_mode: str | None = None
    device_split_count: int | None = None
    device_memory_scaling: float | None = None
    device_core_scaling: float | None = None
    preconfigured_device_memory: int | None = None
    libcuda_log_level: str | None = None
    enable_numa_topology: bool | None = None
    mig_strategy: str | None = None
    filter_devices: FilterDevices = field(default_factory=FilterDevices)
    enable_get_preferred_allocation: bool = False


@dataclass(frozen=True, slots=True)
class NodeConfigFile:
    """The device plugin's ``config.json``: one entry per node it names."""

    entries: tuple[NodeEntry, ...] = ()

    def entry(self, node: str) -> NodeEntry | None:
        return next((entry for entry in self.entries if entry.name == node), None)


@dataclass(frozen=True, slots=True)
class NodeDeviceConfig:
    """What one node's agent works with: the global settings with its entry applied
    (``effective_for``); built plainly, HAMi's chart defaults."""

    device: DeviceConfig = field(default_factory=DeviceConfig)
    """The ``nvidia:`` section, its ``node`` settings replaced by the entry's."""
    operating_mode: str = "hami-core"
    mig_strategy: str = "none"
    filter_devices: FilterDevices = field(default_factory=FilterDevices)
    enable_get_preferred_allocation: bool = False

    @property
    def settings(self) -> NodeSettings:
        return self.device.node


_NODE_FIELDS = tuple(f.name for f in fields(NodeSettings))


def effective_for(device: DeviceConfig, nodes: NodeConfigFile, node: str) -> NodeDeviceConfig:
    """``node``'s settings: its ``nodeconfig`` entry over the global ones.

    A key the entry writes wins whatever its value, 0 and false included (a user who
    writes ``enablenumatopology: false`` for one node means it); a key it leaves out
    keeps the global value. A node without an entry gets the global values.
    """
    entry = nodes.entry(node)
    if entry is None:
        return NodeDeviceConfig(device)
    written = {name: value for name in _NODE_FIELDS
               if (value := getattr(entry, name)) is not None}
    return NodeDeviceConfig(
        replace(device, node=replace(device.node, **written)),
        operating_mode=entry.operating_mode or "hami-core",
        mig_strategy=entry.mig_strategy or "none",
        filter_devices=entry.filter_devices,
        enable_get_preferred_allocation=entry.enable_get_preferred_allocation)


# ---------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class Parsed(Generic[T]):
    """A parsed document and the keys in it that pyhami does not read (dotted paths)."""

    value: T
    ignored: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Refusal:
    """One value refused: the key taken (its dotted path as written, or ``the document``)
    and the one line naming the file, the key and the value."""

    key: str
    message: str


@dataclass(frozen=True, slots=True)
class Written:
    """One key a file writes and pyhami reads: ``key`` as pyhami spells it
    (``deviceSplitCount``, ``devicesplitcount``), ``path`` as the file writes it, ``value``
    as written."""

    key: str
    path: str
    value: object


@dataclass(frozen=True, slots=True)
class Reading(Generic[T]):
    """A document read through to the end: the value (a refused key at its default), the
    keys read as written, the keys not read, and every refusal in the order the keys are
    taken. The loaders raise the first refusal; ``pyhami preflight`` shows them all."""

    value: T
    written: tuple[Written, ...] = ()
    ignored: tuple[str, ...] = ()
    refused: tuple[Refusal, ...] = ()

    def parsed(self) -> Parsed[T]:
        """The loaders' answer: the value and what is not read, or the first refusal
        raised as ``DeviceConfigError``."""
        if self.refused:
            raise DeviceConfigError(self.refused[0].message)
        return Parsed(self.value, self.ignored)


@dataclass(frozen=True, slots=True)
class NodeEntryReading:
    """One ``nodeconfig`` entry read through: ``entry`` is None when it names no node
    (its name absent or refused)."""

    path: str
    entry: NodeEntry | None
    written: tuple[Written, ...] = ()
    refused: tuple[Refusal, ...] = ()


_RESOURCE_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_MIG_PROFILE = re.compile(r"[1-9][0-9]*g\..+")


def _value(value: object) -> str:
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    text = "true" if value is True else "false" if value is False else repr(value)
    return text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"


class _Section:
    """One mapping of the document, its keys taken one by one: what is left at the end
    is what pyhami does not read."""

    def __init__(self, source: str, path: str, mapping: object,
                 fold_case: bool = False, refused: list[Refusal] | None = None) -> None:
        self._source = source
        self._path = path
        self._fold_case = fold_case
        self._refused = refused
        """Where a key's refusal goes, its default taken instead; None: raised."""
        self.written: list[Written] = []
        if not isinstance(mapping, Mapping):
            raise self.error(path or "the document", mapping, "must be a mapping")
        if fold_case:
            # Go's encoding/json, which reads HAMi's config.json, matches keys whatever
            # their case; two spellings of one key are refused rather than guessed.
            folded: dict[str, tuple[str, object]] = {}
            for key, value in mapping.items():
                if not isinstance(key, str):
                    raise self.error(self._key(str(key)), key, "is not a text key")
                if key.lower() in folded:
                    raise self.error(self._key(key), value,
                                      f"is given twice (as {folded[key.lower()][0]!r} too)")
                folded[key.lower()] = (key, value)
            self._items = folded
        else:
            self._items = {str(key): (str(key), value) for key, value in mapping.items()}

    def _key(self, key: str) -> str:
        if not _PLAIN_KEY.fullmatch(key):
            # A key of a file is anything YAML or JSON allows: quoted, so that a newline or
            # a megabyte in it cannot break the one line that names it.
            return f"{self._path}[{shown(key)}]"
        return f"{self._path}.{key}" if self._path else key

    def error(self, key: str, value: object, problem: str) -> DeviceConfigError:
        return DeviceConfigError(f"{self._source}: {key} is {_value(value)}: {problem}")

    def take(self, key: str, read: Callable[[str, object], T], default: T) -> T:
        item = self._items.pop(key.lower() if self._fold_case else key, None)
        if item is None:
            return default
        path = self._key(item[0])
        self.written.append(Written(key, path, item[1]))
        if self._refused is None:
            return read(path, item[1])
        try:
            return read(path, item[1])
        except DeviceConfigError as error:
            self._refused.append(Refusal(path, str(error)))
            return default

    def rest(self) -> tuple[str, ...]:
        return tuple(self._key(written) for written, _ in self._items.values())

    # Readers: each returns the value or raises naming the file, the key and the value.

    def boolean(self, key: str, value: object) -> bool:
        if not isinstance(value, bool):
            raise self.error(key, value, "must be true or false")
        return value

    def integer(self, low: int, high: int) -> Callable[[str, object], int]:
        def read(key: str, value: object) -> int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.error(key, value, f"must be a whole number from {low} to {high}")
            if not low <= value <= high:
                raise self.error(key, value, f"must be from {low} to {high}")
            return value
        return read

    def scaling(self, key: str, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(key, value, f"must be a number above 0, at most {SCALING_MAX:g}")
        if not (math.isfinite(value) and 0 < value <= SCALING_MAX):
            raise self.error(key, value, f"must be above 0 and at most {SCALING_MAX:g}")
        return float(value)

    def choice(self, choices: Sequence[str]) -> Callable[[str, object], str]:
        def read(key: str, value: object) -> str:
            if not isinstance(value, str) or value not in choices:
                named = ", ".join(repr(choice) for choice in choices if choice)
                raise self.error(key, value, f"must be one of {named}")
            return value
        return read

    def log_level(self, key: str, value: object) -> str:
        # The chart renders ``libCudaLogLevel: 1``: YAML reads a number, HAMi a string.
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(text, str) or text not in LOG_LEVELS:
            raise self.error(key, value, "must be 0 to 4 (errors ... debug), or empty")
        return text

    def resource_name(self, key: str, value: object) -> str:
        if not isinstance(value, str):
            raise self.error(key, value, "must be an extended resource name, DOMAIN/NAME")
        domain, slash, name = value.partition("/")
        if not slash or not _is_subdomain(domain) or len(name) > 63 \
                or _RESOURCE_NAME_PART.fullmatch(name) is None:
            raise self.error(key, value, "is not a Kubernetes extended resource name "
                                          "(DOMAIN/NAME, as nvidia.com/gpu)")
        if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
            raise self.error(key, value, "is in Kubernetes' own domain, not an extended "
                                          "resource")
        return value

    def runtime_class(self, key: str, value: object) -> str:
        if not isinstance(value, str) or (value and not _is_subdomain(value)):
            raise self.error(key, value, "must be a RuntimeClass name (a DNS-1123 "
                                          "subdomain), or empty")
        return value

    def text_list(self, check: Callable[[str], bool], expected: str,
                  ) -> Callable[[str, object], tuple[str, ...]]:
        def read(key: str, value: object) -> tuple[str, ...]:
            if not isinstance(value, list) or len(value) > LIST_MAX:
                raise self.error(key, value, f"must be a list of at most {LIST_MAX} "
                                              f"{expected}")
            for position, item in enumerate(value):
                if not isinstance(item, str) or not 0 < len(item) <= TEXT_MAX \
                        or not check(item):
                    raise self.error(f"{key}[{position}]", item, f"must be {expected}")
            return tuple(value)
        return read

    def index_list(self, key: str, value: object) -> tuple[int, ...]:
        if not isinstance(value, list) or len(value) > LIST_MAX:
            raise self.error(key, value, f"must be a list of at most {LIST_MAX} card indexes")
        read = self.integer(0, CARDS_PER_NODE_MAX - 1)
        return tuple(read(f"{key}[{position}]", item) for position, item in enumerate(value))

    def sections(self, key: str, value: object) -> list[object]:
        if not isinstance(value, list) or len(value) > LIST_MAX:
            raise self.error(key, value, f"must be a list of at most {LIST_MAX} entries")
        return value


def _is_subdomain(text: str) -> bool:
    return 0 < len(text) <= SUBDOMAIN_MAX and _SUBDOMAIN.fullmatch(text) is not None


class _NodeOverrides(TypedDict, total=False):
    device_split_count: int
    device_memory_scaling: float
    device_core_scaling: float
    preconfigured_device_memory: int
    libcuda_log_level: str
    enable_numa_topology: bool


def _node_settings(section: _Section) -> _NodeOverrides:
    """The ``NodeDefaultConfig`` keys present in ``section``, read and checked (the global
    section spells them in camel case, ``config.json`` in lower case: its keys match
    whatever their case)."""
    present = _NodeOverrides()
    if (count := section.take("deviceSplitCount", section.integer(1, CARD_COUNT_MAX),
                              None)) is not None:
        present["device_split_count"] = count
    if (memory := section.take("deviceMemoryScaling", section.scaling, None)) is not None:
        present["device_memory_scaling"] = memory
    if (cores := section.take("deviceCoreScaling", section.scaling, None)) is not None:
        present["device_core_scaling"] = cores
    if (preconfigured := section.take("preConfiguredDeviceMemory",
                                      section.integer(0, CARD_MEMORY_MAX_MIB),
                                      None)) is not None:
        present["preconfigured_device_memory"] = preconfigured
    if (level := section.take("libCudaLogLevel", section.log_level, None)) is not None:
        present["libcuda_log_level"] = level
    if (numa := section.take("enableNumaTopology", section.boolean, None)) is not None:
        present["enable_numa_topology"] = numa
    return present


def _allowlist(section: _Section, source: str, key: str, value: object,
               ) -> tuple[MigProfiles, ...]:
    items = section.sections(key, value)
    allowlist: list[MigProfiles] = []
    for position, item in enumerate(items):
        entry = _Section(source, f"{key}[{position}]", item)
        nothing: tuple[str, ...] = ()
        models = entry.take("models", entry.text_list(lambda _: True, "GPU model names"),
                            nothing)
        profiles = entry.take("profiles", entry.text_list(
            lambda text: _MIG_PROFILE.fullmatch(text) is not None,
            "MIG profiles like 1g.10gb"), nothing)
        if not models or not profiles:
            missing = "models" if not models else "profiles"
            raise DeviceConfigError(f"{source}: {key}[{position}] has no {missing}: each "
                                    "item needs models and profiles")
        if entry.rest():
            raise DeviceConfigError(f"{source}: {entry.rest()[0]} is not an allowlist key "
                                    "(models, profiles)")
        allowlist.append(MigProfiles(models, profiles))
    return tuple(allowlist)


def parse_device_config(document: object, source: str,
                        vendor: Vendor = NVIDIA) -> Parsed[DeviceConfig]:
    """``device-config.yaml``'s contents (a mapping, or None for an empty file) as a
    ``DeviceConfig``. Raises ``DeviceConfigError`` (the first refusal of
    ``read_device_config``); ignores, and names in ``ignored``, the other vendors'
    sections and the ``nvidia:`` keys pyhami does not read."""
    return read_device_config(document, source, vendor).parsed()


def read_device_config(document: object, source: str,
                       vendor: Vendor = NVIDIA) -> Reading[DeviceConfig]:
    """``device-config.yaml``'s contents read through: every key refused is named, in the
    order the keys are taken, and read as its default. The one reading behind
    ``parse_device_config``, so that what ``pyhami preflight`` refuses is what the daemon
    and the agents refuse."""
    refused: list[Refusal] = []
    default = DeviceConfig(resources=vendor.resources)
    try:
        top = _Section(source, "", {} if document is None else document)
    except DeviceConfigError as error:
        return Reading(default, refused=(Refusal("the document", str(error)),))
    section_key = vendor.config_section
    found = top.take(section_key, lambda key, value: value, None)
    ignored = top.rest()
    try:
        section = _Section(source, section_key, {} if found is None else found,
                           refused=refused)
    except DeviceConfigError as error:
        return Reading(default, ignored=ignored,
                       refused=(Refusal(section_key, str(error)),))
    names = default.resources
    resources = ResourceNames(
        count=section.take("resourceCountName", section.resource_name, names.count),
        memory=section.take("resourceMemoryName", section.resource_name, names.memory),
        memory_percentage=section.take("resourceMemoryPercentageName",
                                       section.resource_name, names.memory_percentage),
        cores=section.take("resourceCoreName", section.resource_name, names.cores),
        priority=section.take("resourcePriorityName", section.resource_name,
                              names.priority))
    if not refused:  # a refused name stands at its default, which may clash falsely
        try:
            _check_distinct(resources, source, section_key)
        except DeviceConfigError as error:
            refused.append(Refusal(f"{section_key}.resource*Name", str(error)))
    config = DeviceConfig(
        resources=resources,
        overwrite_env=section.take("overwriteEnv", section.boolean, default.overwrite_env),
        default_memory=section.take("defaultMemory", section.integer(0, CARD_MEMORY_MAX_MIB),
                                    default.default_memory),
        default_cores=section.take("defaultCores", section.integer(0, 100),
                                   default.default_cores),
        default_gpu_num=section.take("defaultGPUNum", section.integer(0, CARDS_PER_NODE_MAX),
                                     default.default_gpu_num),
        memory_factor=section.take("memoryFactor", section.integer(1, MEMORY_FACTOR_MAX),
                                   default.memory_factor),
        node=replace(NodeSettings(), **_node_settings(section)),
        gpu_core_policy=section.take("gpuCorePolicy", section.choice(CORE_POLICIES),
                                     default.gpu_core_policy),
        disable_core_limit=section.take("disableCoreLimit", section.boolean,
                                        default.disable_core_limit),
        runtime_class_name=section.take("runtimeClassName", section.runtime_class,
                                        default.runtime_class_name),
        mig_profile_allowlist=section.take(
            "migProfileAllowlist",
            lambda key, value: _allowlist(section, source, key, value),
            default.mig_profile_allowlist),
    )
    return Reading(config, tuple(section.written), ignored + section.rest(), tuple(refused))


def _check_distinct(resources: ResourceNames, source: str, section: str) -> None:
    seen: dict[str, str] = {}
    keys = ("resourceCountName", "resourceMemoryName", "resourceMemoryPercentageName",
            "resourceCoreName", "resourcePriorityName")
    for key, name in zip(keys, (resources.count, resources.memory,
                                resources.memory_percentage, resources.cores,
                                resources.priority), strict=True):
        if name in seen:
            raise DeviceConfigError(f"{source}: {section}.{key} is {shown(name)}: "
                                    f"already {section}.{seen[name]}'s name")
        seen[name] = key


def parse_node_config(document: object, source: str) -> Parsed[NodeConfigFile]:
    """``config.json``'s contents as a ``NodeConfigFile``. Keys match whatever their case,
    as Go's encoding/json matches them for HAMi. Raises ``DeviceConfigError`` (the first
    refusal of ``read_node_config``); ignores, and names in ``ignored``, the keys pyhami
    does not read."""
    reading = read_node_config(document, source)
    entries = tuple(entry.entry for entry in reading.value if entry.entry is not None)
    return Reading(NodeConfigFile(entries), ignored=reading.ignored,
                   refused=reading.refused).parsed()


def read_node_config(document: object, source: str,
                     ) -> Reading[tuple[NodeEntryReading, ...]]:
    """``config.json``'s contents read through, every entry on its own: each refusal
    named, in the order the keys are taken, both in the entry's reading and in the
    whole's. The one reading behind ``parse_node_config``."""
    refused: list[Refusal] = []
    try:
        top = _Section(source, "", {} if document is None else document, fold_case=True,
                       refused=refused)
    except DeviceConfigError as error:
        return Reading((), refused=(Refusal("the document", str(error)),))
    no_entries: list[object] = []
    raw_entries = top.take(NODECONFIG_KEY, top.sections, no_entries)
    ignored = list(top.rest())
    entries: list[NodeEntryReading] = []
    for position, raw in enumerate(raw_entries):
        path = f"{NODECONFIG_KEY}[{position}]"
        entry_refused: list[Refusal] = []
        entry, unread, written = _node_entry(source, path, raw, entry_refused)
        if entry is not None and any(known.entry is not None
                                     and known.entry.name == entry.name for known in entries):
            entry_refused.append(Refusal(f"{path}.name", (
                f"{source}: {path}.name is {shown(entry.name)}: that node has an entry "
                "already")))
        entries.append(NodeEntryReading(path, entry, written, tuple(entry_refused)))
        refused.extend(entry_refused)
        ignored.extend(unread)
    return Reading(tuple(entries), tuple(top.written), tuple(ignored), tuple(refused))


def _node_entry(source: str, path: str, raw: object, refused: list[Refusal],
                ) -> tuple[NodeEntry | None, tuple[str, ...], tuple[Written, ...]]:
    """One ``nodeconfig`` entry (None when it names no node), the keys of it pyhami does
    not read and those it does as written; each refusal added to ``refused``."""
    try:
        section = _Section(source, path, raw, fold_case=True, refused=refused)
    except DeviceConfigError as error:
        refused.append(Refusal(path, str(error)))
        return None, (), ()
    before = len(refused)
    name = section.take("name", _node_name(section), "")
    if not name and len(refused) == before:
        refused.append(Refusal(path, f"{source}: {path} has no name: each entry names its "
                                     "node"))
    overrides = _node_settings(section)
    filters = section.take("filterdevices", lambda key, value: _filter_devices(
        source, key, value), FilterDevices())
    entry = NodeEntry(
        name=name,
        operating_mode=section.take("operatingmode", section.choice(OPERATING_MODES), None),
        mig_strategy=section.take("migstrategy", section.choice(MIG_STRATEGIES), None),
        filter_devices=filters,
        enable_get_preferred_allocation=section.take(
            "enablegetpreferredallocation", section.boolean, False),
    )
    written = tuple(section.written)
    if not name:
        return None, section.rest(), written
    return replace(entry, **overrides), section.rest(), written


def _node_name(section: _Section) -> Callable[[str, object], str]:
    def read(key: str, value: object) -> str:
        if not isinstance(value, str) or not _is_subdomain(value):
            raise section.error(key, value, "must be a node name (a DNS-1123 subdomain)")
        return value
    return read


def _filter_devices(source: str, key: str, value: object) -> FilterDevices:
    section = _Section(source, key, value, fold_case=True)
    filters = FilterDevices(
        uuids=section.take("uuid", section.text_list(lambda _: True, "card UUIDs"), ()),
        indexes=section.take("index", section.index_list, ()))
    if section.rest():
        raise DeviceConfigError(f"{source}: {section.rest()[0]} is not a filterdevices key "
                                "(uuid, index)")
    return filters
