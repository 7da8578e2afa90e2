"""One allreduce of the dense gradients of a step, as Parallax's collectives run it, timed for
each implementation: N worker processes on this machine (loopback), each allreducing (mean) M
tensors of S MB in all per step; the median step of the chief over --steps runs, each after
--warmup runs. Fetched is one element of each result (the bytes stay in the workers, as a
step's gradients do).

    python benchmarks/allreduce.py [--collectives horovod tensorflow] [--mb 1 10 100]
                                   [--tensors 1 50] [--workers 4] [--steps 10]
                                   [--settings bucket_mb=32 bucket_mb=4,recv_chunk=-1 ...]
                                   [--out FILE.md]

Each of --settings is a run of TensorFlow's collectives with settings of its own, joined by
commas: bucket_mb (collectives/tensorflow.py's BUCKET_BYTES), recv_chunk (ConfigProto's
experimental.recv_buf_max_chunk, bytes; -1 sends a tensor in one chunk), subdivs (the
reductions' max_subdivs_per_device), channels (rpc_options.num_channels_per_target).
Horovod's fusion is its own (HOROVOD_FUSION_THRESHOLD, 128 MB by default).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, REPO)


def _worker(args) -> None:
    """One worker: every case of the run, in order, the chief printing one JSON line each."""
    import numpy as np
    import tensorflow as tf

    from parallax.worker import WorkerProcess

    tf.compat.v1.disable_eager_execution()
    process = WorkerProcess(heartbeat=None)  # a worker's collectives and server, as in a job
    cluster, collectives = process.cluster, process.collectives
    if args.settings:
        _apply(_parse(args.settings), collectives)
    collectives.join(stages=False)
    cases = [(megabytes, count) for megabytes in args.mb for count in args.tensors]
    for case, (megabytes, count) in enumerate(cases):
        graph = tf.Graph()
        with graph.as_default():
            size = max(1, int(megabytes * 2**20 / 4 / count))
            gradients = [tf.compat.v1.get_variable(
                f"case{case}_g{i}", initializer=tf.fill([size], cluster.worker_id + 1.0))
                for i in range(count)]
            reduced = collectives.allreduce_all([g.read_value() for g in gradients],
                                                average=True)
            step = tf.stack([r[0] for r in reduced])
            init = tf.compat.v1.global_variables_initializer()
        session = collectives.session(graph)
        session.run(init)
        for _ in range(args.warmup):
            session.run(step)
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            values = session.run(step)
            times.append(time.perf_counter() - start)
        expected = (cluster.num_workers + 1) / 2
        if not np.allclose(values, expected):
            raise AssertionError(f"allreduce gave {values[:3]}, expected {expected}")
        session.close()
        if cluster.is_chief:
            print(json.dumps({"mb": megabytes, "tensors": count,
                              "ms": 1000 * statistics.median(times),
                              "spread_ms": 1000 * (max(times) - min(times))}), flush=True)
    collectives.leave()


def _parse(settings: str) -> dict:
    parsed = dict(item.split("=", 1) for item in settings.split(","))
    unknown = set(parsed) - {"bucket_mb", "recv_chunk", "subdivs", "channels"}
    if unknown:
        raise SystemExit(f"--settings {settings}: unknown {sorted(unknown)}")
    return {key: float(value) for key, value in parsed.items()}


def _apply(settings: dict, collectives) -> None:
    """Sets what the implementation keeps fixed, for this benchmark process only."""
    import functools

    import tensorflow as tf
    from parallax.collectives import tensorflow as tf_collectives

    if "bucket_mb" in settings:
        tf_collectives.BUCKET_BYTES = int(settings["bucket_mb"] * 2**20)
    if "subdivs" in settings:
        tf.raw_ops.CollectiveReduceV2 = functools.partial(
            tf.raw_ops.CollectiveReduceV2, max_subdivs_per_device=int(settings["subdivs"]))
    configure = collectives.configure

    def configured(config):
        config = configure(config)
        if "recv_chunk" in settings:
            config.experimental.recv_buf_max_chunk = int(settings["recv_chunk"])
        if "channels" in settings:
            config.rpc_options.num_channels_per_target = int(settings["channels"])
        return config

    collectives.configure = configured


def _run(implementation: str, args) -> list:
    """Start the workers of one implementation; the chief's results."""
    from parallax import contracts
    from parallax.cluster import Cluster
    from runner.free_ports import free_ports

    n = args.workers
    ports = free_ports(n)
    workers = [f"127.0.0.1:{port}" for port in ports] if implementation == "tensorflow" else []
    rendezvous = None
    envs = [{} for _ in range(n)]
    if implementation == "horovod":
        from runner.rendezvous import GlooRendezvous  # noqa: C0415

        rendezvous = GlooRendezvous([("127.0.0.1", n)], "127.0.0.1")
        envs = [rendezvous.env_for_rank(rank, gloo_iface="lo") for rank in range(n)]
    command = [sys.executable, os.path.abspath(__file__), "--role", "worker",
               "--mb", *map(str, args.mb), "--tensors", *map(str, args.tensors),
               "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.settings and implementation == "tensorflow":
        command += ["--settings", args.settings]
    processes = []
    try:
        for rank in range(n):
            cluster = Cluster([0] * n, workers=workers, worker_id=rank,
                              collectives=implementation)
            env = dict(os.environ, **envs[rank], **{contracts.CLUSTER_ENV: cluster.to_env()},
                       TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
            processes.append(subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                stderr=subprocess.PIPE, text=True))
        out, err = processes[0].communicate(timeout=3600)
        codes = [p.wait(timeout=600) for p in processes]
        if any(codes):
            raise SystemExit(f"{implementation}: workers exited {codes}: {err[-2000:]}")
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        if rendezvous:
            rendezvous.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=["driver", "worker"], default="driver")
    parser.add_argument("--collectives", nargs="+", default=["horovod", "tensorflow"])
    parser.add_argument("--mb", nargs="+", type=float, default=[1, 10, 100])
    parser.add_argument("--tensors", nargs="+", type=int, default=[1, 50])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--settings", nargs="*", default=[])
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.role == "worker":
        args.settings = args.settings[0] if args.settings else None
        _worker(args)
        return
    from parallax.collectives import horovod_installed  # noqa: C0415

    runs = []  # (label, results)
    for implementation in args.collectives:
        if implementation == "horovod" and not horovod_installed():
            print("horovod: not installed here, left out", file=sys.stderr)
            continue
        variants = args.settings if implementation == "tensorflow" and args.settings else [None]
        for settings in variants:
            if settings:
                _parse(settings)  # a typo fails before any process starts
            one = argparse.Namespace(**{**vars(args), "settings": settings})
            label = implementation + (f", {settings}" if settings else "")
            runs.append((label, _run(implementation, one)))
            print(f"{label}: done", file=sys.stderr)
    import tensorflow as tf  # noqa: C0415

    lines = [f"One allreduce (mean) among {args.workers} processes on this machine, TensorFlow "
             f"{tf.__version__}: median ms of {args.steps} steps (max - min)", "",
             "| implementation | " + " | ".join(f"{mb:g} MB in {n}" for mb in args.mb
                                               for n in args.tensors) + " |",
             "|---|" + "---|" * (len(args.mb) * len(args.tensors))]
    for label, results in runs:
        lines.append(f"| {label} | " + " | ".join(
            f"{r['ms']:.1f} ({r['spread_ms']:.0f})" for r in results) + " |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
