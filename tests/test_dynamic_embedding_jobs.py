"""The dynamic embeddings' example as its users run it: on one device in a plain session, and
under `python -m parallax.verify` on two machines of two workers, its two tables on the servers
compared with one device id by id; and a job of it resumed from its checkpoint
(examples/dynamic_embeddings.py)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

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


def _train(ckpt_dir, steps, *more):
    done = subprocess.run([sys.executable, EXAMPLE, "--resources", "127.0.0.1:0,1;127.0.0.2:0,1",
                           "--steps", str(steps), "--ckpt-dir", str(ckpt_dir),
                           "--save-steps", "5", *more], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def _tables(ckpt_dir, step):
    """Each table's rows by id, and the other variables, of the checkpoint of `step`."""
    path = str(ckpt_dir / f"model-{step}")
    values = {}
    for table in ("embeddings", "first_order"):
        keys = tf.train.load_variable(path, f"{table}/keys-keys")
        rows = tf.train.load_variable(path, f"{table}/keys-values")
        order = np.argsort(keys)
        values[f"{table}/keys"] = keys[order]
        for name in (f"{table}/embedding", f"{table}/embedding/Adagrad"):
            values[name] = tf.train.load_variable(path, name)[rows[order]]
    for name in ("deep/kernel", "out/kernel", "global_step"):
        values[name] = tf.train.load_variable(path, name)
    return values


def test_a_job_resumed_from_its_checkpoint_ends_as_the_job_run_through(tmp_path):
    """Parallax's checkpoints of the example (4 workers, 2 servers): 15 steps run through,
    and 10 steps then 5 more resumed from the checkpoint of step 10 (its tables' keys, rows,
    slots and the input's position), end bit for bit alike. The metrics file has the ids each
    server holds."""
    metrics = tmp_path / "metrics.jsonl"
    _train(tmp_path / "through", 15, "--metrics-file", str(metrics))
    _train(tmp_path / "resumed", 10)
    output = _train(tmp_path / "resumed", 15)
    assert "resumed from checkpoint" in output, output[-3000:]
    through, resumed = _tables(tmp_path / "through", 15), _tables(tmp_path / "resumed", 15)
    assert len(through["embeddings/keys"]) > 1000
    for name, value in through.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)
    held = [json.loads(line) for line in metrics.read_text().splitlines()][-1]
    for table in ("embeddings", "first_order"):
        on_servers = [held[f"{table} ids on server {server}"] for server in (0, 1)]
        assert 0 < min(on_servers) and sum(on_servers) <= len(through[f"{table}/keys"]), held
