#!/usr/bin/env bash
# Runs the test suite on a fresh machine: installs what is missing first (scripts/bootstrap.sh).
# Extra arguments go to pytest, e.g. scripts/test.sh tests/test_resources.py -x
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/stack.sh"
bash "$repo/scripts/bootstrap.sh"
cd "$repo"
exec "$venv/bin/python" -m pytest "${@:-tests}"
