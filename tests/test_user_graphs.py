"""Graphs shaped like users' code (tests/workloads/user_graphs.py) train on 2 machines x 2
workers exactly as on one device with the combined batch, in every mode; shapes Parallax cannot
support are refused at get_runner with an error that names them."""
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import parallax
from parallax.planning.analysis import analyze
from conftest import WORKLOADS, load_workload, run_job

user_graphs = load_workload("user_graphs")
TWO_MACHINES = "127.0.0.1:0,1;127.0.0.2:0,1"
WORKERS = 4


@pytest.fixture(autouse=True)
def _checkpoints(tmp_path, monkeypatch):
    """Where the restore shape's job, and then its single-device reference, save."""
    monkeypatch.setenv("USER_GRAPHS_CHECKPOINTS", str(tmp_path / "checkpoints"))


def _train(tmp_path, shape, run_option, *extra, env=None, timeout=600):
    """A job of the shape (or shapes, joined by commas: their results in tmp_path/SHAPE/)."""
    result = run_job(os.path.join(WORKLOADS, "user_graphs.py"), "--shape", shape,
                     "--resources", TWO_MACHINES, "--run-option", run_option,
                     "--out", str(tmp_path), *extra, env=env, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _assert_single_device(tmp_path, shape, tf1=False):
    expected, fetched = user_graphs.train_single_device(shape, WORKERS, tf1)
    largest = 0.0
    for worker in range(WORKERS):
        saved = np.load(tmp_path / f"worker{worker}.npz")
        np.testing.assert_allclose(saved["fetched"], fetched, rtol=1e-5,
                                   err_msg=f"{shape}: fetched on worker {worker}")
        names = {k[len("var/"):] for k in saved.files if k.startswith("var/")}
        assert names == set(expected), f"worker {worker} has other variables than one device"
        for name, value in expected.items():
            np.testing.assert_allclose(saved[f"var/{name}"], value, rtol=1e-5, atol=1e-5,
                                       err_msg=f"{shape}: {name} on worker {worker}")
            largest = max(largest, float(np.max(np.abs(saved[f"var/{name}"] - value),
                                                initial=0.0)))
    if os.environ.get("USER_GRAPHS_DIFFS"):  # a report's table: every test's largest difference
        with open(os.environ["USER_GRAPHS_DIFFS"], "a") as out:
            out.write(f"{os.environ['PYTEST_CURRENT_TEST'].split(' ')[0]} {largest:.3g}\n")


# The mode each shape trains in under TF1 behaviour where not the one its turn gives: the
# tutorial's moving averages of a reference variable on a server read it before its update
# (docs/user-guide.md, Limits), 3e-4 away from one device's.
TF1_MODE = {"cifar10": "AR"}
# Shapes a mode cannot train as one device would: refused at get_runner, saying why.
REFUSED = {("cond", "HYBRID"): "updates variables on parameter servers ['model/emb'] and "
                               "replicated ones ['model/w1', 'model/w2'] at once",
           ("gradient_penalty", "PS"): "is differentiated again"}


MODES = ["AR", "PS", "HYBRID"]


def _tf1(shape, run_option):
    """Whether the shape trains after disable_v2_behavior() (TF1 code) in this mode: each shape
    in one of the three modes, by turns."""
    return TF1_MODE.get(shape, MODES[sorted(user_graphs.SHAPES).index(shape) % 3]) == run_option


@pytest.fixture(scope="module", params=MODES)
def every_shape(request, tmp_path_factory):
    """One job per mode trains every shape it does not refuse, one get_runner each in turn
    (the driver plans the first, which has an embedding, so that the job has servers; the
    workers plan the others by the mode's rule, as the driver would)."""
    run_option = request.param
    shapes = [s for s in sorted(user_graphs.SHAPES) if (s, run_option) not in REFUSED]
    out = tmp_path_factory.mktemp(f"shapes-{run_option}")
    result = run_job(os.path.join(WORKLOADS, "user_graphs.py"), "--shape", ",".join(shapes),
                     "--resources", TWO_MACHINES, "--run-option", run_option, "--out", str(out),
                     "--tf1-behaviour", ",".join(s for s in shapes if _tf1(s, run_option)),
                     env={"USER_GRAPHS_CHECKPOINTS": str(out / "checkpoints")}, timeout=1200)
    return run_option, out, result


@pytest.mark.job
@pytest.mark.parametrize("shape", sorted(user_graphs.SHAPES))
def test_user_graph_trains_as_on_one_device(every_shape, shape):
    """Each shape in each mode, or refused at get_runner saying why."""
    run_option, out, result = every_shape
    if (shape, run_option) in REFUSED:
        refused = run_job(os.path.join(WORKLOADS, "user_graphs.py"), "--shape", shape,
                          "--resources", TWO_MACHINES, "--run-option", run_option,
                          "--out", str(out / shape), timeout=300)
        assert refused.returncode != 0 and REFUSED[shape, run_option] in refused.stderr
        assert "[127.0.0.1:worker:0]" not in refused.stdout, "refused after starting workers"
        return
    assert f"[127.0.0.1:worker:0] {shape}: trained" in result.stdout, (
        result.stdout[-3000:] + result.stderr[-3000:])
    _assert_single_device(out / shape, shape, _tf1(shape, run_option))
    if shape == "cifar10":  # its loop runs the initializer: skipped, once per worker, said so
        made_at = re.findall(r"runner\.run\(the initializer made at (\S+user_graphs\.py:\d+)\) "
                             r"skipped", result.stdout)
        assert len(made_at) == WORKERS and len(set(made_at)) == 1, result.stdout[-3000:]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


# The shapes with embeddings, by job: the driver splits the variables of its first graph, and
# a later get_runner's graph by the driver's decisions where they name its variables (gan's
# embeddings have names of their own).
SPLIT_JOBS = [["accumulate", "cifar10", "gradient_norms", "restore", "schedule", "summary"],
              ["gan"]]


@pytest.mark.job
@pytest.mark.parametrize("shapes", SPLIT_JOBS, ids=["model-emb", "gan"])
def test_user_graphs_with_their_embeddings_split_over_the_servers_train_as_on_one_device(
        tmp_path, shapes):
    """Config(split_variables=True) in HYBRID: each embedding in a row shard on each server
    (passes/split_variables.py), with two optimizers, a dense apply of accumulated gradients,
    gradient histograms, moving averages, a fed learning rate, a restore mid-training: a
    get_runner for each shape in turn."""
    result = _train(tmp_path, ",".join(shapes), "HYBRID", "--split-variables",
                    env={"USER_GRAPHS_CHECKPOINTS": str(tmp_path / "job-checkpoints")},
                    timeout=900)
    plan = [line for line in result.stdout.splitlines()  # the table's rows, not the slots'
            if re.search(r"\] \S*emb/part_\d+ ", line)]
    assert len(plan) == 2 * len(shapes) * (1 + (shapes == ["gan"])), result.stdout[-3000:]
    assert all("parameter server" in line for line in plan), result.stdout[-3000:]
    for shape in shapes:
        _assert_single_device(tmp_path / shape if len(shapes) > 1 else tmp_path, shape)


# Jobs below train a shape in several modes, a get_runner each ("SHAPE@MODE"): PS's first, so
# that the driver starts servers.


@pytest.mark.job
def test_moving_statistics_are_the_same_on_every_worker(tmp_path):
    """With sync_batch_norm=False each worker normalizes its own batch, the driver warns and
    the plan says so; the moving statistics are averaged over workers so that the replicas
    stay identical (PS, then AR)."""
    parts = ["batchnorm@PS", "batchnorm@AR"]
    result = _train(tmp_path, ",".join(parts), "PS", "--own-batch-norm")
    warnings = [line for line in result.stderr.splitlines() if "sync_batch_norm=False" in line]
    assert len(warnings) == 1 and "1 batch norm(s) ('moments/mean') normalize each worker's " \
        "own batch, 1/4 of the combined one" in warnings[0], result.stderr[-3000:]
    assert result.stdout.count("batch norm: statistics of each worker's own batch, not one "
                               "device's (sync_batch_norm=False): moments/mean") == len(parts)
    for part in parts:
        saved = [np.load(tmp_path / part / f"worker{worker}.npz") for worker in range(WORKERS)]
        assert "var/moving_mean" in saved[0].files
        for name in saved[0].files:
            for other in saved[1:]:
                np.testing.assert_allclose(other[name], saved[0][name], rtol=1e-6, atol=1e-6,
                                           err_msg=f"{part}: {name}")
        assert not np.allclose(saved[0]["var/moving_mean"], 0.0)


# Per mode, the batch-norm CNN and a fused batch norm (one kernel, as tf.compat.v1.layers and
# tf_keras build it; NCHW in PS); HYBRID's under TF1.
BATCH_NORMS = ["batchnorm@PS", "fused_batchnorm_nchw@PS", "batchnorm@AR", "fused_batchnorm@AR",
               "batchnorm@HYBRID", "fused_batchnorm@HYBRID"]


@pytest.mark.job
def test_sync_batch_norm_trains_as_on_one_device(tmp_path):
    """With sync_batch_norm (on by default) the batch statistics, forward and backward, are the
    combined batch's: the batch-norm CNN (moving statistics too) and a fused batch norm (its
    outputs and gradient rewritten over the combined batch, its moving statistics with the
    Bessel-corrected variance), NHWC and NCHW, equal one device's in every mode."""
    tf1 = [part for part in BATCH_NORMS if part.endswith("@HYBRID")]
    result = _train(tmp_path, ",".join(BATCH_NORMS), "PS", "--tf1-behaviour", ",".join(tf1))
    for part in BATCH_NORMS:
        _assert_single_device(tmp_path / part, part.partition("@")[0], tf1=part in tf1)
    assert result.stdout.count("batch norm: statistics of the combined batch, as on one device "
                               "(sync_batch_norm): moments/mean") == 3  # each batchnorm part
    assert "sync_batch_norm=False" not in result.stderr


@pytest.mark.job
def test_the_cifar10_tutorial_through_a_monitored_session_trains_as_on_one_device(tmp_path):
    """The tutorial's graph and loop through parallax.MonitoredTrainingSession, with the
    chief's checkpoint and summary savers and step counter, a NanTensorHook and a
    LoggingTensorHook: every variable as one device's, in every mode."""
    parts = ["cifar10@PS", "cifar10@AR", "cifar10@HYBRID"]
    _train(tmp_path, ",".join(parts), "PS", "--monitored")
    for part in parts:
        _assert_single_device(tmp_path / part, "cifar10")
        assert (tmp_path / part / "train" / "checkpoint").exists()


@pytest.mark.job
def test_ps_steps_never_mix_with_one_worker_delayed(tmp_path, monkeypatch):
    """Alternating train ops, local aggregation, and a worker that sleeps at random before
    half of its runs: no interleaving mixes two steps or deadlocks."""
    steps = 200
    monkeypatch.setattr(user_graphs, "STEPS", steps)
    _train(tmp_path, "gan", "PS", "--delay", "0.02", env={"USER_GRAPHS_STEPS": str(steps)})
    _assert_single_device(tmp_path, "gan")


@pytest.mark.job
def test_a_cond_taking_its_empty_branch_never_releases_a_step_early(tmp_path, monkeypatch):
    """Updates of server variables in tf.cond, applied one step in two or three, a worker
    sleeping at random: the chief's release waits for the step's aggregates, not only for the
    cond (which, taking its empty branch, waits for nothing of them), so every worker reads
    the step counter one device reads after each step (PS; split over the servers, HYBRID)."""
    steps = 40
    monkeypatch.setattr(user_graphs, "STEPS", steps)
    parts = ["cond@PS", "cond_split@HYBRID"]
    _train(tmp_path, ",".join(parts), "PS", "--delay", "0.15",
           env={"USER_GRAPHS_STEPS": str(steps)})
    for part in parts:
        _assert_single_device(tmp_path / part, part.partition("@")[0])


@pytest.mark.job
def test_a_restore_with_a_worker_late_to_it_trains_as_on_one_device(tmp_path):
    """Every worker restores the checkpoint, at its own time: a late one must not write the
    servers' variables while the others train on (each worker restores its replicas, the
    chief the servers' variables; the others wait for it, passes/sync.py), in PS and HYBRID."""
    parts = ["restore@PS", "restore@HYBRID"]
    _train(tmp_path, ",".join(parts), "PS", "--delay", "0.5")
    for part in parts:
        _assert_single_device(tmp_path / part, "restore")


@pytest.mark.job
@pytest.mark.parametrize("run_option", ["AR", "PS"])
def test_a_restore_in_the_chief_alone_stops_the_job_naming_it(tmp_path, run_option):
    """Horovod's habit (restore in rank 0, then broadcast) leaves the other workers' replicas
    as they were: the driver stops the job instead of letting the workers train apart."""
    result = run_job(os.path.join(WORKLOADS, "user_graphs.py"), "--shape", "restore",
                     "--resources", TWO_MACHINES, "--run-option", run_option,
                     "--out", str(tmp_path), "--chief-restores", timeout=600)
    assert result.returncode != 0
    assert ("127.0.0.1:worker:0 restored a checkpoint (saver.restore(runner, path), which "
            f"every worker runs, as the script does on one device, not only the chief) after "
            f"its step {user_graphs.STEPS // 2} and ") in result.stderr, result.stderr[-3000:]
    assert "the workers no longer train the same model" in result.stderr


def _graph_with(build):
    graph = tf.Graph()
    with graph.as_default():
        build(tf.compat.v1.placeholder(tf.float32, [4, 3], name="x"))
    return graph


def _assert_refused(build, match, config=None):
    """get_runner refuses the graph in the driver, before it reads the resources (empty here:
    a graph that got through would fail on them, not start workers that re-run pytest)."""
    with pytest.raises(parallax.ParallaxError, match=match):
        parallax.get_runner(_graph_with(build), "", config)


def _dense(x, name="w"):
    w = tf.compat.v1.get_variable(name, [3, 1], initializer=tf.compat.v1.ones_initializer())
    return w, tf.reduce_sum(tf.matmul(x, w))


@pytest.mark.parametrize("run_option", ["AR", "PS", "HYBRID"])
def test_a_penalty_on_a_sparse_gradient_is_refused(run_option):
    """Gathered rows (or rows summed on a server) cannot be differentiated as the combined
    batch's gradient: TensorFlow failed on mismatched shapes (AR, HYBRID), the PS job hung."""
    def build(x):
        table = tf.compat.v1.get_variable("table", [10, 3])
        _, loss = _dense(x + tf.nn.embedding_lookup(table, [1, 2, 2, 5]))
        gradient = tf.convert_to_tensor(tf.compat.v1.gradients(loss, table)[0])
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            loss + tf.reduce_sum(tf.square(gradient)))
    _assert_refused(build, "the gradient of 'table' is differentiated again .* by (allgather|"
                    "parameter server).* use run_option='AR', and a variable whose gradient "
                    "is dense", parallax.Config(run_option=run_option))


