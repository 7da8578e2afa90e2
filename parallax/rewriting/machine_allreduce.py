"""Allreduce in machine stages (Config.hierarchical_allreduce), local aggregation (paper §5.3.2)
for replicated variables. A ring over all N workers carries 2w(N-1)/N bytes of a w-byte tensor
over each machine's link. Here a machine's G workers first sum their tensors within the machine;
then the j-th worker of every machine allreduces the j-th of G slices of that sum across the
machines; then the machine's workers share their summed slices within it. Each machine's link
carries 2w(H-1)/H (H machines): w instead of 1.5w on 2 machines of 2 workers. Horovod's own
hierarchical allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE) exists for MPI and NCCL, not for its gloo
CPU path; this one is built from groups of workers (Collectives.allreduce's `group`). Every
worker ends with the same sum: each slice is summed once, by one group, and the sharing only
adds zeros."""
from __future__ import annotations

import tensorflow as tf

from parallax.collectives import Collectives


def allreduce(tensor: tf.Tensor, average: bool, collectives: Collectives) -> tf.Tensor:
    """The allreduce of `tensor` in machine stages (the collectives joined with them) when its
    shape is known (a gradient's is), else in one ring."""
    size = tensor.shape.num_elements()
    if size is None:
        return collectives.allreduce(tensor, average)
    cluster = collectives.cluster
    groups = cluster.machine_groups()  # each machine's workers, then each position's
    machine = groups[cluster.machine]
    position = machine.index(cluster.worker_id)
    across = groups[cluster.num_machines + position]
    start, end = size * position // len(machine), size * (position + 1) // len(machine)
    flat = tf.reshape(tensor, [size])
    summed = collectives.allreduce(flat, average=False, group=machine)
    slice_sum = collectives.allreduce(summed[start:end], average=False, group=across)
    whole = collectives.allreduce(tf.pad(slice_sum, [[start, size - end]]), average=False,
                                  group=machine)
    if average:
        whole = whole / cluster.num_workers
    return tf.reshape(whole, tensor.shape)
