"""The benchmark models trained by Parallax, written as a Parallax user writes a job: the
single-device graph, `parallax.shard` on the input, `get_runner`, a loop of `runner.run`.

    python benchmarks/parallax_job.py --workload lm --resources FILE --run-option HYBRID \
        --out DIR [--ps-off local_aggregation ...]
"""
import argparse
import dataclasses

import parallax  # before the graph is built: it records the gradients
import tensorflow as tf

import meter
from workloads import WORKLOADS, session_config


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    meter.add_arguments(parser)
    parser.add_argument("--resources", required=True)
    parser.add_argument("--run-option", default="HYBRID")
    parser.add_argument("--ps-off", nargs="*", default=[], metavar="OPTION",
                        choices=[f.name for f in dataclasses.fields(parallax.PSConfig)],
                        help="PSConfig optimizations to turn off (the Table 4 ablation)")
    args = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    workload = WORKLOADS[args.workload]
    graph = tf.Graph()
    with graph.as_default():
        loss = workload.build_loss(workload.input_batch(parallax.shard))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = workload.minimize(loss, workload.make_optimizer(), global_step)
    config = parallax.Config(run_option=args.run_option, sess_config=session_config(),
                             ps_config=parallax.PSConfig(**{o: False for o in args.ps_off}))
    runner = parallax.get_runner(graph, args.resources, config)
    meter.measure(lambda: runner.run(train_op), args.out, runner.is_chief, args.warmup,
                  args.window, args.windows, system="parallax", workers=runner.num_workers,
                  run_option=args.run_option, ps_off=args.ps_off,
                  placement=meter.placement(runner.graph), sync=runner.synchronization,
                  **workload.details(runner.num_workers))


if __name__ == "__main__":
    main()
