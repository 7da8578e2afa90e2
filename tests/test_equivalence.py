"""Data-parallel training must be numerically single-device training on the combined batch:
for every run option, optimizer, with and without clip_by_global_norm, with moving averages,
and with the graph built after tf.compat.v1.disable_v2_behavior() (equivalence.TF1_CONFIGS).
A run option's models share its configurations by turns (equivalence.configs_by_turns): each
configuration trains in some model of the run option, each model in both behaviours."""
import functools
import os
import re
import shlex

import numpy as np
import pytest
import tensorflow as tf

import in_process
from conftest import HOROVOD, WORKLOADS, load_workload, needs_horovod, run_job
from equivalence_jobs import CASES, JOB_OF_PART, JOBS, PARTS, TWO_MACHINES
from parallax.worker import LEFT_COLLECTIVES

pytestmark = pytest.mark.job

equivalence = load_workload("equivalence")
WITHOUT_HOROVOD = os.path.join(os.path.dirname(__file__), "without_horovod")  # sitecustomize
# The parts, jobs and cases (tests/equivalence_jobs.py, read by conftest's scheduler too).
_runs = {}  # a job's name: its folder
# The cases of the collectives' paths (allreduce, allgather, machine stages, joining): .ci/run
# runs them on the Horovod stack too (pytest -m collectives).
COLLECTIVES_CASES = [case for case in CASES if case.startswith(("AR-", "HYBRID"))
                     and "split" not in case and "no-local-aggregation" not in case]
ONLY_BESIDE_HOROVOD = pytest.mark.skipif(
    not HOROVOD, reason="TensorFlow's collectives are this stack's default: the AR parts run them")


def _configs(case):
    """What a case trains, by turns (equivalence.configs_by_turns): each model of a part its
    share, so that the part trains every configuration in its setting; each part of one model
    half, the next such part the other half."""
    part, model = CASES[case]
    models = PARTS[part][0]
    if len(models) > 1:
        return equivalence.configs_by_turns(models.index(model), len(models))
    singles = [p for p, (ms, _) in PARTS.items() if len(ms) == 1]
    return equivalence.configs_by_turns(singles.index(part) % 2, 2)


def _marks(case):
    marks = [pytest.mark.collectives] if case in COLLECTIVES_CASES else []
    if case == "AR-rejoining-horovod":
        marks.append(needs_horovod)
    elif "tensorflow" in case:
        marks.append(ONLY_BESIDE_HOROVOD)
    return marks


def _jobs(*cases, configs=False):
    """Parameters of the `job` fixture, and with `configs` of each case's configurations."""
    if not configs:
        return [pytest.param(case, marks=_marks(case), id=case) for case in cases]
    return [pytest.param(case, config, marks=_marks(case), id=f"{case}-{config}")
            for case in cases for config in _configs(case)]


def _workers(resources):
    return sum(len(host.split(":")[1].split(",")) for host in resources.split(";"))


@pytest.fixture(scope="module")
def job(request, tmp_path_factory):
    """The case's model, the job's workers, the case's folder and whether it fetched the
    gradients; the job is run once, at its first test, for the parts the session's tests
    need."""
    part, model = CASES[request.param]
    job_name = JOB_OF_PART[part]
    resources, parts = JOBS[job_name]
    if job_name not in _runs:
        _runs[job_name] = tmp_path_factory.mktemp(job_name)
        _run(resources, [p for p in parts if p in _selected_parts(request.session)],
             _runs[job_name])
    out = _runs[job_name]
    assert (out / "output.txt").exists(), f"the {job_name} job failed: see its first test"
    models, extra = PARTS[part]
    out = out / part / model if len(models) > 1 else out / part
    return model, _workers(resources), out, "--fetch-gradients" in extra


def _selected_parts(session):
    """The parts of the cases the session's tests take."""
    return {CASES[item.callspec.params["job"]][0] for item in session.items
            if "job" in getattr(getattr(item, "callspec", None), "params", {})}


