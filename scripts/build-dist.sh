#!/usr/bin/env bash
# Builds pyhami's sdist, then its wheel from that sdist, into OUT_DIR (default dist/): the
# files the packaging test installs and the Dockerfile ships.
#   scripts/build-dist.sh [OUT_DIR]
# PYTHON picks the interpreter (default python3); it needs the `build` package.
#
# In a git checkout the build runs on a copy of the files git tracks or would track, so
# nothing a previous build left behind (build/, *.egg-info) can slip into the
# distributions: they hold what a fresh clone holds.
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)"
source_dir="."
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  source_dir="$(mktemp -d "${TMPDIR:-/tmp}/pyhami-dist.XXXXXX")"
  trap 'rm -rf "${source_dir}"' EXIT
  git ls-files -z --cached --others --exclude-standard \
    | xargs -0 -I{} sh -c 'test -e "{}" && printf "%s\0" "{}"' \
    | tar --null -T - -cf - | tar -xf - -C "${source_dir}"
fi
"${PYTHON:-python3}" -m build --outdir "${out}" "${source_dir}"
