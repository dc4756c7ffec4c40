"""HAMi's device configuration read as HAMi v2.10 reads it: the chart's files give the
chart's values, every key changed is read, bad values are refused whole with one line,
what pyhami does not read is ignored with one log line, and a node's entry applies over
the global values."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from common.core.deviceconfig import (
    CHART_MIG_PROFILE_ALLOWLIST,
    DeviceConfig,
    DeviceConfigError,
    FilterDevices,
    MigProfiles,
    NodeConfigFile,
    NodeDeviceConfig,
    NodeEntry,
    NodeSettings,
    effective_for,
    parse_device_config,
    parse_node_config,
)
from common.core.vendors import ResourceNames
from common.deviceconfig import CONFIG_FILE_MAX_BYTES, load_device_config, load_node_config
from common.files import InputFileError

HAMI = Path(__file__).parent / "hami"
VENDORS = ("cambricon", "hygon", "metax", "enflame", "mthreads", "iluvatars", "kunlun",
           "awsneuron", "amd", "vastai", "biren", "vnpus")


class TestChartDefaults:
    def test_the_charts_device_config_reads_as_the_defaults(self) -> None:
        assert load_device_config(HAMI / "device-config.yaml") == DeviceConfig()

    def test_the_defaults_are_the_charts_values_and_pyhamis_fixed_ones(self) -> None:
        config = DeviceConfig()
        assert config.resources == ResourceNames(
            "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage",
            "nvidia.com/gpucores", "nvidia.com/priority")
        assert (config.overwrite_env, config.default_memory, config.default_cores,
                config.default_gpu_num, config.memory_factor) == (False, 0, 0, 1, 1)
        # The split count the NVML source and a simulated card use without the file.
        assert config.node == NodeSettings(10, 1.0, 1.0, 0, "1", False)
        assert (config.gpu_core_policy, config.disable_core_limit,
                config.runtime_class_name) == ("default", False, "")
        assert len(config.mig_profile_allowlist) == 9

    def test_the_other_vendors_sections_are_ignored_with_one_log_line(
            self, caplog: pytest.LogCaptureFixture) -> None:
        with caplog.at_level(logging.INFO, logger="common.deviceconfig"):
            load_device_config(HAMI / "device-config.yaml")
        lines = [record.getMessage() for record in caplog.records]
        assert len(lines) == 1
        assert lines[0] == (f"{HAMI / 'device-config.yaml'}: not read by pyhami, ignored: "
                            + ", ".join(VENDORS))

    def test_the_charts_config_json_leaves_every_other_node_to_the_global_values(
            self) -> None:
        nodes = load_node_config(HAMI / "config.json")
        assert [entry.name for entry in nodes.entries] == ["m5-cloudinfra-online02"]
        assert effective_for(DeviceConfig(), nodes, "gpu-1") == NodeDeviceConfig()
        example = effective_for(DeviceConfig(), nodes, "m5-cloudinfra-online02")
        assert example.settings.device_memory_scaling == 1.8
        assert example.settings.device_split_count == 10
        assert (example.operating_mode, example.mig_strategy) == ("hami-core", "none")

    def test_an_empty_file_is_the_defaults(self) -> None:
        assert parse_device_config(None, "f").value == DeviceConfig()
        assert parse_node_config(None, "f").value == NodeConfigFile()


CHANGED: list[tuple[str, Callable[[DeviceConfig], object], object]] = [
    ("resourceCountName", lambda c: c.resources.count, "example.com/vgpu"),
    ("resourceMemoryName", lambda c: c.resources.memory, "example.com/vgpu-memory"),
    ("resourceMemoryPercentageName", lambda c: c.resources.memory_percentage,
     "example.com/vgpu-memory-percentage"),
    ("resourceCoreName", lambda c: c.resources.cores, "example.com/vgpu-cores"),
    ("resourcePriorityName", lambda c: c.resources.priority, "example.com/vgpu-priority"),
    ("overwriteEnv", lambda c: c.overwrite_env, True),
    ("defaultMemory", lambda c: c.default_memory, 2048),
    ("defaultCores", lambda c: c.default_cores, 25),
    ("defaultGPUNum", lambda c: c.default_gpu_num, 2),
    ("preConfiguredDeviceMemory", lambda c: c.node.preconfigured_device_memory, 24576),
    ("memoryFactor", lambda c: c.memory_factor, 1024),
    ("deviceSplitCount", lambda c: c.node.device_split_count, 4),
    ("deviceMemoryScaling", lambda c: c.node.device_memory_scaling, 2.0),
    ("deviceCoreScaling", lambda c: c.node.device_core_scaling, 1.5),
    ("enableNumaTopology", lambda c: c.node.enable_numa_topology, True),
    ("gpuCorePolicy", lambda c: c.gpu_core_policy, "force"),
    ("disableCoreLimit", lambda c: c.disable_core_limit, True),
    ("libCudaLogLevel", lambda c: c.node.libcuda_log_level, "3"),
    ("runtimeClassName", lambda c: c.runtime_class_name, "nvidia"),
    ("migProfileAllowlist", lambda c: c.mig_profile_allowlist,
     (MigProfiles(("A100-SXM4-80GB",), ("1g.10gb", "7g.79gb")),)),
]


class TestEveryKeyChanged:
    @pytest.mark.parametrize(("key", "read", "value"), CHANGED, ids=[c[0] for c in CHANGED])
    def test_each_nvidia_key_is_read(self, key: str, read: Callable[[DeviceConfig], object],
                                     value: object) -> None:
        changed = load_device_config(HAMI / "device-config-changed.yaml")
        assert read(changed) == value
        assert read(DeviceConfig()) != value  # the file changes it

    def test_the_table_names_every_key_of_the_changed_file(self) -> None:
        document = yaml.safe_load((HAMI / "device-config-changed.yaml").read_text())
        assert sorted(document["nvidia"]) == sorted(key for key, _, _ in CHANGED)

    def test_every_nodeconfig_key_is_read(self) -> None:
        nodes = load_node_config(HAMI / "config-changed.json")
        assert nodes.entries == (NodeEntry(
            name="gpu-1", operating_mode="mig", device_split_count=3,
            device_memory_scaling=1.5, device_core_scaling=2.0,
            preconfigured_device_memory=16384, libcuda_log_level="4",
            enable_numa_topology=True, mig_strategy="mixed",
            filter_devices=FilterDevices(("GPU-aaaa",), (1, 3)),
            enable_get_preferred_allocation=True),)
        node = effective_for(DeviceConfig(), nodes, "gpu-1")
        assert node.settings == NodeSettings(3, 1.5, 2.0, 16384, "4", True)
        assert node.filter_devices.excludes("GPU-aaaa", 0)
        assert node.filter_devices.excludes("GPU-bbbb", 3)
        assert not node.filter_devices.excludes("GPU-bbbb", 2)


class TestNodeEntryMerge:
    GLOBAL = DeviceConfig(node=NodeSettings(8, 2.0, 1.5, 4096, "3", True))

    def test_a_key_the_entry_leaves_out_keeps_the_global_value(self) -> None:
        nodes = parse_node_config({"nodeconfig": [{"name": "a", "devicesplitcount": 5}]},
                                  "c").value
        node = effective_for(self.GLOBAL, nodes, "a")
        assert node.settings == NodeSettings(5, 2.0, 1.5, 4096, "3", True)
        assert node.device.resources == self.GLOBAL.resources

    def test_an_explicit_zero_false_or_empty_wins(self) -> None:
        entry = {"name": "a", "preconfigureddevicememory": 0, "enablenumatopology": False,
                 "libcudaloglevel": ""}
        node = effective_for(self.GLOBAL, parse_node_config({"nodeconfig": [entry]}, "c").value,
                             "a")
        assert node.settings == NodeSettings(8, 2.0, 1.5, 0, "", False)

    def test_another_nodes_entry_does_not_apply(self) -> None:
        nodes = parse_node_config({"nodeconfig": [{"name": "b", "devicesplitcount": 5}]},
                                  "c").value
        assert effective_for(self.GLOBAL, nodes, "a") == NodeDeviceConfig(self.GLOBAL)

    def test_keys_match_whatever_their_case_as_go_reads_json(self) -> None:
        parsed = parse_node_config(
            {"NodeConfig": [{"Name": "a", "deviceSplitCount": 2,
                             "FilterDevices": {"UUID": ["x"]}}]}, "c")
        assert parsed.value.entries[0].device_split_count == 2
        assert parsed.value.entries[0].filter_devices.uuids == ("x",)
        assert parsed.ignored == ()

    def test_unknown_keys_of_an_entry_are_named(self) -> None:
        parsed = parse_node_config({"nodeconfig": [{"name": "a", "gpuCorePolicy": "force"}],
                                    "version": 1}, "c")
        assert parsed.ignored == ("version", "nodeconfig[0].gpuCorePolicy")


def nvidia(**keys: object) -> dict[str, object]:
    return {"nvidia": keys}


REFUSED_DEVICE_CONFIG: list[tuple[str, object, str]] = [
    ("negative memory scaling", nvidia(deviceMemoryScaling=-1),
     "f: nvidia.deviceMemoryScaling is -1: must be above 0 and at most 100"),
    ("zero core scaling", nvidia(deviceCoreScaling=0),
     "f: nvidia.deviceCoreScaling is 0: must be above 0 and at most 100"),
    ("infinite scaling", nvidia(deviceMemoryScaling=float("inf")),
     "f: nvidia.deviceMemoryScaling is inf: must be above 0 and at most 100"),
    ("scaling as text", nvidia(deviceMemoryScaling="2"),
     "f: nvidia.deviceMemoryScaling is '2': must be a number above 0, at most 100"),
    ("split count 0", nvidia(deviceSplitCount=0),
     "f: nvidia.deviceSplitCount is 0: must be from 1 to 65536"),
    ("split count too large", nvidia(deviceSplitCount=65537),
     "f: nvidia.deviceSplitCount is 65537: must be from 1 to 65536"),
    ("split count a float", nvidia(deviceSplitCount=2.5),
     "f: nvidia.deviceSplitCount is 2.5: must be a whole number from 1 to 65536"),
    ("split count a bool", nvidia(deviceSplitCount=True),
     "f: nvidia.deviceSplitCount is true: must be a whole number from 1 to 65536"),
    ("default cores 101", nvidia(defaultCores=101),
     "f: nvidia.defaultCores is 101: must be from 0 to 100"),
    ("negative default memory", nvidia(defaultMemory=-1),
     "f: nvidia.defaultMemory is -1: must be from 0 to 16777216"),
    ("absurd preconfigured memory", nvidia(preConfiguredDeviceMemory=2**40),
     "f: nvidia.preConfiguredDeviceMemory is 1099511627776: must be from 0 to 16777216"),
    ("memory factor 0", nvidia(memoryFactor=0),
     "f: nvidia.memoryFactor is 0: must be from 1 to 1048576"),
    ("card count too large", nvidia(defaultGPUNum=1000),
     "f: nvidia.defaultGPUNum is 1000: must be from 0 to 256"),
    ("no domain", nvidia(resourceCountName="gpu"),
     "f: nvidia.resourceCountName is 'gpu': is not a Kubernetes extended resource name "
     "(DOMAIN/NAME, as nvidia.com/gpu)"),
    ("upper-case domain", nvidia(resourceMemoryName="NVIDIA.com/gpumem"),
     "f: nvidia.resourceMemoryName is 'NVIDIA.com/gpumem': is not a Kubernetes extended "
     "resource name (DOMAIN/NAME, as nvidia.com/gpu)"),
    ("two slashes", nvidia(resourceCoreName="nvidia.com/gpu/cores"),
     "f: nvidia.resourceCoreName is 'nvidia.com/gpu/cores': is not a Kubernetes extended "
     "resource name (DOMAIN/NAME, as nvidia.com/gpu)"),
    ("kubernetes' domain", nvidia(resourcePriorityName="kubernetes.io/priority"),
     "f: nvidia.resourcePriorityName is 'kubernetes.io/priority': is in Kubernetes' own "
     "domain, not an extended resource"),
    ("a name as a number", nvidia(resourceCountName=7),
     "f: nvidia.resourceCountName is 7: must be an extended resource name, DOMAIN/NAME"),
    ("one name twice", nvidia(resourceCoreName="nvidia.com/gpu"),
     "f: nvidia.resourceCoreName is 'nvidia.com/gpu': already nvidia.resourceCountName's "
     "name"),
    ("overwriteEnv as text", nvidia(overwriteEnv="yes"),
     "f: nvidia.overwriteEnv is 'yes': must be true or false"),
    ("unknown core policy", nvidia(gpuCorePolicy="strict"),
     "f: nvidia.gpuCorePolicy is 'strict': must be one of 'default', 'force', 'disable'"),
    ("log level 9", nvidia(libCudaLogLevel=9),
     "f: nvidia.libCudaLogLevel is 9: must be 0 to 4 (errors ... debug), or empty"),
    ("bad runtime class", nvidia(runtimeClassName="Nvidia Runtime"),
     "f: nvidia.runtimeClassName is 'Nvidia Runtime': must be a RuntimeClass name (a "
     "DNS-1123 subdomain), or empty"),
    ("allowlist item without profiles", nvidia(migProfileAllowlist=[{"models": ["A30"]}]),
     "f: nvidia.migProfileAllowlist[0] has no profiles: each item needs models and "
     "profiles"),
    ("allowlist item without models",
     nvidia(migProfileAllowlist=[{"models": [], "profiles": ["1g.6gb"]}]),
     "f: nvidia.migProfileAllowlist[0] has no models: each item needs models and profiles"),
    ("allowlist profile not like 1g.x",
     nvidia(migProfileAllowlist=[{"models": ["A30"], "profiles": ["small"]}]),
     "f: nvidia.migProfileAllowlist[0].profiles[0] is 'small': must be MIG profiles like "
     "1g.10gb"),
    ("allowlist not a list", nvidia(migProfileAllowlist={"models": ["A30"]}),
     "f: nvidia.migProfileAllowlist is a mapping: must be a list of at most 256 entries"),
    ("nvidia a list", {"nvidia": ["a"]}, "f: nvidia is a list: must be a mapping"),
    ("the document a list", ["nvidia"], "f: the document is a list: must be a mapping"),
]


REFUSED_NODE_CONFIG: list[tuple[str, object, str]] = [
    ("no name", {"nodeconfig": [{"devicesplitcount": 2}]},
     "c: nodeconfig[0] has no name: each entry names its node"),
    ("bad node name", {"nodeconfig": [{"name": "Node A"}]},
     "c: nodeconfig[0].name is 'Node A': must be a node name (a DNS-1123 subdomain)"),
    ("a node twice", {"nodeconfig": [{"name": "a"}, {"name": "a"}]},
     "c: nodeconfig[1].name is 'a': that node has an entry already"),
    ("split count 0", {"nodeconfig": [{"name": "a", "devicesplitcount": 0}]},
     "c: nodeconfig[0].devicesplitcount is 0: must be from 1 to 65536"),
    ("negative scaling", {"nodeconfig": [{"name": "a", "devicememoryscaling": -0.5}]},
     "c: nodeconfig[0].devicememoryscaling is -0.5: must be above 0 and at most 100"),
    ("unknown mode", {"nodeconfig": [{"name": "a", "operatingmode": "mps"}]},
     "c: nodeconfig[0].operatingmode is 'mps': must be one of 'hami-core', 'mig'"),
    ("unknown mig strategy", {"nodeconfig": [{"name": "a", "migstrategy": "all"}]},
     "c: nodeconfig[0].migstrategy is 'all': must be one of 'none', 'single', 'mixed'"),
    ("index out of range", {"nodeconfig": [{"name": "a", "filterdevices": {"index": [256]}}]},
     "c: nodeconfig[0].filterdevices.index[0] is 256: must be from 0 to 255"),
    ("uuid not text", {"nodeconfig": [{"name": "a", "filterdevices": {"uuid": [3]}}]},
     "c: nodeconfig[0].filterdevices.uuid[0] is 3: must be card UUIDs"),
    ("unknown filter", {"nodeconfig": [{"name": "a", "filterdevices": {"model": ["T4"]}}]},
     "c: nodeconfig[0].filterdevices.model is not a filterdevices key (uuid, index)"),
    ("preferred allocation as text",
     {"nodeconfig": [{"name": "a", "enablegetpreferredallocation": "true"}]},
     "c: nodeconfig[0].enablegetpreferredallocation is 'true': must be true or false"),
    ("one key twice in two cases",
     {"nodeconfig": [{"name": "a", "devicesplitcount": 2, "deviceSplitCount": 3}]},
     "c: nodeconfig[0].deviceSplitCount is 3: is given twice (as 'devicesplitcount' too)"),
    ("too many entries", {"nodeconfig": [{"name": f"n{i}"} for i in range(257)]},
     "c: nodeconfig is a list: must be a list of at most 256 entries"),
]


class TestRefused:
    @pytest.mark.parametrize(("document", "message"),
                             [case[1:] for case in REFUSED_DEVICE_CONFIG],
                             ids=[case[0] for case in REFUSED_DEVICE_CONFIG])
    def test_a_bad_device_config_value(self, document: object, message: str) -> None:
        with pytest.raises(DeviceConfigError) as refused:
            parse_device_config(document, "f")
        assert str(refused.value) == message

    @pytest.mark.parametrize(("document", "message"),
                             [case[1:] for case in REFUSED_NODE_CONFIG],
                             ids=[case[0] for case in REFUSED_NODE_CONFIG])
    def test_a_bad_node_config_value(self, document: object, message: str) -> None:
        with pytest.raises(DeviceConfigError) as refused:
            parse_node_config(document, "c")
        assert str(refused.value) == message

    def test_a_huge_value_is_shown_cut_short(self) -> None:
        with pytest.raises(DeviceConfigError) as refused:
            parse_device_config(nvidia(gpuCorePolicy="x" * 10_000), "f")
        assert len(str(refused.value)) < 200

    @pytest.mark.parametrize(("text", "message"), [
        (b"nvidia: &a {deviceSplitCount: 2}\nother: *a\n", "YAML aliases (*name) are not"),
        (b"nvidia: [unclosed\n", "not YAML or JSON"),
        (b"#" * (CONFIG_FILE_MAX_BYTES + 1), f"larger than {CONFIG_FILE_MAX_BYTES} bytes"),
    ], ids=["aliases", "not yaml", "too large"])
    def test_a_file_that_cannot_be_read(self, tmp_path: Path, text: bytes,
                                        message: str) -> None:
        path = tmp_path / "device-config.yaml"
        path.write_bytes(text)
        with pytest.raises(InputFileError) as refused:
            load_device_config(path)
        assert str(refused.value).startswith(f"{path}: ")
        assert message in str(refused.value)
        assert "\n" not in str(refused.value)

    def test_the_chart_allowlist_is_what_the_chart_file_holds(self) -> None:
        # Written twice, in the model and in the rendered file: they must agree.
        loaded = load_device_config(HAMI / "device-config.yaml")
        assert loaded.mig_profile_allowlist == CHART_MIG_PROFILE_ALLOWLIST
