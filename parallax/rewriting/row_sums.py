"""Rows of a sparse gradient summed by id before they cross machines (paper §5.3.2, local
aggregation). A lookup's gradient has one row per id looked up, repeated ids included; each
worker sums its rows of one id, and each machine the rows of its workers, so a row per id
travels. That leaves the update unchanged where the model only adds rows into the variable
(every optimizer sums the rows of one id first) and takes the gradient's L2 norm
(clip_by_global_norm): the norm single-device training sees is over every row, and is carried
beside the summed rows as each worker's share (a sum of squares adds up across workers).

Unless the model made its ids unique before the lookup (tf.unique; embedding_lookup_sparse does
it): then single-device training sees one row per id of the combined batch, the sum of every
worker's rows of that id, and its norm is of those sums. Such an aggregate is summed by id
wherever it is complete (one_row_per_id), and its norm taken there."""
from __future__ import annotations

import tensorflow as tf

from parallax import contracts
from parallax.rewriting.rewire import reroute

def one_row_per_id(aggregated):
    """A complete aggregate of a gradient with rows_unique_per_batch as single-device training
    has it: [values, ids] summed by id; a carried norm share, that of the summed rows."""
    rows = sum_rows(*aggregated[:2])
    if carries_norm(aggregated):
        rows.append(norm_share(rows[0]))
    return rows


def carries_norm(parts) -> bool:
    """Whether a pushed or aggregated gradient is [summed values, unique ids, norm share]
    rather than [values, ids] or [dense]."""
    return len(parts) == 3


def sum_rows(values: tf.Tensor, indices: tf.Tensor):
    unique_indices, positions = tf.unique(indices)
    return [tf.math.unsorted_segment_sum(values, positions, tf.shape(unique_indices)[0]),
            unique_indices]


def norm_share(values: tf.Tensor) -> tf.Tensor:
    """What the rows add to an L2Loss of all of them: half their sum of squares."""
    return tf.nn.l2_loss(values)


def use_carried_norm(old_values_consumers, norm: tf.Tensor, trigger: tf.Operation,
                     on_server: bool = False) -> None:
    """The model's L2Loss of the gradient's rows reads the carried norm instead. The L2Loss
    itself, now unused (a fetch of it gets the norm), is detached from the rows: still reading
    them, it looked like a monitor of the aggregate, whose rows every step then fetched to keep
    (1 MB a step per worker on the LM benchmark). The norm comes with the rows: `trigger` and
    `on_server` are theirs (contracts.record_aggregated), so a step that applies the rows has
    the norm too (a global norm of the gradients fetched with the train op)."""
    for op in old_values_consumers:
        if op.type == "L2Loss":
            reroute(op.outputs[0], norm, list(op.outputs[0].consumers()))
            # the post-aggregation ops start here too
            contracts.record_aggregated(op.outputs[0], norm, trigger=trigger, on_server=on_server)
            with op.graph.as_default(), tf.device(op.device):
                # A zero of unknown shape: it fits any shape the edge had.
                detached = tf.compat.v1.placeholder_with_default(
                    tf.zeros([], op.inputs[0].dtype), shape=None)
                reroute(op.inputs[0], detached, [op])
