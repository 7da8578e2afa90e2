# Sourced by the scripts: which stack (PARALLAX_STACK) and which virtualenv (PARALLAX_VENV).
#   tensorflow (the default): TensorFlow 2.21, its own collective ops; nothing to compile.
#   horovod: TensorFlow 2.18.1 with Horovod 0.28.1 built from source (the oldest TensorFlow
#            supported; Horovod builds against no later one), in .venv-horovod.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
stack="${PARALLAX_STACK:-tensorflow}"
case "$stack" in
    tensorflow) requirements="$repo/requirements.txt"; default_venv="$repo/.venv" ;;
    horovod) requirements="$repo/requirements-horovod.txt"; default_venv="$repo/.venv-horovod" ;;
    *) echo "PARALLAX_STACK=$stack: expected tensorflow (the default) or horovod" >&2; exit 2 ;;
esac
venv="${PARALLAX_VENV:-$default_venv}"
