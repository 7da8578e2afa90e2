"""Slurm: the allocation's hosts and tasks from Slurm's environment (parsers fuzzed like the
resource parser), and jobs launched as job steps with srun on a real Slurm (Debian's slurm-wlm:
slurmctld here, one slurmd per emulated host, scripts/slurm_cluster.sh)."""
import os
import random
import re
import subprocess
import sys
import time

import pytest

from conftest import REPO, WORKLOADS
from emulated import STATE, assert_equals_single_device, assert_hosts_idle, cluster  # noqa: F401
from emulated import pytestmark as on_emulated_hosts
from runner import Host, ResourceError, load_resources
from runner.slurm import (SrunConfig, allocation_hosts, expand_nodelist,
                          expand_tasks_per_node)

SLURM_SCRIPT = os.path.join(REPO, "scripts", "slurm_cluster.sh")
FILTERED = re.compile(r"I0000|oneDNN|cpu_feature|AVX|WARNING: All log|rebuild TensorFlow")


def test_nodelists_and_tasks_per_node_in_slurms_forms():
    assert expand_nodelist("node[01-03,07],login") == ["node01", "node02", "node03", "node07",
                                                       "login"]
    assert expand_nodelist("rack[1-2]-n[8-9]") == ["rack1-n8", "rack1-n9", "rack2-n8",
                                                   "rack2-n9"]
    assert expand_nodelist("h1") == ["h1"] and expand_nodelist("n[098-101]")[-1] == "n101"
    assert expand_tasks_per_node("2(x3),1", 4) == [2, 2, 2, 1]
    assert expand_tasks_per_node("", 2) == [1, 1]
    for wrong in ["", "a,,b", "n[1-", "n]1[", "n[[1]]", "n[3-1]", "n[x]", "n[1-2],n2",
                  "-n[1-2]", "n[1-99999999]"]:
        with pytest.raises(ResourceError, match="nodelist"):
            expand_nodelist(wrong)
    for wrong, nodes in [("2(x3)", 2), ("2,1", 3), ("0", 1), ("2(x0)", 1), ("x", 1)]:
        with pytest.raises(ResourceError, match="SLURM_TASKS_PER_NODE"):
            expand_tasks_per_node(wrong, nodes)


def test_the_allocation_gives_hosts_with_a_slot_per_task_its_gpus_where_it_has_them():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[1-2]",
           "SLURM_TASKS_PER_NODE": "2(x2)"}
    assert allocation_hosts(env) == [Host("gpu1", (0, 1)), Host("gpu2", (0, 1))]
    assert allocation_hosts({**env, "SLURM_JOB_GPUS": "2,3,5"}) == [
        Host("gpu1", (2, 3)), Host("gpu2", (2, 3))]
    with pytest.raises(ResourceError, match="2 tasks on gpu1 but 1 GPUs"):
        allocation_hosts({**env, "SLURM_JOB_GPUS": "4"})
    with pytest.raises(ResourceError, match="need a Slurm allocation"):
        allocation_hosts({})
    step = SrunConfig().command("gpu2", ["python", "train.py"], "/work")
    assert step[:4] == ["srun", "--nodes=1", "--ntasks=1", "--nodelist=gpu2"]
    assert "--overlap" in step and "--chdir=/work" in step
    assert step[step.index("--") + 1:][1:] == ["-m", "runner.remote_exec", "python", "train.py"]


def _compressed(rng, names):
    """An independent writer of Slurm's form: runs of numbered names in brackets."""
    items, run = [], []
    for prefix, number, width in names + [(None, None, None)]:
        if run and (prefix != run[0][0] or width != run[0][2] or number != run[-1][1] + 1):
            first, last = run[0], run[-1]
            text = str(first[1]).zfill(first[2])
            if len(run) > 1:
                text += "-" + str(last[1]).zfill(first[2])
            items.append(f"{first[0]}[{text}]" if rng.random() < 0.8 or len(run) > 1
                         else first[0] + text)
            run = []
        if prefix is not None:
            run.append((prefix, number, width))
    return ",".join(items)


def test_fuzzed_nodelists_expand_to_their_nodes_or_fail_with_a_resource_error():
    rng = random.Random(20261127)
    for _ in range(2000):
        names, seen = [], set()
        for _ in range(rng.randint(1, 6)):
            prefix, width = rng.choice(["node", "gpu-a", "n", "rack1-x"]), rng.randint(1, 3)
            start = rng.randint(0, 10 ** width - 5)
            for number in range(start, start + rng.randint(1, 4)):
                if (prefix, number) not in seen and len(str(number)) <= width:
                    seen.add((prefix, number))
                    names.append((prefix, number, width))
        text = _compressed(rng, names)
        assert expand_nodelist(text) == [p + str(n).zfill(w) for p, n, w in names], text
        broken = list(text)
        for _ in range(rng.randint(1, 3)):
            broken[rng.randrange(len(broken))] = rng.choice("[],-x0 (")
        try:
            expanded = expand_nodelist("".join(broken))
        except ResourceError:
            continue
        assert expanded and all(isinstance(name, str) for name in expanded)


def test_slurm_resources_outside_an_allocation_are_a_clear_error(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ResourceError, match="need a Slurm allocation"):
        load_resources("slurm")


