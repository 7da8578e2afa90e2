"""Every example runs on the default cluster spec and its loss falls."""
import os
import re

import pytest

from conftest import REPO, run_job


@pytest.mark.parametrize("example, steps", [
    ("linear_regression.py", 40), ("classifier.py", 100), ("word2vec.py", 200),
    ("cifar10.py", 60)])
def test_example_trains_on_localhost(example, steps):
    result = run_job(os.path.join(REPO, "examples", example), "cluster_specs/localhost", str(steps))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = [float(v) for v in re.findall(r"^\[localhost:worker:0\] step +\d+ +loss ([\d.]+)",
                                           result.stdout, re.M)]
    assert len(losses) >= 3, result.stdout[-3000:]
    assert losses[-1] < 0.7 * losses[0], f"loss did not fall: {losses}"
    assert "[localhost:worker:1]" in result.stdout
