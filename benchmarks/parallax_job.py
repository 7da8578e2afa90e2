"""The benchmark models trained by Parallax, written as a Parallax user writes a job: the
single-device graph, `parallax.shard` on the input, `get_runner`, a loop of `runner.run`.

    python benchmarks/parallax_job.py --workload lm --resources FILE --run-option HYBRID \
        --out DIR [--ps-off local_aggregation ...] [--asynchronous] [--straggler-ms 300]
"""
import argparse
import dataclasses
import time

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
    parser.add_argument("--collectives", choices=["horovod", "tensorflow"],
                        help="Config(collectives=...): the library of the allreduce")
    parser.add_argument("--asynchronous", action="store_true", help="Config(sync=False)")
    parser.add_argument("--flat-allreduce", action="store_true",
                        help="Config(hierarchical_allreduce=False): one ring over all workers; "
                        "by default as the cost model predicts faster")
    parser.add_argument("--own-batch-norm", action="store_true",
                        help="Config(sync_batch_norm=False): each worker's own batch statistics")
    parser.add_argument("--straggler-ms", type=float, default=0,
                        help="the last worker sleeps this long in each of its steps")
    parser.add_argument("--profile-dir", help="profile the chief's last warm-up step there")
    parser.add_argument("--trial-steps", type=int, default=parallax.Config.trial_steps,
                        help="AUTO's steps timing each plan (Config.trial_steps)")
    args = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    workload = WORKLOADS[args.workload]
    graph = tf.Graph()
    with graph.as_default():
        loss = workload.build_loss(workload.input_batch(parallax.shard))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = workload.minimize(loss, workload.make_optimizer(), global_step)
    config = parallax.Config(run_option=args.run_option, sess_config=session_config(),
                             collectives=args.collectives,
                             ps_config=parallax.PSConfig(**{o: False for o in args.ps_off}),
                             sync=not args.asynchronous,
                             hierarchical_allreduce=False if args.flat_allreduce else None,
                             sync_batch_norm=False if args.own_batch_norm else None,
                             trial_steps=args.trial_steps,
                             profile_config=parallax.ProfileConfig(
                                 args.profile_dir, profile_steps=[max(args.warmup, 1)],
                                 profile_workers=[0]) if args.profile_dir else None)
    runner = parallax.get_runner(graph, args.resources, config)
    straggler = args.straggler_ms / 1000 if runner.worker_id == runner.num_workers - 1 else 0

    def step():
        if straggler:  # sleep(0) would still yield the core: 0.3 ms a step on shared cores
            time.sleep(straggler)
        runner.run(train_op)
    while not runner.settled:  # AUTO timing its plans: steps before the warm-up
        step()
    # An asynchronous worker's step trains its own batch only: the job's throughput is the
    # sum of its workers' (report.py).
    details = workload.details(1 if args.asynchronous else runner.num_workers)
    meter.measure(step, args.out, runner.is_chief, args.warmup, args.window, args.windows,
                  system="parallax", workers=runner.num_workers, run_option=args.run_option,
                  ps_off=args.ps_off,
                  hierarchical_allreduce=meter.machine_stages(runner.transformed_graph),
                  placement=meter.placement(runner.transformed_graph),
                  sync=runner.synchronization, asynchronous=args.asynchronous,
                  straggler_ms=args.straggler_ms, **trials(runner), **details)


def trials(runner) -> dict:
    """AUTO's trials as the chief timed them (parallax/runtime/trials.py): each plan's
    predicted and measured step (the median of its turns, and each turn's), whether it was
    timed without Horovod and kept, and what the
    trials cost besides their steps; nothing for a job that timed no plans."""
    candidates = getattr(runner, "candidates", None)
    if not candidates:
        return {}

    def ms(seconds):
        return None if seconds is None else seconds * 1e3
    return {"trials": [{"plan": c.name, "predicted_ms": ms(c.predicted),
                        "measured_ms": ms(c.measured),
                        "turns_ms": [ms(seconds) for seconds in c.turns],
                        "without_horovod": c.quiet,
                        "kept": c.runner is runner.current} for c in candidates],
            "trials_overhead_seconds": dict(runner.overhead)}


if __name__ == "__main__":
    main()
