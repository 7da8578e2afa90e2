#!/usr/bin/env bash
# Creates (or refreshes) the project's virtualenv with everything Parallax needs, from nothing but
# Python 3.11. Safe to run again: installed packages are kept, and pip's wheel cache makes the
# Horovod source build (about 4 minutes on 2 cores) a one-time cost per machine.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${PARALLAX_VENV:-$repo/.venv}"
python="${PYTHON:-python3}"

# A bare Debian Python lacks venv, and Horovod compiles C++: install them when missing.
need=()
"$python" -c "import venv, ensurepip" 2>/dev/null || need+=(python3-venv)
command -v g++ >/dev/null || need+=(g++)
if [ ${#need[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || { echo "bootstrap: please install ${need[*]}" >&2; exit 1; }
    echo "bootstrap: installing ${need[*]} with apt-get" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ ! -x "$venv/bin/python" ]; then
    echo "bootstrap: creating virtualenv $venv" >&2
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

"${pip[@]}" install --quiet --upgrade "pip>=23" "setuptools<70" wheel
"${pip[@]}" install --quiet -r "$repo/requirements.txt"

if ! "$venv/bin/python" -c "import horovod.tensorflow" 2>/dev/null; then
    # Horovod must compile against the TensorFlow just installed, hence no build isolation.
    # cmake comes from PyPI so a machine without it still builds.
    "${pip[@]}" install --quiet "cmake>=3.13,<4"
    echo "bootstrap: building horovod==0.28.1 (CPU, gloo; first time about 4 minutes)" >&2
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
        "${pip[@]}" install --quiet --no-build-isolation horovod==0.28.1
fi

"${pip[@]}" install --quiet --no-deps --no-build-isolation -e "$repo"
TF_CPP_MIN_LOG_LEVEL=2 "$venv/bin/python" -c "import parallax, horovod.tensorflow" >/dev/null
echo "bootstrap: ready ($venv)" >&2
