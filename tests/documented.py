"""The commands and links of the README and docs/, read as a user reads them.

A fenced block marked ``sh``, ``bash``, ``shell`` or ``console`` holds commands (in a
``console`` block, the lines after ``$ ``; the lines below one, up to the next, are its
output). Every such block either runs offline as written (``pyhami`` commands that need
no Kubernetes, GPU, Docker, network or running NATS) or says what it needs on the line
just before its fence, in a comment GitHub does not show::

    <!-- doc-test: needs kubernetes -->

with one of ``NEEDS``. A block of input a command below reads, marked
``<!-- doc-test: file NAME -->``, is written to NAME before the page's commands run.
Every ``pyhami`` command anywhere in a doc (blocks of either kind, indented synopses,
inline code) must name options its command has. Every fence opened is closed and names
its language; every relative link and ``#anchor`` resolves as GitHub resolves it.
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tests.paths import REPO

NEEDS = {
    "kubernetes": "a cluster (kubectl, helm, or a pod's view)",
    "gpu": "an NVIDIA card or its tools",
    "docker": "Docker or Docker Compose",
    "network": "the internet (pip, curl to a public site)",
    "nats": "a nats-server, a running daemon or agents",
    "control-plane": "the binaries scripts/build-control-plane.sh builds",
    "long-run": "minutes of a benchmark's run",
    "files": "input files the doc describes but does not hold whole",
}
"""What a marked block needs, the words a marker may use."""

COMMAND_LANGUAGES = ("sh", "bash", "shell", "console")
OFFLINE = {("decide",), ("explain",), ("simulate",), ("preflight",), ("certs", "init"),
           ("nats-auth", "init"), ("nats-auth", "agent-token"), ("bench", "decide")}
"""The commands that run on this machine alone, as they are written in the docs."""

MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(needs|file|exits)\s+([\w.-]+)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)")
FENCED = re.compile(r"^\s*(`{3,}|~{3,}).*?^\s*\1\s*$", re.DOTALL | re.MULTILINE)
SHELL_OPERATORS = re.compile(r"[|;<>&`]|\$\(")


def documents() -> list[Path]:
    """The README and every page of docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@dataclass
class Block:
    """One fenced block: where it opens, its language, its lines, what it needs."""

    doc: str
    line: int
    language: str
    lines: list[str]
    needs: str | None
    file: str | None = None
    status: int = 0
    """The exit status its commands end with (``exits N``: a page showing a refusal)."""


@dataclass
class Command:
    """One command of a block as the shell would split it, and the output the doc shows
    below it (``console`` blocks only)."""

    where: str
    words: list[str]
    output: list[str] | None
    needs: str | None
    status: int = 0


