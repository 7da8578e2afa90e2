#!/usr/bin/env bash
# The main demo on a fresh machine: installs what is missing, then trains the CNN classifier
# on two local workers (cluster_specs/localhost) and prints its falling loss.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/scripts/bootstrap.sh"
venv="${PARALLAX_VENV:-$repo/.venv}"
cd "$repo"
exec "$venv/bin/python" examples/classifier.py "${@:-cluster_specs/localhost}"
