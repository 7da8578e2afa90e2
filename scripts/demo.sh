#!/usr/bin/env bash
# The main demo on a fresh machine: installs what is missing, then trains the CNN classifier
# on two local workers (cluster_specs/localhost) and prints its falling loss.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/stack.sh"
bash "$repo/scripts/bootstrap.sh"
cd "$repo"
exec "$venv/bin/python" examples/classifier.py "${@:-cluster_specs/localhost}"