@pytest.fixture(scope="module")
def slurm(cluster):  # noqa: F811
    """Slurm on the emulated hosts h1 and h2; the environment its commands need."""
    env = dict(os.environ, PARALLAX_CLUSTER_DIR=STATE)
    up = subprocess.run(["bash", SLURM_SCRIPT, "up"], env=env, capture_output=True, text=True,
                        timeout=600)
    assert up.returncode == 0, up.stderr + up.stdout
    env["SLURM_CONF"] = up.stdout.strip().splitlines()[-1]
    env.pop("PARALLAX_ROLE", None)
    yield env
    subprocess.run(["bash", SLURM_SCRIPT, "down"], env=env, capture_output=True, timeout=120)


def _on_h1(*argv):
    """A command on host h1 (its network: names h1 and h2 resolve there, as on a login node)."""
    return ["ip", "netns", "exec", "pxh1", *argv]


def _wait_idle():
    assert_hosts_idle(timeout=20.0, daemons=("slurmd",))


@on_emulated_hosts
@pytest.mark.job
@pytest.mark.parametrize("run_option", ["AR", "HYBRID"])
def test_a_job_in_an_allocation_runs_as_job_steps_and_equals_one_device(slurm, run_option,
                                                                         tmp_path):
    """salloc -N2 --ntasks-per-node=2: 4 workers (and 2 servers) as srun steps on h1 and h2,
    every variable as one device trains it."""
    result = subprocess.run(_on_h1(
        "salloc", "-N2", "--ntasks-per-node=2", sys.executable,
        os.path.join(WORKLOADS, "equivalence.py"), "--model", "sparse", "--resources", "slurm",
        "--run-option", run_option, "--out", str(tmp_path), "--configs", "sgd"),
        cwd=REPO, env=slurm, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[h2:worker:3]" in result.stdout and "4 workers on 2 machines" in result.stdout
    assert "srun: error" not in result.stdout + result.stderr
    assert_equals_single_device(tmp_path, ["sgd"], run_option)
    _wait_idle()


BATCH_SCRIPT = """#!/bin/bash
#SBATCH -N2
#SBATCH --ntasks-per-node=2
#SBATCH -o {out}
{python} {script} 2>&1
echo "exit status $?"
"""

NO_RESOURCES = """
import numpy as np
import tensorflow as tf
import parallax

tf.compat.v1.disable_eager_execution()
graph = tf.Graph()
with graph.as_default():
    w = tf.compat.v1.get_variable("w", [4, 1])
    x = tf.constant(np.ones((8, 4), np.float32))
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(x @ w))
runner = parallax.get_runner(graph)  # inside an allocation: its nodes and tasks
for step in range(5):
    runner.run(train)
print("trained", runner.num_workers, "workers", flush=True)
"""


@on_emulated_hosts
@pytest.mark.job
def test_a_batch_script_needs_no_resources(slurm, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(NO_RESOURCES)
    out = tmp_path / "out.txt"
    batch = tmp_path / "job.sh"
    batch.write_text(BATCH_SCRIPT.format(out=out, python=sys.executable, script=script))
    submitted = subprocess.run(_on_h1("sbatch", "--parsable", str(batch)), cwd=tmp_path,
                               env=slurm, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 300
    while subprocess.run(["squeue", "-h", "-j", job], env=slurm, capture_output=True,
                         text=True).stdout.strip():
        assert time.monotonic() < deadline, "the batch job did not finish"
        time.sleep(1)
    text = out.read_text()
    assert "exit status 0" in text, text[-3000:]
    assert "trained 4 workers" in text and "[h2:worker:3]" in text
    _wait_idle()


@on_emulated_hosts
@pytest.mark.job
def test_scancel_of_the_job_stops_every_process_and_the_driver(slurm):
    driver = subprocess.Popen(_on_h1(
        "salloc", "-N2", "--ntasks-per-node=2", "-J", "parallax-test-cancel", sys.executable,
        os.path.join(REPO, "examples", "linear_regression.py"), "slurm", "100000000"),
        cwd=REPO, env=slurm, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in driver.stdout:  # training: the chief's lines every 10 steps
            lines.append(line)
            if "global_step 100" in line:
                break
        else:
            raise AssertionError("".join(lines)[-3000:])
        steps = subprocess.run(["squeue", "-h", "-s", "-n", "parallax"], env=slurm,
                               capture_output=True, text=True).stdout
        assert len(steps.splitlines()) == 4, steps  # a step per worker
        job = subprocess.run(["squeue", "-h", "-n", "parallax-test-cancel", "-o", "%i"],
                             env=slurm, capture_output=True, text=True).stdout.strip()
        cancelled = time.monotonic()
        subprocess.run(["scancel", job], env=slurm, check=True, timeout=30)
        rest = driver.communicate(timeout=60)[0]
        assert time.monotonic() - cancelled < 30
        assert driver.returncode != 0
        said = [line for line in rest.splitlines() if not FILTERED.search(line)]
        assert any("CANCELLED" in line for line in said), "\n".join(said)[-3000:]
        assert any(line.startswith("[driver] parallax: ") and "killed by SIGTERM" in line
                   for line in said), "\n".join(said)[-3000:]
        _wait_idle()
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
