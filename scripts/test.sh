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
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache
.venv/bin/pytest "$@"
