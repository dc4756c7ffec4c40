#!/usr/bin/env bash
# Installs pyhami with its test tools into .venv and runs every check and test.
set -euo pipefail
cd "$(dirname "$0")/.."
# The TLS tests make their certificates with the openssl command.
if ! command -v openssl >/dev/null; then
  apt-get update -qq && apt-get install -y -qq openssl >/dev/null
fi
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
# The end-to-end suite (tests/e2e) runs a real etcd, kube-apiserver and kube-scheduler,
# built from Go modules into a cache outside the repository: many minutes the first time
# on a machine, seconds after. Without Go the suite skips itself (fails under CI=true).
if command -v go >/dev/null || [[ -x /usr/local/go/bin/go ]]; then
  scripts/build-control-plane.sh
fi
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache
.venv/bin/pytest "$@"
