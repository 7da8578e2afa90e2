"""Data-parallel training must be numerically single-device training on the combined batch."""
import os

import numpy as np
import pytest

from conftest import WORKLOADS, load_workload, run_job

equivalence = load_workload("equivalence")


@pytest.fixture(scope="module", params=["dense", "sparse", "keras"])
def job(request, tmp_path_factory):
    """One 2-worker job per model trains every optimizer configuration."""
    out = tmp_path_factory.mktemp(request.param)
    result = run_job(os.path.join(WORKLOADS, "equivalence.py"), "--model", request.param,
                     "--resources", "localhost:0,1", "--out", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return request.param, out


@pytest.mark.parametrize("config", equivalence.CONFIGS)
def test_two_workers_equal_single_device(job, config):
    model, out = job
    expected, expected_steps = equivalence.train_single_device(
        model, config, 2 * equivalence.BATCH_PER_WORKER)
    assert expected_steps == list(range(1, equivalence.STEPS + 1))
    for worker in (0, 1):
        saved = np.load(out / f"{config}.worker{worker}.npz")
        assert saved["global_steps"].tolist() == expected_steps, "global_step must advance by 1"
        names = {k[len("var/"):] for k in saved.files if k.startswith("var/")}
        assert names == set(expected), f"worker {worker} has other variables than single-device"
        for name, value in expected.items():
            np.testing.assert_allclose(saved[f"var/{name}"], value, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{config}: {name} on worker {worker}")


def test_sum_aggregation_is_single_device_on_the_summed_loss(tmp_path):
    """average_dense/average_sparse=False sums worker gradients: with two workers that is the
    gradient of twice the mean loss on the combined batch."""
    result = run_job(os.path.join(WORKLOADS, "equivalence.py"), "--model", "sparse", "--sum",
                     "--configs", "sgd", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    expected, _ = equivalence.train_single_device(
        "sparse", "sgd", 2 * equivalence.BATCH_PER_WORKER, loss_scale=2.0)
    saved = np.load(tmp_path / "sgd.worker1.npz")
    for name, value in expected.items():
        np.testing.assert_allclose(saved[f"var/{name}"], value, rtol=1e-4, atol=1e-5,
                                   err_msg=name)
