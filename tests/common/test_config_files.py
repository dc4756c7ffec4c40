"""The configuration files' reader refuses what is not a regular file before reading it, the
YAML loader refuses merge keys and a key given twice, and the log line of what is not read
stays short (issue 45, "bad neighbours")."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from yaml.constructor import SafeConstructor

from common.core.deviceconfig import DeviceConfigError
from common.deviceconfig import (
    IGNORED_SHOWN,
    ignored_summary,
    load_device_config,
    load_node_config,
)
from common.files import InputFileError, parse_document, read_bounded
from common.yamlfiles import DuplicateKeyError, YAMLError, load_document
from tests.paths import EXAMPLES, REPO

LINE_MAX = 1024


def nested_merges(levels: int) -> str:
    """The issue's shape: each level merges the one inside it twice, anchors defined inline,
    so that PyYAML before 6.0.4 doubles the merged pairs at each level before it constructs
    anything (24 levels: 465 bytes, 36 s and 670 MB on PyYAML 6.0.3's flattening)."""
    inner = "&a0 {k: v}"
    for level in range(1, levels + 1):
        inner = f"&a{level} {{<<: [{inner}, *a{level - 1}]}}"
    return f"x: {{<<: [{inner}, *a{levels}]}}\n"


# ------------------------------------------------------------------- regular files only
@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "device-config.yaml"
    os.mkfifo(path)
    return path


def test_a_fifo_is_refused_before_it_is_read(fifo: Path) -> None:
    with pytest.raises(InputFileError) as refused:
        read_bounded(fifo, 1024)
    assert str(refused.value) == f"{fifo}: is a FIFO, not a regular file"


def test_a_fifo_with_a_writer_waiting_is_refused_too(fifo: Path) -> None:
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(writer, b"nvidia: {}\n")
        with pytest.raises(InputFileError, match="is a FIFO, not a regular file"):
            read_bounded(fifo, 1024)
    finally:
        os.close(writer)
        os.close(reader)


@pytest.mark.parametrize(("path", "kind"), [
    (Path("/dev/zero"), "a character device"),
    (Path("/dev/null"), "a character device"),
    (Path("/"), "a directory"),
])
def test_a_device_or_a_directory_is_refused_by_what_it_is(path: Path, kind: str) -> None:
    with pytest.raises(InputFileError) as refused:
        read_bounded(path, 1024)
    assert str(refused.value) == f"{path}: is {kind}, not a regular file"


def test_a_link_to_a_fifo_is_refused_as_a_fifo(fifo: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.yaml"
    link.symlink_to(fifo)
    with pytest.raises(InputFileError, match=r"link\.yaml: is a FIFO, not a regular file"):
        read_bounded(link, 1024)


def test_a_link_to_a_regular_file_is_read_as_a_configmap_mount_needs(tmp_path: Path) -> None:
    data = tmp_path / "..data"
    data.mkdir()
    (data / "device-config.yaml").write_text("nvidia: {}\n")
    link = tmp_path / "device-config.yaml"
    link.symlink_to(data / "device-config.yaml")
    assert read_bounded(link, 1024) == b"nvidia: {}\n"


def test_a_missing_file_and_a_large_one_are_named_as_before(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match=r"absent\.yaml: No such file or directory"):
        read_bounded(tmp_path / "absent.yaml", 10)
    large = tmp_path / "large.yaml"
    large.write_bytes(b"#" * 11)
    with pytest.raises(InputFileError, match=r"large\.yaml: larger than 10 bytes"):
        read_bounded(large, 10)


def test_the_descriptor_is_closed_after_a_refusal(fifo: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with pytest.raises(InputFileError):
            read_bounded(fifo, 1024)
    assert len(os.listdir("/proc/self/fd")) == before


def pyhami(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """A command run to its start; the timeout fails a regression that blocks on the
    file rather than hanging the suite."""
    clean = {name: value for name, value in os.environ.items()
             if not name.startswith(("PYHAMI_", "KUBERNETES_"))}
    return subprocess.run([sys.executable, "-m", "pyhami.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=60, check=False,
                          env=clean, cwd=REPO)


COMMANDS = {
    "agent": ["agent", "--node", "gpu-1", "--inventory", "sim:t4x4"],
    "decide": ["decide", "--cluster", EXAMPLES / "lab-cluster.json",
               "--pod", EXAMPLES / "binpack-pod.yaml"],
}


@pytest.mark.parametrize(("command", "flag"), [
    ("decide", "--device-config"), ("agent", "--device-config"), ("agent", "--node-config"),
])
@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_fifo_or_a_device_given_as_a_file_stops_the_command_with_one_line(
        command: str, flag: str, special: str, tmp_path: Path) -> None:
    path = Path(special)
    if special == "fifo":
        path = tmp_path / "config"
        os.mkfifo(path)
    kind = "a FIFO" if special == "fifo" else "a character device"
    done = pyhami(*COMMANDS[command], flag, path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"pyhami {command}: {flag} {path}: is {kind}, not a regular file"]


# ------------------------------------------------------------------------- merge keys
def test_nested_merges_are_refused_before_pyyaml_flattens_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused by the key's tag before PyYAML's own merging runs: the guarantee holds on a
    PyYAML that still expands merges exponentially."""

    def never(*_: object) -> None:
        raise AssertionError("PyYAML's merge flattening was reached")

    monkeypatch.setattr(SafeConstructor, "flatten_mapping", never)
    body = nested_merges(24)
    assert len(body.encode()) < 485
    with pytest.raises(YAMLError, match=r"YAML merge keys \(<<\) are not accepted"):
        load_document(body)


@pytest.mark.parametrize("text", [
    "a: &a {k: v}\nb: {<<: *a}\n",
    "a: &a {k: v}\nb: {<<: [*a, *a]}\n",
    "<<: {k: v}\n",
    "a:\n  b:\n    - {<<: {k: v}, j: w}\n",
    nested_merges(3),
])
def test_any_merge_key_is_refused(text: str) -> None:
    with pytest.raises(InputFileError, match=r"^f: not YAML or JSON: YAML merge keys \(<<\) "
                                             r"are not accepted"):
        parse_document(text, "f")


def test_a_quoted_key_of_two_angle_brackets_is_only_a_key() -> None:
    assert load_document("'<<': 1\n") == {"<<": 1}


def test_aliases_are_still_refused() -> None:
    with pytest.raises(YAMLError, match=r"YAML aliases \(\*name\) are not accepted"):
        load_document("a: &a [1]\nb: *a\n")


# --------------------------------------------------------------------- keys given twice
@pytest.mark.parametrize(("text", "message"), [
    ("nvidia:\n  deviceSplitCount: 2\n  deviceSplitCount: 3\n",
     "nvidia.deviceSplitCount is given twice (lines 2 and 3)"),
    ('{"nodeconfig": [{"name": "a", "name": "b"}]}',
     "nodeconfig[0].name is given twice (line 1, columns 18 and 31)"),
    ("metadata:\n  annotations:\n    nvidia.com/use-gputype: A10\n"
     "    nvidia.com/use-gputype: T4\n",
     "metadata.annotations['nvidia.com/use-gputype'] is given twice (lines 3 and 4)"),
    ("a: 1\na: 2\n", "a is given twice (lines 1 and 2)"),
    ("x:\n- {k: 1}\n- {k: 1, k: 2}\n", "x[1].k is given twice (line 3, columns 4 and 10)"),
    (f"? {'k' * 100_000}\n: 1\n? {'k' * 100_000}\n: 2\n",  # explicit keys: no length limit
     f"[{'k' * 40!r}...] is given twice (lines 1 and 3)"),
])
def test_a_key_given_twice_is_named_by_its_path_and_lines(text: str, message: str) -> None:
    with pytest.raises(DuplicateKeyError) as refused:
        load_document(text)
    assert str(refused.value) == message


def test_distinct_keys_and_equal_values_are_read() -> None:
    assert load_document("a: 1\nb: 1\nc: {a: 1}\n") == {"a": 1, "b": 1, "c": {"a": 1}}


def test_a_key_given_twice_in_device_config_yaml_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "device-config.yaml"
    path.write_text("nvidia:\n  deviceSplitCount: 2\n  deviceMemoryScaling: 1\n"
                    "  deviceSplitCount: 3\n")
    with pytest.raises(InputFileError) as refused:
        load_device_config(path)
    assert str(refused.value) == (f"{path}: nvidia.deviceSplitCount is given twice "
                                  "(lines 2 and 4)")


def test_a_key_given_twice_in_config_json_is_refused_as_two_spellings_are(
        tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"nodeconfig": [{"name": "gpu-1",\n"name": "gpu-2"}]}')
    with pytest.raises(InputFileError) as refused:
        load_node_config(path)
    assert str(refused.value) == f"{path}: nodeconfig[0].name is given twice (lines 1 and 2)"
    path.write_text('{"nodeconfig": [{"name": "gpu-1", "Name": "gpu-2"}]}')
    with pytest.raises(DeviceConfigError, match="is given twice"):
        load_node_config(path)


# ---------------------------------------------------------- the log line of what is not read
def logged(path: Path, caplog: pytest.LogCaptureFixture) -> str:
    with caplog.at_level(logging.INFO, logger="common.deviceconfig"):
        load_device_config(path)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1
    return lines[0]


def test_two_thousand_unknown_keys_are_summarised_in_one_short_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "device-config.yaml"
    keys = {f"unknownKeyNumber{index}With-A-Long-Name-Of-Sixty-Four-Chars-X": 1
            for index in range(2000)}
    path.write_text(json.dumps({"nvidia": keys}))
    line = logged(path, caplog)
    assert len(line.encode()) < LINE_MAX
    assert line.startswith(f"{path}: not read by pyhami, ignored: nvidia.unknownKeyNumber0")
    assert line.endswith(f" and {2000 - IGNORED_SHOWN} more")


def test_one_key_of_100_kb_is_cut_short(tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "device-config.yaml"
    path.write_text(f"? {'x' * 100_000}\n: 1\nnvidia:\n  ? {'y' * 100_000}\n  : 1\n")
    line = logged(path, caplog)
    assert len(line.encode()) < LINE_MAX
    assert "100000 characters" in line


@pytest.mark.parametrize("keys", [
    [], ["a"], ["k" * 10_000] * 10_000, [f"key-{index}" for index in range(IGNORED_SHOWN)],
])
def test_the_summary_is_bounded_whatever_the_keys(keys: list[str]) -> None:
    summary = ignored_summary(keys)
    assert len(summary) < LINE_MAX - 200
    assert ("more" in summary) == (len(keys) > IGNORED_SHOWN)
