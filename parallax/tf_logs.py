"""TensorFlow's log lines on standard error: a quiet start, and lines dropped while a block runs.

TensorFlow's C++ libraries log through absl while they load, before they read
TF_CPP_MIN_LOG_LEVEL: oneDNN's notice, the CUDA stub's, and absl's own warning that it is not
initialized, once for each library holding a copy of absl. The level only filters what comes
later (on a machine without CUDA drivers, cuInit's failure, logged as an ERROR). So importing
parallax sets the level and loads TensorFlow with the lines below it dropped; the processes
Parallax starts import parallax first, and inherit the driver's environment, remote ones too
(runner.ssh forwards TF_* and PARALLAX_*)."""
from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import tempfile
from typing import Optional

# FATAL only: cuInit's failure is an ERROR. TensorFlow's errors that matter reach the user as
# the exceptions of the ops that failed.
QUIET_LEVEL = "3"
TF_LOGS_VARIABLE = "PARALLAX_TF_LOGS"  # '1': TensorFlow's logs as TensorFlow writes them
_SEVERITIES = b"IWEF"  # absl's, lowest first: a line starts with its letter, e.g. 'I0000 '
_ABSL_NOT_INITIALIZED = rb"WARNING: All log messages before absl::InitializeLog\(\)"


def quiet_start() -> None:
    """Sets TensorFlow's C++ log level (unless the user did, or asked for TensorFlow's logs),
    and imports TensorFlow without the load-time lines that level would have dropped."""
    if os.environ.get(TF_LOGS_VARIABLE) == "1":
        return
    below = lines_below(os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", QUIET_LEVEL))
    with stderr_lines_dropped(below) if below else contextlib.nullcontext():
        importlib.import_module("tensorflow")


def lines_below(level: str) -> Optional[re.Pattern]:
    """absl's lines of a severity below TF_CPP_MIN_LOG_LEVEL's, with absl's warning that it logs
    before it is initialized; None where the level drops nothing."""
    dropped = _SEVERITIES[:int(level)] if level.isdigit() else b""
    if not dropped:
        return None
    return re.compile(rb"^(?:[" + dropped + rb"]\d{4} |" + _ABSL_NOT_INITIALIZED + rb")")


@contextlib.contextmanager
def stderr_lines_dropped(pattern: re.Pattern):
    """Standard error without the lines `pattern` finds while the block runs (the C++ side
    writes to file descriptor 2, not through sys.stderr); every other line written meanwhile is
    kept, in order, once the block is over."""
    try:
        saved = os.dup(2)
    except OSError:  # a process without standard error (a daemon's): nothing to keep clean
        yield
        return
    flush = sys.stderr.flush if sys.stderr is not None else (lambda: None)
    flush()
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = b"".join(line for line in captured if not pattern.search(line))
            while kept:
                kept = kept[os.write(2, kept):]
