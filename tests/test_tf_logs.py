"""TensorFlow starts quietly in every process that imports parallax first: none of the lines
its C++ libraries log while they load (oneDNN's, the CUDA stub's, absl's), nor cuInit's failure
on a machine without CUDA drivers; PARALLAX_TF_LOGS=1 brings them back. (The processes of a
job: test_launch's first job.)"""
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO
from parallax import tf_logs

# What TensorFlow 2.18-2.21 logs when it loads, and at its first op on a CPU-only machine.
START_UP_LINES = re.compile(r"^[IWE]\d{4} .*\] |^WARNING: All log messages before absl",
                            re.MULTILINE)
_IMPORT_AND_RUN = ("import sys, parallax, tensorflow as tf\n"
                   "tf.constant(1.0) + 1.0\n"
                   "print('the script ran', file=sys.stderr)\n")


def _stderr(**env):
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("TF_CPP_MIN_LOG_LEVEL", "PARALLAX_TF_LOGS")}
    result = subprocess.run([sys.executable, "-c", _IMPORT_AND_RUN], capture_output=True,
                            text=True, timeout=300, cwd=REPO, env={**environment, **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


@pytest.mark.job
def test_tensorflow_starts_quietly_unless_its_logs_are_asked_for():
    quiet = _stderr()
    assert "the script ran" in quiet and not START_UP_LINES.search(quiet), quiet
    assert START_UP_LINES.search(_stderr(PARALLAX_TF_LOGS="1"))


def test_the_load_time_lines_dropped_are_those_below_the_level():
    lines = [b"WARNING: All log messages before absl::InitializeLog() is called are written to "
             b"STDERR\n", b"I0000 00:00:1796661916.609102    9770 port.cc:153] oneDNN\n",
             b"W0000 00:00:1796661916.7    9770 a.cc:1] warned\n",
             b"E0000 00:00:1796661917.794807    9770 cuda_platform.cc:52] failed call to cuInit\n",
             b"a line of the script's own\n"]

    def kept(level):
        below = tf_logs.lines_below(level)
        return len([line for line in lines if below is None or not below.search(line)])

    assert [kept(level) for level in ("0", "1", "2", "3", "", "x")] == [5, 3, 2, 1, 5, 5]
