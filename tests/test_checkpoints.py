"""A checkpoint holds the input's position: a job killed at any step and resumed ends with the
variables of the job that was not interrupted, bit for bit; and a checkpoint restores onto
another number of workers, machines and run option, its input going on where the combined
batches stopped, so that the chain of jobs is one device trained straight through
(docs/checkpoints.md, tests/workloads/resumable.py)."""
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import psutil
import pytest
import tensorflow as tf

from conftest import REPO, WORKLOADS, run_job
from parallax.runtime import input_position

pytestmark = pytest.mark.job

SCRIPT = os.path.join(WORKLOADS, "resumable.py")
ONE_MACHINE, TWO_MACHINES = "127.0.0.1:0,1", "127.0.0.1:0,1;127.0.0.2:0,1"
THREE_MACHINES = TWO_MACHINES + ";127.0.0.3:0,1"
STEPS = 15
# name: run option, input, loop, what is killed (each row a job killed once, and the same job
# run through)
KILLS = {
    "AR-both-worker": ("AR", "both", "plain", "worker"),
    "PS-both-host": ("PS", "both", "plain", "host"),
    "HYBRID-dataset-monitored-driver": ("HYBRID", "dataset", "monitored", "driver"),
}


def _arguments(folder, run_option, input_kind, loop, resources=TWO_MACHINES, steps=STEPS):
    return ["--resources", resources, "--run-option", run_option, "--ckpt",
            str(folder / "ckpt"), "--out", str(folder / "a.npz"), "--steps", str(steps),
            "--input", input_kind, "--loop", loop]


def _start(arguments, token):
    env = dict(os.environ, PARALLAX_TEST_TOKEN=token)
    env.pop("PARALLAX_ROLE", None)
    return subprocess.Popen([sys.executable, SCRIPT, *arguments], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _job_processes(token, machine=None):
    """The job's processes (those of loopback machine `machine`: its servers, its workers
    and their watchdogs)."""
    found = []
    for process in psutil.process_iter():
        try:
            environ = process.environ()
            if environ.get("PARALLAX_TEST_TOKEN") != token or "PARALLAX_ROLE" not in environ:
                continue
            cluster = json.loads(environ.get("PARALLAX_CLUSTER", "{}"))
            if machine is None or (environ["PARALLAX_ROLE"] == "server" and int(
                    environ.get("PARALLAX_SERVER_INDEX", -1)) == machine) or (
                    environ["PARALLAX_ROLE"] == "worker"
                    and cluster["worker_machines"][cluster["worker_id"]] == machine):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, KeyError):
            continue
    return found


def _wait_for_resume_point(ckpt_dir, step, driver, seconds=240):
    """Until a job in `ckpt_dir` would resume from `step` or later: the chief's record is
    written before every worker has saved its input's position (a lagging worker's save
    comes later), and a checkpoint some worker did not finish is passed over."""
    deadline = time.monotonic() + seconds
    while True:
        point, _ = input_position.resume_point(ckpt_dir) if os.path.isdir(ckpt_dir) else (
            None, None)
        if point is not None and int(point.rsplit("-", 1)[1]) >= step:
            return
        assert driver.poll() is None, driver.stdout.read()[-3000:]
        assert time.monotonic() < deadline, f"no checkpoint of step {step} in {ckpt_dir}"
        time.sleep(0.05)


def _killed_and_resumed(folder, run_option, input_kind, loop, victim):
    """The job of the arguments killed once after its checkpoint of step 6, resumed (by
    max_restarts, or run again where its driver was killed); its output."""
    arguments = _arguments(folder, run_option, input_kind, loop)
    if victim == "worker":  # the last worker kills itself at step 7
        done = run_job(SCRIPT, *arguments, "--kill-at", "3:7", "--max-restarts", "1")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout + done.stderr
    token = uuid.uuid4().hex
    restarts = ["--max-restarts", "1"] if victim == "host" else []
    driver = _start(arguments + restarts + ["--pause", "0.3"], token)
    _wait_for_resume_point(str(folder / "ckpt"), 6, driver)
    if victim == "host":  # every process of the second machine
        victims = _job_processes(token, machine=1)
        assert len(victims) >= 3, victims
    else:
        victims = [psutil.Process(driver.pid)]
    for process in victims:
        process.send_signal(signal.SIGKILL)
    output = driver.communicate(timeout=300)[0]
    deadline = time.monotonic() + 60
    while _job_processes(token):  # without its driver, a job stops itself
        assert time.monotonic() < deadline, _job_processes(token)
        time.sleep(0.2)
    if victim == "driver":
        assert driver.returncode == -signal.SIGKILL
        done = run_job(SCRIPT, *arguments)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        output += done.stdout + done.stderr
    else:
        assert driver.returncode == 0, output[-5000:]
    return output


