"""The planner's predictions against the jobs' measured steps (issue 55 item 4): for each run
folder of `run.py --predict` (OUT/summary.json with OUT/plan-WORKLOAD.json, or OUT/RATE/...),
each Parallax run option's step as `python -m parallax.plan` predicted it on that cluster and
as its job measured it; per rate the median error; and every pair of plans of one workload
and cluster whose measured steps differ by more than 15%, ranked by the prediction as they
ran, or not.

    python benchmarks/run.py --rate 100mbit 1gbit 10gbit --workloads lm nmt cnn \\
        --systems parallax-ar parallax-ps parallax-hybrid parallax-auto horovod \\
        --no-ablation --no-straggler --predict --out DIR
    python benchmarks/prediction_check.py DIR [DIR ...] [--out FILE.md]

Horovod's jobs are compared with AR's prediction (the same allreduce of every gradient).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
from typing import List, Optional

import report

PREDICTED = {"parallax-ar": "AR", "parallax-ps": "PS", "parallax-hybrid": "HYBRID",
             "parallax-auto": "AUTO", "horovod": "AR"}
APART = 0.15  # measured steps this far apart must be ranked right


def rows(folder: str) -> List[dict]:
    """Per job of the run in `folder` with a prediction: its cluster, system, predicted and
    measured step (ms), the term that bounds the prediction."""
    with open(os.path.join(folder, "summary.json")) as file:
        summary = json.load(file)
    shape = f"{summary['hosts']} x {summary['workers_per_host']}"
    found = []
    for workload, measured in report.rows_by_workload(summary).items():
        path = os.path.join(folder, f"plan-{workload}.json")
        if not os.path.exists(path):
            continue
        with open(path) as file:
            plans = json.load(file)["plans"]
        for row in measured:
            plan = plans.get(PREDICTED.get(row["system"], ""), {})
            if row.get("step_ms") and "step_ms" in plan:
                found.append({"rate": summary["rate"], "shape": shape, "workload": workload,
                              "system": row["system"], "measured": row["step_ms"],
                              "predicted": plan["step_ms"], "bound": plan["bound_by"],
                              "error": plan["step_ms"] / row["step_ms"] - 1})
    return found


def misranked(jobs: List[dict]) -> List[tuple]:
    """Pairs of Parallax's plans of one workload and cluster whose measured steps differ by
    more than APART and whose predictions do not order them so (Horovod is not a plan: its
    prediction is AR's)."""
    wrong = []
    plans = [job for job in jobs if job["system"].startswith("parallax-")]
    for i, first in enumerate(plans):
        for second in plans[i + 1:]:
            if (first["rate"], first["shape"], first["workload"]) != (
                    second["rate"], second["shape"], second["workload"]):
                continue
            slow, fast = sorted((first, second), key=lambda job: -job["measured"])
            if slow["measured"] > fast["measured"] * (1 + APART) and (
                    slow["predicted"] <= fast["predicted"]):
                wrong.append((slow, fast))
    return wrong


def lines(jobs: List[dict]) -> List[str]:
    said = ["| rate | cluster | workload | system | predicted ms | measured ms | error | "
            "bound by |", "|---|---|---|---|---|---|---|---|"]
    for job in jobs:
        said.append(f"| {job['rate']} | {job['shape']} | {job['workload']} | {job['system']} | "
                    f"{job['predicted']:.1f} | {job['measured']:.1f} | {job['error']:+.0%} | "
                    f"{job['bound']} |")
    said.append("")
    for rate in dict.fromkeys(job["rate"] for job in jobs):
        errors = [abs(job["error"]) for job in jobs if job["rate"] == rate]
        signed = [job["error"] for job in jobs if job["rate"] == rate]
        said.append(f"- {rate}: median |error| {statistics.median(errors):.0%} (median "
                    f"{statistics.median(signed):+.0%}, {len(errors)} jobs; target 15%)")
    wrong = misranked(jobs)
    plans = [job for job in jobs if job["system"].startswith("parallax-")]
    apart = sum(1 for i, a in enumerate(plans) for b in plans[i + 1:]
                if (a["rate"], a["shape"], a["workload"]) == (b["rate"], b["shape"], b["workload"])
                and max(a["measured"], b["measured"]) > min(a["measured"], b["measured"]) * (
                    1 + APART))
    said.append(f"- pairs of Parallax's plans measured more than {APART:.0%} apart: {apart}, "
                f"ranked wrong by the prediction: {len(wrong)}")
    for slow, fast in wrong:
        said.append(f"  - {slow['rate']} {slow['shape']} {slow['workload']}: {slow['system']} "
                    f"{slow['measured']:.0f} ms measured, {slow['predicted']:.0f} predicted; "
                    f"{fast['system']} {fast['measured']:.0f} and {fast['predicted']:.0f}")
    return said


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--out", help="also write the table here (markdown)")
    args = parser.parse_args(argv)
    folders = [f for folder in args.folders for f in (
        [folder] if os.path.exists(os.path.join(folder, "summary.json"))
        else sorted(os.path.dirname(p) for p in glob.glob(os.path.join(folder, "*",
                                                                        "summary.json"))))]
    jobs = [job for folder in folders for job in rows(folder)]
    if not jobs:
        raise SystemExit("no job with a prediction (run.py --predict) in " + ", ".join(folders))
    report.print_and_save(lines(jobs), args.out)


if __name__ == "__main__":
    main()