def test_a_trained_variable_written_from_the_batch_is_refused():
    """A max-norm of the rows the batch looked up, by scatter_update: each worker would clip
    its own rows (AR: the replicas drift apart; PS: the chief's rows alone)."""
    def build(x):
        table = tf.compat.v1.get_variable("table", [10, 3])
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        _, loss = _dense(x + tf.nn.embedding_lookup(table, ids))
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with tf.control_dependencies([train_op]):
            unique, _ = tf.unique(ids)
            rows = tf.clip_by_norm(tf.gather(table, unique), 1.0, axes=[1])
            tf.compat.v1.scatter_update(table, unique, rows)
    _assert_refused(build, "writes the trained variable 'table' from the batch itself")


def test_a_pretrained_table_fed_to_an_assign_is_not_written_from_the_batch():
    """What only the write reads is fed alike to every worker (word2vec's pretrained vectors)."""
    def build(x):
        table = tf.compat.v1.get_variable("table", [10, 3])
        table.assign(tf.compat.v1.placeholder(tf.float32, [10, 3], name="pretrained"),
                     name="load_pretrained")
        _, loss = _dense(x + tf.nn.embedding_lookup(table, [0, 1, 1, 2]))
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    writes = analyze(_graph_with(build)).variables["table"].update_ops
    assert "load_pretrained" in writes


