#!/usr/bin/env bash
# Runs the test suite on a fresh machine: installs what is missing first (scripts/bootstrap.sh).
# Extra arguments go to pytest, e.g. scripts/test.sh tests/test_resources.py -x
# Two pytest-xdist workers share the two cores (PARALLAX_TEST_WORKERS, 0 for one process): a
# job's processes spend much of their time waiting on each other, which the other worker's
# tests fill; tests/conftest.py keeps a module's tests, and the emulated cluster's, on one
# worker.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/stack.sh"
bash "$repo/scripts/bootstrap.sh"
cd "$repo"
exec "$venv/bin/python" -m pytest -n "${PARALLAX_TEST_WORKERS:-2}" "${@:-tests}"
