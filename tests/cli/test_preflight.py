"""``pyhami preflight``: HAMi's two device files checked offline, what each setting becomes,
what is not read, and every refusal as the daemon and the agents word it; exit 2 when
anything is refused, with one line on stderr, whatever the files hold."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from common.core.errors import SettingsError
from common.deviceconfig import CONFIG_FILE_MAX_BYTES, device_config_from, node_config_from
from pyhami.cli import build_parser
from pyhami.preflight import preflight_report, print_report
from tests.commands import run_command
from tests.paths import EXAMPLES, REPO

HAMI = REPO / "tests" / "common" / "hami"
DEVICE = EXAMPLES / "hami" / "device-config.yaml"
BAD_ENTRY = EXAMPLES / "hami" / "config-bad-entry.json"
CLI_DOC = REPO / "docs" / "cli.md"


def preflight(capsys: pytest.CaptureFixture[str], *argv: str | Path,
              environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The exit code, stdout and stderr of ``pyhami preflight ARGV`` (in a pipe)."""
    return run_command(capsys, "preflight", *argv, environ=environ, only="preflight")


def report(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, Any, str]:
    code, out, err = preflight(capsys, *argv, "-o", "json")
    return code, json.loads(out), err


def rows(part: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["key"]: row for row in part["settings"]}


# ---------------------------------------------------------------------------- good files


def test_hamis_chart_file_is_read_whole_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    code, document, err = report(capsys, "--device-config", HAMI / "device-config.yaml")
    assert (code, err, document["refused"]) == (0, "", [])
    settings = rows(document["device_config"])
    assert len(settings) == 20  # every nvidia: key pyhami reads
    assert settings["nvidia.deviceSplitCount"] == {
        "key": "nvidia.deviceSplitCount", "written": True, "hami": 10, "pyhami": 10,
        "in": ["agent"], "effect": "10 pods at once on one card", "refused": None}
    assert settings["nvidia.disableCoreLimit"]["written"] is False  # the chart leaves it out
    assert settings["nvidia.libCudaLogLevel"]["pyhami"] == "1"  # YAML's 1, HAMi's text
    assert document["device_config"]["ignored"][:3] == ["cambricon", "hygon", "metax"]
    assert document["node_config"] is None


# Each changed key: where it takes effect and what it does, as the table says it.
CHANGED = [
    ("nvidia.resourceCountName", ["scheduler", "webhook", "agent"], "example.com/vgpu",
     "pods ask for cards with it; the agents advertise it"),
    ("nvidia.overwriteEnv", ["webhook"], True,
     "NVIDIA_VISIBLE_DEVICES=none in containers naming no GPU"),
    ("nvidia.defaultMemory", ["scheduler"], 2048,
     "2048 MiB for a GPU container naming no memory"),
    ("nvidia.defaultGPUNum", ["scheduler"], 2,
     "2 cards for a container naming memory or cores, no count"),
    ("nvidia.memoryFactor", ["scheduler"], 1024, "memory requests and quota limits x 1024"),
    ("nvidia.deviceMemoryScaling", ["agent"], 2.0,
     "each card registered with its MiB x 2; containers get CUDA_OVERSUBSCRIBE=true"),
    ("nvidia.deviceCoreScaling", ["agent"], 1.5, "each card registered with 150 cores"),
    ("nvidia.gpuCorePolicy", ["webhook"], "force",
     "GPU_CORE_UTILIZATION_POLICY=force in every container"),
    ("nvidia.libCudaLogLevel", ["agent"], "3", "containers' LIBCUDA_LOG_LEVEL=3"),
    ("nvidia.runtimeClassName", ["webhook"], "nvidia",
     "runtimeClassName nvidia for a GPU pod naming none"),
    ("nvidia.migProfileAllowlist", ["agent"],
     [{"models": ["A100-SXM4-80GB"], "profiles": ["1g.10gb", "7g.79gb"]}],
     "the MIG profiles a node in MIG mode may make (1 items)"),
]


