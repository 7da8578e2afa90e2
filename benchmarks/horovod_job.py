"""The benchmark models trained with Horovod as its users write it: hvd.init, the input sharded
by rank, hvd.DistributedOptimizer around the optimizer, initial values broadcast from rank 0.
Started with horovodrun:

    horovodrun -np 4 -H h1:2,h2:2 --gloo python benchmarks/horovod_job.py --workload lm \
        --out DIR [--sparse-as-dense]
"""
import argparse

import horovod.tensorflow as hvd
import tensorflow as tf

import meter
from workloads import WORKLOADS, session_config


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    meter.add_arguments(parser)
    parser.add_argument("--sparse-as-dense", action="store_true",
                        help="allreduce sparse gradients as dense tensors")
    args = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    hvd.init()
    workload = WORKLOADS[args.workload]
    loss = workload.build_loss(workload.input_batch(
        lambda dataset: dataset.shard(hvd.size(), hvd.rank())))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    optimizer = hvd.DistributedOptimizer(workload.make_optimizer(),
                                         sparse_as_dense=args.sparse_as_dense)
    train_op = workload.minimize(loss, optimizer, global_step)
    with tf.compat.v1.Session(config=session_config()) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(hvd.broadcast_global_variables(0))
        meter.measure(lambda: session.run(train_op), args.out, hvd.rank() == 0, args.warmup,
                      args.window, args.windows, system="horovod", workers=hvd.size(),
                      sparse_as_dense=args.sparse_as_dense, **workload.details(hvd.size()))


if __name__ == "__main__":
    main()
