"""Reading the user's input files: cluster descriptions and Pod manifests."""

from __future__ import annotations

from pathlib import Path

import msgspec
import yaml

from common.core import ClusterFile, PodManifest


class InputFileError(ValueError):
    """An input file that cannot be used; the message names the file and the problem."""


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise InputFileError(f"{path}: {error.strerror or error}") from None


def load_cluster(path: Path) -> ClusterFile:
    try:
        return msgspec.json.decode(_read(path), type=ClusterFile)
    except msgspec.DecodeError as error:
        raise InputFileError(f"{path}: {error}") from None


def parse_pod_manifest(text: bytes | str, source: str) -> PodManifest:
    """A Pod manifest from YAML or JSON text."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InputFileError(f"{source}: not YAML or JSON: {error}".replace("\n", " ")) from None
    if not isinstance(document, dict):
        raise InputFileError(f"{source}: expected a Pod manifest (a mapping)")
    kind = document.get("kind", "Pod")
    if kind != "Pod":
        raise InputFileError(f"{source}: kind is {kind!r}, expected 'Pod'")
    try:
        return msgspec.convert(document, PodManifest)
    except msgspec.ValidationError as error:
        raise InputFileError(f"{source}: {error}") from None


def load_pod(path: Path) -> PodManifest:
    return parse_pod_manifest(_read(path), str(path))
