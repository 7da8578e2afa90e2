"""Queues on the servers through which gradients travel; shared by the PS and local
aggregation passes."""
from __future__ import annotations

import tensorflow as tf

from parallax.rewriting import row_sums


def shared_queue(parts, name, device):
    """A queue every worker's graph names alike, so that they all reach the same one. It holds
    at most one step's items: no worker pushes step k+1 before the chief took step k."""
    with tf.device(device):
        shapes = [parts[0].shape] if len(parts) == 1 else None
        return tf.queue.FIFOQueue(1 << 16, [t.dtype for t in parts], shapes=shapes,
                                  shared_name=f"parallax/{name}", name=name.replace("/", "_"))


def producer_queues(parts, name, device, producers):
    """A queue for each producer of a step's items (a worker, or a machine's sum): the taker
    reads them in the producers' order, so that a sum is added up in the same order in every
    run, whichever item arrives first (float addition depends on its order)."""
    return [shared_queue(parts, f"{name}/from{producer}", device)
            for producer in range(producers)]


def concat_slices(items):
    """The sum of IndexedSlices, (values, indices) concatenated; a third part, the norm share
    carried with rows summed by id (row_sums.py), is added up."""
    combined = [tf.concat([item[0] for item in items], axis=0),
                tf.concat([item[1] for item in items], axis=0)]
    if row_sums.carries_norm(items[0]):
        combined.append(tf.add_n([item[2] for item in items]))
    return combined
