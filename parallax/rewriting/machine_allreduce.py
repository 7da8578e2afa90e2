"""Allreduce in machine stages (Config.hierarchical_allreduce), local aggregation (paper §5.3.2)
for replicated variables. A ring over all N workers carries 2w(N-1)/N bytes of a w-byte tensor
over each machine's link. Here a machine's G workers first sum their tensors within the machine;
then the j-th worker of every machine allreduces the j-th of G slices of that sum across the
machines; then the machine's workers share their summed slices within it. Each machine's link
carries 2w(H-1)/H (H machines): w instead of 1.5w on 2 machines of 2 workers. Horovod's own
hierarchical allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE) exists for MPI and NCCL, not for its gloo
CPU path; this one is built from Horovod process sets. Every worker ends with the same sum: each
slice is summed once, by one group, and the sharing only adds zeros."""
from __future__ import annotations

import os

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.tensorflow.mpi_ops import _allreduce as allreduce_op

from parallax.cluster import Cluster
from parallax.errors import ParallaxError
from runner import rendezvous

CYCLE_TIME_MS = 5


def init_horovod(cluster: Cluster, machine_stages: bool) -> None:
    """hvd.init, with the process sets of the machine stages when a plan of this get_runner
    call uses them (a later call's plan that does joins Horovod again with them), or again
    after leave_horovod."""
    global _joined_with_stages  # pylint: disable=global-statement
    if hvd.is_initialized() and (_joined_with_stages or not machine_stages):
        return
    leave_horovod()
    if cluster.machine_groups():
        # Every Horovod cycle coordinates each process set a worker is in, tensors pending or
        # not: three sets instead of one cost a worker 5 ms of CPU a step on the LM benchmark
        # at the default 1 ms cycle, none at 5 ms (unless the user set the cycle).
        os.environ.setdefault("HOROVOD_CYCLE_TIME", str(CYCLE_TIME_MS))
    # Not when unused: idle, 4 workers on 2 cores at 5 ms cycles took 130 ms of CPU a second
    # without them, 480-660 with them.
    sets = ([hvd.ProcessSet(workers) for workers in cluster.machine_groups()]
            if machine_stages else [])
    hvd.init(process_sets=sets)
    _joined_with_stages = machine_stages
    if [s.process_set_id for s in sets] != list(range(1, len(sets) + 1)):
        raise ParallaxError(f"Horovod numbered the process sets of the machine stages "
                            f"{[s.process_set_id for s in sets]}, not 1 to {len(sets)} in order: "
                            "was hvd.init called before parallax.get_runner?")


def leave_horovod() -> None:
    """Stop Horovod's background thread, which coordinates the workers every cycle even with no
    tensor pending (idle, 4 workers on 2 cores took 130-660 ms of CPU a second): for a plan
    AUTO kept that needs no Horovod, or to join again with other process sets. Every worker
    calls it at the same point: one worker's hvd.shutdown stops every worker's Horovod."""
    if not hvd.is_initialized():
        return
    graph = tf.Graph()
    with graph.as_default():
        barrier = hvd.allreduce(tf.constant(0.0), op=hvd.Sum, name="parallax_leaving_horovod")
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(barrier)  # every worker is past this round's rendezvous: its keys can go,
        if hvd.rank() == 0:
            rendezvous.next_round()
        session.run(barrier)  # and before any worker joins again
    hvd.shutdown()


_joined_with_stages = False


def _process_set(groups, index: int) -> hvd.ProcessSet:
    """The process set of cluster.machine_groups()[index]: Horovod numbers the sets given to
    hvd.init from 1 in order (init_horovod checks it). A graph is also transformed where
    Horovod has not started (the driver's AUTO probe, tests), so the number is not asked of
    Horovod."""
    process_set = hvd.ProcessSet(groups[index])
    process_set.process_set_id = index + 1
    return process_set


def allreduce(tensor: tf.Tensor, op, cluster: Cluster) -> tf.Tensor:
    """hvd.allreduce(tensor, op) in machine stages (needs cluster.machine_groups) when its shape
    is known (a gradient's is), else in one ring. The ops themselves (Horovod's _allreduce, what
    hvd.allreduce builds) ask nothing of a started Horovod."""
    size = tensor.shape.num_elements()
    if size is None:
        return hvd.allreduce(tensor, op=op)
    groups = cluster.machine_groups()  # each machine's workers, then each position's
    machine = groups[cluster.machine]
    position = machine.index(cluster.worker_id)
    within = _process_set(groups, cluster.machine)
    across = _process_set(groups, cluster.num_machines + position)
    start, end = size * position // len(machine), size * (position + 1) // len(machine)
    flat = tf.reshape(tensor, [size])
    summed = allreduce_op(flat, op=hvd.Sum, process_set=within)
    slice_sum = allreduce_op(summed[start:end], op=hvd.Sum, process_set=across)
    whole = allreduce_op(tf.pad(slice_sum, [[start, size - end]]), op=hvd.Sum,
                         process_set=within)
    if op == hvd.Average:
        whole = whole / cluster.num_workers
    return tf.reshape(whole, tensor.shape)