def test_gradient_tape_updates_are_refused():
    def build(x):
        _, loss = _dense(x)
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        v = tf.compat.v1.get_variable("v", [3, 1])
        with tf.GradientTape() as tape:
            other = tf.reduce_sum(tf.matmul(x, v))
        tf.compat.v1.train.GradientDescentOptimizer(0.1).apply_gradients(
            [(tape.gradient(other, v), v)])
    _assert_refused(build, "'v'.*GradientTape")


def test_a_gradient_computed_only_to_look_at_is_refused():
    def build(x):
        w, loss = _dense(x)
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        tf.compat.v1.gradients(loss * 2.0, [w])  # monitoring only
    _assert_refused(build, "never applied")


def test_a_variable_of_unknown_shape_is_refused():
    def build(x):
        w = tf.Variable(tf.ones([3, 1]), shape=tf.TensorShape(None), name="w")
        loss = tf.reduce_sum(tf.matmul(x, w))
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    _assert_refused(build, "'w'.*no static shape")


def test_per_worker_state_written_by_a_scatter_is_refused():
    def build(x):
        _, loss = _dense(x)
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        seen = tf.Variable(tf.zeros([4]), trainable=False, name="seen")
        tf.compat.v1.scatter_update(seen, [0], tf.reshape(loss, [1]))
    _assert_refused(build, "'seen'.*assignments")