@pytest.mark.parametrize(("key", "where", "value", "effect"), CHANGED,
                         ids=[key for key, *_ in CHANGED])
def test_a_changed_key_says_what_it_becomes(capsys: pytest.CaptureFixture[str], key: str,
                                            where: list[str], value: object,
                                            effect: str) -> None:
    code, document, _ = report(capsys, "--device-config", HAMI / "device-config-changed.yaml")
    assert code == 0
    row = rows(document["device_config"])[key]
    assert (row["in"], row["pyhami"], row["effect"]) == (where, value, effect)


# A nodeconfig entry: what it changes for its node, beside what every other node reads.
ENTRY = [
    ("operatingmode", "mig", "hami-core", "the agent makes MIG instances for the pods (MIG mode)"),
    ("devicesplitcount", 3, 10, "3 pods at once on one card"),
    ("devicememoryscaling", 1.5, 1.0,
     "each card registered with its MiB x 1.5; containers get CUDA_OVERSUBSCRIBE=true"),
    ("preconfigureddevicememory", 16384, 0,
     "16384 MiB for a card NVML gives no memory figure for"),
    ("enablenumatopology", True, False,
     "each advertised device names its card's NUMA node to the kubelet"),
    ("filterdevices", {"uuids": ["GPU-aaaa"], "indexes": [1, 3]},
     {"uuids": [], "indexes": []}, "these cards neither reported nor advertised"),
    ("enablegetpreferredallocation", True, False,
     "the kubelet asks the agent which cards to give"),
]


@pytest.mark.parametrize(("key", "value", "others", "effect"), ENTRY,
                         ids=[key for key, *_ in ENTRY])
def test_an_entry_says_what_it_changes_for_its_node(
        capsys: pytest.CaptureFixture[str], key: str, value: object, others: object,
        effect: str) -> None:
    code, document, _ = report(capsys, "--node-config", HAMI / "config-changed.json")
    assert code == 0
    [entry] = document["node_config"]["entries"]
    assert entry["node"] == "gpu-1"
    row = rows(entry)[key]
    assert (row["pyhami"], row["others"], row["effect"]) == (value, others, effect)


def test_the_other_nodes_read_the_device_files_values(capsys: pytest.CaptureFixture[str],
                                                     ) -> None:
    code, document, _ = report(capsys, "--device-config", HAMI / "device-config-changed.yaml",
                               "--node-config", HAMI / "config-changed.json")
    assert code == 0
    settings = rows(document["node_config"]["entries"][0])
    assert settings["devicesplitcount"]["others"] == 4  # the changed file's deviceSplitCount
    assert settings["devicecorescaling"]["others"] == 1.5


