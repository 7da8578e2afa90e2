"""runner.process on real local processes."""
import sys
import time

import psutil
import pytest

from runner.process import JobFailed, ProcessSpec, run_processes

pytestmark = pytest.mark.job


def test_a_job_past_its_timeout_is_stopped_whole():
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    specs = [ProcessSpec(f"sleeper{i}", sleeper, env={}) for i in range(2)]
    started = time.monotonic()
    with pytest.raises(JobFailed, match="timed out") as failure:
        run_processes(specs, timeout=1.0)
    assert time.monotonic() - started < 10
    assert failure.value.exit_code == 124
    children = psutil.Process().children(recursive=True)
    assert not [c for c in children if "time.sleep(60)" in " ".join(c.cmdline())]


def test_a_job_within_its_timeout_succeeds():
    quick = [sys.executable, "-c", "print('done')"]
    run_processes([ProcessSpec("quick", quick, env={})], timeout=60)