def test_a_learning_rate_placeholder_without_shape_is_refused_saying_how_to_shape_it():
    """A placeholder of unknown shape may carry a batch: its fused slot update is refused, and
    the error says how to declare it a setting (the 'schedule' shape trains with one)."""
    def build(x):
        _, loss = _dense(x)
        rate = tf.compat.v1.placeholder(tf.float32, name="learning_rate")
        tf.compat.v1.train.MomentumOptimizer(rate, 0.9).minimize(loss)
    _assert_refused(build, r"'w/Momentum'.*If 'learning_rate' is a setting every worker feeds "
                           r"alike \(a learning rate\), give it its scalar shape")


@pytest.mark.job
def test_a_server_update_the_gradients_wait_for_is_refused(tmp_path):
    """A variable on a server decayed in place before the gradients are computed: in PS mode
    the update waits for the step's token, which waits for the gradients."""
    script = tmp_path / "decay_first.py"
    script.write_text(
        "import parallax, tensorflow as tf\n"
        "tf.compat.v1.disable_eager_execution()\n"
        "graph = tf.Graph()\n"
        "with graph.as_default():\n"
        "    emb = tf.compat.v1.get_variable('emb', [10, 2])\n"
        "    with tf.control_dependencies([emb.assign(emb * 0.99, name='decay')]):\n"
        "        loss = tf.reduce_sum(tf.nn.embedding_lookup(emb, [1, 2]))\n"
        "    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)\n"
        "runner = parallax.get_runner(graph, 'localhost:0,1', parallax.Config(run_option='PS'))\n"
        "runner.run(train)\n")
    result = run_job(str(script), timeout=300)
    assert result.returncode != 0
    assert "'decay'" in result.stderr and "after the train op" in result.stderr
