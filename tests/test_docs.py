"""The README and docs/ are true: their commands run as written, or say what they need;
their options exist; their fences close; their links and anchors lead somewhere.

The rules, and the marker a command that needs a cluster, a GPU, Docker, the network or a
running NATS carries, are in tests/documented.py and docs/README.md.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from pyhami.cli import build_parser, main
from tests.documented import (
    Command,
    anchors,
    check_doc,
    documents,
    github_anchor,
    input_files,
    link_problems,
    read_doc,
)
from tests.paths import REPO

DOCS = {str(path.relative_to(REPO)): path for path in documents()}
# The chart's README too, for its fences and links (its commands are Helm's).
PAGES = {**DOCS, "charts/pyhami/README.md": REPO / "charts" / "pyhami" / "README.md"}
RUNS_AT_LEAST = 11
"""Commands the docs run offline today; fewer means a runnable one was marked away."""


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser({})


def checked(parser: argparse.ArgumentParser, name: str, text: str) -> tuple[list[str],
                                                                             list[Command]]:
    return check_doc(parser, read_doc(name, text))


@pytest.mark.parametrize("name", DOCS)
def test_every_command_is_known_runs_offline_or_says_what_it_needs(
        parser: argparse.ArgumentParser, name: str) -> None:
    problems, _ = checked(parser, name, DOCS[name].read_text(encoding="utf-8"))
    assert problems == []


@pytest.mark.parametrize("name", PAGES)
def test_fences_close_and_links_and_anchors_resolve(name: str) -> None:
    text = PAGES[name].read_text(encoding="utf-8")
    assert read_doc(name, text).problems == []
    assert link_problems(PAGES[name], text) == []


def run(command: Command, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The command through ``pyhami``'s own entry point, in this process: its exit status
    and what it printed."""
    try:
        code = main(command.words[1:])
    except SystemExit as stopped:  # argparse's refusals
        code = stopped.code if isinstance(stopped.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def workspace(tmp_path: Path) -> Path:
    """A folder laid out as the checkout's root, as the docs' relative paths expect: the
    examples reachable, docs/ empty so that what a command writes there can be compared
    with the file the repository holds."""
    root = tmp_path / "checkout"
    root.mkdir(parents=True)
    (root / "examples").symlink_to(REPO / "examples")
    (root / "docs").mkdir()
    return root


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("PYHAMI_") or name == "COLUMNS":
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_environment")
def test_documented_commands_run_as_written(
        parser: argparse.ArgumentParser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    ran = 0
    for number, (name, path) in enumerate(DOCS.items()):
        root = workspace(tmp_path / str(number))
        monkeypatch.chdir(root)
        doc = read_doc(name, path.read_text(encoding="utf-8"))
        for file, content in input_files(doc).items():
            (root / file).write_text(content, encoding="utf-8")
        _, runnable = check_doc(parser, doc)
        for command in runnable:
            code, printed = run(command, capsys)
            assert code == command.status, f"{command.where}: exit {code}\n{printed}"
            if command.output is not None:
                shown = [line.rstrip() for line in command.output]
                while shown and not shown[-1]:
                    shown.pop()
                assert [line.rstrip() for line in printed.splitlines()] == shown, \
                    command.where
            ran += 1
        for written in root.rglob("*"):
            kept = REPO / written.relative_to(root)
            if written.is_file() and not written.is_symlink() and kept.is_file():
                assert written.read_bytes() == kept.read_bytes(), \
                    f"{name}: the command writes {kept.relative_to(REPO)} otherwise"
    assert ran >= RUNS_AT_LEAST


README_EXAMPLE = """\
```sh
.venv/bin/pyhami decide --cluster examples/lab-cluster.json \\
    --pod examples/mutex-binpack-pod.yaml --explain
```
"""


@pytest.mark.usefixtures("clean_environment")
def test_a_renamed_option_fails_the_check_and_the_run(
        parser: argparse.ArgumentParser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert README_EXAMPLE in DOCS["README.md"].read_text(encoding="utf-8")
    monkeypatch.chdir(workspace(tmp_path))
    problems, runnable = checked(parser, "README.md", README_EXAMPLE)
    assert problems == [] and run(runnable[0], capsys)[0] == 0
    renamed = README_EXAMPLE.replace("--pod ", "--pod-file ")
    problems, runnable = checked(parser, "README.md", renamed)
    assert problems == ["README.md:2: pyhami decide has no option --pod-file"]
    assert run(runnable[0], capsys)[0] == 2
    # A synopsis, a prose mention and a marked block are checked the same way.
    for text in ("    pyhami demo --daemon URL [--lab-nodes NAME]\n",
                 "with `pyhami demo --daemon URL\n--lab-nodes NAME`, the demo...\n",
                 "<!-- doc-test: needs nats -->\n```sh\npyhami demo --lab-nodes x\n```\n"):
        problems, _ = checked(parser, "d.md", text)
        assert len(problems) == 1 and "pyhami demo has no option --lab-nodes" in problems[0]


@pytest.mark.parametrize(("text", "problem"), [
    ("```sh\nkubectl get pods\n```\n", "'kubectl get pods' does not run offline"),
    ("```sh\npyhami watch --nats nats://x\n```\n", "'pyhami watch --nats nats://x' does not"),
    ("```sh\npyhami explain p.yaml --daemon http://x\n```\n", "does not run offline"),
    ("```sh\npyhami decide --cluster c | jq .\n```\n", "does not run offline"),
    ("<!-- doc-test: needs a-cluster -->\n```sh\nkubectl get pods\n```\n",
     "needs 'a-cluster': not one of"),
    ("```sh\npyhami decide\n", "d.md:1: the fence opened here is never closed"),
    ("```\nplain\n```\n", "d.md:1: the fence names no language"),
    ("````md\n```sh\nkubectl x\n```\n````\n", None),
    ("<!-- doc-test: needs kubernetes -->\n\n```sh\nkubectl get pods\n```\n", None),
    ("```console\n$ pyhami decide --cluster c --pod p\n{}\n```\n", None),
])
def test_what_the_check_refuses(parser: argparse.ArgumentParser, text: str,
                                problem: str | None) -> None:
    problems, _ = checked(parser, "d.md", text)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0], problems


def test_console_output_is_read_below_its_command(parser: argparse.ArgumentParser) -> None:
    text = "```console\n$ pyhami decide --cluster c \\\n    --pod p\nline 1\n\nline 2\n```\n"
    _, runnable = checked(parser, "d.md", text)
    assert [(c.words, c.output) for c in runnable] == [
        (["pyhami", "decide", "--cluster", "c", "--pod", "p"], ["line 1", "", "line 2"])]


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Standalone mode", "standalone-mode"),
    ("`config.json`, the `nodeconfig` list", "configjson-the-nodeconfig-list"),
    ("Compared again with v2.10.0: cores, tenants", "compared-again-with-v2100-cores-tenants"),
    ("Which pods take MIG cards: `nvidia.com/vgpu-mode`",
     "which-pods-take-mig-cards-nvidiacomvgpu-mode"),
    ("1. Build and push the image", "1-build-and-push-the-image"),
    ("The webhook's certificate", "the-webhooks-certificate"),
    ("[docs](x.md) and more", "docs-and-more"),
])
def test_anchors_follow_github(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor


def test_a_repeated_heading_is_numbered_and_a_broken_link_named(tmp_path: Path) -> None:
    assert anchors("# A\n## A\n```sh\n# A\n```\n") == {"a", "a-1"}
    page = REPO / "docs" / "probe.md"  # named as a page of docs/, never written
    text = ("[ok](scheduler.md#standalone-mode) [gone](scheduler.md#no-such) "
            "[missing](nothing.md) [web](https://example.com/x) [here](#b)\n# B\n"
            "`[code](nowhere.md)`\n")
    assert link_problems(page, text) == [
        "docs/probe.md: link scheduler.md#no-such: no heading #no-such in scheduler.md",
        "docs/probe.md: link nothing.md: no such file"]
