"""Every example runs on the default cluster spec and its loss falls."""
import os
import re

import pytest

from conftest import REPO, run_job

pytestmark = pytest.mark.job


def _assert_trained(result):
    """The loss fell on the chief, and both workers trained."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = [float(v) for v in re.findall(r"^\[localhost:worker:0\] step +\d+ +loss ([\d.]+)",
                                           result.stdout, re.M)]
    assert len(losses) >= 3, result.stdout[-3000:]
    assert losses[-1] < 0.7 * losses[0], f"loss did not fall: {losses}"
    # Both workers trained: a synchronous step waits for each (and the driver for its exit).
    assert re.search(r"2 workers on 1 machine, (0 servers|1 server)\b", result.stdout), (
        result.stdout[-3000:])


@pytest.mark.parametrize("example, steps", [
    ("linear_regression.py", 40), ("classifier.py", 100), ("cifar10.py", 60)])
def test_example_trains_on_localhost(example, steps):
    _assert_trained(run_job(os.path.join(REPO, "examples", example), "cluster_specs/localhost",
                            str(steps)))


def test_word2vec_tutorial_trains_feeds_its_rows_writes_summaries_and_saves_through_the_runner(
        tmp_path):
    """The tutorial-style port, the README's example: its loss falls; feed_dict input, a loss
    summary the chief writes, similarity .eval() inside runner.as_default(),
    saver.save(runner, ...) on every worker (the chief writes the checkpoint, which loads into
    the single-device graph's variables)."""
    result = run_job(os.path.join(REPO, "examples", "word2vec.py"), "cluster_specs/localhost",
                     "200", str(tmp_path))
    _assert_trained(result)
    assert re.search(r"^\[localhost:worker:0\] nearest to 10: \d+", result.stdout, re.M)
    saved = re.findall(r"^\[localhost:worker:(\d)\] saved (\S+)$", result.stdout, re.M)
    assert sorted(saved) == [("0", str(tmp_path / "model.ckpt")),
                             ("1", str(tmp_path / "model.ckpt"))]
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1  # the chief's
    import tensorflow as tf  # only here: the other tests of this module start jobs
    reader = tf.train.load_checkpoint(str(tmp_path / "model.ckpt"))
    shapes = reader.get_variable_to_shape_map()
    assert shapes["Variable"] == [1000, 32] and shapes["Variable_1"] == [1000, 32]


@pytest.mark.parametrize("loop", ["runner", "monitored"])
def test_a_queue_based_pipeline_is_started_and_stopped_by_the_runner(tmp_path, loop):
    """string_input_producer over parallax.shard(files) and shuffle_batch, in a loop of the
    runner or of parallax.MonitoredTrainingSession (whose queue runners the runner runs, not
    TensorFlow's session a second time): no hang, each worker reads its own files, and close
    stops the queue runners without a traceback."""
    rng = __import__("numpy").random.RandomState(0)
    for part in range(4):
        x = rng.randn(50)
        lines = [f"{a:.5f},{3 * a + 1:.5f}" for a in x]
        (tmp_path / f"part-{part}.csv").write_text("\n".join(lines) + "\n")
    result = run_job(os.path.join(REPO, "tests", "workloads", "queue_input.py"), str(tmp_path),
                     *(["--monitored"] if loop == "monitored" else []), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[localhost:worker:0] files ['part-0.csv', 'part-2.csv']" in result.stdout
    assert "[localhost:worker:1] files ['part-1.csv', 'part-3.csv']" in result.stdout
    for worker in (0, 1):
        first, last = map(float, re.search(
            rf"\[localhost:worker:{worker}\] 60 steps, loss ([\d.]+) -> ([\d.]+); closed",
            result.stdout).groups())
        assert last < 0.3 * first
    output = result.stdout + result.stderr
    assert "CancelledError" not in output and "Traceback" not in output, output[-3000:]


def test_word2vec_trains_asynchronously(tmp_path):
    """Config(sync=False): each worker applies its own gradients to the servers as they come;
    the loss still falls, and the plan says the training is asynchronous."""
    result = run_job(os.path.join(REPO, "examples", "word2vec.py"), "cluster_specs/localhost",
                     "200", str(tmp_path), "--async")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "asynchronous: each worker applies its own gradients" in result.stdout
    assert "parameter server (asynchronous)" in result.stdout
    losses = [float(v) for v in re.findall(r"^\[localhost:worker:0\] step +\d+ +loss ([\d.]+)",
                                           result.stdout, re.M)]
    assert len(losses) >= 3 and losses[-1] < 0.7 * losses[0], losses
