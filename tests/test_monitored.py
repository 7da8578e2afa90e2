"""parallax.MonitoredTrainingSession: a TF1 script's MonitoredTrainingSession loop and hooks,
as written but for its first line (tests/workloads/monitored.py), on real jobs; and the fetch
structures its hooks make."""
import collections
import json
import os

import numpy as np
import pytest

import parallax
from conftest import WORKLOADS, run_job
from parallax.runtime import fetches

SCRIPT = os.path.join(WORKLOADS, "monitored.py")


def _job(out, run_option, mode, *more):
    # A hang would be named by the driver (the stall timeout) before the test's timeout.
    done = run_job(SCRIPT, "localhost:0,1", str(out), run_option, mode, *more,
                   env={"PARALLAX_TEST_STALL_SECS": "60"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return [json.load(open(os.path.join(out, f"worker_{i}.json"))) for i in (0, 1)]


@pytest.mark.job
def test_a_monitored_session_trains_as_the_runner_does_with_tensorflows_hooks(tmp_path):
    for folder in ("plain", "monitored"):
        os.makedirs(tmp_path / folder)
    plain = _job(tmp_path / "plain", "HYBRID", "plain")
    workers = _job(tmp_path / "monitored", "HYBRID", "steps")
    for worker in workers:
        # The user's hook: its calls in TensorFlow's order, its extra fetches each step.
        assert worker["calls"] == (["begin", "after_create_session"]
                                   + ["before_run", "after_run"] * 12 + ["end"])
        assert worker["steps"] == list(range(12))  # StopAtStepHook(last_step=12)
        for name, value in plain[0]["final"].items():  # the runner's loop, equal to one device
            np.testing.assert_allclose(worker["final"][name], value, rtol=1e-6, atol=1e-7)
    train = os.listdir(tmp_path / "monitored" / "train")
    # The chief's hooks: checkpoints every 5 steps and at the end, summaries, the graph.
    assert {"model.ckpt-5.index", "model.ckpt-10.index", "model.ckpt-12.index", "graph.pbtxt",
            "checkpoint"} <= set(train)
    assert any(name.startswith("events.out.tfevents") for name in train)


@pytest.mark.job
def test_one_worker_asking_to_stop_stops_all_after_the_same_step_and_a_restart_resumes(
        tmp_path):
    """AR: only the chief's (chief-only) hook asks to stop, after global step 7; the other
    worker stops after the same step instead of waiting for it in the next. PS: the same
    checkpoint_dir again, to step 15: every worker restores the latest checkpoint."""
    stopped = _job(tmp_path, "AR", "stop-one")
    assert [worker["steps"] for worker in stopped] == [list(range(8))] * 2
    resumed = _job(tmp_path, "PS", "steps", "15")
    assert [worker["steps"] for worker in resumed] == [list(range(8, 15))] * 2


class Hook:  # hooks are dict keys that do not compare
    pass


def test_fetch_structures_keep_their_keys_as_given():
    point = collections.namedtuple("Point", "x y")
    structure = {"caller": [1, (2, 3)], Hook(): {"step": 4}, Hook(): None,
                 "point": point(5, [6])}
    leaves, build = fetches.flatten(structure)
    assert leaves == [1, 2, 3, 4, None, 5, 6]
    rebuilt = build([leaf * 10 if leaf else leaf for leaf in leaves])
    assert list(rebuilt) == list(structure)  # the same keys, in their order
    assert rebuilt["caller"] == [10, (20, 30)] and rebuilt["point"] == point(50, [60])
    assert list(rebuilt.values())[1:3] == [{"step": 40}, None]


def test_tensorflows_own_arguments_only():
    with pytest.raises(parallax.ParallaxError, match=r"got \['config_proto', 'master'\]"):
        parallax.MonitoredTrainingSession("localhost:0", master="grpc://x", config_proto=None)
