"""The user's files: cluster descriptions and Pod manifests read, credentials written whole."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path

import msgspec

from common.core import ClusterFile, PodManifest
from common.core.errors import InvalidInput


class InputFileError(InvalidInput):
    """An input file that cannot be used; the message names the file and the problem."""


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise InputFileError(f"{path}: {error.strerror or error}") from None


def read_bounded(path: Path, limit: int) -> bytes:
    """The file's bytes, refused when it holds more than ``limit`` of them; raises
    ``InputFileError`` naming the file. Read one byte past the limit, never the whole of a
    file that is too large (a device, a runaway log)."""
    try:
        with path.open("rb") as file:
            text = file.read(limit + 1)
    except OSError as error:
        raise InputFileError(f"{path}: {error.strerror or error}") from None
    if len(text) > limit:
        raise InputFileError(f"{path}: larger than {limit} bytes")
    return text


def load_cluster(path: Path) -> ClusterFile:
    try:
        return msgspec.json.decode(_read(path), type=ClusterFile)
    except msgspec.DecodeError as error:
        raise InputFileError(f"{path}: {error}") from None


def parse_document(text: bytes | str, source: str) -> object:
    """A YAML or JSON document as plain values (JSON is YAML), read by the safe loader
    without aliases (``common.yamlfiles``, imported here, so that a command that reads no
    YAML, such as ``pyhami simulate`` on CSV files, does not import PyYAML). Raises
    ``InputFileError`` naming ``source``."""
    from common.yamlfiles import YAMLError, load_document  # noqa: PLC0415 (when needed)

    try:
        return load_document(text)
    except YAMLError as error:
        raise InputFileError(f"{source}: not YAML or JSON: {error}".replace("\n", " ")) from None
    except RecursionError:
        raise InputFileError(f"{source}: nested too deeply") from None
    except ValueError as error:  # an integer of over 4,300 digits, a date like 2001-13-45
        raise InputFileError(f"{source}: a value cannot be read: {error}") from None


class _Kind(msgspec.Struct):
    kind: str = "Pod"


_json_kind = msgspec.json.Decoder(_Kind)
_json_pod = msgspec.json.Decoder(PodManifest)


def parse_pod_manifest(text: bytes | str, source: str) -> PodManifest:
    """A Pod manifest from YAML or JSON text.

    Any text gives a manifest or ``InputFileError``: aliases, nesting deeper than
    the parser allows and numbers too long to convert are refused by name.
    """
    if text[:64].lstrip()[:1] in (b"{", "{"):
        manifest = _parse_json_pod(text, source)
        if manifest is not None:
            return manifest
    document = parse_document(text, source)
    if not isinstance(document, dict):
        raise InputFileError(f"{source}: expected a Pod manifest (a mapping)")
    kind = document.get("kind", "Pod")
    if kind != "Pod":
        raise InputFileError(f"{source}: kind is {kind!r}, expected 'Pod'")
    try:
        return msgspec.convert(document, PodManifest)
    except msgspec.ValidationError as error:
        raise InputFileError(f"{source}: {error}") from None
    except RecursionError:
        raise InputFileError(f"{source}: nested too deeply") from None


def _parse_json_pod(text: bytes | str, source: str) -> PodManifest | None:
    """JSON, which is YAML too, read by msgspec: a hundred times faster than libyaml.

    None when the text is not JSON (YAML's flow style, ``{a: b}``, may still read it).
    """
    try:
        kind = _json_kind.decode(text).kind
        if kind != "Pod":
            raise InputFileError(f"{source}: kind is {kind!r}, expected 'Pod'")
        return _json_pod.decode(text)
    except msgspec.ValidationError as error:
        raise InputFileError(f"{source}: {error}") from None
    except msgspec.DecodeError:
        return None
    except RecursionError:
        raise InputFileError(f"{source}: nested too deeply") from None


def load_pod(path: Path) -> PodManifest:
    return parse_pod_manifest(_read(path), str(path))


PRIVATE_MODE = 0o600


def write_files(contents: Mapping[Path, bytes], mode: Mapping[Path, int]) -> None:
    """Each file written beside its place first, then all moved into place in the order
    given, so that an error leaves no half-written file behind. Private files (mode
    0600) get that mode whatever the umask. Raises ``OSError``."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, text in contents.items():
            temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode[path])
            staged.append((temporary, path))
            with os.fdopen(descriptor, "wb") as file:
                if mode[path] == PRIVATE_MODE:
                    os.fchmod(file.fileno(), PRIVATE_MODE)
                file.write(text)
        for temporary, path in staged:
            os.replace(temporary, path)
    finally:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
