"""The user's files: cluster descriptions and Pod manifests read, credentials written whole."""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

import msgspec

from common.core import ClusterFile, PodManifest
from common.core.errors import InvalidInput, PyhamiError


class InputFileError(InvalidInput):
    """An input file that cannot be used; the message names the file and the problem."""


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise InputFileError(f"{path}: {error.strerror or error}") from None


SECRET_FILE_MAX_BYTES = 1024 * 1024
"""A token, password, key or certificate file: a Secret's own limit, far above any."""

_KINDS = (
    (stat.S_ISREG, "a regular file"), (stat.S_ISLNK, "a link"), (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, as a message names it: ``a FIFO``, ..."""
    return next((name for test, name in _KINDS if test(mode)), "a file of another kind")


def _refuse_unless_regular(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise InputFileError(f"{path}: is {file_kind(mode)}, not a regular file")


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (links followed, as a ConfigMap's mount
    needs), refused when it holds more than ``limit`` of them; raises ``InputFileError``
    naming the file. Anything else is refused by what it is before a byte is read: a FIFO
    would hang the start until something wrote to it, a device may never end. The path is
    looked at first, so that a device is not even opened, then opened without blocking
    and looked at again, so that what is read is what was checked. Reads one byte past
    the limit, never the whole of a file that is too large (a runaway log)."""
    try:
        _refuse_unless_regular(path, os.stat(path).st_mode)
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise InputFileError(f"{path}: {error.strerror or error}") from None
    try:
        with os.fdopen(descriptor, "rb") as file:
            _refuse_unless_regular(path, os.fstat(file.fileno()).st_mode)
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


_YAML_SEPARATORS = b"\n,:[{-?"
_YAML_SEPARATORS_TEXT = dict.fromkeys(map(ord, _YAML_SEPARATORS.decode()))


def yaml_entries(text: bytes | str) -> int:
    """An upper bound on the nodes (scalars, sequences, mappings) YAML ``text`` may hold,
    found without parsing: each but the first follows a line break, a comma, a colon, an
    opening bracket or brace, a dash or a question mark, so this counts those."""
    if isinstance(text, bytes):
        return len(text) - len(text.translate(None, _YAML_SEPARATORS)) + 1
    return len(text) - len(text.translate(_YAML_SEPARATORS_TEXT)) + 1


def parse_document(text: bytes | str, source: str, *,
                   entries_max: int | None = None) -> object:
    """A YAML or JSON document as plain values (JSON is YAML), read by the safe loader
    without aliases or merge keys, a key given twice refused as ``{source}: {path} is
    given twice (lines 2 and 5)`` (``common.yamlfiles``, imported here, so that a command
    that reads no YAML, such as ``pyhami simulate`` on CSV files, does not import PyYAML).
    Raises ``InputFileError`` naming ``source``. ``entries_max``: refuse, before reading,
    text that may hold more entries (``yaml_entries``): reading YAML costs several
    microseconds an entry in one call that nothing can interrupt."""
    if entries_max is not None and (entries := yaml_entries(text)) > entries_max:
        raise InputFileError(
            f"{source}: up to {entries} YAML nodes (lines, commas, colons, brackets, dashes), "
            f"more than the {entries_max} read as YAML here: send it as JSON (with no key "
            "given twice)")
    from common.yamlfiles import (  # noqa: PLC0415 (when needed)
        DuplicateKeyError,
        YAMLError,
        load_document,
    )

    try:
        return load_document(text)
    except DuplicateKeyError as error:
        raise InputFileError(f"{source}: {error}") from None
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


def parse_pod_manifest(text: bytes | str, source: str, *,
                       yaml_entries_max: int | None = None) -> PodManifest:
    """A Pod manifest from YAML or JSON text.

    Any text gives a manifest or ``InputFileError``: aliases, merge keys, a key given
    twice (in JSON too), nesting deeper than the parser allows and numbers too long to
    convert are refused by name. ``yaml_entries_max``: text read as YAML is refused,
    unread, when it may hold more entries (``parse_document``'s ``entries_max``).
    """
    if text[:64].lstrip()[:1] in (b"{", "{"):
        manifest = _parse_json_pod(text, source)
        if manifest is not None:
            return manifest
    document = parse_document(text, source, entries_max=yaml_entries_max)
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
        manifest = _json_pod.decode(text)
    except msgspec.ValidationError as error:
        raise InputFileError(f"{source}: {error}") from None
    except msgspec.DecodeError:
        return None
    except RecursionError:
        raise InputFileError(f"{source}: nested too deeply") from None
    # msgspec keeps a key's last value; the YAML loader names a key given twice.
    return manifest if json_keys_distinct(text) else None


class _KeyGivenTwice(PyhamiError):
    """Stops the JSON reader at the first key given twice."""


def _distinct(pairs: list[tuple[str, object]]) -> dict[str, object]:
    mapping = dict(pairs)
    if len(mapping) < len(pairs):
        raise _KeyGivenTwice
    return mapping


def json_keys_distinct(text: bytes | str) -> bool:
    """Whether JSON text that msgspec read (which keeps a key's last value silently) gives
    no key twice in one object: False when one is, or when this reader cannot tell, so
    that the caller reads the text with ``parse_document``, which names the key, where
    it is and the line. Numbers are not converted; 8 us for a small Pod, 26 ms for 2 MB."""
    try:
        json.loads(text, object_pairs_hook=_distinct, parse_int=str, parse_float=str,
                   parse_constant=str)
    except (_KeyGivenTwice, ValueError, RecursionError):
        return False
    return True


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