@pytest.mark.parametrize(("text", "said"), [
    ('{"nodeconfig": []}', "no nodeconfig entries: every node reads the nvidia: values"),
    ("", "no nodeconfig entries: every node reads the nvidia: values"),
    ('{"nodeconfig": [{"name": "a"}]}', "nothing changed"),
], ids=["pyhamis-chart-default", "empty-file", "a-name-alone"])
def test_a_file_that_changes_nothing_says_so(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    code, out, err = preflight(capsys, "--node-config", path)
    assert (code, err) == (0, "")
    assert said in out
    assert out.rstrip().endswith("nothing refused: pyhami's scheduler and agents start "
                                 "with these files")


# ---------------------------------------------------------------------------- refusals

BAD = [
    # (flag, file contents, the refusal after "FLAG PATH: ")
    ("--device-config", "nvidia:\n  deviceSplitCount: 0\n",
     "nvidia.deviceSplitCount is 0: must be from 1 to 65536"),
    ("--device-config", "nvidia:\n  deviceSplitCount: 2\n  deviceSplitCount: 3\n",
     "nvidia.deviceSplitCount is given twice (lines 2 and 3)"),
    ("--device-config", "nvidia: [1]\n", "nvidia is a list: must be a mapping"),
    ("--device-config", "- a\n", "the document is a list: must be a mapping"),
    ("--device-config", "a: [\n", "not YAML or JSON: "),
    ("--device-config", "nvidia:\n  runtimeClassName: Nvidia_1\n",
     "nvidia.runtimeClassName is 'Nvidia_1': must be a RuntimeClass name"),
    ("--node-config", '{"nodeconfig": [{"name": "a", "operatingmode": "mps"}]}',
     "nodeconfig[0].operatingmode is 'mps': must be one of 'hami-core', 'mig'"),
    ("--node-config", '{"nodeconfig": [{"name": "a"}, {"name": "a"}]}',
     "nodeconfig[1].name is 'a': that node has an entry already"),
    ("--node-config", '{"nodeconfig": [{"devicesplitcount": 2}]}',
     "nodeconfig[0] has no name: each entry names its node"),
    ("--node-config", '{"nodeconfig": [{"name": "a", "Name": "b"}]}',
     "nodeconfig[0].Name is 'b': is given twice (as 'name' too)"),
    ("--node-config", '{"nodeconfig": [{"name": "a", "filterdevices": {"index": [300]}}]}',
     "nodeconfig[0].filterdevices.index[0] is 300: must be from 0 to 255"),
]


@pytest.mark.parametrize(("flag", "text", "refusal"), BAD,
                         ids=[f"{flag}-{n}" for n, (flag, *_) in enumerate(BAD)])
def test_a_refused_value_is_named_as_the_daemon_and_the_agents_name_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str, text: str,
        refusal: str) -> None:
    path = tmp_path / "file"
    path.write_text(text)
    code, out, err = preflight(capsys, flag, path)
    assert code == 2
    line = f"{flag} {path}: {refusal}"
    assert next(row for row in out.splitlines() if row.startswith(f"  {flag}")).startswith(
        f"  {line}")
    assert len(err.splitlines()) == 1 and err.startswith("pyhami preflight: 1 refused: ")
    # Word for word the line the scheduler or the agent stops with (after its name).
    args = build_parser({}, only="agent").parse_args(
        ["agent", "--node", "a", flag, str(path)])
    with pytest.raises(SettingsError) as stopped:
        node_config_from(args) if flag == "--node-config" else device_config_from(args)
    code, document, _ = report(capsys, flag, path)
    assert document["refused"] == [str(stopped.value)]