@dataclass
class Doc:
    """A page read: its blocks, the pyhami commands it mentions, its problems."""

    name: str
    blocks: list[Block] = field(default_factory=list)
    mentions: list[tuple[int, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_doc(name: str, text: str) -> Doc:
    """Fences, markers and the pyhami commands mentioned outside fences."""
    doc = Doc(name)
    lines = text.split("\n")
    index = 0
    previous = ""
    while index < len(lines):
        line = lines[index]
        opened = FENCE.match(line)
        if opened is None:
            _mentions(doc, index + 1, line)
            if line.strip():
                previous = line
            index += 1
            continue
        indent, fence, language = opened.groups()
        marker = MARKER.match(previous)
        needs = marker.group(2) if marker and marker.group(1) == "needs" else None
        file = marker.group(2) if marker and marker.group(1) == "file" else None
        exits = marker.group(2) if marker and marker.group(1) == "exits" else "0"
        if not exits.isdigit():
            doc.problems.append(f"{name}:{index}: doc-test marker exits {exits!r}: not a "
                                "number")
            exits = "0"
        if needs is not None and needs not in NEEDS:
            doc.problems.append(f"{name}:{index}: doc-test marker needs {needs!r}: not one "
                                f"of {', '.join(NEEDS)}")
        if not language:
            doc.problems.append(f"{name}:{index + 1}: the fence names no language "
                                "(```sh, ```console, ```text, ```json, ...)")
        body: list[str] = []
        close = index + 1
        while close < len(lines) and not re.fullmatch(
                rf"\s*{re.escape(fence[0])}{{{len(fence)},}}\s*", lines[close]):
            body.append(lines[close].removeprefix(indent))
            close += 1
        if close == len(lines):
            doc.problems.append(f"{name}:{index + 1}: the fence opened here is never closed")
        doc.blocks.append(Block(name, index + 1, language, body, needs, file, int(exits)))
        if language not in COMMAND_LANGUAGES:
            for offset, inner in enumerate(body):
                _mentions(doc, index + 2 + offset, inner)
        previous = ""
        index = close + 1
    _inline_mentions(doc, text)
    return doc


def _mentions(doc: Doc, number: int, line: str) -> None:
    stripped = line.strip()
    if stripped.startswith(("pyhami ", "$ pyhami ")):
        doc.mentions.append((number, stripped.removeprefix("$ ")))


def _inline_mentions(doc: Doc, text: str) -> None:
    """``pyhami ...`` in inline code, which may run over a line break."""
    outside = FENCED.sub(lambda block: "\n" * block.group(0).count("\n"), text)
    for span in re.finditer(r"`(pyhami [^`]+)`", outside):
        number = outside.count("\n", 0, span.start()) + 1
        doc.mentions.append((number, " ".join(span.group(1).replace("\\|", "|").split())))


def input_files(doc: Doc) -> dict[str, str]:
    """The blocks marked as files the page's commands read, by name."""
    return {block.file: "\n".join(block.lines) + "\n" for block in doc.blocks
            if block.file is not None}


def commands(block: Block) -> list[Command]:
    """The commands of a command block, continuation lines joined, comments dropped."""
    found: list[Command] = []
    pending = ""
    start = 0
    for offset, line in enumerate(block.lines):
        if block.language == "console":
            if line.startswith("$ "):
                pending, start = line[2:], offset
            elif pending.endswith("\\"):
                pending += "\n" + line
            else:
                if found and found[-1].output is not None and not pending:
                    found[-1].output.append(line)
                continue
        else:
            if not pending:
                start = offset
            pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            continue
        text = pending.replace("\\\n", " ")
        pending = ""
        where = f"{block.doc}:{block.line + 1 + start}"
        try:
            words = shlex.split(text, comments=True)
        except ValueError as error:
            words = ["<unreadable>", str(error)]
        if SHELL_OPERATORS.search(text.split(" #")[0]):
            words = ["<shell>", text]
        if words:
            found.append(Command(where, words,
                                 [] if block.language == "console" else None, block.needs,
                                 block.status))
    return found


def command_path(parser: argparse.ArgumentParser,
                 words: list[str]) -> tuple[tuple[str, ...], argparse.ArgumentParser] | None:
    """The subcommands ``words`` (after ``pyhami``) name and the parser of the last, or
    None when the first word is no command (a log line, a sentence)."""
    path: list[str] = []
    current = parser
    for word in words:
        sub = next((action for action in current._actions
                    if isinstance(action, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            break
        path.append(word)
        current = sub.choices[word]
    return (tuple(path), current) if path else None


def unknown_options(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The ``--options`` a command written in a doc gives that its command lacks."""
    words = text.replace("|", " ").replace("[", " ").replace("(", " ").split()
    if words[:1] != ["pyhami"]:
        return []
    found = command_path(parser, words[1:])
    if found is None:
        return []
    path, command = found
    unknown = []
    for word in words[1 + len(path):]:
        option = word.strip(")],.'\"").split("=")[0]
        if re.fullmatch(r"--?[a-zA-Z][\w-]*", option) and \
                option not in command._option_string_actions:
            unknown.append(f"pyhami {' '.join(path)} has no option {option}")
    return unknown


def pyhami_words(words: list[str]) -> list[str] | None:
    """``words`` from ``pyhami`` on (``.venv/bin/pyhami`` is the same), else None."""
    if words and Path(words[0]).name == "pyhami":
        return ["pyhami", *words[1:]]
    return None


def check_doc(parser: argparse.ArgumentParser, doc: Doc) -> tuple[list[str], list[Command]]:
    """The doc's problems and the commands to run offline."""
    problems = list(doc.problems)
    runnable: list[Command] = []
    for number, text in doc.mentions:
        problems += [f"{doc.name}:{number}: {message}"
                     for message in unknown_options(parser, text)]
    for block in doc.blocks:
        if block.language not in COMMAND_LANGUAGES:
            continue
        for command in commands(block):
            words = pyhami_words(command.words)
            if words is not None:
                problems += [f"{command.where}: {message}"
                             for message in unknown_options(parser, shlex.join(words))]
            if command.needs is not None:
                continue
            found = command_path(parser, words[1:]) if words else None
            if found is None or found[0] not in OFFLINE or "--daemon" in words:
                problems.append(
                    f"{command.where}: {' '.join(command.words)!r} does not run offline as "
                    "written: mark its block <!-- doc-test: needs WHAT --> "
                    f"({', '.join(NEEDS)})")
                continue
            command.words = words
            runnable.append(command)
    return problems, runnable


def github_anchor(heading: str) -> str:
    """The ``#anchor`` GitHub gives a heading: its text lower-cased, punctuation but
    hyphens and underscores dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor, a repeated one numbered as GitHub numbers it."""
    seen: dict[str, int] = {}
    found = set()
    in_fence = False
    for line in text.split("\n"):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading and not in_fence:
            anchor = github_anchor(heading.group(1))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def link_problems(path: Path, text: str) -> list[str]:
    """Relative links and anchors of ``text`` (the page at ``path``) that lead nowhere."""
    problems = []
    outside = FENCED.sub("", text)
    outside = re.sub(r"`[^`\n]*`", "", outside)
    for match in LINK.finditer(outside):
        target = match.group(1) or match.group(2)
        if re.match(r"^[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        where = f"{path.relative_to(REPO)}: link {target}"
        if not file_part:
            if anchor not in anchors(text):
                problems.append(f"{where}: no heading #{anchor} on this page")
            continue
        linked = (path.parent / file_part).resolve()
        if not linked.exists():
            problems.append(f"{where}: no such file")
        elif anchor and linked.suffix == ".md" and \
                anchor not in anchors(linked.read_text(encoding="utf-8")):
            problems.append(f"{where}: no heading #{anchor} in {linked.name}")
    return problems
