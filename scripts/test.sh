#!/usr/bin/env bash
# Runs the test suite on a fresh machine: installs what is missing first (scripts/bootstrap.sh).
# Extra arguments go to pytest, e.g. scripts/test.sh tests/test_resources.py -x
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/scripts/bootstrap.sh"
venv="${PARALLAX_VENV:-$repo/.venv}"
cd "$repo"
exec "$venv/bin/python" -m pytest "${@:-tests}"
