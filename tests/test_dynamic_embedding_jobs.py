"""The dynamic embeddings' example as its users run it: on one device in a plain session, and
under `python -m parallax.verify` on two machines of two workers, its two tables on the servers
compared with one device id by id (examples/dynamic_embeddings.py)."""
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.job
EXAMPLE = os.path.join(REPO, "examples", "dynamic_embeddings.py")


def test_the_example_trains_on_one_device_and_verifies_against_it_distributed():
    single = subprocess.run([sys.executable, EXAMPLE, "--single", "--steps", "10"], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    steps = [line.split() for line in single.stdout.splitlines() if line.startswith("step")]
    assert [int(words[1]) for words in steps] == [1, 10]
    assert int(steps[-1][-1]) > int(steps[0][-1]) > 0  # ids keep coming

    verified = subprocess.run(
        [sys.executable, "-m", "parallax.verify", EXAMPLE, "--resources",
         "127.0.0.1:0,1;127.0.0.2:0,1", "--steps", "10"], cwd=REPO, capture_output=True,
        text=True, timeout=600)
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    report = verified.stdout[verified.stdout.rindex("\nvariable "):]
    for name in ("embeddings/embedding", "embeddings/embedding/Adagrad", "embeddings/keys",
                 "first_order/embedding", "first_order/keys", "deep/kernel"):
        assert f"\n{name} " in report, report
    assert "PASS: all 15 variables of the 4 workers" in report, report