def _run(resources, parts, out):
    """The job training `parts` in turn; its output, and each part's model's share of it in
    that part's folder."""
    env = None
    if any("tensorflow" in PARTS[part][1] for part in parts):
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [WITHOUT_HOROVOD,
                                                           os.environ.get("PYTHONPATH")]))}
    arguments = []
    for part in parts:
        models, extra = PARTS[part]
        configs = (["--by-turns"] if len(models) > 1
                   else ["--configs", *_configs(part)])
        arguments.append(f"--part={part}=" + shlex.join(
            ["--model", ",".join(models), *extra, *configs]))
    result = run_job(os.path.join(WORKLOADS, "equivalence.py"), "--resources", resources,
                     "--out", str(out), *arguments, timeout=1800, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rest = result.stdout
    for part in parts:
        models = PARTS[part][0]
        for model in models:
            share, _, rest = rest.partition(f":worker:0] {part}/{model}: trained")
            folder = out / part / model if len(models) > 1 else out / part
            (folder / "output.txt").write_text(share)
    (out / "output.txt").write_text(result.stdout)


@functools.lru_cache(maxsize=None)
def _single_device(model, config, batch, fetch_gradients=False):
    """One device's training (the same for every job of a model and a number of workers)."""
    return equivalence.train_single_device(model, config, batch,
                                           fetch_gradients=fetch_gradients)


@pytest.mark.parametrize("job,config", _jobs(*CASES, configs=True), indirect=["job"])
def test_workers_equal_single_device(job, config):
    model, workers, out, fetch_gradients = job
    expected, expected_steps = _single_device(
        model, config, workers * equivalence.BATCH_PER_WORKER, fetch_gradients)
    assert any(n.startswith("gradient_sum/") for n in expected) == fetch_gradients
    assert expected_steps == list(range(1, equivalence.STEPS + 1))
    # of the resource variables: none under TF1 behaviour (see equivalence.build)
    assert any(name.endswith("ExponentialMovingAverage") for name in expected) == (
        config not in equivalence.TF1_CONFIGS or model in ("keras", "keras-embedding"))
    for worker in range(workers):
        saved = np.load(out / f"{config}.worker{worker}.npz")
        assert saved["global_steps"].tolist() == expected_steps, "global_step must advance by 1"
        names = {k[len("var/"):] for k in saved.files if k.startswith("var/")}
        assert names == set(expected), f"worker {worker} has other variables than single-device"
        for name, value in expected.items():
            if name.endswith("seed_generator_state"):
                continue  # Keras's RNG state for dropout (none here): advanced by each worker
            np.testing.assert_allclose(saved[f"var/{name}"], value, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{config}: {name} on worker {worker}")


@pytest.mark.parametrize("job", _jobs("AR-seq2seq", "PS-seq2seq", "HYBRID-seq2seq",
                                     "AUTO-seq2seq"), indirect=True)
def test_a_loss_normalized_by_its_tokens_is_divided_by_the_combined_batchs(job):
    """Said in the plan, for the hand-written loss and tf.compat.v1.losses' (weights=mask).
    (Each trains as on one device: test_workers_equal_single_device.)"""
    _, _, out, _ = job
    said = [line for line in (out / "output.txt").read_text().splitlines()
            if "loss divided by a sum over the batch: by the combined batch's" in line]
    assert any(line.endswith(": Sum_1:0") for line in said), said
    assert any(line.endswith(": sparse_softmax_cross_entropy_loss/num_present:0")
               for line in said), said


@pytest.mark.parametrize("job", _jobs("PS-lstm"), indirect=True)
def test_workers_leave_horovod_after_the_first_broadcast_when_no_step_uses_it(job):
    """Each configuration's runner joins Horovod to broadcast the Keras LSTM's seed generator
    state, then leaves it (idle, it costs CPU every cycle), and the next joins again: still
    every variable as on one device (test_workers_equal_single_device). Under TF1 behaviour the
    LSTM is a tf.scan of variables that all live on the servers: no Horovod at all."""
    _, _, out, _ = job
    output = (out / "output.txt").read_text()
    keras = [config for config in _configs("PS-lstm") if config not in equivalence.TF1_CONFIGS]
    assert output.count(LEFT_COLLECTIVES) == len(keras), output[-3000:]


@pytest.mark.parametrize("job", _jobs("AUTO-two-tables"), indirect=True)
def test_auto_weighs_a_plan_mixing_a_server_and_an_allgather_and_times_it(job):
    """The search's plan puts the embedding, whose batches repeat a few ids, on a server
    (whole: 40 rows, which a split would not make 5% faster), and allgathers the tags table,
    whose ~100 ids a batch are nearly all distinct: its server would send them in the pulls
    and receive them again in the pushes. On loopback links the bytes cost nothing and the
    CPU decides: the whole step may predict a rule's plan faster, which is then proposed and
    says where the search's differs. Either way the trials run the mix (every plan trains as
    on one device through the switches: test_workers_equal_single_device). A reference
    variable, tags cannot be split, and the plan says so."""
    _, _, out, _ = job
    output = (out / "output.txt").read_text()
    plan = output.splitlines()
    assert "parameter server" in next(line for line in plan if "] embedding " in line), plan
    tags = next(line for line in plan if "] tags " in line)
    if "allgather" not in tags:
        assert re.search(r"chosen: \w+'s rule, its whole step predicted faster than the "
                         r"search's plan \(tags: allgather[,)]", output), output[-3000:]
        assert re.search(r"AUTO timed its plans on the cluster: .*the search's plan [0-9.]+ ms "
                         r"a step", output), output[-3000:]
    assert "kept whole: tags ('tags' is a reference variable" in output


@pytest.mark.parametrize("job", _jobs("HYBRID-split", "HYBRID-keras-embedding-split"),
                         indirect=True)
def test_an_embedding_is_split_over_both_servers(job):
    """Each worker stores the embedding in two row shards, one on each server. (They train
    as one device with the whole embedding: test_workers_equal_single_device.)"""
    _, _, out, _ = job
    output = (out / "output.txt").read_text()
    assert "split over servers: embedding" in output, output[-3000:]
    plan = [line for line in output.splitlines() if "] embedding" in line]
    assert "/part_0 " in plan[0] and "server 0" in plan[0], plan
    assert "/part_1 " in plan[1] and "server 1" in plan[1], plan


@pytest.mark.parametrize("job,config", _jobs("HYBRID-split", configs=True), indirect=["job"])
def test_checkpoints_of_a_split_embedding_load_into_the_single_device_graph(job, config):
    _, workers, out, _ = job
    expected, _ = _single_device("sparse", config, workers * equivalence.BATCH_PER_WORKER)
    with equivalence.behaviour(config in equivalence.TF1_CONFIGS):  # as the job built it
        graph, _, _ = equivalence.build("sparse", config, equivalence.BATCH_PER_WORKER,
                                        shard=False)
        with graph.as_default():
            saver = tf.compat.v1.train.Saver()
            variables = tf.compat.v1.global_variables()
        with tf.compat.v1.Session(graph=graph) as session:
            saver.restore(session, tf.train.latest_checkpoint(str(out / "ckpt" / config)))
            restored = dict(zip([v.op.name for v in variables], session.run(variables)))
    assert set(restored) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(restored[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("run_option", ["AR", "PS"])
def test_sum_aggregation_is_single_device_on_the_summed_loss(tmp_path, run_option):
    """average_dense/average_sparse=False sums worker gradients: with two workers that is the
    gradient of twice the mean loss on the combined batch. (Its workers are threads of this
    process: tests/in_process.py.)"""
    equivalence.train_in_process(["--model", "sparse", "--sum", "--configs", "sgd",
                                  "--run-option", run_option, "--resources", "localhost:0,1",
                                  "--out", str(tmp_path)], in_process.run_workers)
    expected, _ = equivalence.train_single_device(
        "sparse", "sgd", 2 * equivalence.BATCH_PER_WORKER, loss_scale=2.0)
    for worker in (0, 1):
        saved = np.load(tmp_path / f"sgd.worker{worker}.npz")
        for name, value in expected.items():
            np.testing.assert_allclose(saved[f"var/{name}"], value, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{name} on worker {worker}")


@pytest.mark.parametrize("model,dense_ids", [("sparse", True), ("sparse", False),
                                             ("lookup-sparse", True)],
                         ids=["nearly-dense", "sparse", "nearly-dense-unique-ids"])
def test_auto_chooses_by_measured_rows_and_equals_single_device(tmp_path, monkeypatch, model,
                                                                 dense_ids):
    """run_option='AUTO' on 2 machines x 2 workers: an embedding whose every row is in every
    batch is allreduced (its slices summed to dense and back, so Adam and momentum update the
    touched rows only, as on one device); one read a little goes to a parameter server. Either
    plan is timed on the cluster against the embedding allgathered and every variable on
    servers (and the allreduced one against the embedding on a server too;
    Config.trial_steps=3: a step each to warm up and one timed, then one more in the reverse
    order, then the fastest, of the 20 steps; trial_margin=inf: every rule's plan,
    whatever the cost model predicts of it; every variable on servers without Horovod,
    as it would run once kept): the training goes on across the plan changes, and every
    variable ends as on one device. The 'sparse' model starts from a checkpoint
    (init_from_checkpoint, as fine-tuning does), the trials' runner of resource variables
    (TF2) where the embedding is nearly dense, of reference variables (TF1 behaviour, whose
    initializers are then tensors) where it is sparse."""
    configs = (["adam", "momentum+clip", "sgd"] if dense_ids
               else ["adam"] if model == "lookup-sparse" else ["momentum+clip"])
    start = []
    if model == "sparse":
        start = ["--from-checkpoint", equivalence.write_start_checkpoint(
            str(tmp_path / "start" / "ckpt"), model)]
        monkeypatch.setattr(equivalence, "FROM_CHECKPOINT", start[1])
    result = run_job(os.path.join(WORKLOADS, "equivalence.py"), "--model", model,
                     "--resources", TWO_MACHINES, "--run-option", "AUTO", "--out",
                     str(tmp_path), "--configs", *configs, "--trial-steps", "3",
                     "--trial-margin", "inf", *start,
                     *(["--dense-ids"] if dense_ids else []), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    plan = [line for line in result.stdout.splitlines()
            if "] embedding " in line or "] embedding/part_0 " in line][0]
    assert ("allreduce" if dense_ids else "parameter server") in plan, result.stdout[-3000:]
    assert "AUTO: cost model" in result.stdout
    assert "; transport probed: a message " in result.stdout  # between the two machines
    timed = [line for line in result.stdout.splitlines() if "AUTO timed its plans" in line]
    # a line for the first config's runner; the later get_runner calls are not timed
    assert len(timed) == 1 and "the cost model's choice" in timed[0], timed
    assert "AR's rule" in timed[0] and "PS's rule" in timed[0], timed
    assert ("HYBRID's rule" in timed[0]) is dense_ids, timed
    # every variable on servers: timed without Horovod, as it runs once kept (Quiet)
    assert re.search(r"PS's rule [0-9.]+ ms a step \(turns [0-9.]+, [0-9.]+\) "
                     r"\(predicted [0-9.]+\) without Horovod;", timed[0]), timed
    assert timed[0].count("(turns ") == timed[0].count(" ms a step"), timed
    assert "; kept " in timed[0], timed
    if dense_ids:
        monkeypatch.setattr(equivalence, "IDS_PER_EXAMPLE", 60)
        monkeypatch.setattr(equivalence, "ID_RANGE", equivalence.VOCAB)
    for config in configs:
        expected, _ = equivalence.train_single_device(
            model, config, 4 * equivalence.BATCH_PER_WORKER)
        for worker in range(4):
            saved = np.load(tmp_path / f"{config}.worker{worker}.npz")
            for name, value in expected.items():
                np.testing.assert_allclose(saved[f"var/{name}"], value, rtol=1e-4, atol=1e-5,
                                           err_msg=f"{config}: {name} on worker {worker}")


def test_searched_partitions_are_chosen_by_the_cost_model_and_equal_single_device(
        tmp_path, monkeypatch):
    """An embedding made with parallax.get_partitioner(1) under search_partitions on 2 machines:
    the driver's cost model splits it in 2 shards, one a server (the shards balance each link's
    pulls and pushes), every worker builds it so, and training is single-device training of the
    same graph (the embedding in 2 shards) on the combined batch."""
    configs = ["adagrad+clip", "adam"]
    result = run_job(os.path.join(WORKLOADS, "equivalence.py"), "--model", "partitioned",
                     "--resources", TWO_MACHINES, "--run-option", "HYBRID",
                     "--search-partitions", "--out", str(tmp_path), "--configs", *configs,
                     timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "partitions: embedding in 2" in result.stdout, result.stdout[-3000:]
    plan = [line for line in result.stdout.splitlines() if "] embedding/part_" in line]
    assert len(plan) == 2 * len(configs), plan  # the chief's plan of each get_runner
    assert "server 0" in plan[0] and "server 1" in plan[1], plan
    monkeypatch.setattr(equivalence, "MIN_PARTITIONS", 2)
    for config in configs:
        expected, _ = equivalence.train_single_device(
            "partitioned", config, 4 * equivalence.BATCH_PER_WORKER)
        assert "embedding/part_1" in expected
        for worker in range(4):
            saved = np.load(tmp_path / f"{config}.worker{worker}.npz")
            assert {k[len("var/"):] for k in saved.files if k.startswith("var/")} == set(expected)
            for name, value in expected.items():
                np.testing.assert_allclose(saved[f"var/{name}"], value, rtol=1e-4, atol=1e-5,
                                           err_msg=f"{config}: {name} on worker {worker}")
