"""Launching on one machine: one worker process per slot, output streamed with a prefix, and
no process left behind whatever happens."""
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from conftest import COLLECTIVE_OPS, REPO, WORKLOADS, run_job
from parallax import Config, launch
from runner import load_resources
from runner.ssh import SSHConfig
from test_tf_logs import START_UP_LINES

pytestmark = pytest.mark.job

SCRIPT = os.path.join(WORKLOADS, "supervised.py")


def _job_processes(token):
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("PARALLAX_TEST_TOKEN") == token:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _start(*args, **extra_env):
    token = uuid.uuid4().hex
    env = dict(os.environ, PARALLAX_TEST_TOKEN=token, **extra_env)
    env.pop("PARALLAX_ROLE", None)
    driver = subprocess.Popen([sys.executable, SCRIPT, *args], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return driver, token


def _finish(driver, timeout=120):
    output, _ = driver.communicate(timeout=timeout)
    return driver.returncode, output


def _assert_nothing_left(token):
    deadline = time.monotonic() + 5
    while _job_processes(token) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _job_processes(token) == [], "processes of the job are still running"


def test_workers_run_with_prefixed_output_and_progress_goes_to_the_metrics_file(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    driver, token = _start("ok", PARALLAX_TEST_METRICS=str(metrics))
    code, output = _finish(driver)
    assert code == 0, output
    assert not START_UP_LINES.search(output), output  # TensorFlow starts quietly (tf_logs.py)
    assert "[localhost:worker:0] worker 0 ready" in output
    assert "[localhost:worker:1] worker 1 done" in output
    # parallax.num_shards_and_shard_id(): tensors of each worker's graph
    assert "[localhost:worker:1] worker 1 is shard 1 of 2" in output
    # Every worker runs the script's top again, but its lines are the driver's to print.
    assert [line for line in output.splitlines() if "graph built for" in line] == [
        "graph built for ok"]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert records[-1]["step"] == 10  # every worker's 10 steps, the last record after exit
    assert all(r["loss"] > 0 for r in records if "loss" in r) and "loss" in records[-1]
    assert [r["step"] for r in records] == sorted(r["step"] for r in records)
    _assert_nothing_left(token)


def test_failed_worker_stops_the_job():
    driver, token = _start("fail-worker-1")
    code, output = _finish(driver)
    assert code == 1, output
    assert "localhost:worker:1 exited with status 1" in output
    tail_of_worker_1 = output.split("Last lines of localhost:worker:1:")[1].split("Last lines")[0]
    assert "RuntimeError: boom from worker 1" in tail_of_worker_1
    _assert_nothing_left(token)


def test_fetch_not_in_graph_fails_the_job_with_its_name():
    driver, token = _start("bad-fetch")
    code, output = _finish(driver)
    assert code != 0
    assert "fetch 'no_such_tensor:0' is not in the graph" in output
    _assert_nothing_left(token)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_driver_stops_every_worker(signum):
    driver, token = _start("hang")
    ready, seen = 0, []
    for line in driver.stdout:
        seen.append(line)
        ready += " ready" in line
        if ready == 2:
            break
    assert ready == 2, "workers did not start:\n" + "".join(seen)
    started = time.monotonic()
    driver.send_signal(signum)
    code, output = _finish(driver, timeout=30)
    assert time.monotonic() - started < 10
    assert code == 128 + signum, output
    assert f"stopped by {signal.Signals(signum).name}" in output
    _assert_nothing_left(token)


def test_loopback_addresses_are_separate_machines_and_redirect_path_writes_a_log_each(
        tmp_path):
    """...in which no process, server or worker, logged TensorFlow's start-up (tf_logs.py)."""
    driver, token = _start("ok", "127.0.0.1:0\n127.0.0.2:0", str(tmp_path), "sparse")
    code, output = _finish(driver)
    assert code == 0, output
    assert "[127.0.0." not in output
    for worker, host in enumerate(("127.0.0.1", "127.0.0.2")):
        log = (tmp_path / f"{host}_worker_{worker}.log").read_text()
        assert f"worker {worker} done" in log and f"worker {worker} is shard {worker} of 2" in log
    logs = {path.name: path.read_text() for path in tmp_path.glob("*.log")}
    assert len(logs) == 4 and not [name for name, log in logs.items()
                                   if START_UP_LINES.search(log)], logs
    _assert_nothing_left(token)


def test_workers_out_of_step_are_a_stall_naming_the_one_behind():
    driver, token = _start("diverge", PARALLAX_TEST_STALL_SECS="5")
    started = time.monotonic()
    code, output = _finish(driver)
    assert code == 124, output
    assert "stalled: localhost:worker:0 (step 4) in a step for more than 5 s" in output, output
    assert "behind: localhost:worker:1 (step 3, not in a run)" in output
    assert time.monotonic() - started < 60
    _assert_nothing_left(token)


def test_a_run_that_failed_and_was_caught_is_not_a_stall():
    driver, token = _start("caught-error", PARALLAX_TEST_STALL_SECS="3")
    code, output = _finish(driver)
    assert code == 0, output
    assert "worker 1 done" in output
    _assert_nothing_left(token)


def test_a_remote_host_that_does_not_resolve_is_named_with_its_line(tmp_path):
    spec = tmp_path / "hosts"
    spec.write_text("# the cluster\nnosuchhost.invalid: 0\nother.invalid: 0\n")
    driver, token = _start("ok", str(spec), "", "dense", "AR")
    code, output = _finish(driver)
    assert code != 0
    assert (f"{spec}, line 2: host 'nosuchhost.invalid' does not resolve (Name or service not "
            "known); check its spelling, or use its address") in output, output
    assert "gaierror" not in output  # a ParallaxError, not the socket module's
    _assert_nothing_left(token)


def test_profiled_runs_write_a_chrome_trace_and_their_phases_and_graphs_are_exported(
        tmp_path):
    """HYBRID on two loopback machines: the third run of each worker is traced; its phases
    show the allreduce of the dense variable, the push of the sparse gradient, the servers'
    work, and worker 1 waiting for the chief's token. Each worker's rewritten graph and the
    single-device one are written."""
    profile, exported = tmp_path / "profile", tmp_path / "graphs"
    driver, token = _start("ok", "127.0.0.1:0;127.0.0.2:0", "", "sparse", "HYBRID",
                           PARALLAX_TEST_PROFILE=str(profile),
                           PARALLAX_TEST_EXPORT=str(exported))
    code, output = _finish(driver, timeout=240)
    assert code == 0, output
    for worker in (0, 1):
        trace = json.loads((profile / f"worker{worker}_step3.json").read_text())
        assert any(e.get("name") == COLLECTIVE_OPS["beside_servers"]
                   or COLLECTIVE_OPS["beside_servers"] in str(e.get("args", {}))
                   for e in trace["traceEvents"])
    phases = {r["worker"]: r for r in map(json.loads,
                                          (profile / "phases.jsonl").read_text().splitlines())}
    assert sorted(phases) == [0, 1] and all(r["step"] == 3 for r in phases.values())
    for record in phases.values():
        assert record["allreduce_ms"] > 0 and record["push_ms"] > 0, record
        assert record["server_ms"] > 0 and record["compute_ms"] > 0, record
        assert record["pull_ms"] > 0, record  # the rows of the embedding
        # Each phase is a part of the run (the servers' clocks are this machine's).
        assert all(v <= record["run_ms"] + 5 for k, v in record.items() if k.endswith("_ms"))
    assert phases[1]["wait_for_chief_ms"] > 0, phases[1]
    single = (exported / "single_device.pbtxt").read_text()
    assert COLLECTIVE_OPS["prefix"] not in single and "parallax_ps" not in single
    for worker in (0, 1):
        assert COLLECTIVE_OPS["allreduce"] in (exported / f"worker{worker}.pbtxt").read_text()
        assert list((exported / f"worker{worker}").glob("events.out.tfevents.*"))
    _assert_nothing_left(token)


SECOND_GRAPH_NEEDS_SERVERS = """
import tensorflow as tf
import parallax

tf.compat.v1.disable_eager_execution()
for sparse in (False, True):
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", [4, 1])
        x = tf.ones([2, 4])
        if sparse:
            table = tf.compat.v1.get_variable("table", [10, 4])
            x = tf.nn.embedding_lookup(table, [1, 2])
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf.matmul(x, w)))
    runner = parallax.get_runner(graph, "localhost:0,1")
    runner.run(train)
    runner.close()
"""


def test_a_later_graph_that_needs_servers_the_job_lacks_is_refused(tmp_path):
    """The driver launches for the script's first graph (dense: AR, no servers); a second
    graph with a sparse variable would wait forever for a server: refused, saying why."""
    script = tmp_path / "two_graphs.py"
    script.write_text(SECOND_GRAPH_NEEDS_SERVERS)
    result = run_job(str(script), timeout=300)
    assert result.returncode != 0
    assert "this graph puts 'table' on a parameter server, and the job has none" in (
        result.stdout + result.stderr)


HELD_PORT = """
import sys
import tensorflow as tf
import parallax

tf.compat.v1.disable_eager_execution()
graph = tf.Graph()
with graph.as_default():
    table = tf.compat.v1.get_variable("table", [10, 4])
    loss = tf.reduce_sum(tf.nn.embedding_lookup(table, [1, 2]))
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
runner = parallax.get_runner(graph, "localhost:0", parallax.Config(
    run_option="PS", base_port=int(sys.argv[1])))
runner.run(train)
runner.close()
"""


@contextlib.contextmanager
def _held_port_after_a_free_one():
    """A port held by a listening socket, the one before it free."""
    while True:
        with socket.socket() as holder, socket.socket() as before:
            holder.bind(("", 0))
            try:
                before.bind(("", holder.getsockname()[1] - 1))
            except OSError:
                continue
            before.close()
            holder.listen()
            yield holder.getsockname()[1]
            return


def test_a_port_another_process_holds_is_named(tmp_path):
    """TensorFlow says only "Could not start gRPC server"; the job names the port."""
    script = tmp_path / "held_port.py"
    script.write_text(HELD_PORT)
    with _held_port_after_a_free_one() as worker_port:
        # The server takes base_port, worker 0 the next port.
        result = run_job(str(script), str(worker_port - 1), timeout=300)
    assert result.returncode != 0
    assert f"worker 0 cannot listen on localhost:{worker_port}: another process holds the " \
           "port" in result.stdout + result.stderr


def test_local_machines_never_share_a_port(monkeypatch):
    """127.0.0.1 and 127.0.0.2 are two machines to Parallax but one kernel, where every
    server listens on all addresses: their ports are drawn together (CI once failed when two
    separate draws gave a worker of each the same port). Without shuffling, separate draws
    would repeat exactly."""
    monkeypatch.setattr(random, "shuffle", lambda items: None)
    hosts = load_resources("127.0.0.1:0,1;127.0.0.2:0,1;127.0.0.3:0")
    ports = launch._ports(hosts, Config(), SSHConfig(), with_servers=True)
    assert [len(ports[host.name]) for host in hosts] == [3, 3, 2]
    # TensorFlow's collectives without parameter servers: the workers' ports alone
    alone = launch._ports(hosts, Config(), SSHConfig(), with_servers=False)
    assert [len(alone[host.name]) for host in hosts] == [2, 2, 1]
    drawn = [port for host in hosts for port in ports[host.name]]
    assert len(set(drawn)) == len(drawn)


UNSHARDED = """
import sys
import numpy as np
import tensorflow as tf
import parallax

shard_dataset, own_rows, silence = (arg == "1" for arg in sys.argv[1:4])
take_rows = sys.argv[1] == "rows"  # each worker reads the combined batch and takes its rows
# DeepFM's example: each worker shuffles with an unseeded np.random and takes its share
shuffled = sys.argv[2] == "shuffled"
tf.compat.v1.disable_eager_execution()
data = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
graph = tf.Graph()
with graph.as_default():
    dataset = tf.data.Dataset.from_tensor_slices(data)
    if shard_dataset:
        dataset = parallax.shard(dataset)
    read = tf.compat.v1.data.make_one_shot_iterator(dataset.repeat().batch(8)).get_next()
    if take_rows:
        num_shards, shard_id = parallax.num_shards_and_shard_id()
        read = tf.gather(read, tf.range(shard_id, 8, num_shards))
    fed = tf.compat.v1.placeholder(tf.float32, [None, 4], name="fed_rows")
    rate = tf.compat.v1.placeholder(tf.float32, [], name="rate")
    w = tf.compat.v1.get_variable("w", [4, 1])
    loss = tf.reduce_mean(tf.matmul(read, w)) + tf.reduce_mean(tf.matmul(fed, w))
    train = tf.compat.v1.train.GradientDescentOptimizer(rate).minimize(loss)
runner = parallax.get_runner(graph, "localhost:0,1",
                             parallax.Config(run_option="AR", warn_unsharded_input=not silence))
for step in range(20):
    rows = data[8 * runner.worker_id:8 * runner.worker_id + 8] if own_rows else data[:8]
    if shuffled:
        rows = data[np.random.permutation(64)[runner.worker_id::runner.num_workers]]
    runner.run(train, feed_dict={fed: rows, rate: 0.01})
"""


@pytest.mark.parametrize("shard_dataset,own_rows,silence,warned", [
    ("0", "0", "0", ["tf.data 'IteratorGetNext'", "feed 'fed_rows'"]),
    ("1", "shuffled", "0", ["feed 'fed_rows'"]), ("1", "0", "0", []), ("rows", "1", "0", []),
    ("0", "0", "1", [])],
    ids=["unsharded", "sharded-dataset-shuffled-feed", "sharded-dataset-same-feed",
         "rows-taken-in-the-graph", "silenced"])
def test_workers_that_all_read_the_same_input_are_told_once(tmp_path, shard_dataset,
                                                            own_rows, silence, warned):
    """The newcomer's mistake (a tutorial run without its sharding line trained on copies of
    one batch, silently): said once by the driver, naming the inputs, not the fed rate. An
    input any worker reads differently is taken as sharded, and so is one of which each worker
    takes its rows by parallax.num_shards_and_shard_id(), as the warning advises (beside a
    sharded dataset, or the rows fed). Its subtler form, shares of unseeded shuffles, is told
    by the rows the first batches have in common; a feed equal on every worker is not."""
    script = tmp_path / "unsharded.py"
    script.write_text(UNSHARDED)
    result = run_job(str(script), shard_dataset, own_rows, silence, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines()
            if "read the same input" in line or "have rows in common" in line]
    assert len(said) == (1 if warned else 0), said
    if warned and own_rows == "shuffled":
        assert said[0].startswith("[driver] parallax: the first training batches of the 2 "
                                  "workers have rows in common")
        assert "feed 'fed_rows': " in said[0] and "tf.data" not in said[0]
    elif warned:
        assert said[0].startswith("[driver] parallax: every worker read the same input")
        assert all(name in said[0] for name in warned) and "'rate'" not in said[0]
        assert "parallax.shard(dataset)" in said[0] and "2 copies of one batch" in said[0]