@pytest.mark.parametrize("row", list(KILLS))
def test_a_job_killed_and_resumed_ends_bit_identical(row, tmp_path):
    run_option, input_kind, loop, victim = KILLS[row]
    through, killed = tmp_path / "through", tmp_path / "killed"
    done = run_job(SCRIPT, *_arguments(through, run_option, input_kind, loop))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = _killed_and_resumed(killed, run_option, input_kind, loop, victim)
    starts = [int(line.split()[-1]) for line in output.splitlines()
              if "worker 0 starts at step" in line]
    assert starts[0] == 0 and max(starts) >= 6, output[-3000:]
    expected, resumed = np.load(through / "a.npz"), np.load(killed / "a.npz")
    assert sorted(expected.files) == sorted(resumed.files)
    differences = {name: float(np.max(np.abs(resumed[name] - expected[name])))
                   for name in expected.files}
    print(f"{row}: killed the {victim}, max |diff| {max(differences.values())}")
    assert differences == {name: 0.0 for name in expected.files}, differences


# from -> to: resources, run option, the step it trains to (the combined batch stays 12)
CHAIN = [("4 workers HYBRID on 2 machines", TWO_MACHINES, "HYBRID", 6),
         ("2 workers AR on 1", ONE_MACHINE, "AR", 9),
         ("2 workers AR on 1, again", ONE_MACHINE, "AR", 12),
         ("6 workers PS on 3", THREE_MACHINES, "PS", 18),
         ("4 workers AUTO, split tables", TWO_MACHINES, "AUTO", 24)]


def test_a_checkpoint_restores_onto_other_clusters_as_one_device(tmp_path):
    """Each job resumes the last one's checkpoint: its variables start equal to it, and its
    input goes on; the chain ends as one device trained 24 steps. The checkpoint then loads
    without Parallax, into the graph of its meta graph, with a plain Saver."""
    ckpt = tmp_path / "ckpt"
    previous = None
    for index, (name, resources, run_option, steps) in enumerate(CHAIN):
        arguments = ["--resources", resources, "--run-option", run_option, "--ckpt",
                     str(ckpt), "--out", str(tmp_path / f"{index}.npz"), "--steps", str(steps)]
        done = run_job(SCRIPT, *arguments, *(["--split"] if run_option == "AUTO" else []))
        assert done.returncode == 0, name + done.stdout[-3000:] + done.stderr[-3000:]
        if previous is not None:
            started = np.load(tmp_path / f"{index}.npz.start.npz")
            saved = tf.train.load_checkpoint(previous)
            for variable in started.files:
                np.testing.assert_array_equal(started[variable], saved.get_tensor(variable),
                                              err_msg=f"{name}: {variable}")
            if "again" not in name:
                assert "parallax.shard's input goes on at its element" in done.stdout, (
                    done.stdout[-3000:])
        previous = tf.train.latest_checkpoint(str(ckpt))
    one = run_job(SCRIPT, "--one-device", "--out", str(tmp_path / "one.npz"), "--steps", "24")
    assert one.returncode == 0, one.stderr[-3000:]
    expected, chained = np.load(tmp_path / "one.npz"), np.load(tmp_path / f"{index}.npz")
    for variable in expected.files:
        np.testing.assert_allclose(chained[variable], expected[variable], rtol=1e-5, atol=1e-6,
                                   err_msg=variable)
    graph = tf.Graph()
    with graph.as_default():
        saver = tf.compat.v1.train.import_meta_graph(previous + ".meta")
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        with tf.compat.v1.Session(graph=graph) as session:
            saver.restore(session, previous)
            loaded = session.run(variables)
    assert sorted(loaded) == sorted(expected.files)
    for variable, value in loaded.items():
        np.testing.assert_array_equal(value, chained[variable], err_msg=variable)
