"""pyhami as it ships: the wheel and the sdist, installed into a fresh virtual environment.

The rest of the suite runs from an editable install, which sees every source file
whatever the packaging says; this test builds the distributions with
``scripts/build-dist.sh`` (the Dockerfile's command), checks that they hold every module
of the source tree and nothing of the repository's harness, and runs ``pyhami --version``,
``pyhami demo`` and ``pyhami bench cluster`` (which names the harness's command) from a
virtual environment that has only the wheel, in a folder outside the repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from pyhami.natsserver import free_port
from tests.paths import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
# Generous: pip fetches the dependencies when its cache is cold.
INSTALL_TIMEOUT_S = 900

pytestmark = [pytest.mark.slow, pytest.mark.timeout(INSTALL_TIMEOUT_S + 300)]


def shipped_sources() -> set[str]:
    """Every module and marker file of the packages, found on disk, as wheel paths."""
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    roots = [REPO / pattern.rstrip("*") for pattern in include]
    found: set[str] = set()
    for root in roots:
        for path in root.rglob("*"):
            if path.suffix in (".py", ".typed") and "__pycache__" not in path.parts:
                found.add(path.relative_to(REPO).as_posix())
    return found


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run([str(REPO / "scripts" / "build-dist.sh"), str(out)],
                           capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                           env={**os.environ, "PYTHON": sys.executable}, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    return out


def one(folder: Path, pattern: str) -> Path:
    matches = sorted(folder.glob(pattern))
    assert len(matches) == 1, f"expected one {pattern} in {folder}, found {matches}"
    return matches[0]


def test_the_wheel_holds_every_module_of_the_source_tree(dist: Path) -> None:
    wheel = one(dist, f"pyhami-{PROJECT['version']}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    wanted = shipped_sources()
    assert {"common/core/__init__.py", "common/core/decide.py"} <= wanted
    assert wanted - names == set(), "modules missing from the wheel"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as archive:
        assert "pyhami = pyhami.cli:main" in archive.read(entry_points).decode()


def harness_in(names: set[str]) -> set[str]:
    """The paths among ``names`` that need a checkout: the harness's package, the
    micro-benchmarks, the control plane's runner and the cluster benchmark wherever they
    would come back."""
    return {name for name in names
            if name.split("/", 1)[0] in ("harness", "benchmarks")
            or "controlplane" in name or "bench_cluster" in name}


def test_the_wheel_holds_no_harness(dist: Path) -> None:
    wheel = one(dist, f"pyhami-{PROJECT['version']}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    # The check itself sees the harness where it is: in the source tree.
    harness_sources = {path.relative_to(REPO).as_posix()
                       for path in (REPO / "harness").rglob("*.py")}
    assert {"harness/controlplane.py", "harness/bench_cluster.py"} <= harness_in(
        harness_sources)
    assert harness_in(names) == set(), "the wheel holds what needs a checkout"
    assert harness_sources & names == set()


def test_the_sdist_holds_every_module_and_the_build_files(dist: Path) -> None:
    sdist = one(dist, f"pyhami-{PROJECT['version']}.tar.gz")
    prefix = f"pyhami-{PROJECT['version']}/"
    with tarfile.open(sdist) as archive:
        names = {member.name.removeprefix(prefix) for member in archive.getmembers()}
    assert shipped_sources() | {"pyproject.toml", "README.md"} <= names


def test_the_wheel_alone_runs_version_and_the_demo(dist: Path, tmp_path: Path) -> None:
    wheel = one(dist, "pyhami-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    clean_env = {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/"),
                 "COLUMNS": "120"}
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         str(wheel)], capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
        env=clean_env, check=False)
    assert installed.returncode == 0, installed.stderr[-3000:]

    def pyhami(*args: str) -> subprocess.CompletedProcess[str]:
        # Run from an empty folder: nothing of the source tree is importable there.
        return subprocess.run([str(env_dir / "bin" / "pyhami"), *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, env=clean_env,
                              check=False)

    version = pyhami("--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"pyhami {PROJECT['version']}"

    demo = pyhami("demo", "--nats-port", str(free_port()))
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "mutex was waiting and is now placed" in demo.stdout
    # Installed, the cluster benchmark's checkout is nowhere: one line naming its command.
    cluster = pyhami("bench", "cluster", "--nodes", "2")
    assert (cluster.returncode, cluster.stdout) == (2, "")
    assert cluster.stderr.startswith("pyhami bench cluster needs a checkout of the repository: "
                                     "run scripts/bench-cluster there"), cluster.stderr
    assert len(cluster.stderr.splitlines()) == 1
    located = subprocess.run(
        [str(python), "-c", "import common.core, pyhami; print(common.core.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env, check=False, timeout=60)
    assert str(env_dir) in located.stdout, located.stdout + located.stderr
