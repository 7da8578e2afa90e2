"""One worker, no distribution: the plain single-device graph in a local session. Its step time
is the compute-only reference (no network) and its throughput the base of every speedup.

    python benchmarks/single_job.py --workload lm --out DIR
"""
import argparse
import os
import sys

import numpy as np
import tensorflow as tf

import meter
from workloads import WORKLOADS, session_config

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Importing parallax makes autodiff record the gradients.
from parallax.planning.analysis import (analyze, gradient_sources,  # noqa: E402
                               update_ops_by_variable)
from parallax.planning.traces import step_shares  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    meter.add_arguments(parser)
    args = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    workload = WORKLOADS[args.workload]
    loss = workload.build_loss(workload.input_batch(lambda dataset: dataset))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = workload.minimize(loss, workload.make_optimizer(), global_step)
    graph = tf.compat.v1.get_default_graph()
    analysis = analyze(graph)  # the train op's gradients, before any other
    sources, updates = gradient_sources(graph, analysis), update_ops_by_variable(graph, analysis)
    variables = tf.compat.v1.trainable_variables()
    gradients = tf.compat.v1.gradients(loss, variables)
    with tf.compat.v1.Session(config=session_config()) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        sizes = _sizes(session, variables, gradients, workload.loop_steps)
        ready, update = _traced_shares(session, train_op, sources, updates)
        for size in sizes:
            size["ready"] = ready.get(size["name"], 1.0)
            size["update"] = update.get(size["name"], 0.0)
        meter.measure(lambda: session.run(train_op), args.out, True, args.warmup, args.window,
                      args.windows, system="single", workers=1, **workload.details(1),
                      variables=sizes)


def _traced_shares(session, train_op, sources, updates, warmup=3, traced=3):
    """Per variable, the share of a step done when its gradient is ready
    (cost.VariableStats.ready) and its share of the step's updates (cost.VariableStats.update),
    the medians of `traced` steps (profile.step_shares)."""
    for _ in range(warmup):
        session.run(train_op)
    ready = {variable: [] for variable in sources.heads}
    update = {variable: [] for variable in updates}
    for _ in range(traced):
        metadata = tf.compat.v1.RunMetadata()
        session.run(train_op, options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE), run_metadata=metadata)
        for shares, step in zip((ready, update),
                                step_shares(metadata.step_stats, sources, updates)):
            for variable, share in step.items():
                shares[variable].append(share)
    return tuple({variable: float(np.median(values)) for variable, values in shares.items()}
                 for shares in (ready, update))


def _sizes(session, variables, gradients, loop_steps, batches=4):
    """Each variable's bytes, how many times a step reads it (a while loop reads what it takes
    at every iteration) and, for a sparse gradient, the rows a step touches and how many
    distinct ids the batches of 1, 2, ... workers have: what the analytic byte counts
    (analytic.py) are made of."""
    in_loops = {t.op.name for op in tf.compat.v1.get_default_graph().get_operations()
                if op.type in ("While", "StatelessWhile") for t in op.inputs
                if t.dtype == tf.resource}
    sparse = [(v, g) for v, g in zip(variables, gradients) if isinstance(g, tf.IndexedSlices)]
    steps = [session.run({v.op.name: (g.values, g.indices) for v, g in sparse})
             for _ in range(batches)]
    sizes = []
    for variable, gradient in zip(variables, gradients):
        size = {"name": variable.op.name, "bytes": variable.shape.num_elements() * 4,
                "rows": None, "row_bytes": None, "index_bytes": None,
                "reads": loop_steps if variable.op.name in in_loops else 1}
        if isinstance(gradient, tf.IndexedSlices):
            values, _ = steps[0][variable.op.name]
            indices = [step[variable.op.name][1] for step in steps]
            size.update(rows=values.shape[0], row_bytes=values[0].nbytes,
                        index_bytes=gradient.indices.dtype.size,
                        unique_rows=[len(np.unique(np.concatenate(indices[:k])))
                                     for k in range(1, batches + 1)])
        sizes.append(size)
    return sizes


if __name__ == "__main__":
    main()
