"""Allreduce in machine stages (Config.hierarchical_allreduce): which workers form its groups,
when a plan uses it, and the collectives each worker's graph runs (built in-process; the
numbers are checked against one device by the equivalence jobs *-machine-stages), and
joining Horovod again in one job, with and without their process sets."""
import os
import subprocess
import sys

import pytest
import tensorflow as tf

import parallax
from conftest import REPO, WORKLOADS, load_workload, needs_horovod
from parallax.planning import cost
from parallax.planning.analysis import analyze
from parallax.planning.job_plan import Decision
from parallax.cluster import Cluster
from parallax.config import PlanOptions
from parallax.rewriting.pipeline import transform
from parallax.planning.job_plan import make_plan

equivalence = load_workload("equivalence")


@pytest.mark.parametrize("machines, groups", [
    ([0, 0, 1, 1], [[0, 1], [2, 3], [0, 2], [1, 3]]),
    ([0, 0, 0, 1, 1, 1], [[0, 1, 2], [3, 4, 5], [0, 3], [1, 4], [2, 5]]),
    ([0, 0, 1], []),  # machines of unequal sizes
    ([0, 1, 2], []),  # one worker a machine: a ring already crosses each link once
    ([0, 0, 0], []),  # one machine
])
def test_the_groups_are_each_machine_then_each_position_across_machines(machines, groups):
    assert Cluster(worker_machines=machines).machine_groups() == groups


def _plan(model, hierarchical, worker_id=0, decision=None, **cluster):
    graph, _, _ = equivalence.build(model, "sgd", 4, shard=False)
    config = PlanOptions(run_option="AR", hierarchical_allreduce=hierarchical)
    return graph, make_plan(analyze(graph), config,
                            Cluster(worker_machines=[0, 0, 1, 1], worker_id=worker_id,
                                    **cluster), decision=decision)


def test_by_default_a_plan_uses_machine_stages_when_the_bytes_saved_pay_for_them():
    # The test model's few kB save microseconds of link, less than two Horovod cycles.
    assert not _plan("dense", None)[1].hierarchical_allreduce
    assert _plan("dense", True)[1].hierarchical_allreduce
    assert not _plan("dense", False)[1].hierarchical_allreduce
    assert not cost.machine_stages_pay(100e3, cost.Shape(2, 2), cost.Links())
    assert cost.machine_stages_pay(800e3, cost.Shape(2, 2), cost.Links())


def test_a_plan_follows_autos_decision_on_machine_stages_unless_the_config_says():
    graph, _ = _plan("dense", None)
    methods = {name: cost.Method(cost.ALLREDUCE) for name in analyze(graph).variables}

    def stages(hierarchical, decided, decided_for=methods):
        decision = Decision(methods=decided_for, stats={}, note="", machine_stages=decided)
        return _plan("dense", hierarchical, decision=decision)[1].hierarchical_allreduce

    assert stages(None, True) and not stages(None, False)
    assert not stages(False, True) and stages(True, False)
    # Not decided by the driver, or for another graph: the few kB do not pay.
    assert not stages(None, None) and not stages(None, True, decided_for={})


def _horovod_sets(graph):
    return [op.get_attr("process_set_id") for op in graph.get_operations()
            if op.type == "HorovodAllreduce"]


def _tensorflow_groups(graph):
    """Group keys less one: the key of all workers is 1, the machine stages' groups follow."""
    return [int(tf.get_static_value(op.inputs[2])) - 1 for op in graph.get_operations()
            if op.type == "CollectiveReduceV2"]


@pytest.mark.collectives
@pytest.mark.parametrize("library, groups_of", [
    pytest.param("horovod", _horovod_sets, marks=needs_horovod),
    ("tensorflow", _tensorflow_groups)])
@pytest.mark.parametrize("worker_id, within, across", [(0, 1, 3), (1, 1, 4), (2, 2, 3),
                                                       (3, 2, 4)])
def test_each_gradient_is_summed_in_its_machine_across_its_position_then_shared(
        library, groups_of, worker_id, within, across):
    """Groups are numbered from 1 in the order of Cluster.machine_groups (Horovod's process
    sets; TensorFlow's group keys, after the key of all workers)."""
    graph, plan = _plan("dense", True, worker_id, collectives=library)
    gradients = len([r for p in plan.variables.values() for r in p.variable.gradients])
    groups = groups_of(transform(graph, plan))
    assert groups.count(within) == 2 * gradients and groups.count(across) == gradients
    assert set(groups) == {within, across}


@pytest.mark.job
@pytest.mark.collectives
@needs_horovod
def test_workers_join_horovod_again_and_again_with_and_without_the_stages_process_sets():
    """Horovod's rendezvous server keeps some scopes' keys after a round (runner/rendezvous.py):
    without a new round, a join read a peer's old address by the 2nd to 12th join here (gloo:
    connection refused, send timeouts)."""
    from runner.rendezvous import GlooRendezvous  # pylint: disable=C0415

    rounds = 12
    with GlooRendezvous([("127.0.0.1", 2), ("127.0.0.2", 2)], "127.0.0.1") as rendezvous:
        workers = [subprocess.Popen(
            [sys.executable, os.path.join(WORKLOADS, "rejoin.py"), str(rounds)], cwd=REPO,
            env=dict(os.environ, **rendezvous.env_for_rank(rank, gloo_iface="lo"),
                     HOROVOD_GLOO_TIMEOUT_SECONDS="20", PYTHONPATH=REPO),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(4)]
        try:
            outputs = [worker.communicate(timeout=300)[0] for worker in workers]
        finally:
            for worker in workers:
                worker.kill()
    # Each worker's sums: all four (1+2+3+4), then its machine's and its position's.
    in_stages = [[10.0, 3.0, 4.0], [10.0, 3.0, 6.0], [10.0, 7.0, 4.0], [10.0, 7.0, 6.0]]
    for rank, (worker, output) in enumerate(zip(workers, outputs)):
        assert worker.returncode == 0, output[-3000:]
        lines = [line for line in output.splitlines() if line.startswith("round ")]
        assert lines == [f"round {r}: {in_stages[rank] if r % 2 else [10.0]}"
                         for r in range(rounds)], output[-3000:]
