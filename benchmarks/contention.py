"""Compute on shared cores, without synchronization: one worker's step alone (single_job.py),
then `--copies` of it at once on this machine, each training its own model, against the cost
model's price of that sharing (cost.shared_compute: the step alone, or the copies' CPU over the
cores when longer). A distributed job's step beyond it is what its synchronization costs.

    python benchmarks/contention.py --workload lm [--copies 4] [--out DIR]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, REPO)

from parallax.planning.cost import shared_compute  # noqa: E402
from runner.process import ProcessSpec, run_processes  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", required=True,
                        choices=["cnn", "cnn-bn", "lm", "lm-whole", "nmt", "tags"])
    parser.add_argument("--copies", type=int, default=4)
    # The copies start a few seconds apart (imports, graph building): long warm-ups and windows
    # keep each copy's windows within the time all of them run.
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument("--out", help="folder for the records (a temporary one if not given)")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="parallax-contention-")
    alone = _run(args, 1, os.path.join(out, "alone"))[0]
    together = _run(args, args.copies, os.path.join(out, "together"))
    cores = len(os.sched_getaffinity(0))
    predicted = shared_compute(alone["step"], alone["cpu"], args.copies, cores)
    print(f"{args.workload}: one worker alone {alone['step'] * 1e3:.1f} ms a step "
          f"({alone['cpu'] * 1e3:.1f} ms of CPU)")
    print(f"{args.copies} at once on {cores} cores: " + ", ".join(
        f"{r['step'] * 1e3:.1f} ms ({r['cpu'] * 1e3:.1f} ms of CPU)" for r in together))
    measured = statistics.median(r["step"] for r in together)
    print(f"median {measured * 1e3:.1f} ms a step; cost.shared_compute {predicted * 1e3:.1f} "
          f"ms ({predicted / measured - 1:+.0%}); records in {out}")


def _run(args, copies: int, out: str) -> list:
    """Each copy's median step and CPU per step, in seconds, `copies` started at once."""
    specs = [ProcessSpec(f"copy{i}", [sys.executable, os.path.join(BENCH, "single_job.py"),
                                      "--workload", args.workload, "--out",
                                      os.path.join(out, str(i)), "--warmup", str(args.warmup),
                                      "--window", str(args.window), "--windows", "5"],
                         {}, cwd=REPO, log_file=os.path.join(out, f"log{i}.txt"))
             for i in range(copies)]
    os.makedirs(out, exist_ok=True)
    run_processes(specs, timeout=1800)
    measured = []
    for path in sorted(glob.glob(os.path.join(out, "*", "*.json"))):
        record = json.load(open(path))
        steps = record["window_steps"]
        measured.append({"step": statistics.median(record["window_seconds"]) / steps,
                         "cpu": statistics.median(record["window_cpu_seconds"]) / steps})
    return measured


if __name__ == "__main__":
    main()
