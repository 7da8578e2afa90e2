#!/usr/bin/env bash
# Creates (or refreshes) the project's virtualenv with everything Parallax needs, from nothing but
# Python 3.11, for the stack PARALLAX_STACK names (scripts/stack.sh). Safe to run again:
# installed packages are kept, and pip's wheel cache makes the Horovod stack's source build
# (about 4 minutes on 2 cores) a one-time cost per machine.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/stack.sh"
python="${PYTHON:-python3}"

# A bare Debian Python lacks venv, and Horovod compiles C++: install them when missing.
need=()
"$python" -c "import venv, ensurepip" 2>/dev/null || need+=(python3-venv)
if [ "$stack" = horovod ] && ! command -v g++ >/dev/null; then need+=(g++); fi
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
"${pip[@]}" install --quiet -r "$requirements"

if [ "$stack" = tensorflow ]; then
    # A Horovod left from the other stack was built against another TensorFlow.
    if "${pip[@]}" show --quiet horovod >/dev/null 2>&1; then
        echo "bootstrap: uninstalling horovod (the $stack stack has none)" >&2
        "${pip[@]}" uninstall --quiet --yes horovod
    fi
elif ! "$venv/bin/python" -c "import horovod.tensorflow" 2>/dev/null; then
    # Horovod must compile against the TensorFlow just installed, hence no build isolation.
    echo "bootstrap: building horovod==0.28.1 (CPU, gloo; first time about 4 minutes)" >&2
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
        "${pip[@]}" install --quiet --no-build-isolation horovod==0.28.1
fi

"${pip[@]}" install --quiet --no-deps --no-build-isolation -e "$repo"
TF_CPP_MIN_LOG_LEVEL=2 "$venv/bin/python" -c "import parallax" >/dev/null
echo "bootstrap: ready ($stack stack, $venv)" >&2
