"""The installed pyhami's version, as its package metadata records it."""

from __future__ import annotations

import importlib.metadata


def package_version() -> str:
    """``unknown`` when run from a source tree that was never installed."""
    try:
        return importlib.metadata.version("pyhami")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
