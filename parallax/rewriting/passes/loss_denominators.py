"""A loss divided by a sum over the batch — the tokens that are not padding,
`sum(cross_entropy * mask) / sum(mask)`, or tf.compat.v1.losses' SUM_BY_NONZERO_WEIGHTS — is on
one device the combined batch's sum over the combined batch's count. Each worker divides by its
own count, so the averaged gradients would weight each worker's examples by how many it has.

Each such denominator (analysis.loss_denominators) becomes its mean over workers, one scalar
allreduce a step, in the loss and in autodiff's gradient ops that read it: worker i's loss is
then S_i / mean(C) = N S_i / sum(C), the mean of the workers' gradients is one device's
gradient sum(grad S_i) / sum(C), and the mean of the losses they report is one device's loss.
"""
from __future__ import annotations

import tensorflow as tf

from parallax import contracts
from parallax.collectives import Collectives
from parallax.vocabulary import upstream_ops
from parallax.planning.job_plan import Plan
from parallax.rewriting.passes import graph_pass
from parallax.rewriting.rewire import reroute


@graph_pass(produces=["loss denominators combined"],
            runs_if=lambda plan: bool(plan.loss_denominators) and not plan.asynchronous,
            collective=True)
def combine_loss_denominators(graph: tf.Graph, plan: Plan, collectives: Collectives
                              ) -> tf.Graph:
    gradients = [graph.get_tensor_by_name(name).op for record in contracts.read_gradients(graph)
                 for name in record.tensor_names()]
    ahead = upstream_ops(gradients) | set(gradients)  # the losses and autodiff's ops
    with graph.as_default(), tf.name_scope("parallax_loss_denominator"):
        for name in plan.loss_denominators:
            count = graph.get_tensor_by_name(name)
            # A summary or metric of the count outside the step's gradients keeps the worker's.
            consumers = [op for op in count.consumers() if op in ahead]
            with tf.device(count.op.device):
                combined = collectives.allreduce(count, average=True)
            reroute(count, combined, consumers)
    return graph
