"""Local aggregation: the workers of one machine sum their sparse gradients on that machine's
server first, so one gradient per variable per machine crosses to the owning server instead of
one per worker (paper §5.3.2). The machine's first worker forwards the sum."""
from __future__ import annotations

import tensorflow as tf

from parallax.rewriting import row_sums
from parallax.rewriting.queues import concat_slices, producer_queues
from parallax.planning.job_plan import Plan


def push_through_machine(parts, key, plan: Plan, server_queue):
    """This worker's push of a sparse gradient via its machine (into `server_queue`, its
    machine's queue on the owning server)."""
    cluster = plan.cluster
    machine_device = cluster.server_device(cluster.machine)
    local = cluster.workers_on(cluster.machine)
    machine_queues = producer_queues(parts, f"machine{cluster.machine}/{key}", machine_device,
                                     len(local))
    push = machine_queues[local.index(cluster.worker_id)].enqueue(parts)
    if cluster.is_local_chief:
        with tf.device(machine_device), tf.control_dependencies([push]):
            machine_sum = concat_slices([queue.dequeue() for queue in machine_queues])
            if row_sums.carries_norm(parts):  # the machine's rows of one id become one
                machine_sum[:2] = row_sums.sum_rows(*machine_sum[:2])
        push = server_queue.enqueue(machine_sum)
    return push
