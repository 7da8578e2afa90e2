"""One worker, no distribution: the plain single-device graph in a local session. Its step time
is the compute-only reference (no network) and its throughput the base of every speedup.

    python benchmarks/single_job.py --workload lm --out DIR
"""
import argparse

import numpy as np
import tensorflow as tf

import meter
from workloads import WORKLOADS, session_config


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    meter.add_arguments(parser)
    args = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    workload = WORKLOADS[args.workload]
    loss = workload.build_loss(workload.input_batch(lambda dataset: dataset))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = workload.minimize(loss, workload.make_optimizer(), global_step)
    variables = tf.compat.v1.trainable_variables()
    gradients = tf.compat.v1.gradients(loss, variables)
    with tf.compat.v1.Session(config=session_config()) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        meter.measure(lambda: session.run(train_op), args.out, True, args.warmup, args.window,
                      args.windows, system="single", workers=1, **workload.details(1),
                      variables=_sizes(session, variables, gradients, workload.loop_steps))


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