def test_every_refusal_is_listed_not_only_the_first(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    device = tmp_path / "device-config.yaml"
    device.write_text("nvidia:\n  memoryFactor: 0\n  deviceSplitCount: 0\n")
    nodes = tmp_path / "config.json"
    nodes.write_text(json.dumps({"nodeconfig": [
        {"name": "a", "devicesplitcount": 0}, {"name": "b"},
        {"name": "c", "devicecorescaling": -1}]}))
    code, document, err = report(capsys, "--device-config", device, "--node-config", nodes)
    assert code == 2
    assert [line.split(": ")[1] for line in document["refused"]] == [
        "nvidia.memoryFactor is 0", "nvidia.deviceSplitCount is 0",
        "nodeconfig[0].devicesplitcount is 0", "nodeconfig[2].devicecorescaling is -1"]
    assert [e["refused"] != [] for e in document["node_config"]["entries"]] == [
        True, False, True]
    assert err == ("pyhami preflight: 4 refused: the scheduler and the agents would not "
                   "start with --device-config; no agent would start with --node-config\n")


@pytest.fixture
def not_regular(tmp_path: Path) -> list[tuple[Path, str]]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    large = tmp_path / "large"
    large.write_bytes(b"#" * (CONFIG_FILE_MAX_BYTES + 1))
    return [(fifo, "is a FIFO, not a regular file"), (tmp_path, "is a directory, not a "
            "regular file"), (tmp_path / "absent", "No such file or directory"),
            (large, f"larger than {CONFIG_FILE_MAX_BYTES} bytes")]


def test_a_file_that_cannot_be_read_is_refused_unread(
        capsys: pytest.CaptureFixture[str], not_regular: list[tuple[Path, str]]) -> None:
    for path, problem in not_regular:
        for flag in ("--device-config", "--node-config"):
            code, document, err = report(capsys, flag, path)
            assert (code, document["refused"]) == (2, [f"{flag} {path}: {problem}"])
            assert len(err.splitlines()) == 1


def test_nothing_to_check_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert preflight(capsys) == (2, "", "pyhami preflight: nothing to check: give "
                                        "--device-config FILE, --node-config FILE or both\n")


def test_the_files_may_come_from_the_environment(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = preflight(capsys, environ={"PYHAMI_NODE_CONFIG": str(BAD_ENTRY),
                                              "PYHAMI_OUTPUT": "json"})
    assert code == 2
    assert json.loads(out)["node_config"]["file"] == str(BAD_ENTRY)


# ---------------------------------------------------------------------------- the docs


def documented_output() -> tuple[str, str]:
    """The command docs/cli.md shows under "Checking HAMi's files" and the output it
    shows (stdout, then stderr)."""
    text = CLI_DOC.read_text()
    found = re.search(r"```sh\n(pyhami preflight [^`]*?)\n```\n\n```text\n(.*?)```", text,
                      re.DOTALL)
    assert found is not None, "docs/cli.md shows no preflight run"
    return found.group(1).replace("\\\n", " "), found.group(2)


def test_the_documented_run_prints_what_the_docs_show(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # HAMi's sample device-config.yaml as its chart renders it, and a config.json whose
    # second entry is refused: the mapping, the entry named, exit 2.
    command, shown = documented_output()
    monkeypatch.chdir(REPO)
    code, out, err = preflight(capsys, *command.split()[2:])
    assert code == 2
    # The docs hold the lines without the spaces that pad a table's last column.
    assert [line.rstrip() for line in (out + err).splitlines()] == shown.splitlines()
    assert "nodeconfig[1].devicecorescaling is 0" in err + out


def test_the_example_is_hamis_chart_rendering() -> None:
    assert DEVICE.read_bytes() == (HAMI / "device-config.yaml").read_bytes()


# ---------------------------------------------------------------------------- fuzz

FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])
SAMPLES = [(HAMI / name).read_bytes() for name in
           ("device-config.yaml", "config.json", "config-changed.json",
            "device-config-changed.yaml")]


@st.composite
def file_bytes(draw: st.DrawFn) -> bytes:
    """Any bytes, or HAMi's files with a slice of them replaced."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=300))
    sample = draw(st.sampled_from(SAMPLES))
    start = draw(st.integers(0, len(sample)))
    end = draw(st.integers(start, min(len(sample), start + 20)))
    return sample[:start] + draw(st.binary(max_size=12)) + sample[end:]


@FUZZ
@given(device=file_bytes(), nodes=file_bytes(), output=st.sampled_from(["table", "json"]))
def test_any_bytes_are_checked_or_refused_in_one_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, device: bytes, nodes: bytes,
        output: str) -> None:
    (tmp_path / "d").write_bytes(device)
    (tmp_path / "n").write_bytes(nodes)
    code, out, err = preflight(capsys, "--device-config", tmp_path / "d",
                               "--node-config", tmp_path / "n", "-o", output)
    assert code in (0, 2)
    assert "Traceback" not in out + err
    assert err.count("\n") == (code == 2)
    assert code == 0 or err.startswith("pyhami preflight: ")
    if output == "json":
        assert bool(json.loads(out)["refused"]) == (code == 2)


@pytest.mark.parametrize("width", [60, 80, 100])
def test_on_a_narrow_terminal_cells_wrap_and_are_never_cut(width: int) -> None:
    document = preflight_report(DEVICE, BAD_ENTRY)
    console = Console(file=io.StringIO(), width=width, force_terminal=True, record=True)
    print_report(document, console)
    printed = console.export_text()
    assert "…" not in printed
    assert max(len(line.rstrip()) for line in printed.splitlines()) <= width
    lines = printed.splitlines()
    for row in document["device_config"]["settings"]:  # the keys whole, on one line each
        assert any(line.startswith(row["key"].removeprefix("nvidia.") + " ")
                   for line in lines), row["key"]
