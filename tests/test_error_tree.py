"""Every exception the project defines derives from the one root, so none can miss it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from common.core.errors import PyhamiError

PACKAGES = ("common", "agent", "scheduler", "pyhami")


def project_exceptions() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        for module_info in pkgutil.walk_packages(package.__path__, f"{name}."):
            module = importlib.import_module(module_info.name)
            found.extend(
                value for value in vars(module).values()
                if inspect.isclass(value) and issubclass(value, BaseException)
                and value.__module__ == module.__name__)
    return found


def test_every_project_exception_derives_from_the_root() -> None:
    exceptions = project_exceptions()
    assert len(exceptions) > 15, "the walk found the project's exceptions"
    outside = sorted(f"{error.__module__}.{error.__qualname__}" for error in exceptions
                     if not issubclass(error, PyhamiError))
    assert outside == []
